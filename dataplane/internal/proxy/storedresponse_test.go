package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"rolter.dev/dataplane/internal/responseid"
)

// storingUpstream makes u answer the Responses API as an engine with its
// response store on does: a response's id is the request's request_id, it
// is kept in u's memory only, and previous_response_id, GET and cancel
// find it there or answer 404. ids records the request_id of every create
// (absent: "").
func storingUpstream(u *upstream) (ids func() []string) {
	var mu sync.Mutex
	stored := map[string]bool{}
	var seen []string
	notFound := func(w http.ResponseWriter, id string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error"}}`, id)
	}
	u.handler = func(w http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		body, _ := u.last()
		if r.URL.Path == "/v1/responses" {
			id, _ := body["request_id"].(string)
			seen = append(seen, id)
			if prev, ok := body["previous_response_id"].(string); ok && !stored[prev] {
				notFound(w, prev)
				return true
			}
			if id == "" {
				id = "resp_0123456789abcdef0123456789abcdef"
			}
			stored[id] = true
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","output":[]}`, id)
			return true
		}
		id, sub, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/responses/"), "/")
		switch {
		case !stored[id]:
			notFound(w, id)
		case sub == "cancel":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error"}}`)
		case r.URL.Query().Get("stream") == "true":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":%q}}\n\n", id)
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","method":%q}`, id, r.Method)
		}
		return true
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// storingFleet serves route m over three storing upstreams with the given
// strategy, and route m2 over the third alone.
func storingFleet(t *testing.T, strategy, extra string) (string, []*upstream, []func() []string) {
	t.Helper()
	ups := []*upstream{newUpstream(t, "a"), newUpstream(t, "b"), newUpstream(t, "c")}
	var ids []func() []string
	for _, u := range ups {
		ids = append(ids, storingUpstream(u))
	}
	_, srv := newTestProxy(t, extra+providers(ups...)+fmt.Sprintf("[[routes]]\nmodel = \"m\"\nstrategy = %q\n", strategy)+
		"targets = [{ provider = \"p0\" }, { provider = \"p1\" }, { provider = \"p2\" }]\n"+
		"[[routes]]\nmodel = \"m2\"\ntargets = [{ provider = \"p2\" }]\n")
	return srv.URL, ups, ids
}

func TestStoredResponsesStayOnTheirReplica(t *testing.T) {
	for _, strategy := range []string{"round_robin", "least_load", "predicted_ttft", "cache_aware"} {
		t.Run(strategy, func(t *testing.T) {
			url, _, ids := storingFleet(t, strategy, openAuth)
			create := func(body string) (string, string) {
				t.Helper()
				resp, out := post(t, url+"/v1/responses", "", body)
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, out)
				}
				var r struct{ ID string }
				if err := json.Unmarshal(out, &r); err != nil {
					t.Fatal(err)
				}
				return r.ID, resp.Header.Get("X-Rolter-Provider")
			}
			// Each conversation continues its last response six times; a
			// strategy's spread (round_robin: every replica in turn) would
			// send most turns where the response is not stored.
			for c := range 3 {
				id, holder := create(fmt.Sprintf(`{"model":"m","input":"conversation %d"}`, c))
				if tag, ok := responseid.TagOf(id); !ok || tag != responseid.Tag(holder) {
					t.Fatalf("response id %q does not name its replica %s", id, holder)
				}
				for turn := range 6 {
					next, by := create(fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"turn %d"}`, id, turn))
					if by != holder {
						t.Fatalf("conversation %d turn %d served by %s; its responses are stored by %s", c, turn, by, holder)
					}
					id = next
				}
				// Retrieved, streamed, deleted and cancelled where it is.
				for _, q := range []struct{ method, suffix, want string }{
					{http.MethodGet, "", `"method":"GET"`},
					{http.MethodGet, "?stream=true", "event: response.completed"},
					{http.MethodDelete, "", `"method":"DELETE"`},
					{http.MethodPost, "/cancel", "Cannot cancel a synchronous response."},
				} {
					resp, out := send(t, q.method, url+"/v1/responses/"+id+q.suffix, "")
					if !strings.Contains(string(out), q.want) || resp.Header.Get("X-Rolter-Provider") != holder {
						t.Fatalf("%s %s%s: %d from %s: %s", q.method, id, q.suffix, resp.StatusCode, resp.Header.Get("X-Rolter-Provider"), out)
					}
				}
			}
			for i, f := range ids {
				for _, id := range f() {
					if _, ok := responseid.TagOf(id); !ok {
						t.Fatalf("replica %d was sent request_id %q, not one the gateway names", i, id)
					}
				}
			}
		})
	}
}

func TestStoredResponseIDsTheGatewayDidNotIssue(t *testing.T) {
	url, ups, ids := storingFleet(t, "round_robin", openAuth)
	// A client's own request_id is left as it is (and the proxy cannot
	// find its replica later).
	resp, out := post(t, url+"/v1/responses", "", `{"model":"m","request_id":"resp_mine","input":"x"}`)
	if resp.StatusCode != 200 || !strings.Contains(string(out), `"id":"resp_mine"`) {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	var sent []string
	for _, f := range ids {
		sent = append(sent, f()...)
	}
	if fmt.Sprint(sent) != "[resp_mine]" {
		t.Fatalf("request ids sent: %q", sent)
	}
	// Other endpoints' bodies are not touched.
	post(t, url+"/v1/chat/completions", "", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	for _, u := range ups {
		for _, b := range u.bodies {
			if _, ok := b["messages"]; ok && b["request_id"] != nil {
				t.Fatalf("a chat completion was sent a request_id: %v", b)
			}
		}
	}
	hits := func() (n int32) {
		for _, u := range ups {
			n += u.hits.Load()
		}
		return n
	}
	before := hits()
	forged := responseid.New(responseid.Tag("no-such-provider"))
	for _, c := range []struct{ method, path, code string }{
		{http.MethodGet, "/v1/responses/resp_mine", "not_found"},
		{http.MethodGet, "/v1/responses/" + forged, "not_found"},
		{http.MethodPost, "/v1/responses/" + forged + "/cancel", "not_found"},
		{http.MethodPut, "/v1/responses/" + forged, "method_not_allowed"},
		{http.MethodGet, "/v1/responses/" + forged + "/cancel", "method_not_allowed"},
		{http.MethodGet, "/v1/responses/" + forged + "/other", "not_found"},
		{http.MethodPost, "/v1/responses/compact", "not_found"},
		{http.MethodPost, "/v1/responses/input_tokens", "not_found"},
	} {
		resp, out := send(t, c.method, url+c.path, "")
		if resp.Header.Get("X-Rolter-Error") != c.code {
			t.Fatalf("%s %s: %d %s", c.method, c.path, resp.StatusCode, out)
		}
	}
	resp, out = post(t, url+"/v1/responses", "", fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"x"}`, forged))
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(out), "does not have") {
		t.Fatalf("a forged previous_response_id: %d %s", resp.StatusCode, out)
	}
	if n := hits(); n != before {
		t.Fatalf("%d upstream requests for ids that name no replica", n-before)
	}
}

func TestStoredResponsesHonourTheKey(t *testing.T) {
	url, _, _ := storingFleet(t, "round_robin", keys)
	// Route m2 is p2 alone: a response stored there.
	resp, out := post(t, url+"/v1/responses", "sk-rolter-full-000000000", `{"model":"m2","input":"x"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	var r struct{ ID string }
	_ = json.Unmarshal(out, &r)
	// only-p1 may not use p2; only-m2 may, through m2.
	for _, c := range []struct {
		key  string
		code string
	}{{"sk-rolter-p1-00000000000", "provider_not_allowed"}, {"sk-rolter-m2-00000000000", ""}, {"sk-rolter-full-000000000", ""}} {
		resp, out := send(t, http.MethodGet, url+"/v1/responses/"+r.ID, "", "Authorization", "Bearer "+c.key)
		if resp.Header.Get("X-Rolter-Error") != c.code || c.code == "" && resp.StatusCode != 200 {
			t.Fatalf("GET with %s: %d %s", c.key, resp.StatusCode, out)
		}
	}
	resp, out = post(t, url+"/v1/responses", "sk-rolter-p1-00000000000", fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"x"}`, r.ID))
	if resp.Header.Get("X-Rolter-Error") != "provider_not_allowed" {
		t.Fatalf("continued with a key that may not use its replica: %d %s", resp.StatusCode, out)
	}
	if resp, out := send(t, http.MethodGet, url+"/v1/responses/"+r.ID, ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET without a key: %d %s", resp.StatusCode, out)
	}
}

func TestStoredResponseReplicaDownIsNotFailedOver(t *testing.T) {
	url, ups, _ := storingFleet(t, "round_robin", openAuth)
	resp, out := post(t, url+"/v1/responses", "", `{"model":"m","input":"x"}`)
	var r struct{ ID string }
	_ = json.Unmarshal(out, &r)
	holder := resp.Header.Get("X-Rolter-Provider")
	var down *upstream
	for i, u := range ups {
		if fmt.Sprintf("p%d", i) == holder {
			down = u
		}
	}
	down.mu.Lock()
	down.handler = nil
	down.mu.Unlock()
	down.status.Store(http.StatusServiceUnavailable)
	hits := [3]int32{}
	for i, u := range ups {
		hits[i] = u.hits.Load()
	}
	for range 2 {
		resp, out = post(t, url+"/v1/responses", "", fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"y"}`, r.ID))
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("X-Rolter-Provider") != "" && resp.Header.Get("X-Rolter-Provider") != holder {
			t.Fatalf("continued while its replica fails: %d from %q: %s", resp.StatusCode, resp.Header.Get("X-Rolter-Provider"), out)
		}
	}
	for i, u := range ups {
		if got := u.hits.Load() - hits[i]; (u == down) != (got == 2) || u != down && got != 0 {
			t.Fatalf("replica p%d asked %d times; only the holder (%s) may be", i, got, holder)
		}
	}
}

func TestStoredResponseAnswerThatBreaksOffIsCut(t *testing.T) {
	// The replica's connection dies mid-stream, or its stream ends
	// cleanly before the terminal event (as vLLM's does when it cannot
	// replay a response): either way the client must see a cut answer.
	for _, hangUp := range []bool{true, false} {
		t.Run(fmt.Sprintf("hang up %v", hangUp), func(t *testing.T) {
			u := newUpstream(t, "a")
			u.handler = func(w http.ResponseWriter, r *http.Request) bool {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\"}\n\n")
				w.(http.Flusher).Flush()
				if conn, _, err := http.NewResponseController(w).Hijack(); hangUp && err == nil {
					_ = conn.Close()
				} else if err == nil {
					_, _ = conn.Write([]byte("0\r\n\r\n")) // the chunked body's clean end
					_ = conn.Close()
				}
				return true
			}
			p, srv := newTestProxy(t, openAuth+providers(u)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
			id := responseid.New(responseid.Tag("p0"))
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/v1/responses/"+id+"?stream=true", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil {
				t.Fatalf("a stream the replica broke off read as whole: %q", b)
			}
			if !strings.Contains(string(b), "response.created") || !strings.Contains(string(b), `"code":"upstream_error"`) {
				t.Fatalf("the events before the cut and an error event were not relayed: %q", b)
			}
			if n := testutil.ToFloat64(p.metrics.Requests.WithLabelValues("/v1/responses/{id}", "", "502", "")); n != 1 {
				t.Fatalf("requests counted 502: %v", n)
			}
		})
	}
}

func TestHostedResponsesKeepTheirOwnIDs(t *testing.T) {
	// Two hosted accounts, each storing the responses made on it under its
	// own ids, as OpenAI's API does.
	var ups []*upstream
	var ids [2]func() []string
	doc := openAuth
	for i := range 2 {
		u := newUpstream(t, fmt.Sprint(i))
		ids[i] = storingUpstream(u)
		ups = append(ups, u)
		doc += fmt.Sprintf("[[providers]]\nname = \"openai-%d\"\nkind = \"openai\"\napi_base = %q\napi_key = \"k%d\"\n", i, u.URL, i)
	}
	doc += "[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"openai-0\" }]\n[[routes]]\nmodel = \"m2\"\ntargets = [{ provider = \"openai-1\" }]\n"
	doc += `[[virtual_keys]]
name = "all"
key = "sk-rolter-all-0000000000"

[[virtual_keys]]
name = "only-m"
key = "sk-rolter-m-000000000000"
models = ["m"]
`
	_, srv := newTestProxy(t, doc)
	var made [2]string
	for i, model := range []string{"m", "m2"} {
		resp, out := post(t, srv.URL+"/v1/responses", "sk-rolter-all-0000000000", fmt.Sprintf(`{"model":%q,"input":"x"}`, model))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		var r struct{ ID string }
		_ = json.Unmarshal(out, &r)
		made[i] = r.ID
		if b, _ := ups[i].last(); b["request_id"] != nil {
			t.Fatalf("the hosted API was sent a request_id: %v", b)
		}
	}
	if ids[0]()[0] != "" || ids[1]()[0] != "" {
		t.Fatal("hosted creates carried a request_id")
	}
	// Their ids are the hosts' own (the fake's fixed one here is alike on
	// both): found by asking each account the key may use in turn.
	for i, c := range []struct{ key, id, provider string }{
		{"sk-rolter-all-0000000000", made[0], "openai-0"},
		{"sk-rolter-m-000000000000", made[0], "openai-0"},
	} {
		resp, out := send(t, http.MethodGet, srv.URL+"/v1/responses/"+c.id, "", "Authorization", "Bearer "+c.key)
		if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Provider") != c.provider {
			t.Fatalf("case %d: GET %s: %d from %q: %s", i, c.id, resp.StatusCode, resp.Header.Get("X-Rolter-Provider"), out)
		}
	}
	// An id only the second account holds: its first 404 is not the answer.
	ups[0].mu.Lock()
	ups[0].handler = nil
	ups[0].mu.Unlock()
	ups[0].status.Store(http.StatusNotFound)
	resp, out := send(t, http.MethodGet, srv.URL+"/v1/responses/"+made[1], "", "Authorization", "Bearer sk-rolter-all-0000000000")
	if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Provider") != "openai-1" {
		t.Fatalf("GET on the second account: %d from %q: %s", resp.StatusCode, resp.Header.Get("X-Rolter-Provider"), out)
	}
	// A key that may use only the first account gets its 404.
	resp, out = send(t, http.MethodGet, srv.URL+"/v1/responses/"+made[1], "", "Authorization", "Bearer sk-rolter-m-000000000000")
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("X-Rolter-Provider") != "openai-0" {
		t.Fatalf("GET with a key of the first account: %d from %q: %s", resp.StatusCode, resp.Header.Get("X-Rolter-Provider"), out)
	}
}

// FuzzStoredResponsePath holds storedResponsePath to its contract for any
// path: what it accepts is the prefix, one id segment and a known suffix.
func FuzzStoredResponsePath(f *testing.F) {
	for _, s := range []string{"/v1/responses/resp_1", "/v1/responses/resp_1/cancel", "/v1/responses/", "/v1/responses//cancel",
		"/v1/responses/a/b/c", "/v1/responses/compact", "/v1/responses/x/input_items"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		id, sub, ok := storedResponsePath(path)
		if !ok {
			return
		}
		if id == "" || strings.Contains(id, "/") || storedResponsesPrefix+id+sub != path ||
			sub != "" && sub != "/cancel" && sub != "/input_items" || id == "compact" || id == "input_tokens" {
			t.Fatalf("storedResponsePath(%q) = %q, %q", path, id, sub)
		}
	})
}

// TestBackgroundResponsesTeachRoutingNothing: an engine answers a
// background Responses request at once with the queued response and
// generates it later, so that answer's timing is no time to first token:
// predicted_ttft hears neither a first token nor a whole answer nor a
// completion of it, only that the attempt ended. The same request in the
// foreground teaches it as usual.
func TestBackgroundResponsesTeachRoutingNothing(t *testing.T) {
	for _, c := range []struct {
		body                  string
		first, whole, learned int
	}{
		{`{"model":"m","input":"x","background":true}`, 0, 0, 0},
		{`{"model":"m","input":"x","background":true,"stream":true}`, 0, 0, 0},
		{`{"model":"m","input":"x"}`, 0, 1, 1},
	} {
		t.Run(c.body, func(t *testing.T) {
			up := newUpstream(t, "u")
			up.handler = func(w http.ResponseWriter, _ *http.Request) bool {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"resp_1","object":"response","status":"queued","output":[],"usage":null}`)
				return true
			}
			_, rec, url, _ := recordedTTFTProxy(t, up)
			if resp, out := post(t, url+"/v1/responses", "", c.body); resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if rec.observed != 1 || rec.first != c.first || len(rec.whole) != c.whole || rec.learned != c.learned || len(rec.ends) != 1 {
				t.Fatalf("observed %d, first tokens %d, whole answers %d, learned %d, ended %d attempts; want 1, %d, %d, %d, 1",
					rec.observed, rec.first, len(rec.whole), rec.learned, len(rec.ends), c.first, c.whole, c.learned)
			}
		})
	}
}

// TestStoredResponsesPassTheDeliveryPolicy: a retrieval returns the output
// its create returned (or, answered queued in the background, never
// showed): it passes the output guardrails as the create's answer does,
// and a stream the policy cannot examine is refused up front.
func TestStoredResponsesPassTheDeliveryPolicy(t *testing.T) {
	u := newUpstream(t, "a")
	u.handler = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			fmt.Fprint(w, `{"id":"resp_1","object":"response","status":"queued","output":[]}`)
			return true
		}
		fmt.Fprint(w, `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"write to alice@example.com"}]}]}`)
		return true
	}
	guard := "[guardrails]\nstreaming_post_call = \"reject\"\n[[guardrails.rules]]\nname = \"email\"\nbuiltin = \"email\"\nstage = \"post_call\"\naction = \"block\"\n"
	_, srv := newTestProxy(t, openAuth+guard+providers(u)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	resp, out := post(t, srv.URL+"/v1/responses", "", `{"model":"m","input":"x","background":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("the queued create: %d %s", resp.StatusCode, out)
	}
	id := responseid.New(responseid.Tag("p0"))
	resp, out = send(t, http.MethodGet, srv.URL+"/v1/responses/"+id, "")
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Rolter-Error") != "guardrail_blocked" || strings.Contains(string(out), "alice") {
		t.Fatalf("a retrieval around the output guardrail: %d %s", resp.StatusCode, out)
	}
	hits := u.hits.Load()
	resp, out = send(t, http.MethodGet, srv.URL+"/v1/responses/"+id+"?stream=true", "")
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("X-Rolter-Error") != "guardrail_streaming_unsupported" || u.hits.Load() != hits {
		t.Fatalf("a streamed retrieval the guardrail cannot examine: %d %s", resp.StatusCode, out)
	}
}

// TestContinuationsFindTheirHostedAccount: a route over two hosted
// accounts continues a response only the second one stores; the first
// one's 404 sends the request on to the next account, and is no failure of
// the first (it is not parked, no upstream error is counted).
func TestContinuationsFindTheirHostedAccount(t *testing.T) {
	var ups []*upstream
	doc := openAuth
	for i := range 2 {
		u := newUpstream(t, fmt.Sprint(i))
		storingUpstream(u)
		ups = append(ups, u)
		doc += fmt.Sprintf("[[providers]]\nname = \"openai-%d\"\nkind = \"openai\"\napi_base = %q\napi_key = \"k%d\"\n", i, u.URL, i)
	}
	doc += "[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"openai-0\" }, { provider = \"openai-1\" }]\n" +
		"[[routes]]\nmodel = \"only-1\"\ntargets = [{ provider = \"openai-1\" }]\n"
	p, srv := newTestProxy(t, doc)
	resp, out := post(t, srv.URL+"/v1/responses", "", `{"model":"only-1","input":"x"}`)
	var r struct{ ID string }
	if resp.StatusCode != 200 || json.Unmarshal(out, &r) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, out)
	}
	for i := range 4 {
		resp, out := post(t, srv.URL+"/v1/responses", "", fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"more"}`, r.ID))
		if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Provider") != "openai-1" {
			t.Fatalf("continuation %d: %d from %q: %s", i, resp.StatusCode, resp.Header.Get("X-Rolter-Provider"), out)
		}
	}
	if ups[0].hits.Load() == 0 {
		t.Fatal("the first account was never asked: the test shows nothing")
	}
	if n := testutil.ToFloat64(p.metrics.UpstreamErrors.WithLabelValues("openai-0", "status_404")); n != 0 {
		t.Fatalf("the first account's 404s counted as its failures: %v", n)
	}
	// A response neither account stores: the last 404 is the answer.
	resp, out = post(t, srv.URL+"/v1/responses", "", `{"model":"m","previous_response_id":"resp_nowhere","input":"more"}`)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a continuation nobody stores: %d %s", resp.StatusCode, out)
	}
}
