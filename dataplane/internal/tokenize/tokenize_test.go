package tokenize_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"rolter.dev/dataplane/internal/tokenize"
)

func TestBuild(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		want             string // the /tokenize body; "" with ok false
		ids              []uint32
	}{
		{"chat: the template's fields, nothing else", tokenize.PathChatCompletions,
			`{"model":"public","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true,"tools":[{"type":"function"}],"add_generation_prompt":false,"temperature":0}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],"add_generation_prompt":false}`, nil},
		{"chat: text parts", tokenize.PathChatCompletions,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null}],"chat_template_kwargs":{"x":1},"continue_final_message":true,"add_special_tokens":true,"chat_template":"t"}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null}],"chat_template":"t","chat_template_kwargs":{"x":1},"continue_final_message":true,"add_special_tokens":true}`, nil},
		{"chat: a reasoning effort reaches the template with the thinking it implies", tokenize.PathChatCompletions,
			`{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":"low"}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"reasoning_effort":"low","enable_thinking":true}}`, nil},
		{"chat: effort none turns thinking off", tokenize.PathChatCompletions,
			`{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":"none","chat_template_kwargs":{ }}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"reasoning_effort":"none","enable_thinking":false}}`, nil},
		{"chat: the client's enable_thinking stays, its effort is overridden", tokenize.PathChatCompletions,
			`{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false, "reasoning_effort":"high" } ,"reasoning_effort":"low","documents":[{"title":"t","text":"x"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false, "reasoning_effort":"high","documents":[{"title":"t","text":"x"}],"reasoning_effort":"low"}}`, nil},
		{"chat: null effort and documents add nothing", tokenize.PathChatCompletions,
			`{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":null,"documents":null}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil},
		{"chat: an effort that is not a string", tokenize.PathChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":1}`, "", nil},
		{"chat: kwargs that are not an object", tokenize.PathChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":[],"reasoning_effort":"low"}`, "", nil},
		{"chat: an image is not tokenized here", tokenize.PathChatCompletions,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x"}}]}]}`, "", nil},
		{"chat: no messages", tokenize.PathChatCompletions, `{"messages":[]}`, "", nil},
		{"completions: a string", tokenize.PathCompletions, `{"model":"p","prompt":"once","add_special_tokens":false,"n":2}`,
			`{"model":"m","prompt":"once","add_special_tokens":false}`, nil},
		{"completions: token ids need no call", tokenize.PathCompletions, `{"prompt":[1,2,3]}`, "", []uint32{1, 2, 3}},
		{"completions: a batch", tokenize.PathCompletions, `{"prompt":["a","b"]}`, "", nil},
		{"completions: a batch of one string is that prompt", tokenize.PathCompletions, `{"prompt":[ "once" ],"add_special_tokens":true}`,
			`{"model":"m","prompt":"once","add_special_tokens":true}`, nil},
		{"completions: a batch of one token list is those ids", tokenize.PathCompletions, `{"prompt":[[4,5]]}`, "", []uint32{4, 5}},
		{"completions: a batch of two token lists", tokenize.PathCompletions, `{"prompt":[[4],[5]]}`, "", nil},
		{"completions: a batch of one empty list", tokenize.PathCompletions, `{"prompt":[[]]}`, "", nil},
		{"completions: negative ids", tokenize.PathCompletions, `{"prompt":[-1]}`, "", nil},
		{"responses: instructions and a string", tokenize.PathResponses,
			`{"model":"p","instructions":"be brief","input":"hi","max_output_tokens":5,"stream":true,"store":false,"tools":[],"reasoning":{"summary":"auto"},"truncation":"disabled","previous_response_id":null}`,
			`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"add_generation_prompt":true,"add_special_tokens":true}`, nil},
		{"responses: empty instructions add no system message", tokenize.PathResponses, `{"instructions":"","input":"hi"}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true,"add_special_tokens":true}`, nil},
		{"responses: message items", tokenize.PathResponses,
			`{"input":[{"role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},` +
				`{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"c","annotations":[],"logprobs":[]}]},{"role":"user","content":"again"}]}`,
			`{"model":"m","messages":[{"role":"developer","content":"d"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},` +
				`{"role":"assistant","content":"c"},{"role":"user","content":"again"}],"add_generation_prompt":true,"add_special_tokens":true}`, nil},
		{"responses: strings as the client wrote them", tokenize.PathResponses, `{"input":"caf\u00e9 \ud800"}`,
			`{"model":"m","messages":[{"role":"user","content":"caf\u00e9 \ud800"}],"add_generation_prompt":true,"add_special_tokens":true}`, nil},
		{"responses: stored state", tokenize.PathResponses, `{"input":"hi","previous_response_id":"resp_1"}`, "", nil},
		{"responses: a conversation", tokenize.PathResponses, `{"input":"hi","conversation":"conv_1"}`, "", nil},
		// A function tool as vLLM renders it: FunctionTool's fields in
		// its order, those left out null, in the chat form.
		{"responses: function tools", tokenize.PathResponses,
			`{"input":"hi","tool_choice":"auto","tools":[{"type":"function","name":"f"},{"description":"look it up","name":"g","parameters":{"type":"object","properties":{"q":{"type":"string"}}},"strict":true,"type":"function"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[` +
				`{"type":"function","function":{"name":"f","parameters":null,"strict":null,"allowed_callers":null,"defer_loading":null,"description":null,"output_schema":null}},` +
				`{"type":"function","function":{"name":"g","parameters":{"type":"object","properties":{"q":{"type":"string"}}},"strict":true,"allowed_callers":null,"defer_loading":null,"description":"look it up","output_schema":null}}],` +
				`"add_generation_prompt":true,"add_special_tokens":true}`, nil},
		{"chat: truncate_prompt_tokens", tokenize.PathChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"truncate_prompt_tokens":512}`, "", nil},
		{"completions: truncate_prompt_tokens", tokenize.PathCompletions, `{"prompt":[1,2,3],"truncate_prompt_tokens":-1}`, "", nil},
		{"chat: truncate_prompt_tokens null", tokenize.PathChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"truncate_prompt_tokens":null}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil},
		{"responses: no tools", tokenize.PathResponses, `{"input":"hi","tools":[]}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true,"add_special_tokens":true}`, nil},
		{"responses: a built-in tool", tokenize.PathResponses, `{"input":"hi","tools":[{"type":"web_search"}]}`, "", nil},
		{"responses: a function with a field FunctionTool lacks", tokenize.PathResponses, `{"input":"hi","tools":[{"type":"function","name":"f","x":1}]}`, "", nil},
		{"responses: a function's strict not a boolean", tokenize.PathResponses, `{"input":"hi","tools":[{"type":"function","name":"f","strict":"yes"}]}`, "", nil},
		{"responses: tools with tool_choice none", tokenize.PathResponses, `{"input":"hi","tool_choice":"none","tools":[{"type":"function","name":"f"}]}`, "", nil},
		{"responses: a reasoning effort reaches the template, with no thinking flag", tokenize.PathResponses, `{"input":"hi","reasoning":{"effort":"low","summary":null}}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"reasoning_effort":"low"},"add_generation_prompt":true,"add_special_tokens":true}`, nil},
		{"responses: reasoning not an object", tokenize.PathResponses, `{"input":"hi","reasoning":"low"}`, "", nil},
		{"responses: truncation auto", tokenize.PathResponses, `{"input":"hi","truncation":"auto"}`, "", nil},
		{"responses: template kwargs", tokenize.PathResponses, `{"input":"hi","chat_template_kwargs":{"x":1}}`, "", nil},
		{"responses: a function call", tokenize.PathResponses,
			`{"input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}`, "", nil},
		{"responses: a function call output", tokenize.PathResponses, `{"input":[{"type":"function_call_output","call_id":"c","output":"x"}]}`, "", nil},
		{"responses: a reasoning item", tokenize.PathResponses,
			`{"input":[{"type":"reasoning","id":"r","summary":[],"content":[{"type":"reasoning_text","text":"t"}]},{"role":"user","content":"hi"}]}`, "", nil},
		{"responses: an image", tokenize.PathResponses,
			`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"http://x"}]}]}`, "", nil},
		{"responses: a file", tokenize.PathResponses, `{"input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`, "", nil},
		{"responses: a chat text part", tokenize.PathResponses, `{"input":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`, "", nil},
		{"responses: a part with more fields", tokenize.PathResponses, `{"input":[{"role":"user","content":[{"type":"input_text","text":"a","x":1}]}]}`, "", nil},
		{"responses: an assistant message of two parts", tokenize.PathResponses,
			`{"input":[{"role":"assistant","content":[{"type":"output_text","text":"a"},{"type":"output_text","text":"b"}]}]}`, "", nil},
		{"responses: a refusal", tokenize.PathResponses, `{"input":[{"role":"assistant","content":[{"type":"refusal","refusal":"no"}]}]}`, "", nil},
		{"responses: a partial message is continued", tokenize.PathResponses,
			`{"input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","status":"incomplete","content":"Once"}]}`, "", nil},
		{"responses: a named message", tokenize.PathResponses, `{"input":[{"role":"user","name":"bob","content":"hi"}]}`, "", nil},
		{"responses: a tool message", tokenize.PathResponses, `{"input":[{"role":"tool","content":"x"}]}`, "", nil},
		{"responses: no input items", tokenize.PathResponses, `{"instructions":"be brief","input":[]}`, "", nil},
		{"responses: no input", tokenize.PathResponses, `{"instructions":"be brief"}`, "", nil},
		{"responses: instructions not a string", tokenize.PathResponses, `{"instructions":1,"input":"hi"}`, "", nil},
		{"a salted chat", tokenize.PathChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"cache_salt":"tenant-a"}`, "", nil},
		{"salted token ids", tokenize.PathCompletions, `{"prompt":[1,2],"cache_salt":"tenant-a"}`, "", nil},
		{"a null salt is none", tokenize.PathCompletions, `{"prompt":[1,2],"cache_salt":null}`, "", []uint32{1, 2}},
		{"another endpoint", "/v1/embeddings", `{"input":"hi"}`, "", nil},
		{"not JSON", tokenize.PathChatCompletions, `{`, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, ids, _, ok := tokenize.Build(tc.path, []byte(tc.body), "m")
			if ok != (tc.want != "" || tc.ids != nil) || string(tok) != tc.want || !slices.Equal(ids, tc.ids) {
				t.Fatalf("Build = %s, %v, %v; want %s, %v", tok, ids, ok, tc.want, tc.ids)
			}
			if tok != nil && !json.Valid(tok) {
				t.Fatalf("invalid JSON %s", tok)
			}
		})
	}
}

// FuzzBuild: Build reads a client's body, so any body gives a /tokenize
// body, ids or nothing, never a panic; a /tokenize body is a JSON object
// holding the engine's model and only fields copied unchanged from the
// client's body, or for a Responses body the conversation checked by
// checkResponses.
func FuzzBuild(f *testing.F) {
	f.Add(uint8(0), []byte(`{"model":"public","messages":[{"role":"user","content":"hi"}],"tools":[],"add_generation_prompt":false}`))
	f.Add(uint8(0), []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`))
	f.Add(uint8(0), []byte(`{"messages":[{"content":"\ud800"}],"messages":[]}`))
	f.Add(uint8(1), []byte(`{"prompt":"once","add_special_tokens":false}`))
	f.Add(uint8(1), []byte(`{"prompt":[1,2,4294967296]}`))
	f.Add(uint8(1), []byte(`{"prompt":[[1],[2]]}`))
	f.Add(uint8(1), []byte(`{"prompt":["one"],"add_special_tokens":null}`))
	f.Add(uint8(0), []byte(`{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":null},"reasoning_effort":"none","documents":[]}`))
	f.Add(uint8(2), []byte(`{"instructions":"be brief","input":"hi","tools":[],"reasoning":{"effort":null}}`))
	f.Add(uint8(2), []byte(`{"input":"hi","reasoning":{"effort":"high"}}`))
	f.Add(uint8(3), []byte(`{"messages":[{"role":"user","content":"hi"}],"output_config":{"effort":"max"},"chat_template_kwargs":{"x":1}}`))
	f.Add(uint8(2), []byte(`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"b"}]}]}`))
	f.Add(uint8(2), []byte(`{"input":[{"role":"user","content":"hi"},{"type":"function_call","name":"f","arguments":"{}"}],"previous_response_id":"r"}`))
	f.Add(uint8(3), []byte(`{"system":[{"type":"text","text":"a"}],"messages":[{"role":"user","content":[{"type":"text","text":"b"},{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"c"}]}]}]}`))
	f.Add(uint8(3), []byte(`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"tool_use","id":"i","name":"f","input":{"a":[1,{"b":"\u00e9"}]}}]}],"tools":[{"name":"f","input_schema":{}}]}`))
	f.Fuzz(func(t *testing.T, sel uint8, body []byte) {
		path := []string{tokenize.PathChatCompletions, tokenize.PathCompletions, tokenize.PathResponses, tokenize.PathMessages}[sel%4]
		tok, ids, _, ok := tokenize.Build(path, body, "engine-model")
		if !ok {
			if tok != nil || ids != nil {
				t.Fatalf("not ok, yet %s %v", tok, ids)
			}
			return
		}
		if (tok == nil) == (ids == nil) {
			t.Fatalf("ok with tok %s and ids %v", tok, ids)
		}
		if tok == nil {
			return
		}
		var got, in map[string]json.RawMessage
		if err := json.Unmarshal(tok, &got); err != nil {
			t.Fatalf("tokenize body %s: %v", tok, err)
		}
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatalf("accepted a body that is not a JSON object: %v", err)
		}
		if string(got["model"]) != `"engine-model"` {
			t.Fatalf("model %s", got["model"])
		}
		switch path {
		case tokenize.PathResponses:
			checkResponses(t, got, in, body)
			return
		case tokenize.PathMessages:
			checkMessages(t, got, in)
			return
		}
		if path == tokenize.PathChatCompletions {
			checkKwargs(t, got, in["chat_template_kwargs"], in["documents"], in["reasoning_effort"], true)
		}
		for k, v := range got {
			if k == "chat_template_kwargs" && path == tokenize.PathChatCompletions {
				continue // checked above
			}
			sent := in[k]
			var one []json.RawMessage
			if k == "prompt" && json.Unmarshal(sent, &one) == nil && len(one) == 1 {
				sent = bytes.TrimSpace(one[0]) // a batch of one
			}
			if k != "model" && string(sent) != string(v) {
				t.Fatalf("%s: %s, the client sent %s", k, v, in[k])
			}
		}
	})
}

// checkMessages checks the /tokenize body Build made of an Anthropic
// Messages body: chat messages of the roles vLLM's conversion makes, the
// chat completion's defaults, and only the template's kwargs copied.
func checkMessages(t *testing.T, got, in map[string]json.RawMessage) {
	t.Helper()
	if string(got["add_generation_prompt"]) != "true" || string(got["add_special_tokens"]) != "false" {
		t.Fatalf("tokenize body %v", got)
	}
	var oc struct{ Effort json.RawMessage }
	_ = json.Unmarshal(in["output_config"], &oc)
	checkKwargs(t, got, in["chat_template_kwargs"], nil, oc.Effort, true)
	var msgs []struct {
		Role string `json:"role"`
	}
	if err := json.Unmarshal(got["messages"], &msgs); err != nil {
		t.Fatalf("messages %s: %v", got["messages"], err)
	}
	for i, m := range msgs {
		if !slices.Contains([]string{"system", "user", "assistant", "tool"}, m.Role) || (m.Role == "system" && i > 0) {
			t.Fatalf("message %d: role %q", i, m.Role)
		}
	}
	if tools, ok := got["tools"]; ok {
		var fns []struct {
			Type     string                     `json:"type"`
			Function map[string]json.RawMessage `json:"function"`
		}
		if err := json.Unmarshal(tools, &fns); err != nil {
			t.Fatalf("tools %s: %v", tools, err)
		}
		for _, f := range fns {
			var params map[string]json.RawMessage
			if f.Type != "function" || json.Unmarshal(f.Function["parameters"], &params) != nil || params["type"] == nil {
				t.Fatalf("tool %v", f)
			}
		}
	}
}

// checkResponses checks the /tokenize body Build made of a Responses body:
// a body with no stored state, a non-empty conversation of known roles
// whose every text is a JSON string copied from the client's body, the
// generation prompt on and special tokens added, as vLLM renders it.
func checkResponses(t *testing.T, got, in map[string]json.RawMessage, body []byte) {
	t.Helper()
	if p := in["previous_response_id"]; p != nil && string(p) != "null" {
		t.Fatalf("tokenized with previous_response_id %s", p)
	}
	var r struct{ Effort json.RawMessage }
	_ = json.Unmarshal(in["reasoning"], &r)
	checkKwargs(t, got, nil, nil, r.Effort, false)
	if len(got) != 4+len(got["chat_template_kwargs"][:min(len(got["chat_template_kwargs"]), 1)]) ||
		string(got["add_generation_prompt"]) != "true" || string(got["add_special_tokens"]) != "true" {
		t.Fatalf("tokenize body %v", got)
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(got["messages"], &msgs); err != nil || len(msgs) == 0 {
		t.Fatalf("messages %s: %v", got["messages"], err)
	}
	copied := func(s json.RawMessage) {
		var v string
		if json.Unmarshal(s, &v) != nil || !bytes.Contains(body, s) {
			t.Fatalf("text %s is not a string of the client's body", s)
		}
	}
	for _, m := range msgs {
		if !slices.Contains([]string{"system", "developer", "user", "assistant"}, m.Role) {
			t.Fatalf("role %q", m.Role)
		}
		if len(m.Content) > 0 && m.Content[0] == '"' {
			copied(m.Content)
			continue
		}
		var parts []map[string]json.RawMessage
		if err := json.Unmarshal(m.Content, &parts); err != nil || len(parts) == 0 || m.Role == "assistant" {
			t.Fatalf("%s content %s", m.Role, m.Content)
		}
		for _, p := range parts {
			if len(p) != 2 || string(p["type"]) != `"text"` {
				t.Fatalf("part %v", p)
			}
			copied(p["text"])
		}
	}
}

// checkKwargs checks a /tokenize body's chat_template_kwargs against the
// merge vLLM's chat completion makes of the client's user kwargs, its
// documents and reasoning effort, and, with thinking, enable_thinking
// unless the client set it: the same keys with the same values, or no
// kwargs where there is nothing to pass.
func checkKwargs(t *testing.T, got map[string]json.RawMessage, user, documents, effort json.RawMessage, thinking bool) {
	t.Helper()
	null := func(v json.RawMessage) bool { v = bytes.TrimSpace(v); return len(v) == 0 || string(v) == "null" }
	var want map[string]json.RawMessage
	if !null(user) {
		if err := json.Unmarshal(user, &want); err != nil {
			t.Fatalf("tokenized with chat_template_kwargs %s: %v", user, err)
		}
	}
	_, set := want["enable_thinking"]
	if !null(documents) || !null(effort) {
		if want == nil {
			want = map[string]json.RawMessage{}
		}
	}
	if !null(documents) {
		want["documents"] = documents
	}
	if !null(effort) {
		var e string
		if err := json.Unmarshal(effort, &e); err != nil {
			t.Fatalf("tokenized with effort %s: %v", effort, err)
		}
		want["reasoning_effort"] = effort
		if thinking && !set {
			want["enable_thinking"] = json.RawMessage(fmt.Sprint(e != "none"))
		}
	}
	k, ok := got["chat_template_kwargs"]
	if ok != (want != nil) {
		t.Fatalf("chat_template_kwargs %s, want %s", k, want)
	}
	var have map[string]json.RawMessage
	if ok && json.Unmarshal(k, &have) != nil {
		t.Fatalf("chat_template_kwargs %s: not an object", k)
	}
	compact := func(v json.RawMessage) string {
		var b bytes.Buffer
		if err := json.Compact(&b, v); err != nil {
			t.Fatalf("value %s: %v", v, err)
		}
		return b.String()
	}
	if len(have) != len(want) {
		t.Fatalf("chat_template_kwargs %s, want %s", k, want)
	}
	for key, v := range want {
		if h, ok := have[key]; !ok || compact(h) != compact(v) {
			t.Fatalf("chat_template_kwargs %s: %s is %s, want %s", k, key, h, v)
		}
	}
}

func TestCacheSalt(t *testing.T) {
	for body, want := range map[string]string{
		`{"cache_salt":"tenant-a","messages":[]}`:       "tenant-a",
		`{"messages":[{"content":""cache_salt":"x""}]}`: "",
		`{"cache_salt":null}`:                           "",
		`{"cache_salt":1}`:                              "",
		`{"cache_salt":"a","cache_salt":"b"}`:           "b",
		`{"cache_salt":"café"}`:                         "café",
		`[]`:                                            "",
	} {
		if got := tokenize.CacheSalt([]byte(body)); got != want {
			t.Errorf("CacheSalt(%s) = %q, want %q", body, got, want)
		}
	}
}

// TestReadsNoCache: the requests vLLM prefills whole, reading nothing from
// its prefix cache: those asking for prompt log probabilities, by
// prompt_logprobs or by echo (chat: top_logprobs, 0 when absent;
// completions: logprobs, none when absent).
func TestReadsNoCache(t *testing.T) {
	const chat, completions = tokenize.PathChatCompletions, tokenize.PathCompletions
	for _, tc := range []struct {
		path, body string
		want       bool
	}{
		{chat, `{"messages":[{"role":"user","content":"the echo and prompt_logprobs words"}]}`, false},
		{chat, `{"messages":[],"prompt_logprobs":0}`, true},
		{chat, `{"messages":[],"prompt_logprobs":null}`, false},
		{chat, `{"messages":[],"echo":true}`, true},
		{chat, `{"messages":[],"echo":true,"top_logprobs":null}`, false},
		{chat, `{"messages":[],"echo":false,"top_logprobs":5}`, false},
		{completions, `{"prompt":"a","echo":true,"logprobs":1,"max_tokens":0}`, true},
		{completions, `{"prompt":"a","echo":true}`, false},
		{completions, `{"prompt":"a","echo":true,"logprobs":null}`, false},
		{completions, `{"prompt":"a","prompt_logprobs":2}`, true},
		{tokenize.PathResponses, `{"input":"a","prompt_logprobs":2}`, false},
		{chat, `[1]`, false},
	} {
		if got := tokenize.ReadsNoCache(tc.path, []byte(tc.body)); got != tc.want {
			t.Errorf("ReadsNoCache(%s, %s) = %v, want %v", tc.path, tc.body, got, tc.want)
		}
	}
}

func TestDecode(t *testing.T) {
	ids, err := tokenize.Decode([]byte(`{"count":3,"max_model_len":32768,"tokens":[5,0,4294967295],"token_strs":null}`))
	if err != nil || !slices.Equal(ids, []uint32{5, 0, 4294967295}) {
		t.Fatalf("Decode = %v, %v", ids, err)
	}
	if ids, err := tokenize.Decode([]byte(`{"count":0,"tokens":[]}`)); err != nil || len(ids) != 0 {
		t.Fatalf("empty: %v, %v", ids, err)
	}
	for _, bad := range []string{`{"count":2,"tokens":[1]}`, `{"tokens":[1]}`, `{"count":1}`, `{"count":1,"tokens":[-1]}`,
		`{"count":1,"tokens":[4294967296]}`, `{"count":1,"tokens":[1.5]}`, `[1]`, `{"object":"error","message":"x"}`, ``} {
		if _, err := tokenize.Decode([]byte(bad)); !errors.Is(err, tokenize.ErrResponse) {
			t.Errorf("%s: err %v, want ErrResponse", bad, err)
		}
	}
}

// FuzzDecode: any answer gives ids or ErrResponse, never a panic; ids come
// back only when the answer counts them.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"count":3,"max_model_len":32768,"tokens":[5,0,4294967295],"token_strs":null}`))
	f.Add([]byte(`{"count":1,"tokens":[1],"token_strs":["a"]}`))
	f.Add([]byte(`{"count":1,"tokens":[-1]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, err := tokenize.Decode(b)
		if err != nil {
			if !errors.Is(err, tokenize.ErrResponse) {
				t.Fatalf("error %v is not ErrResponse", err)
			}
			return
		}
		var r struct {
			Count int `json:"count"`
		}
		if json.Unmarshal(b, &r) != nil || r.Count != len(ids) {
			t.Fatalf("%d ids from %q", len(ids), b)
		}
	})
}

func TestEndpoint(t *testing.T) {
	for base, want := range map[string]string{
		"http://h:8000/v1": "http://h:8000/tokenize", "http://h:8000/v1/": "http://h:8000/tokenize",
		"http://h:8000": "http://h:8000/tokenize", "http://h/p/v1": "http://h/p/tokenize",
	} {
		if got := tokenize.Endpoint(base); got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", base, got, want)
		}
	}
}

// TestClient: the engine's answer is decoded and cached by body; a failing
// or slow engine is an error, never ids; the cache stays within
// CacheTokens.
func TestClient(t *testing.T) {
	var calls atomic.Int64
	var delay atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path != "/tokenize" || r.Header.Get("Authorization") != "Bearer k" {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		if d := delay.Load(); d > 0 {
			select {
			case <-time.After(time.Duration(d)):
			case <-release:
				return
			}
		}
		var req struct {
			Prompt string `json:"prompt"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Prompt == "fail" {
			http.Error(w, `{"object":"error"}`, http.StatusBadRequest)
			return
		}
		n := len(strings.Fields(req.Prompt))
		toks := make([]int, n)
		for i := range toks {
			toks[i] = i + 1
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"count": n, "max_model_len": 100, "tokens": toks, "token_strs": nil})
	}))
	defer srv.Close()
	defer close(release)
	c := tokenize.New(srv.Client())
	ctx := context.Background()
	body := []byte(`{"model":"m","prompt":"a b c"}`)
	if _, ok := c.Cached(body); ok {
		t.Fatal("cached before any call")
	}
	ids, err := c.Tokenize(ctx, srv.URL+"/v1", "k", body)
	if err != nil || !slices.Equal(ids, []uint32{1, 2, 3}) {
		t.Fatalf("Tokenize = %v, %v", ids, err)
	}
	if got, ok := c.Cached(body); !ok || !slices.Equal(got, ids) {
		t.Fatalf("Cached = %v, %v", got, ok)
	}
	if _, ok := c.Cached([]byte(`{"model":"other","prompt":"a b c"}`)); ok {
		t.Fatal("another model hit the cache")
	}
	if _, err := c.Tokenize(ctx, srv.URL, "k", []byte(`{"model":"m","prompt":"fail"}`)); !errors.Is(err, tokenize.ErrRejected) || errors.Is(err, tokenize.ErrUnavailable) {
		t.Fatalf("a 400: %v, want ErrRejected only", err)
	}
	if _, err := c.Tokenize(ctx, srv.URL, "wrong", body); err == nil {
		t.Fatal("a 404 gave ids")
	}
	delay.Store(int64(time.Minute))
	tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := c.Tokenize(tctx, srv.URL, "k", []byte(`{"model":"m","prompt":"slow"}`)); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, tokenize.ErrUnavailable) {
		t.Fatalf("slow engine: %v, want a deadline error, unavailable", err)
	}
	delay.Store(0)
	// Bounded (here at 64 token ids and two answers' bookkeeping): answers
	// of 20–25 tokens, the oldest go first; an answer larger than the bound
	// is not kept.
	small := tokenize.NewLimited(srv.Client(), 64+2*tokenize.EntryOverhead)
	if _, err := small.Tokenize(ctx, srv.URL, "k", body); err != nil {
		t.Fatal(err)
	}
	words := strings.Repeat("w ", 20)
	for i := range 6 {
		b, _ := json.Marshal(map[string]string{"model": "m", "prompt": words + strings.Repeat("x ", i)})
		if _, err := small.Tokenize(ctx, srv.URL, "k", b); err != nil {
			t.Fatal(err)
		}
	}
	if n, toks := small.Len(); n != 2 || toks != 24+25 {
		t.Fatalf("cache holds %d answers, %d tokens (bound 64: want the newest two, 49 tokens)", n, toks)
	}
	if _, ok := small.Cached(body); ok {
		t.Fatal("the oldest answer survived")
	}
	huge := []byte(`{"model":"m","prompt":"` + strings.Repeat("w ", 65+2*tokenize.EntryOverhead) + `"}`)
	if _, err := small.Tokenize(ctx, srv.URL, "k", huge); err != nil {
		t.Fatal(err)
	}
	if _, ok := small.Cached(huge); ok {
		t.Fatal("an answer larger than the whole cache was kept")
	}
}

// TestClientEmptyAnswer: an answer with no token ids ({"count":0,
// "tokens":[]}, as the test engine gives a blank prompt) is ErrNoTokens,
// never ids, and is not cached: a flood of such answers, each for another
// body, leaves the cache as it was instead of growing it past its bound
// (the bound counts token ids, which these have none of).
func TestClientEmptyAnswer(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.WriteString(w, `{"count":0,"max_model_len":100,"tokens":[],"token_strs":null}`)
	}))
	defer srv.Close()
	c := tokenize.NewLimited(srv.Client(), 64)
	const flood = 1000
	var bad error
	for i := range flood {
		body := []byte(fmt.Sprintf(`{"model":"m","prompt":" ","n":%d}`, i))
		ids, err := c.Tokenize(t.Context(), srv.URL, "", body)
		if _, ok := c.Cached(body); (ok || ids != nil || !errors.Is(err, tokenize.ErrNoTokens)) && bad == nil {
			bad = fmt.Errorf("answer %d: ids %v, error %v, cached %v; want ErrNoTokens, no ids, not cached", i, ids, err, ok)
		}
	}
	if n, toks := c.Len(); n != 0 || toks != 0 {
		t.Errorf("the cache holds %d answers (%d token ids) after %d empty ones, want none", n, toks, flood)
	}
	if bad != nil {
		t.Fatal(bad)
	}
	// The same body again asks the engine again.
	if _, err := c.Tokenize(t.Context(), srv.URL, "", []byte(`{"model":"m","prompt":" ","n":0}`)); !errors.Is(err, tokenize.ErrNoTokens) {
		t.Fatal(err)
	}
	if n := calls.Load(); n != flood+1 {
		t.Fatalf("the engine was asked %d times, want %d", n, flood+1)
	}
}

// TestClientShortAnswersBounded: the bound charges each answer its
// bookkeeping as well as its ids, so a flood of one-token answers holds at
// most limit / (1 + EntryOverhead) of them, not limit.
func TestClientShortAnswersBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"count":1,"max_model_len":100,"tokens":[7],"token_strs":null}`)
	}))
	defer srv.Close()
	const limit = 1000
	c := tokenize.NewLimited(srv.Client(), limit)
	for i := range 2 * limit {
		body := []byte(fmt.Sprintf(`{"model":"m","prompt":"x","n":%d}`, i))
		if _, err := c.Tokenize(t.Context(), srv.URL, "", body); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := c.Len(); n != limit/(1+tokenize.EntryOverhead) {
		t.Fatalf("the cache holds %d one-token answers under a bound of %d, want %d", n, limit, limit/(1+tokenize.EntryOverhead))
	}
}

// TestClientUnavailable: a 5xx and a refused connection are ErrUnavailable
// (the replica may not be serving), unlike a malformed answer.
func TestClientUnavailable(t *testing.T) {
	var status atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s := status.Load(); s != 0 {
			w.WriteHeader(int(s))
			return
		}
		_, _ = io.WriteString(w, `{"count":1,"tokens":"x"}`)
	}))
	c := tokenize.New(srv.Client())
	body := []byte(`{"model":"m","prompt":"a"}`)
	if _, err := c.Tokenize(context.Background(), srv.URL, "", body); err == nil || errors.Is(err, tokenize.ErrUnavailable) {
		t.Fatalf("a malformed answer: %v, want an error, not unavailable", err)
	}
	for _, s := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusRequestTimeout} {
		status.Store(int64(s))
		if _, err := c.Tokenize(context.Background(), srv.URL, "", body); !errors.Is(err, tokenize.ErrUnavailable) {
			t.Fatalf("status %d: %v, want unavailable", s, err)
		}
	}
	srv.Close()
	if _, err := c.Tokenize(context.Background(), srv.URL, "", body); !errors.Is(err, tokenize.ErrUnavailable) {
		t.Fatalf("connection refused: %v, want unavailable", err)
	}
}

// TestPark: a parked endpoint stays parked until its time, whatever form
// of its api_base names it, and a later Park never shortens it.
func TestPark(t *testing.T) {
	c := tokenize.New(http.DefaultClient)
	t0 := time.Unix(1000, 0)
	if c.Parked("http://a:8000/v1", t0) {
		t.Fatal("parked before any Park")
	}
	c.Park("http://a:8000/v1", t0.Add(5*time.Second))
	c.Park("http://a:8000", t0.Add(time.Second))
	for _, tc := range []struct {
		base string
		at   time.Duration
		want bool
	}{
		{"http://a:8000", 0, true},
		{"http://a:8000/v1/", 4 * time.Second, true},
		{"http://b:8000/v1", 0, false},
		{"http://a:8000/v1", 5 * time.Second, false},
		{"http://a:8000/v1", 0, false}, // forgotten once expired
	} {
		if got := c.Parked(tc.base, t0.Add(tc.at)); got != tc.want {
			t.Errorf("Parked(%s, +%v) = %v, want %v", tc.base, tc.at, got, tc.want)
		}
	}
}
