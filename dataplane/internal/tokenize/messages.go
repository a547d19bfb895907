package tokenize

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
)

// How vLLM renders an Anthropic Messages request
// (vllm/entrypoints/anthropic/serving.py at 0001948bc769, the commit
// responses.go cites; in full 0001948bc76939369ca855c90b36d81256477e85):
// AnthropicServingMessages._convert_anthropic_to_openai_request turns it
// into a ChatCompletionRequest, rendered and tokenized as a chat completion
// (add_generation_prompt true, continue_final_message false,
// add_special_tokens false: the request's defaults).
//
//   - _convert_system_message: one system message first, the text of the
//     top-level system (a string, or its text blocks) and then of every
//     message of role system, joined with "" (text blocks that are empty or
//     start with "x-anthropic-billing-header" left out); none when there is
//     no text at all.
//   - _convert_messages: every other message in order. A string content is
//     kept; blocks become text parts (empty texts left out), "thinking"
//     the message's reasoning (joined with ""), "tool_use" a tool call whose
//     arguments are Python's json.dumps of its input, a user's
//     "tool_result" a tool message placed before the message it came in
//     (its text, or its text items joined with "\n"), an assistant's the
//     text part "Tool result: " + str(content). One text part becomes the
//     content string, several stay parts; a user message left with no
//     content is dropped, an assistant one kept without it.
//   - _convert_tools: each tool becomes {"type":"function","function":
//     {"name","description","parameters":input_schema,"defer_loading"}}.
//   - chat_template_kwargs is passed on; _handle_output_config sets
//     output_config.effort as the chat completion's reasoning_effort, which
//     reaches the template as a chat completion's does ([templateKwargs]).

// messagesBillingHeader starts the system text block Claude Code sends with
// a per-request hash, which vLLM leaves out of the prompt.
const messagesBillingHeader = "x-anthropic-billing-header"

// surrogateEscape matches a \u escape of a UTF-16 surrogate. Joining two
// JSON strings' texts is exact unless one holds such an escape (a lone
// surrogate, which Python keeps as it is, or half of a pair), so those are
// not joined.
var surrogateEscape = regexp.MustCompile(`\\u[dD][89a-fA-F]`)

// messagesBody returns the /tokenize chat body vLLM renders for an
// Anthropic Messages body's fields, or false when Build cannot reproduce
// it exactly: images and documents (the engine fetches and processes them),
// tool references, block types it does not know, a tool use without an id
// (vLLM names it by the clock) or whose input holds a number that is not an
// integer (Python prints floats its own way).
func messagesBody(model string, fields map[string]json.RawMessage) ([]byte, bool) {
	var effort json.RawMessage
	if oc := fields["output_config"]; !isNull(oc) {
		o, ok := object(oc)
		if !ok {
			return nil, false
		}
		effort = o["effort"]
	}
	kw, ok := templateKwargs(fields["chat_template_kwargs"], nil, effort, true)
	if !ok {
		return nil, false
	}
	msgs, ok := objects(fields["messages"])
	if !ok || len(msgs) == 0 {
		return nil, false
	}
	var system [][]byte // JSON strings
	if s := bytes.TrimSpace(fields["system"]); !isNull(s) {
		if isString(s) {
			if string(s) != `""` { // Python's "if system" skips an empty one
				system = append(system, s)
			}
		} else if !systemTexts(s, &system) {
			return nil, false
		}
	}
	for _, m := range msgs {
		if role, ok := str(m["role"]); !ok || role != "system" {
			continue
		}
		c := bytes.TrimSpace(m["content"])
		if isString(c) {
			system = append(system, c)
		} else if !systemTexts(c, &system) {
			return nil, false
		}
	}
	m, _ := json.Marshal(model)
	out := make([]byte, 0, len(fields["messages"])+len(fields["system"])+len(fields["tools"])+256)
	out = append(append(append(out, `{"model":`...), m...), `,"messages":[`...)
	first := len(out)
	add := func(msg []byte) {
		if len(out) > first {
			out = append(out, ',')
		}
		out = append(out, msg...)
	}
	if len(system) > 0 {
		text, ok := joinStrings(system, "")
		if !ok {
			return nil, false
		}
		add(append(append([]byte(`{"role":"system","content":`), text...), '}'))
	}
	for _, m := range msgs {
		role, ok := str(m["role"])
		switch {
		case !ok:
			return nil, false
		case role == "system":
			continue
		case role != "user" && role != "assistant":
			return nil, false
		}
		if !messagesTurn(role, m["content"], add) {
			return nil, false
		}
	}
	b := append(out, ']')
	if t := fields["tools"]; !isNull(t) {
		tools, ok := messagesTools(t)
		if !ok {
			return nil, false
		}
		b = append(append(b, `,"tools":`...), tools...)
	}
	if !isNull(kw) {
		b = append(append(b, `,"chat_template_kwargs":`...), kw...)
	}
	return append(b, `,"add_generation_prompt":true,"add_special_tokens":false}`...), true
}

// systemTexts appends the texts of a system content's blocks to dst: text
// blocks, less the empty ones and the billing header. Any other block, or
// content that is not an array of blocks, is not reproduced.
func systemTexts(content json.RawMessage, dst *[][]byte) bool {
	blocks, ok := objects(content)
	if !ok {
		return false
	}
	for _, bl := range blocks {
		typ, _ := str(bl["type"])
		if typ != "text" {
			return false
		}
		text := bytes.TrimSpace(bl["text"])
		if isNull(text) {
			continue
		}
		s, ok := str(text)
		if !ok {
			return false
		}
		if s != "" && !strings.HasPrefix(s, messagesBillingHeader) {
			*dst = append(*dst, text)
		}
	}
	return true
}

// messagesTurn adds the chat messages of one user or assistant message:
// the tool messages of a user's tool results, then the message itself
// unless it is a user's with no content left.
func messagesTurn(role string, content json.RawMessage, add func([]byte)) bool {
	r, _ := json.Marshal(role)
	msg := append([]byte(`{"role":`), r...)
	c := bytes.TrimSpace(content)
	if isString(c) {
		add(append(append(append(msg, `,"content":`...), c...), '}'))
		return true
	}
	blocks, ok := objects(c)
	if !ok || len(c) == 0 || c[0] != '[' {
		return false
	}
	var parts, calls [][]byte
	var reasoning [][]byte
	for _, bl := range blocks {
		typ, _ := str(bl["type"])
		switch typ {
		case "text":
			text := bytes.TrimSpace(bl["text"])
			if isNull(text) || string(text) == `""` {
				continue
			}
			if !isString(text) {
				return false
			}
			parts = append(parts, append(append([]byte(`{"type":"text","text":`), text...), '}'))
		case "thinking":
			th := bytes.TrimSpace(bl["thinking"])
			if isNull(th) {
				continue
			}
			if !isString(th) {
				return false
			}
			reasoning = append(reasoning, th)
		case "redacted_thinking":
		case "tool_use":
			call, ok := toolCall(bl)
			if !ok {
				return false
			}
			calls = append(calls, call)
		case "tool_result":
			if role == "user" {
				tool, ok := toolMessage(bl)
				if !ok {
					return false
				}
				add(tool)
				continue
			}
			text := bytes.TrimSpace(bl["content"])
			if isNull(text) || string(text) == `""` {
				text = []byte(`""`)
			} else if !isString(text) {
				return false // str() of a list is Python's repr
			}
			joined, ok := joinStrings([][]byte{[]byte(`"Tool result: "`), text}, "")
			if !ok {
				return false
			}
			parts = append(parts, append(append([]byte(`{"type":"text","text":`), joined...), '}'))
		default: // images, documents, tool references, what vLLM adds later
			return false
		}
	}
	if len(reasoning) > 0 {
		text, ok := joinStrings(reasoning, "")
		if !ok {
			return false
		}
		msg = append(append(msg, `,"reasoning":`...), text...)
	}
	if len(calls) > 0 {
		msg = append(append(msg, `,"tool_calls":`...), jsonArray(calls)...)
	}
	switch {
	case len(parts) == 1:
		text := parts[0][len(`{"type":"text","text":`) : len(parts[0])-1]
		msg = append(append(msg, `,"content":`...), text...)
	case len(parts) > 1:
		msg = append(append(msg, `,"content":`...), jsonArray(parts)...)
	case role == "user":
		return true // no content: vLLM drops it, tool calls and all
	}
	add(append(msg, '}'))
	return true
}

// toolCall is the chat tool call of a tool_use block, its id and name
// copied as the client wrote them.
func toolCall(bl map[string]json.RawMessage) ([]byte, bool) {
	id := bytes.TrimSpace(bl["id"])
	if s, ok := str(id); !ok || s == "" {
		return nil, false
	}
	name := []byte(`""`) // block.name or ""
	if n := bytes.TrimSpace(bl["name"]); !isNull(n) {
		if !isString(n) {
			return nil, false
		}
		name = n
	}
	args := []byte("{}") // json.dumps(block.input or {})
	if in := bytes.TrimSpace(bl["input"]); !isNull(in) {
		var ok bool
		if in[0] != '{' {
			return nil, false
		}
		if args, ok = pythonDumps(in); !ok {
			return nil, false
		}
	}
	a, _ := json.Marshal(string(args))
	call := append(append([]byte(`{"id":`), id...), `,"type":"function","function":{"name":`...)
	call = append(append(call, name...), `,"arguments":`...)
	return append(append(call, a...), "}}"...), true
}

// toolMessage is the chat tool message of a user's tool_result block.
func toolMessage(bl map[string]json.RawMessage) ([]byte, bool) {
	id := []byte(`""`)
	if v := bytes.TrimSpace(bl["tool_use_id"]); !isNull(v) {
		if !isString(v) {
			return nil, false
		}
		id = v
	}
	text := []byte(`""`)
	c := bytes.TrimSpace(bl["content"])
	if isString(c) {
		text = c
	} else if !isNull(c) {
		items, ok := objects(c)
		if !ok || c[0] != '[' {
			return nil, false // not a list of dicts: vLLM's model refuses it
		}
		var texts [][]byte
		for _, item := range items {
			switch typ, _ := str(item["type"]); typ {
			case "text":
				t, present := item["text"]
				if !present {
					t = []byte(`""`) // item.get("text", "")
				} else if !isString(t) {
					return nil, false // null or not a string: vLLM fails to join it
				}
				t = bytes.TrimSpace(t)
				texts = append(texts, t)
			case "image", "tool_reference":
				return nil, false // they add messages of their own
			}
		}
		if len(texts) > 0 {
			var ok bool
			if text, ok = joinStrings(texts, `\n`); !ok {
				return nil, false
			}
		}
	}
	msg := append([]byte(`{"role":"tool","tool_call_id":`), id...)
	return append(append(append(msg, `,"content":`...), text...), '}'), true
}

// messagesTools converts Anthropic tools to the chat form vLLM renders.
func messagesTools(raw json.RawMessage) ([]byte, bool) {
	tools, ok := objects(raw)
	if !ok {
		return nil, false
	}
	out := make([][]byte, len(tools))
	for i, t := range tools {
		fn := []byte(`{"name":`)
		name := bytes.TrimSpace(t["name"])
		if !isString(name) {
			return nil, false
		}
		fn = append(fn, name...)
		if v := bytes.TrimSpace(t["description"]); len(v) > 0 {
			fn = append(append(fn, `,"description":`...), v...)
		}
		params, ok := inputSchema(t["input_schema"])
		if !ok {
			return nil, false
		}
		fn = append(append(fn, `,"parameters":`...), params...)
		if v := bytes.TrimSpace(t["defer_loading"]); len(v) > 0 {
			fn = append(append(fn, `,"defer_loading":`...), v...)
		}
		out[i] = append(append([]byte(`{"type":"function","function":`), fn...), `}}`...)
	}
	return jsonArray(out), true
}

// inputSchema is a tool's input_schema as vLLM's AnthropicTool validates
// it (vllm/entrypoints/anthropic/protocol.py at 00589e563e77): an object,
// given "type": "object" at its end when it has no "type".
func inputSchema(raw json.RawMessage) ([]byte, bool) {
	raw = bytes.TrimSpace(raw)
	keys, ok := object(raw)
	if !ok || keys == nil {
		return nil, false
	}
	if _, ok := keys["type"]; ok {
		return raw, true
	}
	body := bytes.TrimSpace(raw[1 : len(raw)-1])
	b := append([]byte{'{'}, body...)
	if len(body) > 0 {
		b = append(b, ',')
	}
	return append(b, `"type":"object"}`...), true
}

// jsonArray joins JSON values into an array.
func jsonArray(vals [][]byte) []byte {
	b := []byte{'['}
	for i, v := range vals {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, v...)
	}
	return append(b, ']')
}

// joinStrings joins JSON strings with sep (JSON string text) into one,
// copying each one's text as the client wrote it; false when a part holds
// a surrogate escape.
func joinStrings(parts [][]byte, sep string) ([]byte, bool) {
	if len(parts) == 1 {
		return parts[0], true
	}
	b := []byte{'"'}
	for i, p := range parts {
		if surrogateEscape.Match(p) {
			return nil, false
		}
		if i > 0 {
			b = append(b, sep...)
		}
		b = append(b, p[1:len(p)-1]...)
	}
	return append(b, '"'), true
}

// WithoutBillingHeader returns an Anthropic Messages body with the system
// text blocks vLLM leaves out of the prompt removed (Claude Code's
// x-anthropic-billing-header, whose per-request hash would make every
// request's text unlike the last), and true; or body and false when it
// holds none. Only the top-level system array is rewritten, in place
// within a copy of the body, so the rest stays byte for byte: a balancer
// that reads the conversation's text (the approximate index) then sees
// the prompt the engine caches.
func WithoutBillingHeader(body []byte) ([]byte, bool) {
	if !bytes.Contains(body, []byte(messagesBillingHeader)) {
		return body, false
	}
	d := json.NewDecoder(bytes.NewReader(body))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return body, false
	}
	for d.More() {
		k, err := d.Token()
		if err != nil {
			return body, false
		}
		start := d.InputOffset()
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return body, false
		}
		if k != "system" {
			continue
		}
		end := d.InputOffset()
		var blocks []json.RawMessage
		if json.Unmarshal(v, &blocks) != nil {
			return body, false // a string: nothing to leave out
		}
		kept := blocks[:0]
		for _, bl := range blocks {
			var b struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			}
			if json.Unmarshal(bl, &b) == nil && b.Type == "text" && b.Text != nil && strings.HasPrefix(*b.Text, messagesBillingHeader) {
				continue
			}
			kept = append(kept, bl)
		}
		if len(kept) == len(blocks) {
			return body, false
		}
		// start is just past the key: the value follows a colon and
		// perhaps white space.
		colon := bytes.IndexByte(body[start:end], ':')
		if colon < 0 {
			return body, false
		}
		out := make([]byte, 0, len(body))
		out = append(out, body[:start+int64(colon)+1]...)
		vals := make([][]byte, len(kept))
		for i, bl := range kept {
			vals[i] = bl
		}
		out = append(out, jsonArray(vals)...)
		return append(out, body[end:]...), true
	}
	return body, false
}

// isString reports whether v, a value of an already parsed JSON document,
// is a string: its first byte tells, with no second pass over a long text.
func isString(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 0 && v[0] == '"'
}
