package proxy

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"rolter.dev/pkg/syncbuf"
)

const (
	corsKey   = "sk-rolter-cors-000000000"
	corsRoute = "[accounting]\nsink = \"none\"\n[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n" +
		"[[virtual_keys]]\nname = \"k\"\nkey = \"" + corsKey + "\"\n"
)

func preflight(t *testing.T, url, origin, method, headers string) *http.Response {
	t.Helper()
	hdr := []string{"Origin", origin, "Access-Control-Request-Method", method}
	if headers != "" {
		hdr = append(hdr, "Access-Control-Request-Headers", headers)
	}
	resp, _ := send(t, http.MethodOptions, url, "", hdr...)
	return resp
}

// TestPreflight: the proxy answers a browser's preflight itself, without a
// key (a browser never sends one on it), without calling an upstream and
// without counting an API request: 204 with the Access-Control-* headers
// of [server.cors] for an allowed origin, without them for another.
func TestPreflight(t *testing.T) {
	tests := []struct {
		name, cors, path, origin, method, asked string
		// want: Access-Control-Allow-Origin, -Methods, -Headers,
		// -Credentials, -Max-Age, Vary ("" = absent).
		allow, methods, headers, creds, maxAge, vary string
	}{
		{name: "any origin: answered *, the asked headers reflected", path: "/v1/chat/completions", origin: "https://x.example", method: "POST", asked: "authorization, content-type",
			allow: "*", methods: "POST", headers: "authorization, content-type", maxAge: "600", vary: "Access-Control-Request-Headers"},
		{name: "listed origin: echoed, varies by origin", cors: `allowed_origins = ["https://app.example"]`, path: "/v1/chat/completions", origin: "https://app.example", method: "POST", asked: "authorization, content-type",
			allow: "https://app.example", methods: "POST", headers: "authorization, content-type", maxAge: "600", vary: "Origin, Access-Control-Request-Headers"},
		{name: "origin not listed: no Access-Control-* header", cors: `allowed_origins = ["https://app.example"]`, path: "/v1/chat/completions", origin: "https://evil.example", method: "POST", asked: "authorization",
			vary: "Origin, Access-Control-Request-Headers"},
		{name: "credentials", cors: "allowed_origins = [\"https://app.example\"]\nallow_credentials = true", path: "/v1/messages", origin: "https://app.example", method: "POST", asked: "x-api-key, anthropic-version, content-type",
			allow: "https://app.example", methods: "POST", headers: "x-api-key, anthropic-version, content-type", creds: "true", maxAge: "600", vary: "Origin, Access-Control-Request-Headers"},
		{name: "listed headers, max age", cors: "allowed_headers = [\"Authorization\", \"Content-Type\"]\nmax_age_secs = 0", path: "/v1/embeddings", origin: "https://x.example", method: "POST", asked: "authorization, x-other",
			allow: "*", methods: "POST", headers: "Authorization, Content-Type", maxAge: "0"},
		{name: "the model list is read", path: "/v1/models", origin: "https://x.example", method: "GET", asked: "authorization",
			allow: "*", methods: "GET, HEAD", headers: "authorization", maxAge: "600", vary: "Access-Control-Request-Headers"},
		{name: "one model is read", path: "/v1/models/m", origin: "https://x.example", method: "GET",
			allow: "*", methods: "GET, HEAD", maxAge: "600", vary: "Access-Control-Request-Headers"},
		{name: "count_tokens", path: countTokensPath, origin: "https://x.example", method: "POST",
			allow: "*", methods: "POST", maxAge: "600", vary: "Access-Control-Request-Headers"},
		{name: "a path the proxy does not serve: the asked method, to read the 404", path: "/v1/files/f-1", origin: "https://x.example", method: "DELETE",
			allow: "*", methods: "DELETE", maxAge: "600", vary: "Access-Control-Request-Headers, Access-Control-Request-Method"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, "a")
			p, srv := newTestProxy(t, "[server.cors]\n"+tc.cors+"\n"+providers(up)+corsRoute)
			resp := preflight(t, srv.URL+tc.path, tc.origin, tc.method, tc.asked)
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("status %d, want 204", resp.StatusCode)
			}
			for _, h := range []struct{ name, want string }{
				{"Access-Control-Allow-Origin", tc.allow}, {"Access-Control-Allow-Methods", tc.methods},
				{"Access-Control-Allow-Headers", tc.headers}, {"Access-Control-Allow-Credentials", tc.creds},
				{"Access-Control-Max-Age", tc.maxAge}, {"Vary", tc.vary},
			} {
				if got := strings.Join(resp.Header.Values(h.name), ", "); got != h.want {
					t.Errorf("%s = %q, want %q", h.name, got, h.want)
				}
			}
			if n := up.hits.Load(); n != 0 {
				t.Errorf("the upstream was called %d times", n)
			}
			if n := testutil.CollectAndCount(p.metrics.Requests); n != 0 {
				t.Errorf("rolter_requests_total has %d series, want none: a preflight is no API request", n)
			}
			if n := testutil.CollectAndCount(p.metrics.AuthFailures); n != 0 {
				t.Errorf("rolter_auth_failures_total has %d series, want none", n)
			}
			result := "allowed"
			if tc.allow == "" {
				result = "denied"
			}
			if n := testutil.ToFloat64(p.metrics.CORSPreflights.WithLabelValues(result)); n != 1 {
				t.Errorf("rolter_cors_preflights_total{result=%q} = %v, want 1", result, n)
			}
		})
	}
}

// TestCORSOnActualResponses: every response to an allowed origin carries
// its Access-Control-Allow-Origin (one: the upstream's own is replaced)
// and exposes the headers a page needs, whatever produced it: a relayed
// answer, a stream, a cache hit, the proxy's own errors, the upstream's
// 429. Another origin's response carries none, the upstream's either, so
// the browser withholds it.
func TestCORSOnActualResponses(t *testing.T) {
	up := newUpstream(t, "a")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		// vLLM answers an Origin itself; a hosted API sends its limits.
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "99")
		if r.Header.Get("X-Test-Stream") == "" {
			return false
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
		return true
	}
	doc := "[server.cors]\nallowed_origins = [\"https://app.example\"]\nallow_credentials = true\n[cooldown]\nbase_secs = 0\n[cache]\nenabled = true\n" +
		providers(up) + corsRoute + "[routes.cache]\nenabled = true\n"
	_, srv := newTestProxy(t, doc)
	const app = "https://app.example"
	chat := srv.URL + "/v1/chat/completions"
	tests := []struct {
		name, method, url, body string
		hdr                     []string
		upstream                int32 // scripted upstream status (0: 200)
		status                  int
		allow                   string   // Access-Control-Allow-Origin; "" = absent
		exposed                 []string // among Access-Control-Expose-Headers
	}{
		{name: "answer", method: "POST", url: chat, body: `{"model":"m","messages":[{"role":"user","content":"a"}]}`,
			hdr: []string{"Origin", app, "Authorization", "Bearer " + corsKey}, status: 200, allow: app,
			exposed: []string{"X-Request-Id", "X-Rolter-Cache", "X-Rolter-Provider", "X-Ratelimit-Remaining-Requests"}},
		{name: "cache hit", method: "POST", url: chat, body: `{"model":"m","messages":[{"role":"user","content":"a"}]}`,
			hdr: []string{"Origin", app, "Authorization", "Bearer " + corsKey}, status: 200, allow: app,
			exposed: []string{"X-Request-Id", "X-Rolter-Cache", "X-Rolter-Cache-Kind"}},
		{name: "stream", method: "POST", url: chat, body: `{"model":"m","stream":true,"messages":[{"role":"user","content":"b"}]}`,
			hdr: []string{"Origin", app, "Authorization", "Bearer " + corsKey, "X-Test-Stream", "1"}, status: 200, allow: app,
			exposed: []string{"X-Request-Id", "X-Rolter-Cache", "X-Ratelimit-Remaining-Requests"}},
		{name: "error: missing key", method: "POST", url: chat, body: `{"model":"m"}`,
			hdr: []string{"Origin", app}, status: 401, allow: app, exposed: []string{"X-Request-Id", "X-Rolter-Error"}},
		{name: "error: malformed json", method: "POST", url: chat, body: `{"model":`,
			hdr: []string{"Origin", app, "Authorization", "Bearer " + corsKey}, status: 400, allow: app, exposed: []string{"X-Rolter-Error"}},
		{name: "error: unknown path", method: "DELETE", url: srv.URL + "/v1/files/f-1",
			hdr: []string{"Origin", app}, status: 404, allow: app, exposed: []string{"X-Rolter-Error"}},
		{name: "error: OPTIONS that is no preflight keeps its 405", method: "OPTIONS", url: chat,
			hdr: []string{"Origin", app}, status: 405, allow: app, exposed: []string{"X-Rolter-Error"}},
		{name: "error: the upstream's 429", method: "POST", url: chat, body: `{"model":"m","messages":[{"role":"user","content":"c"}]}`,
			hdr: []string{"Origin", app, "Authorization", "Bearer " + corsKey}, upstream: 429, status: 429, allow: app,
			exposed: []string{"Retry-After", "X-Ratelimit-Remaining-Requests"}},
		{name: "models", method: "GET", url: srv.URL + "/v1/models",
			hdr: []string{"Origin", app, "Authorization", "Bearer " + corsKey}, status: 200, allow: app, exposed: []string{"X-Request-Id"}},
		{name: "origin not listed: served, no Access-Control-* header", method: "POST", url: chat, body: `{"model":"m","messages":[{"role":"user","content":"d"}]}`,
			hdr: []string{"Origin", "https://evil.example", "Authorization", "Bearer " + corsKey}, status: 200},
		{name: "no origin: no Access-Control-* header", method: "POST", url: chat, body: `{"model":"m","messages":[{"role":"user","content":"e"}]}`,
			hdr: []string{"Authorization", "Bearer " + corsKey}, status: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up.status.Store(tc.upstream)
			defer up.status.Store(0)
			resp, b := send(t, tc.method, tc.url, tc.body, tc.hdr...)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if got := resp.Header.Values("Access-Control-Allow-Origin"); tc.allow == "" && len(got) != 0 || tc.allow != "" && (len(got) != 1 || got[0] != tc.allow) {
				t.Fatalf("Access-Control-Allow-Origin %q, want only %q", got, tc.allow)
			}
			if vary := strings.Join(resp.Header.Values("Vary"), ", "); !strings.Contains(vary, "Origin") {
				t.Errorf("Vary %q, want Origin: the answer depends on it", vary)
			}
			if tc.allow == "" {
				for k := range resp.Header {
					if strings.HasPrefix(k, "Access-Control-") {
						t.Errorf("%s: %q on a response to an origin not allowed", k, resp.Header.Values(k))
					}
				}
				return
			}
			if got := resp.Header.Get("Access-Control-Allow-Credentials"); got != "true" {
				t.Errorf("Access-Control-Allow-Credentials %q, want true", got)
			}
			exposed := map[string]bool{}
			for name := range strings.SplitSeq(resp.Header.Get("Access-Control-Expose-Headers"), ", ") {
				exposed[http.CanonicalHeaderKey(name)] = true
			}
			for _, name := range tc.exposed {
				if resp.Header.Get(name) == "" || !exposed[name] {
					t.Errorf("%s: %q, exposed %v; want it sent and exposed (Access-Control-Expose-Headers %q)",
						name, resp.Header.Get(name), exposed[name], resp.Header.Get("Access-Control-Expose-Headers"))
				}
			}
			if exposed["Content-Type"] || exposed["Access-Control-Allow-Origin"] {
				t.Errorf("Access-Control-Expose-Headers %q lists a header pages read anyway", resp.Header.Get("Access-Control-Expose-Headers"))
			}
		})
	}
}

// TestCORSOff: with allowed_origins = [] the proxy answers as it did
// without CORS support: OPTIONS gets 405, responses pass the upstream's
// headers as they are and get none of the proxy's.
func TestCORSOff(t *testing.T) {
	up := newUpstream(t, "a")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		return false
	}
	_, srv := newTestProxy(t, "[server.cors]\nallowed_origins = []\n"+providers(up)+corsRoute)
	resp := preflight(t, srv.URL+"/v1/chat/completions", "https://app.example", "POST", "authorization")
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("preflight with CORS off: status %d, Allow %q; want 405 and POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
	resp2, b := send(t, http.MethodPost, srv.URL+"/v1/chat/completions", `{"model":"m"}`, "Origin", "https://app.example", "Authorization", "Bearer "+corsKey)
	if resp2.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp2.StatusCode, b)
	}
	for _, r := range []*http.Response{resp, resp2} {
		for k := range r.Header {
			if strings.HasPrefix(k, "Access-Control-") && (r == resp || k != "Access-Control-Allow-Origin") || k == "Vary" {
				t.Errorf("%s: %q with CORS off", k, r.Header.Values(k))
			}
		}
	}
	if got := resp2.Header.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "*" {
		t.Errorf("the upstream's Access-Control-Allow-Origin became %q, want it passed as before", got)
	}
}

// TestCORSReload: the policy comes with the config snapshot, so a reload
// changes the allowed origins for the next request, and can turn CORS off.
func TestCORSReload(t *testing.T) {
	up := newUpstream(t, "a")
	p := New(Options{})
	url := newServer(t, p) + "/v1/chat/completions"
	allowed := func(origin string) string {
		t.Helper()
		resp := preflight(t, url, origin, "POST", "authorization")
		if resp.StatusCode != http.StatusNoContent {
			return fmt.Sprint(resp.StatusCode)
		}
		return resp.Header.Get("Access-Control-Allow-Origin")
	}
	for _, step := range []struct {
		origins, wantA, wantB string
	}{
		{`["https://a.example"]`, "https://a.example", ""},
		{`["https://b.example"]`, "", "https://b.example"},
		{`["*"]`, "*", "*"},
		{`[]`, "405", "405"},
		{`["https://a.example", "https://b.example"]`, "https://a.example", "https://b.example"},
	} {
		applyDoc(t, p, "[server.cors]\nallowed_origins = "+step.origins+"\n"+providers(up)+corsRoute)
		if a, b := allowed("https://a.example"), allowed("https://b.example"); a != step.wantA || b != step.wantB {
			t.Errorf("allowed_origins = %s: a.example answered %q, b.example %q; want %q, %q", step.origins, a, b, step.wantA, step.wantB)
		}
	}
	if n := up.hits.Load(); n != 0 {
		t.Errorf("the upstream was called %d times", n)
	}
}

// TestOpenGatewayWarnsOfBrowsers: a gateway open to every client
// (require_auth = false, no keys) says at its first request that any web
// page may call it while CORS allows every origin, and not when it lists
// origins.
func TestOpenGatewayWarnsOfBrowsers(t *testing.T) {
	up := newUpstream(t, "a")
	route := "[accounting]\nsink = \"none\"\n[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n"
	for _, tc := range []struct {
		cors string
		want bool
	}{
		{"", true},
		{"[server.cors]\nallowed_origins = [\"https://app.example\"]\n", false},
		{"[server.cors]\nallowed_origins = []\n", false},
	} {
		var logs syncbuf.Buffer
		p := New(Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		applyDoc(t, p, openAuth+tc.cors+providers(up)+route)
		if resp, b := post(t, newServer(t, p)+"/v1/chat/completions", "", `{"model":"m"}`); resp.StatusCode != 200 {
			t.Fatalf("%q: status %d: %s", tc.cors, resp.StatusCode, b)
		}
		out := logs.String()
		if !strings.Contains(out, "open to every client") {
			t.Fatalf("%q: no open-gateway warning in %q", tc.cors, out)
		}
		if got := strings.Contains(out, "any web page"); got != tc.want {
			t.Errorf("%q: warning names web pages: %v, want %v (%q)", tc.cors, got, tc.want, out)
		}
	}
}
