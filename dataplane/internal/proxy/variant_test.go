package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"

	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/natstest"
	"rolter.dev/pkg/routing"
	"rolter.dev/pkg/syncbuf"
)

const chat = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

// variantRoute is a route m with two variants, stable on p0 and canary on
// p1 (weights given), after providers(…).
func variantRoute(stable, canary int, extra string) string {
	return fmt.Sprintf(`
[server]
require_auth = false
[accounting]
sink = "none"
[retry]
base_backoff_ms = 1
max_backoff_ms = 1
[cooldown]
base_secs = 300
max_secs = 300

[[routes]]
model = "m"
%s
[[routes.variants]]
name = "stable"
weight = %d
targets = [{ provider = "p0" }]

[[routes.variants]]
name = "canary"
weight = %d
targets = [{ provider = "p1" }]
`, extra, stable, canary)
}

// sessionRankedFirst finds an x-session-id the proxy assigns to want.
func sessionRankedFirst(t *testing.T, want string, names []string, weights []int) string {
	t.Helper()
	for i := range 100_000 {
		id := fmt.Sprintf("s-%d", i)
		if r := routing.RankVariants(nil, routing.AssignmentKey(id, "", ""), names, weights); len(r) > 0 && names[r[0]] == want {
			return id
		}
	}
	t.Fatalf("no session ranks %s first", want)
	return ""
}

func variantServedBy(t *testing.T, b []byte) string {
	t.Helper()
	var out struct {
		ServedBy string `json:"served_by"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return out.ServedBy
}

// TestVariantSplit: requests are split by weight, sticky per x-session-id
// and per virtual key, and every answer names its variant.
func TestVariantSplit(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	_, srv := newTestProxy(t, providers(a, b)+variantRoute(80, 20, "")+keys+"[[routes]]\nmodel = \"m2\"\ntargets = [{ provider = \"p0\" }]\n")
	const n = 1000
	count := map[string]int{}
	for i := range n {
		resp, body := post(t, srv.URL+"/v1/chat/completions", "sk-rolter-full-000000000", chat, "X-Session-Id", fmt.Sprintf("user-%d", i))
		v := resp.Header.Get("X-Rolter-Variant")
		want := map[string]string{"stable": "a", "canary": "b"}[v]
		if resp.StatusCode != 200 || variantServedBy(t, body) != want {
			t.Fatalf("status %d, variant %q, served by %s", resp.StatusCode, v, variantServedBy(t, body))
		}
		count[v]++
	}
	// 4 standard deviations of a binomial at n = 1000, p = 0.2.
	if share := float64(count["canary"]) / n; math.Abs(share-0.2) > 0.05 {
		t.Errorf("canary share %.3f over %d sessions, want 0.20 ± 0.05 (%v)", share, n, count)
	}
	sticky := func(hdr ...string) map[string]int {
		seen := map[string]int{}
		for range 20 {
			resp, _ := post(t, srv.URL+"/v1/chat/completions", "sk-rolter-full-000000000", chat, hdr...)
			seen[resp.Header.Get("X-Rolter-Variant")]++
		}
		return seen
	}
	if seen := sticky("X-Session-Id", "user-7"); len(seen) != 1 {
		t.Errorf("one session got several variants: %v", seen)
	}
	if seen := sticky(); len(seen) != 1 {
		t.Errorf("one virtual key without a session got several variants: %v", seen)
	}
	// A plain route has no variant header.
	if resp, _ := post(t, srv.URL+"/v1/chat/completions", "sk-rolter-full-000000000", `{"model":"m2"}`); resp.Header.Get("X-Rolter-Variant") != "" {
		t.Errorf("plain route: x-rolter-variant %q", resp.Header.Get("X-Rolter-Variant"))
	}
}

// TestVariantPerRequestWithoutSessionOrKey: with neither a session nor a
// key, each request is assigned on its own, so both variants are seen.
func TestVariantPerRequestWithoutSessionOrKey(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	_, srv := newTestProxy(t, providers(a, b)+variantRoute(50, 50, ""))
	seen := map[string]int{}
	for range 64 {
		resp, _ := post(t, srv.URL+"/v1/chat/completions", "", chat)
		seen[resp.Header.Get("X-Rolter-Variant")]++
	}
	if seen["stable"] == 0 || seen["canary"] == 0 {
		t.Errorf("64 anonymous requests: %v", seen)
	}
}

// TestVariantDeadTargetRetriesInsideVariant: a failing target of the
// assigned variant is retried on the variant's other target, not on
// another variant.
func TestVariantDeadTargetRetriesInsideVariant(t *testing.T) {
	a, b, c := newUpstream(t, "a"), newUpstream(t, "b"), newUpstream(t, "c")
	a.status.Store(503)
	doc := providers(a, b, c) + openAuth + `
[accounting]
sink = "none"
[retry]
base_backoff_ms = 1
max_backoff_ms = 1
[[routes]]
model = "m"
[[routes.variants]]
name = "stable"
strategy = "round_robin"
targets = [{ provider = "p0" }, { provider = "p1" }]
[[routes.variants]]
name = "canary"
targets = [{ provider = "p2" }]
`
	_, srv := newTestProxy(t, doc)
	sess := sessionRankedFirst(t, "stable", []string{"stable", "canary"}, []int{1, 1})
	for range 4 {
		resp, body := post(t, srv.URL+"/v1/chat/completions", "", chat, "X-Session-Id", sess)
		if resp.StatusCode != 200 || variantServedBy(t, body) != "b" || resp.Header.Get("X-Rolter-Variant") != "stable" {
			t.Fatalf("status %d, served by %s, variant %q", resp.StatusCode, variantServedBy(t, body), resp.Header.Get("X-Rolter-Variant"))
		}
	}
	if c.hits.Load() != 0 {
		t.Errorf("the canary got %d requests of a stable session", c.hits.Load())
	}
	if a.hits.Load() != 1 {
		t.Errorf("the parked target got %d requests, want 1", a.hits.Load())
	}
}

// TestVariantIneligibleFallsOver: when every target of the assigned
// variant is down, the request goes to the next variant of its ranking;
// the down variant does not shape the pick, and its answer is not asked
// again while it is parked.
func TestVariantIneligibleFallsOver(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	b.status.Store(503)
	_, srv := newTestProxy(t, providers(a, b)+variantRoute(1, 1, ""))
	sess := sessionRankedFirst(t, "canary", []string{"stable", "canary"}, []int{1, 1})
	for range 5 {
		resp, body := post(t, srv.URL+"/v1/chat/completions", "", chat, "X-Session-Id", sess)
		if resp.StatusCode != 200 || variantServedBy(t, body) != "a" || resp.Header.Get("X-Rolter-Variant") != "stable" {
			t.Fatalf("status %d, served by %s, variant %q", resp.StatusCode, variantServedBy(t, body), resp.Header.Get("X-Rolter-Variant"))
		}
	}
	if n := b.hits.Load(); n != 1 {
		t.Errorf("the parked canary got %d requests, want 1 (the first, which parked it)", n)
	}
}

// TestVariantNothingEligibleFailsOpenInAssigned: with every target of
// every variant parked, the request fails open as a plain route does, in
// its assigned variant.
func TestVariantNothingEligibleFailsOpenInAssigned(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	a.status.Store(503)
	b.status.Store(503)
	_, srv := newTestProxy(t, providers(a, b)+variantRoute(1, 1, ""))
	sess := sessionRankedFirst(t, "canary", []string{"stable", "canary"}, []int{1, 1})
	if resp, _ := post(t, srv.URL+"/v1/chat/completions", "", chat, "X-Session-Id", sess); resp.StatusCode != 503 {
		t.Fatalf("both down: status %d", resp.StatusCode)
	}
	if a.hits.Load() != 1 || b.hits.Load() != 1 {
		t.Fatalf("hits a=%d b=%d, want one each (the canary, then the stable fall-over)", a.hits.Load(), b.hits.Load())
	}
	a.status.Store(0)
	b.status.Store(0)
	resp, body := post(t, srv.URL+"/v1/chat/completions", "", chat, "X-Session-Id", sess)
	if resp.StatusCode != 200 || variantServedBy(t, body) != "b" || resp.Header.Get("X-Rolter-Variant") != "canary" {
		t.Fatalf("status %d, served by %s, variant %q; want the assigned canary, failed open", resp.StatusCode, variantServedBy(t, body), resp.Header.Get("X-Rolter-Variant"))
	}
}

// TestVariantNeverPastKeyAllowList: a variant whose targets the key may
// not use is skipped, and failing open never reaches them either.
func TestVariantNeverPastKeyAllowList(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	_, srv := newTestProxy(t, providers(a, b)+variantRoute(1, 1000, "")+keys+"[[routes]]\nmodel = \"m2\"\ntargets = [{ provider = \"p0\" }]\n")
	// only-p1 may use the canary only; full's canary-ranked session.
	for range 5 {
		resp, body := post(t, srv.URL+"/v1/chat/completions", "sk-rolter-p1-00000000000", chat)
		if resp.StatusCode != 200 || variantServedBy(t, body) != "b" {
			t.Fatalf("only-p1: status %d, served by %s", resp.StatusCode, variantServedBy(t, body))
		}
	}
	sess := sessionRankedFirst(t, "stable", []string{"stable", "canary"}, []int{1, 1000})
	b.status.Store(503)
	for range 3 {
		// The canary is down, the stable variant is not allowed to the key:
		// the answer is the canary's own failure, never the stable target.
		resp, _ := post(t, srv.URL+"/v1/chat/completions", "sk-rolter-p1-00000000000", chat, "X-Session-Id", sess)
		if resp.StatusCode != 503 || resp.Header.Get("X-Rolter-Variant") != "canary" {
			t.Fatalf("status %d, variant %q", resp.StatusCode, resp.Header.Get("X-Rolter-Variant"))
		}
	}
	if a.hits.Load() != 0 {
		t.Errorf("a key limited to p1 reached p0 %d times", a.hits.Load())
	}
}

// TestVariantPin: x-rolter-variant pins a variant only where the route
// allows it; an unknown name is refused.
func TestVariantPin(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	_, srv := newTestProxy(t, providers(a, b)+variantRoute(1, 0, "allow_variant_pin = true"))
	for range 3 {
		resp, body := post(t, srv.URL+"/v1/chat/completions", "", chat, "X-Rolter-Variant", "canary")
		if resp.StatusCode != 200 || variantServedBy(t, body) != "b" || resp.Header.Get("X-Rolter-Variant") != "canary" {
			t.Fatalf("pinned to the drained canary: status %d, served by %s", resp.StatusCode, variantServedBy(t, body))
		}
	}
	if resp, _ := post(t, srv.URL+"/v1/chat/completions", "", chat); resp.Header.Get("X-Rolter-Variant") != "stable" {
		t.Error("a weight-0 variant was assigned without a pin")
	}
	if resp, body := post(t, srv.URL+"/v1/chat/completions", "", chat, "X-Rolter-Variant", "nope"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("unknown pin: status %d %s", resp.StatusCode, body)
	}

	_, off := newTestProxy(t, providers(a, b)+variantRoute(1, 0, ""))
	if resp, _ := post(t, off.URL+"/v1/chat/completions", "", chat, "X-Rolter-Variant", "canary"); resp.Header.Get("X-Rolter-Variant") != "stable" {
		t.Error("a pin was honoured on a route that does not allow it")
	}
}

// TestVariantCacheNeverCrosses: an answer is replayed only to requests
// assigned to the variant that produced it, and an answer produced by a
// fall-over variant is not stored.
func TestVariantCacheNeverCrosses(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	doc := "[cache]\nenabled = true\n" + providers(a, b) + variantRoute(1, 1, "allow_variant_pin = true\n[routes.cache]\nttl_secs = 600\n")
	_, srv := newTestProxy(t, doc)
	ask := func(variant string) (string, string, string) {
		resp, body := post(t, srv.URL+"/v1/chat/completions", "", chat, "X-Rolter-Variant", variant)
		return resp.Header.Get("X-Rolter-Cache"), variantServedBy(t, body), resp.Header.Get("X-Rolter-Variant")
	}
	if c, s, _ := ask("stable"); c != "MISS" || s != "a" {
		t.Fatalf("stable first: %s from %s", c, s)
	}
	if c, s, v := ask("stable"); c != "HIT" || s != "a" || v != "stable" {
		t.Fatalf("stable again: %s from %s (%s)", c, s, v)
	}
	if c, s, _ := ask("canary"); c != "MISS" || s != "b" {
		t.Fatalf("canary got %s from %s", c, s)
	}
	if c, s, v := ask("canary"); c != "HIT" || s != "b" || v != "canary" {
		t.Fatalf("canary again: %s from %s (%s)", c, s, v)
	}

	// Falling over: a canary session served by stable stores nothing.
	_, srv2 := newTestProxy(t, doc)
	b.status.Store(503)
	sess := sessionRankedFirst(t, "canary", []string{"stable", "canary"}, []int{1, 1})
	body := `{"model":"m","messages":[{"role":"user","content":"fall over"}]}`
	for i := range 3 {
		resp, got := post(t, srv2.URL+"/v1/chat/completions", "", body, "X-Session-Id", sess)
		if resp.StatusCode != 200 || variantServedBy(t, got) != "a" || resp.Header.Get("X-Rolter-Cache") != "MISS" {
			t.Fatalf("request %d: status %d from %s, cache %q; want a stable MISS every time", i, resp.StatusCode, variantServedBy(t, got), resp.Header.Get("X-Rolter-Cache"))
		}
	}
}

// TestVariantBalancersKeptAcrossWeightChange: a reload that only moves
// weights keeps every variant's balancer; a variant whose targets change
// gets a new one, the others keep theirs.
func TestVariantBalancersKeptAcrossWeightChange(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	p, _ := newTestProxy(t, providers(a, b)+variantRoute(90, 10, "strategy = \"cache_aware\""))
	before := p.rt.Load().routes["m"].pools
	apply := func(doc string) { t.Helper(); applyDoc(t, p, doc) }
	apply(providers(a, b) + variantRoute(75, 25, "strategy = \"cache_aware\""))
	after := p.rt.Load().routes["m"]
	if after.pools[0].balancer != before[0].balancer || after.pools[1].balancer != before[1].balancer {
		t.Error("a weight change rebuilt a variant's balancer")
	}
	if after.weights[0] != 75 || after.weights[1] != 25 {
		t.Errorf("weights %v", after.weights)
	}
	doc := providers(a, b) + variantRoute(75, 25, "strategy = \"cache_aware\"")
	apply(doc[:len(doc)-len("targets = [{ provider = \"p1\" }]\n")] + "targets = [{ provider = \"p1\" }, { provider = \"p0\" }]\n")
	again := p.rt.Load().routes["m"].pools
	if again[0].balancer != before[0].balancer || again[1].balancer == before[1].balancer {
		t.Error("changing the canary's targets must rebuild its balancer only")
	}
}

// TestVariantObservability: the variant that answered is in the metrics'
// variant label (empty for a plain route), the usage row and the access log.
func TestVariantObservability(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	usagePath := t.TempDir() + "/usage.jsonl"
	doc := providers(a, b) + strings.Replace(variantRoute(1, 1, "allow_variant_pin = true"), "sink = \"none\"", fmt.Sprintf("sink = \"file\"\npath = %q", usagePath), 1) +
		"[[routes]]\nmodel = \"plain\"\ntargets = [{ provider = \"p0\" }]\n"
	var logs syncbuf.Buffer
	p := New(Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	applyDoc(t, p, doc)
	url := newServer(t, p)
	post(t, url+"/v1/chat/completions", "", chat, "X-Rolter-Variant", "canary")
	post(t, url+"/v1/chat/completions", "", `{"model":"plain"}`)
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`rolter_requests_total{code="200",endpoint="/v1/chat/completions",model="m",variant="canary"} 1`,
		`rolter_requests_total{code="200",endpoint="/v1/chat/completions",model="plain",variant=""} 1`,
		`rolter_request_ttft_seconds_count{model="m",variant="canary"} 1`,
	} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if !strings.Contains(logs.String(), `"variant":"canary"`) {
		t.Errorf("access log lacks the variant:\n%s", logs.String())
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	rows, _ := os.ReadFile(usagePath)
	if !strings.Contains(string(rows), `"variant":"canary"`) || strings.Count(string(rows), `"variant"`) != 1 {
		t.Errorf("usage rows:\n%s", rows)
	}
}

// TestWarnsWhenKVEventsAreNotFollowed: a route whose strategy reads the
// engines' KV events, to providers that publish them, on a proxy that
// follows none (file mode without --nats) is logged once per balancer built,
// naming the route; the same route with cache_aware, or a proxy that
// follows the events, is not.
func TestWarnsWhenKVEventsAreNotFollowed(t *testing.T) {
	a := newUpstream(t, "a")
	doc := func(strategy string) string {
		return openAuth + fmt.Sprintf("\n[[providers]]\nname = \"v\"\nkind = \"openai_compatible\"\napi_base = %q\n[providers.kv_events]\nendpoint = \"tcp://127.0.0.1:5557\"\n\n[[routes]]\nmodel = \"m\"\nstrategy = %q\ntargets = [{ provider = \"v\" }]\n", a.URL, strategy)
	}
	const warning = "follows none"
	for _, tc := range []struct {
		strategy string
		kv       bool
		want     bool
	}{
		{"predicted_ttft", false, true},
		{"precise_cache_aware", false, true},
		{"cache_aware", false, false},
		{"predicted_ttft", true, false},
	} {
		var logs syncbuf.Buffer
		opts := Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
		if tc.kv {
			ix, err := kvindex.New(natstest.Connect(t, natstest.Start(t)), nil, kvindex.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(ix.Close)
			opts.KVIndex = ix
		}
		p := New(opts)
		applyDoc(t, p, doc(tc.strategy))
		if got := strings.Contains(logs.String(), warning); got != tc.want {
			t.Errorf("%s, KV index %v: warned %v, want %v:\n%s", tc.strategy, tc.kv, got, tc.want, logs.String())
		}
		if tc.want && !strings.Contains(logs.String(), `"route":"m"`) {
			t.Errorf("%s: the warning does not name the route:\n%s", tc.strategy, logs.String())
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
