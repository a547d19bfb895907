package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

func TestModelRetrieveIsFilteredByTheKey(t *testing.T) {
	a := newUpstream(t, "a")
	doc := providers(a, newUpstream(t, "b")) + "[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n[[routes]]\nmodel = \"m2\"\ntargets = [{ provider = \"p0\" }]\n" + keys
	_, srv := newTestProxy(t, doc)
	get := func(path, key string) (int, map[string]any) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	if s, b := get("/v1/models/m", "sk-rolter-full-000000000"); s != 200 || b["id"] != "m" || b["object"] != "model" {
		t.Errorf("full key, m: %d %v", s, b)
	}
	for _, tc := range []struct{ path, key string }{
		{"/v1/models/m", "sk-rolter-m2-00000000000"}, // not this key's
		{"/v1/models/nope", "sk-rolter-full-000000000"},
	} {
		s, b := get(tc.path, tc.key)
		if e, _ := b["error"].(map[string]any); s != 404 || e["code"] != "model_not_found" {
			t.Errorf("%s: %d %v, want 404 model_not_found in OpenAI's shape", tc.path, s, b)
		}
	}
	if s, _ := get("/v1/models/m", "sk-rolter-wrong-00000000"); s != 401 {
		t.Errorf("wrong key: %d", s)
	}
}

// Without an anthropic target, count_tokens is counted by the engine's
// /tokenize on the messages, rendered as chat messages.
func TestCountTokensOnTheEngine(t *testing.T) {
	a := newUpstream(t, "a")
	var got map[string]any
	a.handler = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/tokenize" {
			return false
		}
		a.mu.Lock()
		got = a.bodies[len(a.bodies)-1]
		a.mu.Unlock()
		fmt.Fprint(w, `{"count":42,"max_model_len":4096,"tokens":[]}`)
		return true
	}
	_, srv := newTestProxy(t, openAuth+providers(a)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\", model = \"engine-m\" }]\n")
	resp, b := post(t, srv.URL+countTokensPath, "", `{"model":"m","system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`)
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != `{"input_tokens":42}` {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	msgs, _ := got["messages"].([]any)
	if got["model"] != "engine-m" || len(msgs) != 2 || got["add_generation_prompt"] != true {
		t.Errorf("engine got %v", got)
	}
	// An image cannot be counted by a text tokenizer: a clear error, in
	// Anthropic's shape.
	resp, b = post(t, srv.URL+countTokensPath, "", `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`)
	var e anthropicErrorBody
	_ = json.Unmarshal(b, &e)
	if resp.StatusCode != 400 || e.Type != "error" || !strings.Contains(e.Error.Message, "image") {
		t.Errorf("image: %d %s", resp.StatusCode, b)
	}
	resp, b = post(t, srv.URL+countTokensPath, "", `{"model":"nope","messages":[]}`)
	_ = json.Unmarshal(b, &e)
	if resp.StatusCode != 404 || e.Type != "error" || e.Error.Type != "not_found_error" {
		t.Errorf("unknown model: %d %s", resp.StatusCode, b)
	}
}

// With an anthropic target, the request goes there, with the provider's
// key and the target's model.
func TestCountTokensForwardsToAnthropic(t *testing.T) {
	up := newUpstream(t, "anthropic")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != countTokensPath || r.Header.Get("X-Api-Key") != "upstream-secret-0" || r.Header.Get("Anthropic-Version") == "" {
			w.WriteHeader(400)
			return true
		}
		fmt.Fprint(w, `{"input_tokens":7}`)
		return true
	}
	doc := openAuth + strings.Replace(providers(up), "openai_compatible", "anthropic", 1) +
		"[[routes]]\nmodel = \"claude\"\ntargets = [{ provider = \"p0\", model = \"claude-x\" }]\n"
	_, srv := newTestProxy(t, doc)
	resp, b := post(t, srv.URL+countTokensPath, "", `{"model":"claude","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || string(b) != `{"input_tokens":7}` {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if body, _ := up.last(); body["model"] != "claude-x" {
		t.Errorf("upstream got model %v", body["model"])
	}
}

// A tool_result holds text (and media), never tool blocks; one nested in
// another is refused, so that a request is read in one pass however deep it
// nests (a chain of 5,000 tool_results, 170 KB, used to cost seconds of CPU and
// 600 MB, each level decoding all those below it again).
func TestCountTokensRefusesNestedToolBlocks(t *testing.T) {
	a := newUpstream(t, "a")
	a.handler = func(w http.ResponseWriter, r *http.Request) bool {
		fmt.Fprint(w, `{"count":1,"max_model_len":4096,"tokens":[0]}`)
		return true
	}
	_, srv := newTestProxy(t, openAuth+providers(a)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	deep := `"x"`
	for range 4000 {
		deep = `[{"type":"tool_result","content":` + deep + `}]`
	}
	tests := []struct {
		name, content string
		status        int
	}{
		{"text in a tool_result", `[{"type":"tool_result","content":[{"type":"text","text":"r"}]}]`, 200},
		{"string in a tool_result", `[{"type":"tool_result","content":"r"}]`, 200},
		{"tool_result in a tool_result", `[{"type":"tool_result","content":[{"type":"tool_result","content":"r"}]}]`, 400},
		{"tool_use in a tool_result", `[{"type":"tool_result","content":[{"type":"tool_use","name":"f","input":{}}]}]`, 400},
		{"4000 nested tool_results", deep, 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hits := a.hits.Load()
			resp, b := post(t, srv.URL+countTokensPath, "", `{"model":"m","messages":[{"role":"user","content":`+tc.content+`}]}`)
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %s, want %d", resp.StatusCode, b, tc.status)
			}
			if tc.status == 400 {
				var e anthropicErrorBody
				if json.Unmarshal(b, &e) != nil || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, "tool_result") {
					t.Errorf("error body %s", b)
				}
				if a.hits.Load() != hits {
					t.Error("a refused request reached the engine")
				}
			}
		})
	}
}

// count_tokens reads its body as the other endpoints do: the same errors for
// the same bad bodies, in Anthropic's shape, naming no Go type.
func TestCountTokensBadBodies(t *testing.T) {
	a := newUpstream(t, "a")
	_, srv := newTestProxy(t, openAuth+providers(a)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	for _, tc := range []struct{ name, body, code, msg string }{
		{"not JSON", `{"model":`, "invalid_json", "not valid JSON"},
		{"an array", `[{"model":"m"}]`, "invalid_json", "must be a JSON object"},
		{"a string", `"m"`, "invalid_json", "must be a JSON object"},
		{"no model", `{"messages":[]}`, "invalid_request", "must name a model"},
		{"a number for model", `{"model":5,"messages":[]}`, "invalid_request", "must name a model"},
		{"model in two cases", `{"model":"m","MODEL":"x","messages":[]}`, "invalid_request", "model"},
		{"messages not an array", `{"model":"m","messages":{}}`, "invalid_request", "messages"},
		{"a number for a tool's name", `{"model":"m","messages":[],"tools":[{"name":1}]}`, "invalid_request", "tools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := post(t, srv.URL+countTokensPath, "", tc.body)
			var e anthropicErrorBody
			if resp.StatusCode != 400 || resp.Header.Get("X-Rolter-Error") != tc.code || json.Unmarshal(b, &e) != nil || e.Type != "error" ||
				e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.msg) || strings.Contains(e.Error.Message, "proxy.") {
				t.Fatalf("%d %s %s", resp.StatusCode, resp.Header.Get("X-Rolter-Error"), b)
			}
		})
	}
	if a.hits.Load() != 0 {
		t.Fatalf("the engine was called %d times", a.hits.Load())
	}
}

func FuzzCountTokensMessages(f *testing.F) {
	f.Add([]byte(`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"r"}]}]}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image"}]}]}`))
	f.Add([]byte(`{"messages":[{"role":"x","content":3}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"text","text":"r"}]}]}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var req countTokensRequest
		if json.Unmarshal(b, &req) != nil {
			return
		}
		msgs, err := req.chatMessages()
		if err == nil && len(msgs) == 0 {
			t.Fatal("no error and no messages")
		}
	})
}
