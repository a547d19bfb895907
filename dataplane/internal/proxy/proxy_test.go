package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rolter.dev/pkg/config"
)

// upstream is a scripted OpenAI-compatible upstream recording what it got.
type upstream struct {
	*httptest.Server
	mu      sync.Mutex
	bodies  []map[string]any
	headers []http.Header
	status  atomic.Int32 // 0 = 200
	hits    atomic.Int32
	handler func(w http.ResponseWriter, r *http.Request) bool // true = handled
}

func newUpstream(t *testing.T, name string) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		u.mu.Lock()
		u.bodies = append(u.bodies, body)
		u.headers = append(u.headers, r.Header.Clone())
		h := u.handler
		u.mu.Unlock()
		if h != nil && h(w, r) {
			return
		}
		if s := u.status.Load(); s != 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(int(s))
			fmt.Fprintf(w, `{"error":{"message":"scripted %d"}}`, s)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","served_by":%q,"model":%q}`, name, body["model"])
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) last() (map[string]any, http.Header) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.bodies[len(u.bodies)-1], u.headers[len(u.headers)-1]
}

// openAuth opens a config without keys (server.require_auth defaults to
// true): the tests that send no key say so.
const openAuth = "[server]\nrequire_auth = false\n"

func newTestProxy(t *testing.T, doc string) (*Proxy, *httptest.Server) {
	t.Helper()
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := config.Compile(cfg, config.CompileOptions{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	p := New(Options{})
	if err := p.Apply(snap); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv
}

func newServer(t *testing.T, p *Proxy) string {
	t.Helper()
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL
}

func post(t *testing.T, url, key, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	h := []string{"Content-Type", "application/json"}
	if key != "" {
		h = append(h, "Authorization", "Bearer "+key)
	}
	return send(t, http.MethodPost, url, body, append(h, hdr...)...)
}

// send makes one request with the given headers (name, value, …) and
// returns the response with its body read.
func send(t *testing.T, method, url, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func providers(ups ...*upstream) string {
	var s strings.Builder
	for i, u := range ups {
		fmt.Fprintf(&s, "[[providers]]\nname = \"p%d\"\nkind = \"openai_compatible\"\napi_base = %q\napi_key = \"upstream-secret-%d\"\n\n", i, u.URL, i)
	}
	return s.String()
}

// keys needs routes m and m2 and providers p0 and p1 in the config.
const keys = `
[[virtual_keys]]
name = "full"
key = "sk-rolter-full-000000000"

[[virtual_keys]]
name = "only-m2"
key = "sk-rolter-m2-00000000000"
models = ["m2"]

[[virtual_keys]]
name = "only-p1"
key = "sk-rolter-p1-00000000000"
providers = ["p1"]
`

func TestErrorShapes(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	doc := "[server]\nmax_body_bytes = 200\n" + providers(a, b) + `
[[providers]]
name = "claude"
kind = "anthropic"
api_base = "http://127.0.0.1:1"

[[routes]]
model = "m"
targets = [{ provider = "p0" }]
[[routes]]
model = "m2"
targets = [{ provider = "p0" }]
[[routes]]
model = "claude-only"
targets = [{ provider = "claude" }]
` + keys
	_, srv := newTestProxy(t, doc)
	const full = "sk-rolter-full-000000000"
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 300) + `"}]}`
	tests := []struct {
		name, path, key, body string
		status                int
		code                  string // OpenAI error.code, or Anthropic error.type
	}{
		{"error: missing key", "/v1/chat/completions", "", `{"model":"m"}`, 401, "missing_api_key"},
		{"error: invalid key", "/v1/chat/completions", "sk-rolter-nope-000000000", `{"model":"m"}`, 401, "invalid_api_key"},
		{"error: malformed json", "/v1/chat/completions", full, `{"model":`, 400, "invalid_json"},
		{"error: json not an object", "/v1/chat/completions", full, `[1]`, 400, "invalid_json"},
		{"error: body too large", "/v1/chat/completions", full, big, 413, "request_too_large"},
		{"error: no model", "/v1/chat/completions", full, `{"messages":[]}`, 400, "invalid_request"},
		{"error: unknown model", "/v1/chat/completions", full, `{"model":"ghost"}`, 404, "model_not_found"},
		{"error: model not allowed", "/v1/chat/completions", "sk-rolter-m2-00000000000", `{"model":"m"}`, 403, "model_not_allowed"},
		{"error: provider not allowed", "/v1/chat/completions", "sk-rolter-p1-00000000000", `{"model":"m"}`, 403, "provider_not_allowed"},
		{"error: anthropic target cannot take chat", "/v1/chat/completions", full, `{"model":"claude-only"}`, 400, "unsupported_endpoint"},
		{"error: anthropic dialect missing key", "/v1/messages", "", `{"model":"m"}`, 401, "authentication_error"},
		{"error: anthropic dialect malformed json", "/v1/messages", full, `{`, 400, "invalid_request_error"},
		{"error: anthropic dialect too large", "/v1/messages", full, big, 413, "request_too_large"},
		{"error: anthropic dialect unknown model", "/v1/messages", full, `{"model":"ghost"}`, 404, "not_found_error"},
		{"error: anthropic dialect forbidden", "/v1/messages", "sk-rolter-m2-00000000000", `{"model":"m"}`, 403, "permission_error"},
		{"error: unknown endpoint", "/v1/nope", full, `{}`, 404, "not_found"},
		{"error: unknown path under an openai endpoint", "/v1/chat/completions/x", full, `{}`, 404, "not_found"},
		{"error: unknown path next to the anthropic prefix", "/v1/messagesx", full, `{}`, 404, "not_found"},
		// Under /v1/messages/ the client speaks Anthropic: its SDK reads
		// only that shape.
		{"error: anthropic dialect unknown path", "/v1/messages/foo", full, `{}`, 404, "not_found_error"},
		{"error: anthropic dialect batches", "/v1/messages/batches", full, `{}`, 404, "not_found_error"},
		{"error: anthropic dialect below count_tokens", "/v1/messages/count_tokens/x", full, `{}`, 404, "not_found_error"},
		{"error: anthropic dialect without a key, unknown path", "/v1/messages/foo", "", `{}`, 404, "not_found_error"},
		// count_tokens is served, not a 404.
		{"error: count_tokens malformed json", "/v1/messages/count_tokens", full, `{`, 400, "invalid_request_error"},
		// A model or stream an upstream could read otherwise than the
		// gateway: the key's allow-list and the stream policy would apply
		// to one request and the upstream serve another.
		{"error: model key in another case", "/v1/chat/completions", "sk-rolter-m2-00000000000", `{"model":"m2","MODEL":"m"}`, 400, "invalid_request"},
		{"error: model twice", "/v1/chat/completions", full, `{"model":"m","model":"m2"}`, 400, "invalid_request"},
		{"error: stream not a boolean", "/v1/chat/completions", full, `{"model":"m","stream":"true"}`, 400, "invalid_request"},
		{"error: stream key in another case", "/v1/completions", full, `{"model":"m","Stream":true}`, 400, "invalid_request"},
		{"error: anthropic dialect stream not a boolean", "/v1/messages", full, `{"model":"m","stream":1}`, 400, "invalid_request_error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, srv.URL+tc.path, tc.key, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("content-type %q", ct)
			}
			if resp.Header.Get("X-Request-Id") == "" {
				t.Error("no x-request-id")
			}
			if strings.HasPrefix(tc.path, "/v1/messages/") || tc.path == "/v1/messages" {
				var e anthropicErrorBody
				if err := json.Unmarshal(body, &e); err != nil || e.Type != "error" || e.Error.Type != tc.code || e.Error.Message == "" {
					t.Fatalf("anthropic error shape: %s", body)
				}
				return
			}
			var e openAIErrorBody
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("openai error shape: %s", body)
			}
		})
	}
	if a.hits.Load() != 0 {
		t.Fatalf("refused requests reached the upstream %d times", a.hits.Load())
	}
}

// A path no route serves gets its 404 in the shape of the API the client
// speaks: an Anthropic SDK sends anthropic-version on every request, so
// its calls to Anthropic-only paths (/v1/files, /v1/complete) read an
// Anthropic error too.
func TestNotFoundSpeaksTheClientsAPI(t *testing.T) {
	_, srv := newTestProxy(t, openAuth+providers(newUpstream(t, "a"))+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	tests := []struct {
		method, path, version string
		anthropic             bool
	}{
		{http.MethodPost, "/v1/complete", "2023-06-01", true},
		{http.MethodGet, "/v1/files", "2023-06-01", true},
		{http.MethodGet, "/v1/nope", "2023-06-01", true},
		{http.MethodPost, "/v1/messages/batches", "", true},
		{http.MethodPost, "/v1/complete", "", false},
		{http.MethodGet, "/v1/files", "", false},
		{http.MethodPost, "/v1/chat/completions/x", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path+" "+tc.version, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, nil)
			if tc.version != "" {
				req.Header.Set("Anthropic-Version", tc.version)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 404 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var a anthropicErrorBody
			var o openAIErrorBody
			switch {
			case tc.anthropic && (json.Unmarshal(body, &a) != nil || a.Type != "error" || a.Error.Type != "not_found_error"):
				t.Errorf("want the anthropic shape: %s", body)
			case !tc.anthropic && (json.Unmarshal(body, &o) != nil || o.Error.Code != "not_found"):
				t.Errorf("want the openai shape: %s", body)
			}
		})
	}
}

func TestForwardRewritesModelAndAuth(t *testing.T) {
	a := newUpstream(t, "a")
	claude := newUpstream(t, "claude")
	doc := providers(a) + fmt.Sprintf(`
[[providers]]
name = "claude"
kind = "anthropic"
api_base = %q
api_key = "anthropic-secret"

[[routes]]
model = "public"
targets = [{ provider = "p0", model = "upstream-model" }]
[[routes]]
model = "claude-public"
targets = [{ provider = "claude", model = "claude-3" }]
`, claude.URL) + "[[virtual_keys]]\nname = \"full\"\nkey = \"sk-rolter-full-000000000\"\n"
	_, srv := newTestProxy(t, doc)
	resp, body := post(t, srv.URL+"/v1/chat/completions", "sk-rolter-full-000000000",
		`{"messages":[{"role":"user","content":"hi"}],"model":"public","temperature":0.5}`, "X-Request-Id", "req-123")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got, h := a.last()
	if got["model"] != "upstream-model" || got["temperature"] != 0.5 {
		t.Fatalf("upstream body %v", got)
	}
	if h.Get("Authorization") != "Bearer upstream-secret-0" {
		t.Fatalf("upstream auth %q", h.Get("Authorization"))
	}
	if h.Get("X-Request-Id") != "req-123" || resp.Header.Get("X-Request-Id") != "req-123" {
		t.Fatal("request id not propagated and echoed")
	}
	if resp.Header.Get("X-Rolter-Provider") != "p0" {
		t.Fatalf("x-rolter-provider %q", resp.Header.Get("X-Rolter-Provider"))
	}

	resp, body = post(t, srv.URL+"/v1/messages", "", `{"model":"claude-public","max_tokens":5,"messages":[]}`,
		"X-Api-Key", "sk-rolter-full-000000000")
	if resp.StatusCode != 200 {
		t.Fatalf("messages status %d: %s", resp.StatusCode, body)
	}
	got, h = claude.last()
	if got["model"] != "claude-3" || h.Get("X-Api-Key") != "anthropic-secret" || h.Get("Anthropic-Version") != "2023-06-01" || h.Get("Authorization") != "" {
		t.Fatalf("anthropic upstream got model=%v headers=%v", got["model"], h)
	}
}

func TestFailoverRetryAndCooldown(t *testing.T) {
	a, b, c := newUpstream(t, "a"), newUpstream(t, "b"), newUpstream(t, "c")
	a.status.Store(503)
	doc := openAuth + "[retry]\nbase_backoff_ms = 1\nmax_backoff_ms = 2\n[cooldown]\nbase_secs = 300\nmax_secs = 600\n" + providers(a, b, c) + `
[[routes]]
model = "m"
strategy = "round_robin"
targets = [{ provider = "p0" }, { provider = "p1" }, { provider = "p2" }]
`
	p, srv := newTestProxy(t, doc)
	for i := range 12 {
		resp, body := post(t, srv.URL+"/v1/chat/completions", "", `{"model":"m"}`)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
	}
	if got := a.hits.Load(); got != 1 {
		t.Fatalf("failed target tried %d times; the cooldown should park it after the first failure", got)
	}
	if b.hits.Load()+c.hits.Load() != 12 {
		t.Fatalf("healthy targets served %d+%d", b.hits.Load(), c.hits.Load())
	}
	tgt := p.rt.Load().routes["m"].pools[0].targets[0].state
	if !tgt.CoolingDown(time.Now()) {
		t.Fatal("failed target not parked")
	}
}

func TestAllTargetsFailingReturnsLastAnswer(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	a.status.Store(503)
	b.status.Store(429)
	doc := openAuth + "[retry]\nmax_retries = 5\nbase_backoff_ms = 1\nmax_backoff_ms = 1\n" + providers(a, b) + `
[[routes]]
model = "m"
targets = [{ provider = "p0" }, { provider = "p1" }]
`
	_, srv := newTestProxy(t, doc)
	resp, _ := post(t, srv.URL+"/v1/chat/completions", "", `{"model":"m"}`)
	if resp.StatusCode != 503 && resp.StatusCode != 429 {
		t.Fatalf("status %d, want the upstream's own retryable status", resp.StatusCode)
	}
	if a.hits.Load() != 1 || b.hits.Load() != 1 {
		t.Fatalf("each target should be tried once: %d, %d", a.hits.Load(), b.hits.Load())
	}
	// Both parked now: the next request fails open and still tries them.
	resp, _ = post(t, srv.URL+"/v1/chat/completions", "", `{"model":"m"}`)
	if a.hits.Load()+b.hits.Load() != 4 {
		t.Fatalf("fail-open did not try parked targets: %d", a.hits.Load()+b.hits.Load())
	}
	if resp.StatusCode < 400 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestDeadTargetTransportError(t *testing.T) {
	b := newUpstream(t, "b")
	dead := newUpstream(t, "dead")
	dead.Close()
	doc := openAuth + "[retry]\nbase_backoff_ms = 1\nmax_backoff_ms = 1\n" + providers(dead, b) + `
[[routes]]
model = "m"
targets = [{ provider = "p0" }, { provider = "p1" }]
`
	_, srv := newTestProxy(t, doc)
	for i := range 6 {
		if resp, body := post(t, srv.URL+"/v1/chat/completions", "", `{"model":"m"}`); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
}

func TestKeyAllowListIsNeverFailedOpen(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	b.status.Store(503)
	doc := openAuth + "[retry]\nbase_backoff_ms = 1\nmax_backoff_ms = 1\n" + providers(a, b) + `
[[routes]]
model = "m"
targets = [{ provider = "p0" }, { provider = "p1" }]
[[routes]]
model = "m2"
targets = [{ provider = "p0" }]
` + keys
	_, srv := newTestProxy(t, doc)
	for range 3 {
		resp, _ := post(t, srv.URL+"/v1/chat/completions", "sk-rolter-p1-00000000000", `{"model":"m"}`)
		if resp.StatusCode != 503 {
			t.Fatalf("status %d, want p1's own 503", resp.StatusCode)
		}
	}
	if a.hits.Load() != 0 {
		t.Fatalf("a key limited to p1 reached p0 %d times", a.hits.Load())
	}
}

func TestStreamingPassesThroughEventByEvent(t *testing.T) {
	a := newUpstream(t, "a")
	release := make(chan struct{})
	upstreamDone := make(chan struct{})
	a.handler = func(w http.ResponseWriter, r *http.Request) bool {
		defer close(upstreamDone)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		select { // the second event only after the client saw the first
		case <-release:
		case <-r.Context().Done():
			return true
		}
		fmt.Fprint(w, "data: {\"n\":2}\n\ndata: [DONE]\n\n")
		return true
	}
	doc := openAuth + providers(a) + "[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n"
	p, srv := newTestProxy(t, doc)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil || line != "data: {\"n\":1}\n" {
		t.Fatalf("first event %q %v", line, err)
	}
	if n := p.rt.Load().routes["m"].pools[0].targets[0].state.InFlight(); n != 1 {
		t.Fatalf("in flight during the stream = %d, want 1", n)
	}
	close(release)
	rest, _ := io.ReadAll(rd)
	if string(rest) != "\ndata: {\"n\":2}\n\ndata: [DONE]\n\n" {
		t.Fatalf("rest %q", rest)
	}
	<-upstreamDone
	waitFor(t, func() bool { return p.rt.Load().routes["m"].pools[0].targets[0].state.InFlight() == 0 })
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	a := newUpstream(t, "a")
	cancelled := make(chan struct{})
	a.handler = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(cancelled)
		return true
	}
	doc := openAuth + providers(a) + "[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n"
	p, srv := newTestProxy(t, doc)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // the client goes away mid-stream
	<-cancelled       // the upstream saw its request cancelled
	waitFor(t, func() bool { return p.rt.Load().routes["m"].pools[0].targets[0].state.InFlight() == 0 })
}

func TestModelsAndProbes(t *testing.T) {
	a := newUpstream(t, "a")
	doc := providers(a, newUpstream(t, "b")) + "[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n[[routes]]\nmodel = \"m2\"\ntargets = [{ provider = \"p0\" }]\n" + keys
	p, srv := newTestProxy(t, doc)
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer sk-rolter-m2-00000000000")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list modelList
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Data) != 1 || list.Data[0].ID != "m2" {
		t.Fatalf("models for a key limited to m2: %+v", list)
	}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200} {
		resp, err := http.Get(srv.URL + path)
		if err != nil || resp.StatusCode != want {
			t.Fatalf("%s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	p.SetDraining(true)
	resp, _ = http.Get(srv.URL + "/readyz")
	if resp.StatusCode != 503 {
		t.Fatalf("readyz while draining = %d", resp.StatusCode)
	}
	resp.Body.Close()
	// While draining, requests are still served, each closing its
	// keep-alive connection so the client reconnects elsewhere.
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("a request while draining: %v (close %v), %v", resp.Status, resp.Close, err)
	}
	resp.Body.Close()
	p.SetDraining(false)
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.Close {
		t.Fatalf("not draining: connection close %v, %v", resp.Close, err)
	}
	resp.Body.Close()
}

// A request already in flight when draining starts closes its keep-alive
// connection too, as long as its response headers go out after that: a
// stream (waiting for its first event) and a buffered answer alike.
// Otherwise the client reuses the connection and the server's close at
// shutdown can cross the next request on it.
func TestInFlightRequestClosesItsConnectionWhenDrainingStarts(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			up := newUpstream(t, "a")
			arrived, release := make(chan struct{}), make(chan struct{})
			up.handler = func(w http.ResponseWriter, r *http.Request) bool {
				close(arrived)
				<-release
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
					return true
				}
				return false
			}
			p, srv := newTestProxy(t, openAuth+providers(up)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
			type result struct {
				resp *http.Response
				err  error
			}
			done := make(chan result, 1)
			go func() {
				body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
				resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
				done <- result{resp, err}
			}()
			<-arrived // the proxy's handler is running, its response not started
			p.SetDraining(true)
			close(release)
			res := <-done
			if res.err != nil {
				t.Fatal(res.err)
			}
			b, _ := io.ReadAll(res.resp.Body)
			res.resp.Body.Close()
			if res.resp.StatusCode != 200 || !res.resp.Close {
				t.Fatalf("status %d, Connection: close %v (%s)", res.resp.StatusCode, res.resp.Close, b)
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Every route answers a method it does not serve with 405, the Allow header
// RFC 9110 §15.5.6 requires, and an error in the route's dialect, without
// reaching an upstream.
func TestWrongMethods(t *testing.T) {
	a := newUpstream(t, "a")
	_, srv := newTestProxy(t, openAuth+providers(a)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	tests := []struct {
		path, allow string
		anthropic   bool
	}{
		{"/v1/models", allowRead, false},
		{"/v1/models/m", allowRead, false},
		{"/v1/chat/completions", http.MethodPost, false},
		{"/v1/completions", http.MethodPost, false},
		{"/v1/embeddings", http.MethodPost, false},
		{"/v1/responses", http.MethodPost, false},
		{"/v1/messages", http.MethodPost, true},
		{countTokensPath, http.MethodPost, true},
	}
	for _, tc := range tests {
		for _, method := range []string{http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions, http.MethodHead, http.MethodGet, http.MethodPost} {
			if strings.Contains(tc.allow, method) {
				continue
			}
			t.Run(tc.path+" "+method, func(t *testing.T) {
				req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL+tc.path, strings.NewReader(`{"model":"m"}`))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != tc.allow || resp.Header.Get("X-Rolter-Error") != "method_not_allowed" {
					t.Fatalf("status %d, Allow %q, x-rolter-error %q", resp.StatusCode, resp.Header.Get("Allow"), resp.Header.Get("X-Rolter-Error"))
				}
				if method == http.MethodHead {
					return
				}
				b, _ := io.ReadAll(resp.Body)
				var oe openAIErrorBody
				var ae anthropicErrorBody
				if tc.anthropic && (json.Unmarshal(b, &ae) != nil || ae.Type != "error") || !tc.anthropic && (json.Unmarshal(b, &oe) != nil || oe.Error.Code != "method_not_allowed") {
					t.Fatalf("error body %s", b)
				}
			})
		}
	}
	if a.hits.Load() != 0 {
		t.Fatalf("the upstream was called %d times", a.hits.Load())
	}
}

// How each way of presenting a key is read: a Bearer token (any case of the
// scheme) wins; x-api-key serves when Authorization carries no Bearer
// token (a proxy's Basic credentials, an empty Bearer); an Authorization
// header that is not `Bearer <key>` and no x-api-key is a malformed
// credential (401 invalid_api_key saying how to send it), not a missing one.
func TestCredentialForms(t *testing.T) {
	a := newUpstream(t, "a")
	_, srv := newTestProxy(t, providers(a)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n[[virtual_keys]]\nname = \"k\"\nkey = \"sk-rolter-good-000000000\"\n")
	const good = "sk-rolter-good-000000000"
	tests := []struct {
		name          string
		auth, apiKey  string
		status        int
		code, message string
	}{
		{"bearer", "Bearer " + good, "", 200, "", ""},
		{"bearer in lower case, spaces around", "bearer   " + good + "  ", "", 200, "", ""},
		{"x-api-key", "", good, 200, "", ""},
		{"basic credentials and x-api-key", "Basic Zm9vOmJhcg==", good, 200, "", ""},
		{"empty bearer and x-api-key", "Bearer ", good, 200, "", ""},
		{"nothing", "", "", 401, "missing_api_key", "missing api key"},
		{"a wrong bearer wins over a good x-api-key", "Bearer sk-rolter-bad-0000000000", good, 401, "invalid_api_key", "invalid api key"},
		{"the key without a scheme", good, "", 401, "invalid_api_key", "Bearer"},
		{"a tab after the scheme", "Bearer\t" + good, "", 401, "invalid_api_key", "Bearer"},
		{"basic credentials only", "Basic Zm9vOmJhcg==", "", 401, "invalid_api_key", "Bearer"},
		{"bearer alone", "Bearer", "", 401, "invalid_api_key", "Bearer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.auth != "" {
				hdr = append(hdr, "Authorization", tc.auth)
			}
			if tc.apiKey != "" {
				hdr = append(hdr, "X-Api-Key", tc.apiKey)
			}
			resp, b := post(t, srv.URL+"/v1/chat/completions", "", `{"model":"m","messages":[]}`, hdr...)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.status == 200 {
				return
			}
			var e openAIErrorBody
			if json.Unmarshal(b, &e) != nil || e.Error.Code != tc.code || !strings.Contains(e.Error.Message, tc.message) {
				t.Fatalf("error %s, want %s mentioning %q", b, tc.code, tc.message)
			}
		})
	}
}
