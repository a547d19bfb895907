package proxy

import (
	"path/filepath"
	"testing"
	"time"

	"rolter.dev/dataplane/internal/routingstate"
	"rolter.dev/pkg/routing"
)

// A proxy restarted with the state its previous process wrote (the
// --routing-state file) builds its predicted_ttft balancer with what the
// old one learned: the fitted law, and at each target, matched by provider
// and model whatever its index in the new config, the prompts it holds.
// A state written for other settings, or damaged, is not read: the
// balancer starts from nothing, and the proxy serves.
func TestRestartReadsBackPredictedTTFT(t *testing.T) {
	route := ttftRoute(t)
	p, _ := newTestProxy(t, route("", "p0", "p1"))
	conv, want := teachTTFT(t, p.rt.Load().routes["m"].pools[0].balancer)

	if _, ok := New(Options{}).RoutingState(); ok {
		t.Fatal("a proxy with no config reports a routing state to write")
	}
	state, ok := p.RoutingState()
	if !ok || len(state) != 1 || state[0].Route != "m" || len(state[0].Targets) != 2 {
		t.Fatalf("routing state %+v (ok %v), want route m's balancer over 2 targets", state, ok)
	}
	path := filepath.Join(t.TempDir(), "routing.state")
	if _, err := routingstate.Save(path, state); err != nil {
		t.Fatal(err)
	}
	saved, _, err := routingstate.Load(path)
	if err != nil {
		t.Fatal(err)
	}

	// The restarted proxy's config lists a new replica first: p1 is now
	// target 1, p0 target 2.
	restarted := New(Options{Restore: saved})
	applyDoc(t, restarted, route("", "p2", "p1", "p0"))
	b2 := restarted.rt.Load().routes["m"].pools[0].balancer
	if got := b2.(routing.LawReporter).Law(); !got.Fitted || got.OwnMSPer1K != want.OwnMSPer1K || got.BaseMS != want.BaseMS {
		t.Fatalf("after the restart the law is %+v, want the old one's %+v", got, want)
	}
	next := &routing.Context{Prompt: conv + "and its next turn"}
	for range 5 {
		if got := b2.Pick(next, []int{0, 0, 0}, routing.All(3)); got != 1 {
			t.Fatalf("the conversation's next turn went to target %d, want 1 (p1, which holds it)", got)
		}
	}
	// Read by the first config only: a reload that changes the targets
	// inherits from the running balancer, not from the file again.
	b2.Observe(1, next)
	b2.(routing.TTFTObserver).FirstToken(1, next, 30*time.Millisecond, 100)
	applyDoc(t, restarted, route("", "p1", "p0"))
	if got := restarted.rt.Load().routes["m"].pools[0].balancer.(routing.LawReporter).Law(); got.FirstTokens != 1 {
		t.Fatalf("after a reload the balancer counts %d first tokens, want the running one's 1 (inherited, not read again)", got.FirstTokens)
	}

	for name, r := range map[string]*Proxy{
		"other settings": New(Options{Restore: saved}),
		"damaged state":  New(Options{Restore: []routingstate.Route{{Route: "m", Settings: saved[0].Settings, Targets: saved[0].Targets, State: []byte("rpt\x01garbage")}}}),
	} {
		doc := route("", "p0", "p1")
		if name == "other settings" {
			doc = route("[routes.balancer]\nspeculative_ttl_ms = 250\n", "p0", "p1")
		}
		applyDoc(t, r, doc)
		if got := r.rt.Load().routes["m"].pools[0].balancer.(routing.LawReporter).Law(); got.Fitted {
			t.Fatalf("%s: the balancer read the law anyway: %+v", name, got)
		}
	}
}

// Each variant of a route keeps its own state: the restarted proxy's
// variant reads back its own balancer's, not its sibling's.
func TestRestartReadsBackEachVariant(t *testing.T) {
	a, b, c := newUpstream(t, "a"), newUpstream(t, "b"), newUpstream(t, "c")
	doc := openAuth + providers(a, b, c) + `[[routes]]
model = "m"
[[routes.variants]]
name = "stable"
strategy = "predicted_ttft"
targets = [{ provider = "p0" }, { provider = "p1" }]
[[routes.variants]]
name = "canary"
strategy = "predicted_ttft"
targets = [{ provider = "p1" }, { provider = "p2" }]
`
	p, _ := newTestProxy(t, doc)
	pools := p.rt.Load().routes["m"].pools
	if len(pools) != 2 || pools[1].variant != "canary" {
		t.Fatalf("pools %+v, want stable and canary", pools)
	}
	teachTTFT(t, pools[1].balancer) // the canary only
	state, _ := p.RoutingState()
	if len(state) != 2 || state[0].Variant != "stable" || state[1].Variant != "canary" {
		t.Fatalf("routing state %+v, want one entry per variant", state)
	}
	restarted := New(Options{Restore: state})
	applyDoc(t, restarted, doc)
	pools = restarted.rt.Load().routes["m"].pools
	if pools[0].balancer.(routing.LawReporter).Law().Fitted || !pools[1].balancer.(routing.LawReporter).Law().Fitted {
		t.Fatalf("after the restart stable fitted %v, canary fitted %v; want only the canary's law read back",
			pools[0].balancer.(routing.LawReporter).Law().Fitted, pools[1].balancer.(routing.LawReporter).Law().Fitted)
	}
}
