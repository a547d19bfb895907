package tokenize

import (
	"bytes"
	"encoding/json"
)

// How vLLM renders a Responses request (github.com/vllm-project/vllm, each
// file as read at the commit named):
//
//   - vllm/entrypoints/openai/responses/serving.py (0001948bc769):
//     OpenAIServingResponses._make_request, for every model but gpt-oss,
//     renders construct_input_messages(...) with the chat template through
//     the same OnlineRenderer.preprocess_chat as a chat completion, with
//     the tools of construct_tool_dicts (None for no tools).
//   - vllm/entrypoints/openai/responses/utils.py (01ca842df5b1):
//     construct_input_messages puts non-empty instructions first as a
//     system message, a string input as a user message, and turns items
//     into messages: a user, system or developer message item is passed on
//     as is; an assistant message becomes {"role":"assistant","content":
//     its first part's text}; function calls, their outputs and reasoning
//     items become tool calls, tool messages and reasoning.
//     should_continue_final_message continues a last message whose status
//     is in_progress or incomplete.
//   - vllm/entrypoints/openai/responses/protocol.py (010a69cea9ac):
//     ResponsesRequest.build_chat_params sets add_generation_prompt (unless
//     continuing), continue_final_message and reasoning_effort (from
//     reasoning.effort) as the template's arguments; build_tok_params
//     leaves add_special_tokens at TokenizeParams' default, true
//     (vllm/renderers/params.py, 1aa021e827032484a7f89194c7e528fc40655204).
//   - vllm/renderers/chat_utils/parse_chat_message_content.py
//     (be90fe165bb8): the template sees text, input_text and output_text
//     parts alike, as {"type":"text","text":...} (or their texts joined
//     with "\n" for string-content templates).
//
// Full commits: 0001948bc76939369ca855c90b36d81256477e85,
// 01ca842df5b1ddd7f91aa376294040d126a453f2,
// 010a69cea9ac46d2953fa673c3b814f922d1b194,
// be90fe165bb89d9edcaebd94ad32cf310bfe9907.

// responsesUnset are the Responses fields that must be absent or null: the
// prompt would depend on state the engine stores (previous_response_id,
// vLLM's previous_response and previous_input_messages, OpenAI's
// conversation), vLLM refuses prompt templates, and the chat-template
// fields are not read by the ResponsesRequest cited above but may be by
// another vLLM release.
var responsesUnset = []string{"previous_response_id", "previous_response", "previous_input_messages",
	"conversation", "prompt", "chat_template", "chat_template_kwargs", "add_generation_prompt",
	"continue_final_message", "add_special_tokens"}

// responsesMessages returns, as a JSON array, the chat messages vLLM
// renders for a Responses body's fields, or false when Build cannot
// reproduce them exactly. Strings are copied as the client wrote them.
func responsesMessages(fields map[string]json.RawMessage) ([]byte, bool) {
	for _, k := range responsesUnset {
		if !isNull(fields[k]) {
			return nil, false
		}
	}
	// Tools are rendered from their chat form ([responsesTools]);
	// truncation "auto" may cut the prompt's start. reasoning.effort
	// reaches the template ([responsesKwargs]).
	if t := fields["truncation"]; !isNull(t) {
		if s, ok := str(t); !ok || s != "disabled" {
			return nil, false
		}
	}
	b := []byte{'['}
	add := func(role string, content []byte) {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(append(append(b, `{"role":"`+role+`","content":`...), content...), '}')
	}
	if ins := bytes.TrimSpace(fields["instructions"]); !isNull(ins) {
		s, ok := str(ins)
		if !ok {
			return nil, false
		}
		if s != "" {
			add("system", ins)
		}
	}
	in := bytes.TrimSpace(fields["input"])
	if _, ok := str(in); ok {
		add("user", in)
		return append(b, ']'), true
	}
	items, ok := objects(in)
	if !ok || len(in) == 0 || in[0] != '[' || len(items) == 0 {
		return nil, false
	}
	for _, it := range items {
		role, content, ok := responsesItem(it)
		if !ok {
			return nil, false
		}
		add(role, content)
	}
	return append(b, ']'), true
}

// functionToolFields are the fields of the openai package's FunctionTool
// (openai-python src/openai/types/responses/function_tool.py at e43b4224),
// in its order, less type. vLLM renders a Responses function tool from that
// model's dump: construct_tool_dicts (responses/utils.py, cited above)
// validates {every field but type} into FunctionDefinition and dumps the
// chat tool, so each field the client left out is there as null, after the
// fields FunctionDefinition declares, in this order. The installed openai
// release decides the set (vLLM pins only openai >= 1.99.1); a fleet with
// another one renders otherwise, which the /tokenize check finds and the
// shape's distrust stops (trust.go).
var functionToolFields = []string{"name", "parameters", "strict", "allowed_callers", "defer_loading", "description", "output_schema"}

// responsesTools returns, as the /tokenize chat form's tools array, the
// tools vLLM renders for a Responses request's tools and tool_choice; nil
// for none. False for what the conversion cannot reproduce: a tool other
// than a function (built-in tools, MCP, custom and namespace tools are
// rendered otherwise or not at all), a function with a field FunctionTool
// does not declare or of another type, and tool_choice "none", which one
// vLLM release renders with the tools and another without
// (exclude_tools_when_tool_choice_none).
func responsesTools(tools, choice json.RawMessage) ([]byte, bool) {
	if isNull(tools) {
		return nil, true
	}
	list, ok := objects(tools)
	if !ok {
		return nil, false
	}
	if len(list) == 0 {
		return nil, true
	}
	if s, _ := str(choice); s == "none" {
		return nil, false
	}
	out := []byte{'['}
	for i, t := range list {
		if typ, _ := str(t["type"]); typ != "function" || !functionTool(t) {
			return nil, false
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"type":"function","function":{`...)
		for j, k := range functionToolFields {
			if j > 0 {
				out = append(out, ',')
			}
			v := bytes.TrimSpace(t[k])
			if len(v) == 0 {
				v = []byte("null")
			}
			out = append(append(append(append(out, '"'), k...), `":`...), v...)
		}
		out = append(out, "}}"...)
	}
	return append(out, ']'), true
}

// functionTool reports whether a function tool's fields are FunctionTool's,
// each of its type (or null where FunctionTool allows it).
func functionTool(t map[string]json.RawMessage) bool {
	if _, ok := str(t["name"]); !ok {
		return false
	}
	for k, v := range t {
		v = bytes.TrimSpace(v)
		null := string(v) == "null"
		switch k {
		case "type", "name":
		case "parameters", "output_schema":
			if !null && v[0] != '{' {
				return false
			}
		case "strict", "defer_loading":
			if !null && string(v) != "true" && string(v) != "false" {
				return false
			}
		case "allowed_callers":
			if !null && v[0] != '[' {
				return false
			}
		case "description":
			if _, ok := str(v); !ok && !null {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// responsesKwargs returns the chat template's keyword arguments of a
// Responses body: reasoning_effort, from reasoning.effort unless null
// (ResponsesRequest.build_chat_params, cited above, which adds no
// enable_thinking), or nil when there is none (the Responses body's own
// chat_template_kwargs are refused, responsesUnset); false when reasoning
// is not an object or its effort not a string.
func responsesKwargs(fields map[string]json.RawMessage) (json.RawMessage, bool) {
	if isNull(fields["reasoning"]) {
		return nil, true
	}
	r, ok := object(fields["reasoning"])
	if !ok {
		return nil, false
	}
	return templateKwargs(nil, nil, r["effort"], false)
}

// responsesItem returns the chat message of one input item: a message
// with text content only and no status but completed (a partial last
// message would be continued, not answered). Any other item is not
// reproduced.
func responsesItem(it map[string]json.RawMessage) (role string, content []byte, ok bool) {
	for k, v := range it {
		switch k {
		case "role", "content", "id":
		case "type":
			if s, ok := str(v); !ok || s != "message" {
				return "", nil, false
			}
		case "status":
			if s, ok := str(v); !ok || s != "completed" {
				return "", nil, false
			}
		default: // e.g. name: the template would see it
			return "", nil, false
		}
	}
	role, _ = str(it["role"])
	c := bytes.TrimSpace(it["content"])
	if _, isStr := str(c); isStr {
		switch role {
		case "user", "system", "developer", "assistant":
			return role, c, true
		}
		return "", nil, false
	}
	parts, ok := objects(c)
	if !ok || len(c) == 0 || c[0] != '[' || len(parts) == 0 {
		return "", nil, false
	}
	switch role {
	case "user", "system", "developer":
		// Passed on as they are: input_text parts, which the template sees
		// as text parts; /tokenize takes the text type.
		out := []byte{'['}
		for i, p := range parts {
			typ, _ := str(p["type"])
			text := bytes.TrimSpace(p["text"])
			if _, ok := str(text); !ok || typ != "input_text" || len(p) != 2 {
				return "", nil, false
			}
			if i > 0 {
				out = append(out, ',')
			}
			out = append(append(append(out, `{"type":"text","text":`...), text...), '}')
		}
		return role, append(out, ']'), true
	case "assistant":
		// Its first part's text, as a string. One part only: releases that
		// passed assistant items on as they are would join several.
		typ, _ := str(parts[0]["type"])
		text := bytes.TrimSpace(parts[0]["text"])
		if _, ok := str(text); !ok || len(parts) != 1 || (typ != "output_text" && typ != "input_text") {
			return "", nil, false
		}
		return role, text, true
	}
	return "", nil, false
}

// isNull reports whether a field is absent or null.
func isNull(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) == 0 || string(v) == "null"
}

// str decodes a JSON string; ok is false for anything else.
func str(v json.RawMessage) (string, bool) {
	v = bytes.TrimSpace(v)
	var s string
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}
