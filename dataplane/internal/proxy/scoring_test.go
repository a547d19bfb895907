package proxy

import (
	"fmt"
	"net/http"
	"testing"
)

// TestScoringEndpoints: vLLM's rerank and score paths are forwarded to an
// engine as sent (the target's model name in the body), refused where
// only a hosted API serves the model (OpenAI and Anthropic have no such
// endpoint), and open to browsers as the /v1 paths are.
func TestScoringEndpoints(t *testing.T) {
	u := newUpstream(t, "engine")
	hosted := newUpstream(t, "hosted")
	_, srv := newTestProxy(t, openAuth+providers(u)+fmt.Sprintf("[[providers]]\nname = \"openai\"\nkind = \"openai\"\napi_base = %q\napi_key = \"k\"\n", hosted.URL)+
		"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\", model = \"bge-reranker\" }]\n"+
		"[[routes]]\nmodel = \"gpt\"\ntargets = [{ provider = \"openai\" }]\n")
	for _, path := range []string{"/rerank", "/v1/rerank", "/v2/rerank", "/score", "/v1/score"} {
		resp, out := post(t, srv.URL+path, "", `{"model":"m","query":"q","documents":["a","b"]}`)
		if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Provider") != "p0" {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, out)
		}
		if b, _ := u.last(); b["model"] != "bge-reranker" || b["query"] != "q" {
			t.Fatalf("%s: the engine got %v", path, b)
		}
		resp, out = post(t, srv.URL+path, "", `{"model":"gpt","query":"q","documents":["a"]}`)
		if resp.Header.Get("X-Rolter-Error") != "unsupported_endpoint" {
			t.Fatalf("%s on a hosted route: %d %s", path, resp.StatusCode, out)
		}
		resp, _ = send(t, http.MethodOptions, srv.URL+path, "", "Origin", "http://app.example", "Access-Control-Request-Method", "POST")
		if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Methods") != http.MethodPost {
			t.Fatalf("%s preflight: %d %v", path, resp.StatusCode, resp.Header)
		}
	}
	if hosted.hits.Load() != 0 {
		t.Fatalf("the hosted API was asked %d times", hosted.hits.Load())
	}
}

// TestScoringIsCachedExactly: a rerank is deterministic, so a route that
// caches answers a repeat from the cache, and the same documents reranked
// for another query, or sent to the score endpoint, are other entries.
func TestScoringIsCachedExactly(t *testing.T) {
	u := newUpstream(t, "engine")
	_, srv := newTestProxy(t, openAuth+"[cache]\nenabled = true\n"+providers(u)+
		"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n[routes.cache]\nttl_secs = 600\n")
	for i, c := range []struct{ path, body, want string }{
		{"/v1/rerank", `{"model":"m","query":"q","documents":["a","b"]}`, "MISS"},
		{"/v1/rerank", `{"model":"m","query":"q","documents":["a","b"]}`, "HIT"},
		{"/v1/rerank", `{"model":"m","query":"other","documents":["a","b"]}`, "MISS"},
		{"/rerank", `{"model":"m","query":"q","documents":["a","b"]}`, "MISS"},
		{"/v1/score", `{"model":"m","query":"q","documents":["a","b"]}`, "MISS"},
	} {
		resp, out := post(t, srv.URL+c.path, "", c.body)
		if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Cache") != c.want {
			t.Fatalf("request %d (%s): %d, cache %q, want %q: %s", i, c.path, resp.StatusCode, resp.Header.Get("X-Rolter-Cache"), c.want, out)
		}
	}
	if n := u.hits.Load(); n != 4 {
		t.Fatalf("the engine answered %d requests, want 4", n)
	}
}
