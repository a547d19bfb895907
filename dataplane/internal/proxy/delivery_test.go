package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"rolter.dev/pkg/config"
)

// chatUpstream answers every chat request with the same completion and
// counts the calls.
func chatUpstream(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"upstream says hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// pluginServer answers post_response plugin calls by path: /block,
// /transform, /allow.
func pluginServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/block":
			fmt.Fprint(w, `{"action":"block","reason":"policy says no"}`)
		case "/transform":
			fmt.Fprint(w, `{"action":"transform","body":{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"transformed"},"finish_reason":"stop"}]}}`)
		default:
			fmt.Fprint(w, `{"action":"allow"}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func deliveryConfig(up, embed, plugin, mode string, cache bool) string {
	doc := openAuth + fmt.Sprintf(`
[cache]
enabled = true
[[providers]]
name = "up"
kind = "openai_compatible"
api_base = %q
[[providers]]
name = "emb"
kind = "openai"
api_base = %q
[[routes]]
model = "m"
targets = [{ provider = "up" }]
`, up, embed)
	if cache {
		doc += "[routes.cache]\nttl_secs = 600\n[routes.cache.semantic]\nprovider = \"emb\"\nmodel = \"e\"\nthreshold = 0.9\n"
	}
	if plugin != "" {
		doc += fmt.Sprintf("[[plugins]]\nname = \"p\"\nurl = %q\nstage = \"post_response\"\ntimeout_ms = 500\nfailure_mode = %q\n", plugin, mode)
	}
	return doc
}

func applyDoc(tb testing.TB, p *Proxy, doc string) {
	tb.Helper()
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		tb.Fatal(err)
	}
	snap, err := config.Compile(cfg, config.CompileOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.Apply(snap); err != nil {
		tb.Fatal(err)
	}
}

// TestDeliveryPolicyOnEveryPath: enabling the cache never changes which
// policy a response passes through. Each plugin behaviour is checked on the
// uncached path, the first (cacheable) miss, an exact hit and a semantic hit,
// and the upstream is called once per cacheable request.
func TestDeliveryPolicyOnEveryPath(t *testing.T) {
	embed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"data":[{"embedding":[1,0,0],"index":0}]}`)
	}))
	t.Cleanup(embed.Close)
	plugins := pluginServer(t)
	// A plugin that cannot be reached: every connection is dropped before
	// an answer. A closed server would do, but its port could be handed to
	// the next test server (a subtest's upstream), and then the plugin
	// calls reached it instead.
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(down.Close)

	type want struct {
		status  int
		code    string // error code, or "" for a 200
		content string
	}
	tests := []struct {
		name   string
		plugin string
		mode   string
		want   want
	}{
		{"no plugin", "", "", want{200, "", "upstream says hi"}},
		{"blocking plugin", plugins.URL + "/block", "fail_open", want{403, "plugin_blocked", ""}},
		{"transforming plugin", plugins.URL + "/transform", "fail_open", want{200, "", "transformed"}},
		{"unreachable fail_open plugin", down.URL, "fail_open", want{200, "", "upstream says hi"}},
		{"unreachable fail_closed plugin", down.URL, "fail_closed", want{502, "plugin_unavailable", ""}},
	}
	paths := []struct {
		name     string
		cache    bool
		question string
		wantHit  string // x-rolter-cache
		calls    int32  // upstream calls this request adds
	}{
		{"cache off", false, "What is the capital of France?", "", 1},
		{"first miss", true, "What is the capital of France?", "MISS", 1},
		{"exact hit", true, "What is the capital of France?", "HIT", 0},
		{"semantic hit", true, "Tell me the capital city of France.", "HIT", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			upstream, calls := chatUpstream(t)
			p := New(Options{})
			srv := newServer(t, p)
			for _, path := range paths {
				applyDoc(t, p, deliveryConfig(upstream.URL, embed.URL, tc.plugin, tc.mode, path.cache))
				before := calls.Load()
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, path.question)
				resp, b := post(t, srv+"/v1/chat/completions", "", body)
				if got := calls.Load() - before; got != path.calls {
					t.Errorf("%s: %d upstream calls, want %d", path.name, got, path.calls)
				}
				if path.wantHit != "" && resp.Header.Get("X-Rolter-Cache") != path.wantHit {
					t.Errorf("%s: x-rolter-cache %q, want %q", path.name, resp.Header.Get("X-Rolter-Cache"), path.wantHit)
				}
				if resp.StatusCode != tc.want.status {
					t.Fatalf("%s: status %d, want %d: %s", path.name, resp.StatusCode, tc.want.status, b)
				}
				if tc.want.code != "" {
					var e openAIErrorBody
					if json.Unmarshal(b, &e) != nil || e.Error.Code != tc.want.code {
						t.Fatalf("%s: error %s, want code %s", path.name, b, tc.want.code)
					}
					continue
				}
				if !strings.Contains(string(b), tc.want.content) {
					t.Fatalf("%s: body %s, want content %q", path.name, b, tc.want.content)
				}
			}
		})
	}

	t.Run("a reload installs a plugin over existing entries", func(t *testing.T) {
		upstream, calls := chatUpstream(t)
		p := New(Options{})
		srv := newServer(t, p)
		body := `{"model":"m","messages":[{"role":"user","content":"cached before the plugin"}]}`
		applyDoc(t, p, deliveryConfig(upstream.URL, embed.URL, "", "", true))
		if resp, _ := post(t, srv+"/v1/chat/completions", "", body); resp.StatusCode != 200 {
			t.Fatalf("before: %d", resp.StatusCode)
		}
		applyDoc(t, p, deliveryConfig(upstream.URL, embed.URL, plugins.URL+"/block", "fail_open", true))
		resp, b := post(t, srv+"/v1/chat/completions", "", body)
		if resp.StatusCode != 403 || resp.Header.Get("X-Rolter-Cache") != "HIT" || calls.Load() != 1 {
			t.Fatalf("after the reload: %d %q calls=%d: %s", resp.StatusCode, resp.Header.Get("X-Rolter-Cache"), calls.Load(), b)
		}
	})
}

// TestPIIRestorationIsNeverStored: the request leg replaces an email with a
// placeholder, the upstream answers with the placeholder, and the response
// leg restores it for the request being answered. The cache keeps the
// upstream's own (placeholder) bytes: a later hit without restoration rights
// shows the placeholder, never the restored address.
func TestPIIRestorationIsNeverStored(t *testing.T) {
	const secret, placeholder = "alice@example.com", "<EMAIL_1>"
	var upstreamSaw atomic.Value
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		upstreamSaw.Store(req.Messages[0].Content)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"I will write to %s"},"finish_reason":"stop"}]}`, placeholder)
	}))
	t.Cleanup(upstream.Close)
	pii := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/sanitize":
			var in struct {
				Direction string   `json:"direction"`
				Content   []string `json:"content"`
			}
			_ = json.NewDecoder(r.Body).Decode(&in)
			out := make([]string, len(in.Content))
			for i, c := range in.Content {
				out[i] = strings.ReplaceAll(c, secret, placeholder)
			}
			reply := map[string]any{"content": out, "findings": []any{}}
			if in.Direction == "request" {
				reply["restoration_token"] = "ticket-1"
			}
			_ = json.NewEncoder(w).Encode(reply)
		case "/restore":
			var in struct {
				Token   string   `json:"restoration_token"`
				Content []string `json:"content"`
			}
			_ = json.NewDecoder(r.Body).Decode(&in)
			out := make([]string, len(in.Content))
			for i, c := range in.Content {
				if in.Token == "ticket-1" {
					c = strings.ReplaceAll(c, placeholder, secret)
				}
				out[i] = c
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"content": out})
		}
	}))
	t.Cleanup(pii.Close)
	doc := openAuth + fmt.Sprintf(`
[cache]
enabled = true
[pii_sanitizer]
enabled = true
url = "%[1]s/sanitize"
restore_url = "%[1]s/restore"
direction = "both"
restoration = "caller_authorized"
[[providers]]
name = "up"
kind = "openai_compatible"
api_base = %[2]q
[[routes]]
model = "m"
targets = [{ provider = "up" }]
[routes.cache]
ttl_secs = 600
`, pii.URL, upstream.URL)
	p := New(Options{})
	srv := newServer(t, p)
	applyDoc(t, p, doc)
	body := `{"model":"m","messages":[{"role":"user","content":"mail ` + secret + `"}]}`

	resp, b := post(t, srv+"/v1/chat/completions", "", body, "X-Rolter-Pii-Restore", "true")
	if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Cache") != "MISS" {
		t.Fatalf("first: %d %q %s", resp.StatusCode, resp.Header.Get("X-Rolter-Cache"), b)
	}
	if saw, _ := upstreamSaw.Load().(string); strings.Contains(saw, secret) || !strings.Contains(saw, placeholder) {
		t.Fatalf("the upstream saw %q: the request leg did not sanitize", saw)
	}
	if !strings.Contains(string(b), secret) {
		t.Fatalf("the authorized caller did not get its data restored: %s", b)
	}

	// The same request without restoration rights hits the stored entry.
	resp, b = post(t, srv+"/v1/chat/completions", "", body)
	if resp.Header.Get("X-Rolter-Cache") != "HIT" {
		t.Fatalf("second: %q", resp.Header.Get("X-Rolter-Cache"))
	}
	if strings.Contains(string(b), secret) || !strings.Contains(string(b), placeholder) {
		t.Fatalf("the stored entry holds restored data: %s", b)
	}
}

// TestWithheldReasonIsTheRefusalsReason: the usage row of a withheld
// response names its code once ("guardrail_blocked: email"), as the policy
// gave it, not the code again in front of it.
func TestWithheldReasonIsTheRefusalsReason(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"write to ann@example.com"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(up.Close)
	plugins := pluginServer(t)
	tests := []struct{ name, extra, want string }{
		{"guardrail", "[guardrails]\n[[guardrails.rules]]\nname = \"email\"\nbuiltin = \"email\"\nstage = \"post_call\"\naction = \"block\"\n", "guardrail_blocked: email"},
		{"plugin", fmt.Sprintf("[[plugins]]\nname = \"p\"\nurl = %q\nstage = \"post_response\"\ntimeout_ms = 500\n", plugins.URL+"/block"), "plugin_blocked: p"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			acct, path := accountingFile(t)
			p := New(Options{})
			applyDoc(t, p, acct+tc.extra+fmt.Sprintf("[[providers]]\nname = \"up\"\nkind = \"openai_compatible\"\napi_base = %q\n[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"up\" }]\n", up.URL))
			resp, body := post(t, newServer(t, p)+"/v1/chat/completions", "", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if r := usageRows(t, path, 1)[0]; !r.Withheld || r.WithheldReason != tc.want {
				t.Fatalf("withheld %v reason %q, want %q", r.Withheld, r.WithheldReason, tc.want)
			}
		})
	}
}
