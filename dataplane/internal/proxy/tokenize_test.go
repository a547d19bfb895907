package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"rolter.dev/dataplane/internal/tokenize"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/natstest"
)

// TestEmptyTokenizeAnswerIsNoIDs: a replica whose /tokenize answers no
// token ids for a conversation gives the request no ids: it is routed on
// the approximate state and served, counted as a tokenize error (never
// engine), and the answer is not cached, so the same request asks again
// (counted error again, never cached).
func TestEmptyTokenizeAnswerIsNoIDs(t *testing.T) {
	up, tokenizeCalls := tokenizeUpstream(t, `{"count":0,"max_model_len":100,"tokens":[],"token_strs":null}`)
	p, url := kvRouteProxy(t, up, "precise_cache_aware")
	for i := range 2 {
		resp, body := post(t, url+"/v1/chat/completions", "", `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
	}
	if n := tokenizeCalls.Load(); n != 2 {
		t.Fatalf("/tokenize asked %d times, want 2 (an empty answer is not cached)", n)
	}
	for outcome, want := range map[string]float64{"error": 2, "engine": 0, "cached": 0} {
		if n := testutil.ToFloat64(p.metrics.Tokenize.WithLabelValues("m", outcome)); n != want {
			t.Errorf("rolter_tokenize_total{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
}

// TestRejectedTokenizeIsNotAnError: a /tokenize the engine refuses as a
// client error (vLLM's 400 for an empty prompt) is counted rejected, not
// error: the engine refuses the request itself the same way, and the
// client gets that answer.
func TestRejectedTokenizeIsNotAnError(t *testing.T) {
	up := newUpstream(t, "v")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"prompt: must not be empty","type":"BadRequestError","param":null,"code":400}}`)
		return true
	}
	p, url := kvRouteProxy(t, up, "predicted_ttft")
	resp, body := post(t, url+"/v1/completions", "", `{"model":"m","prompt":""}`)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "must not be empty") {
		t.Fatalf("status %d: %s; want the engine's 400", resp.StatusCode, body)
	}
	for outcome, want := range map[string]float64{"rejected": 1, "error": 0} {
		if n := testutil.ToFloat64(p.metrics.Tokenize.WithLabelValues("m", outcome)); n != want {
			t.Errorf("rolter_tokenize_total{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
}

// TestMalformedTokenIDsHeaderIsIgnoredAndCounted: a token-ids header that
// is not a list of unsigned 32-bit ids is ignored whole (a wrong list would
// steer precise routing wrongly): the request is served and tokenized by
// the engine as if it had none, and rolter_token_ids_header_ignored_total
// counts it; a well-formed header is used and not counted.
func TestMalformedTokenIDsHeaderIsIgnoredAndCounted(t *testing.T) {
	up, tokenizeCalls := tokenizeUpstream(t, `{"count":2,"max_model_len":100,"tokens":[7,8],"token_strs":null}`)
	p, url := kvRouteProxy(t, up, "predicted_ttft")
	for i, h := range []string{"1,2,abc", "-4", "1,,2", "4294967296", "1, 2,3"} {
		resp, body := post(t, url+"/v1/chat/completions", "", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hello %d"}]}`, i),
			"X-Rolter-Vllm-Token-Ids", h)
		if resp.StatusCode != 200 {
			t.Fatalf("header %q: status %d: %s", h, resp.StatusCode, body)
		}
	}
	if n := testutil.ToFloat64(p.metrics.TokenIDsIgnored.WithLabelValues("m")); n != 4 {
		t.Errorf("rolter_token_ids_header_ignored_total = %v, want 4 (the last header is well formed)", n)
	}
	if n := tokenizeCalls.Load(); n != 4 {
		t.Errorf("/tokenize asked %d times, want 4: once for each ignored header, never for the well-formed one", n)
	}
}

// tokenizeUpstream is a provider v whose /tokenize answers answer, with
// the count of the calls it took; every other path gets the upstream's
// default answer.
func tokenizeUpstream(t *testing.T, answer string) (*upstream, *atomic.Int32) {
	var calls atomic.Int32
	up := newUpstream(t, "v")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/tokenize" {
			return false
		}
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
		return true
	}
	return up, &calls
}

// kvRouteProxy serves a proxy whose route m, of strategy, has the one
// provider up with KV events (so it asks up's /tokenize).
func kvRouteProxy(t *testing.T, up *upstream, strategy string) (*Proxy, string) {
	t.Helper()
	p := newKVProxy(t)
	applyDoc(t, p, openAuth+fmt.Sprintf("\n[[providers]]\nname = \"v\"\nkind = \"openai_compatible\"\napi_base = %q\n"+
		"[providers.kv_events]\nendpoint = \"tcp://127.0.0.1:5557\"\ntokenize_timeout_ms = 10000\n\n"+
		"[[routes]]\nmodel = \"m\"\nstrategy = %q\ntargets = [{ provider = \"v\" }]\n", up.URL, strategy))
	return p, newServer(t, p)
}

// newKVProxy returns a proxy following the KV events of a NATS server of
// its own.
func newKVProxy(t *testing.T) *Proxy {
	t.Helper()
	ix, err := kvindex.New(natstest.Connect(t, natstest.Start(t)), nil, kvindex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ix.Close)
	p := New(Options{KVIndex: ix})
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestTokenizeSkipsAReplicaThatTimedOut: a replica whose /tokenize timed
// out (a frozen engine: connections open, nothing answered) is not asked
// again for the cooldown's base time while another replica can answer, so
// one request pays the timeout, not every other one.
func TestTokenizeSkipsAReplicaThatTimedOut(t *testing.T) {
	var hungCalls, calls atomic.Int32
	hung, ok := newUpstream(t, "hung"), newUpstream(t, "ok")
	hung.handler = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/tokenize" {
			return false
		}
		hungCalls.Add(1)
		<-r.Context().Done()
		return true
	}
	ok.handler = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/tokenize" {
			return false
		}
		calls.Add(1)
		_, _ = io.WriteString(w, `{"count":2,"max_model_len":100,"tokens":[1,2],"token_strs":null}`)
		return true
	}
	p := newKVProxy(t)
	provider := "\n[[providers]]\nname = %q\nkind = \"openai_compatible\"\napi_base = %q\n" +
		"[providers.kv_events]\nendpoint = \"tcp://127.0.0.1:%d\"\ntokenize_timeout_ms = 20\n"
	applyDoc(t, p, openAuth+fmt.Sprintf(provider, "hung", hung.URL, 5557)+fmt.Sprintf(provider, "ok", ok.URL, 5558)+
		"\n[[routes]]\nmodel = \"m\"\nstrategy = \"predicted_ttft\"\ntargets = [{ provider = \"ok\" }, { provider = \"hung\" }]\n")
	url := newServer(t, p)
	send := func(i int) {
		t.Helper()
		resp, body := post(t, url+"/v1/completions", "", fmt.Sprintf(`{"model":"m","prompt":"prompt %d"}`, i))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
	}
	timeouts := func() float64 { return testutil.ToFloat64(p.metrics.Tokenize.WithLabelValues("m", "timeout")) }
	// Until the hung replica is asked once (each request asks one of the
	// two at random).
	i := 0
	for ; timeouts() == 0; i++ {
		if i == 64 {
			t.Fatal("the hung replica's /tokenize was never asked in 64 requests")
		}
		send(i)
	}
	before, okBefore := hungCalls.Load(), calls.Load()
	for j := range 16 {
		send(i + j)
	}
	if n := hungCalls.Load() - before; n != 0 {
		t.Fatalf("the replica whose /tokenize timed out was asked %d more times in 16 requests, want 0", n)
	}
	if n := calls.Load() - okBefore; n != 16 {
		t.Fatalf("the other replica was asked %d times for 16 requests, want 16", n)
	}
	if n := timeouts(); n != 1 {
		t.Fatalf("rolter_tokenize_total{outcome=\"timeout\"} = %v, want 1", n)
	}
}

// TestPredictedTTFTReadsMessagesWithoutTheBillingHeader: Claude Code opens
// every Messages request's system with a billing block that carries a
// per-request hash, which vLLM leaves out of the prompt. A predicted_ttft
// route without KV events reads the conversation without it too, so
// requests sharing a long system prompt go where its first went; through
// the body as sent, each would look like a new prompt.
func TestPredictedTTFTReadsMessagesWithoutTheBillingHeader(t *testing.T) {
	send := predictedTTFTPair(t)
	system := strings.Repeat("You are a careful coding agent with many tools. ", 300)
	served := map[string]int{}
	for i := range 6 {
		served[send("/v1/messages", fmt.Sprintf(`{"model":"m","max_tokens":8,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1; cch=%08x;"},`+
			`{"type":"text","text":%q}],"messages":[{"role":"user","content":"question %d"}]}`, i*7919, system, i))]++
	}
	if len(served) != 1 {
		t.Fatalf("requests sharing a system prompt spread over %v", served)
	}
}

// TestTokenizedIDsCheckedAgainstThePrompt: a request routed on ids from
// the engine's /tokenize (fresh or cached) is checked against the prompt
// length its answer reports: as many tokens counts match, another number
// mismatch (the engine rendered the prompt otherwise); an answer without
// usage, or ids the client sent, are not checked.
func TestTokenizedIDsCheckedAgainstThePrompt(t *testing.T) {
	up := newUpstream(t, "v")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/tokenize" {
			_, _ = io.WriteString(w, `{"count":3,"max_model_len":100,"tokens":[7,8,9],"token_strs":null}`)
			return true
		}
		body, _ := up.last()
		msgs, _ := body["messages"].([]any)
		text, _ := msgs[0].(map[string]any)["content"].(string)
		switch {
		case strings.HasPrefix(text, "no usage"):
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[]}`)
		default:
			prompt := 3
			if strings.HasPrefix(text, "mismatch") {
				prompt = 5
			}
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d}}`, prompt, prompt+1)
		}
		return true
	}
	p, url := kvRouteProxy(t, up, "predicted_ttft")
	for _, tc := range []struct{ text, header string }{
		{"match", ""}, {"match", ""}, // the second one's ids are cached
		{"mismatch", ""}, {"no usage", ""}, {"mismatch sent by the client", "7,8,9"},
	} {
		h := []string{}
		if tc.header != "" {
			h = []string{"X-Rolter-Vllm-Token-Ids", tc.header}
		}
		resp, body := post(t, url+"/v1/chat/completions", "", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, tc.text), h...)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", tc.text, resp.StatusCode, body)
		}
	}
	for result, want := range map[string]float64{"match": 2, "mismatch": 1} {
		if n := testutil.ToFloat64(p.metrics.TokenizeChecked.WithLabelValues("m", "/v1/chat/completions", result)); n != want {
			t.Errorf("rolter_tokenize_checked_total{result=%q} = %v, want %v", result, n, want)
		}
	}
	if n := testutil.ToFloat64(p.metrics.Tokenize.WithLabelValues("m", "cached")); n != 1 {
		t.Errorf("rolter_tokenize_total{outcome=\"cached\"} = %v, want 1", n)
	}
}

// TestWrongTokenIDsDistrusted: an engine that renders a request shape
// otherwise than the proxy's conversion answers prompts of another length
// than the ids /tokenize gave; once tokenize.TrustMismatches of them, more
// than the matches, proved the ids wrong, the endpoint's requests are not
// tokenized (counted distrusted) and route on the approximate state, still
// served, while another endpoint's ids keep being asked for and used.
func TestWrongTokenIDsDistrusted(t *testing.T) {
	var calls atomic.Int32
	up := newUpstream(t, "v")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/tokenize":
			calls.Add(1)
			_, _ = io.WriteString(w, `{"count":3,"max_model_len":100,"tokens":[7,8,9],"token_strs":null}`)
		case "/v1/responses": // rendered with two tokens more than the proxy's conversion
			_, _ = io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":5,"output_tokens":1,"total_tokens":6}}`)
		default:
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
		}
		return true
	}
	p, url := kvRouteProxy(t, up, "predicted_ttft")
	send := func(path, body string) {
		t.Helper()
		resp, out := post(t, url+path, "", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", path, resp.StatusCode, out)
		}
	}
	for i := range tokenize.TrustMismatches + 3 {
		send("/v1/responses", fmt.Sprintf(`{"model":"m","input":"question %d"}`, i))
		send("/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}]}`, i))
	}
	want := map[string]float64{"engine": 2*tokenize.TrustMismatches + 3, "distrusted": 3}
	for outcome, n := range want {
		if got := testutil.ToFloat64(p.metrics.Tokenize.WithLabelValues("m", outcome)); got != n {
			t.Errorf("rolter_tokenize_total{outcome=%q} = %v, want %v", outcome, got, n)
		}
	}
	if n := calls.Load(); n != 2*tokenize.TrustMismatches+3 {
		t.Errorf("/tokenize asked %d times, want %d", n, 2*tokenize.TrustMismatches+3)
	}
	for path, n := range map[string]float64{"/v1/responses": tokenize.TrustMismatches, "/v1/chat/completions": tokenize.TrustMismatches + 3} {
		result := map[bool]string{true: "mismatch", false: "match"}[path == "/v1/responses"]
		if got := testutil.ToFloat64(p.metrics.TokenizeChecked.WithLabelValues("m", path, result)); got != n {
			t.Errorf("rolter_tokenize_checked_total{endpoint=%q,result=%q} = %v, want %v", path, result, got, n)
		}
	}
}

// TestWrongTokenIDsOfOneShapeDistrusted: chat requests with tools whose
// ids the engine proves wrong (its template renders the tools otherwise),
// a minority among plain chat requests it proves right, stop being
// tokenized alone; the plain ones keep theirs.
func TestWrongTokenIDsOfOneShapeDistrusted(t *testing.T) {
	up := newUpstream(t, "v")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		body, _ := up.last() // the request, as newUpstream read it
		switch prompt := 3; {
		case r.URL.Path == "/tokenize":
			_, _ = io.WriteString(w, `{"count":3,"max_model_len":100,"tokens":[7,8,9],"token_strs":null}`)
		default:
			if body["tools"] != nil {
				prompt = 9
			}
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d}}`, prompt, prompt+1)
		}
		return true
	}
	p, url := kvRouteProxy(t, up, "predicted_ttft")
	tools := `,"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]`
	for i := range tokenize.TrustMismatches + 3 {
		for j, extra := range []string{"", "", tools} {
			resp, out := post(t, url+"/v1/chat/completions", "", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d.%d"}]%s}`, i, j, extra))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
		}
	}
	want := map[string]float64{"engine": 3*tokenize.TrustMismatches + 3*2, "distrusted": 3}
	for outcome, n := range want {
		if got := testutil.ToFloat64(p.metrics.Tokenize.WithLabelValues("m", outcome)); got != n {
			t.Errorf("rolter_tokenize_total{outcome=%q} = %v, want %v", outcome, got, n)
		}
	}
}

// TestReadsNoCacheNotTokenized: a request vLLM prefills whole (prompt log
// probabilities) gets no token ids from /tokenize on a predicted_ttft
// route, which prices it as a prompt no replica holds; a precise_cache_aware
// route (the seed's) tokenizes it as before.
func TestReadsNoCacheNotTokenized(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"score me"}],"prompt_logprobs":1,"max_tokens":1}`
	for strategy, want := range map[string]int32{"predicted_ttft": 0, "precise_cache_aware": 1} {
		up, calls := tokenizeUpstream(t, `{"count":2,"max_model_len":100,"tokens":[7,8],"token_strs":null}`)
		p, url := kvRouteProxy(t, up, strategy)
		if resp, out := post(t, url+"/v1/chat/completions", "", body); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", strategy, resp.StatusCode, out)
		}
		if n := calls.Load(); n != want {
			t.Errorf("%s: /tokenize asked %d times, want %d", strategy, n, want)
		}
		if got, wantCount := testutil.ToFloat64(p.metrics.Tokenize.WithLabelValues("m", "reads_no_cache")), float64(1-want); got != wantCount {
			t.Errorf("%s: rolter_tokenize_total{outcome=\"reads_no_cache\"} = %v, want %v", strategy, got, wantCount)
		}
	}
}

// TestPredictedTTFTKeepsSaltsApart: vLLM hashes a request's cache_salt
// into its prompt's first block, so requests of different salts share no
// cached prefix. A predicted_ttft route reads a salted prompt as one that
// shares prefixes only with its salt: two tenants sending the same long
// system prompt each keep to a replica of their own (through the
// conversation alone, the second tenant's first request would follow the
// first's), and a salted request is not tokenized, nor routed on token
// ids it sends, which cannot say which blocks the salt keys.
func TestPredictedTTFTKeepsSaltsApart(t *testing.T) {
	send := predictedTTFTPair(t)
	system := strings.Repeat("You are a careful assistant for a tenant. ", 300)
	served := map[string]map[string]int{"tenant-a": {}, "tenant-b": {}}
	for i := range 6 {
		salt := []string{"tenant-a", "tenant-b"}[i%2]
		served[salt][send("/v1/chat/completions", fmt.Sprintf(`{"model":"m","cache_salt":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, salt, system, i))]++
	}
	if len(served["tenant-a"]) != 1 || len(served["tenant-b"]) != 1 || fmt.Sprint(served["tenant-a"]) == fmt.Sprint(served["tenant-b"]) {
		t.Fatalf("two salts' requests served %v", served)
	}

	up, tokenizeCalls := tokenizeUpstream(t, `{"count":2,"max_model_len":100,"tokens":[7,8],"token_strs":null}`)
	p, url := kvRouteProxy(t, up, "predicted_ttft")
	for _, h := range [][]string{nil, {"X-Rolter-Vllm-Token-Ids", "7,8"}} {
		resp, out := post(t, url+"/v1/chat/completions", "", `{"model":"m","cache_salt":"tenant-a","messages":[{"role":"user","content":"hi"}]}`, h...)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
	}
	if n, unsupported := tokenizeCalls.Load(), testutil.ToFloat64(p.metrics.Tokenize.WithLabelValues("m", "unsupported")); n != 0 || unsupported != 2 {
		t.Fatalf("/tokenize asked %d times, %v counted unsupported; want 0 and 2", n, unsupported)
	}
	if n := testutil.ToFloat64(p.metrics.TokenIDsIgnored.WithLabelValues("m")); n != 0 {
		t.Fatalf("a well-formed header counted as ignored: %v", n)
	}
}

// predictedTTFTPair serves a predicted_ttft route m over two replicas
// without KV events and returns a sender: it posts body to path, fails the
// test unless the answer is a 200, and returns the provider that served it.
func predictedTTFTPair(t *testing.T) func(path, body string) string {
	t.Helper()
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	_, srv := newTestProxy(t, openAuth+providers(a, b)+"[[routes]]\nmodel = \"m\"\nstrategy = \"predicted_ttft\"\n"+
		"targets = [{ provider = \"p0\" }, { provider = \"p1\" }]\n")
	return func(path, body string) string {
		t.Helper()
		resp, out := post(t, srv.URL+path, "", body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		return resp.Header.Get("X-Rolter-Provider")
	}
}
