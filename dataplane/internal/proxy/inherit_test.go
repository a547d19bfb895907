package proxy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"rolter.dev/pkg/routing"
)

// A reload that adds a replica to a predicted_ttft route (an autoscaler's
// new target) builds a new balancer that inherits what the old one
// learned: the fitted law, and at each kept target, matched by provider
// and model whatever its new index, the prompts it holds. A reload that
// changes the strategy's settings starts from nothing.
func TestReloadAddingATargetInheritsPredictedTTFT(t *testing.T) {
	route := ttftRoute(t)
	p, _ := newTestProxy(t, route("", "p0", "p1"))
	old := p.rt.Load().routes["m"].pools[0].balancer
	conv, want := teachTTFT(t, old)

	applyDoc(t, p, route("", "p2", "p1", "p0")) // p1 is now target 1, p0 target 2
	b2 := p.rt.Load().routes["m"].pools[0].balancer
	if b2 == old {
		t.Fatal("a reload that added a target kept the old balancer (its target indexes changed meaning)")
	}
	if got := b2.(routing.LawReporter).Law(); got.OwnMSPer1K != want.OwnMSPer1K || got.BaseMS != want.BaseMS || !got.Fitted {
		t.Fatalf("after adding a target the law is %+v, want the old one's %+v", got, want)
	}
	next := &routing.Context{Prompt: conv + "and its next turn"}
	for range 5 {
		if got := b2.Pick(next, []int{0, 0, 0}, routing.All(3)); got != 1 {
			t.Fatalf("the conversation's next turn went to target %d, want 1 (p1, which holds it)", got)
		}
	}

	applyDoc(t, p, route("[routes.balancer]\nspeculative_ttl_ms = 250\n", "p2", "p1", "p0"))
	if got := p.rt.Load().routes["m"].pools[0].balancer.(routing.LawReporter).Law(); got.Fitted {
		t.Fatalf("a balancer with other settings inherited the law: %+v", got)
	}
}

// A balancer reads some of its providers' settings when it is built:
// predicted_ttft the KV capacity and the engine load's table, the
// strategies that route on KV events the model their block identities are
// seeded with. A reload that changes
// one builds a new balancer (predicted_ttft's inherits the old one's
// state) rather than keeping the old value; a reload that changes nothing
// keeps it, and one that changes what the strategy does not read too.
func TestReloadChangingWhatABalancerReadsRebuildsIt(t *testing.T) {
	up := newUpstream(t, "a")
	doc := func(strategy string, capacity int, model string, engineLoad bool) string {
		el := ""
		if engineLoad {
			el = "[providers.engine_load]\n"
		}
		return fmt.Sprintf(openAuth+"[[providers]]\nname = \"p0\"\nkind = \"openai_compatible\"\napi_base = %q\nkv_capacity_tokens = %d\n"+
			"[providers.kv_events]\nendpoint = \"tcp://127.0.0.1:5557\"\nmodel = %q\n%s"+
			"[[routes]]\nmodel = \"m\"\nstrategy = %q\ntargets = [{ provider = \"p0\" }]\n", up.URL, capacity, model, el, strategy)
	}
	for _, tc := range []struct {
		strategy                   string
		capacity, seed, engineLoad bool // whether a change of each rebuilds
	}{
		{"predicted_ttft", true, true, true},
		{"precise_cache_aware", false, true, false},
		{"cache_aware", false, false, false},
	} {
		p, _ := newTestProxy(t, doc(tc.strategy, 100000, "sim", false))
		balancer := func() routing.Balancer { return p.rt.Load().routes["m"].pools[0].balancer }
		old := balancer()
		applyDoc(t, p, doc(tc.strategy, 100000, "sim", false))
		if balancer() != old {
			t.Fatalf("%s: a reload that changed nothing rebuilt the balancer", tc.strategy)
		}
		applyDoc(t, p, doc(tc.strategy, 200000, "sim", false))
		if rebuilt := balancer() != old; rebuilt != tc.capacity {
			t.Fatalf("%s: a reload that changed kv_capacity_tokens rebuilt the balancer: %v, want %v", tc.strategy, rebuilt, tc.capacity)
		}
		old = balancer()
		applyDoc(t, p, doc(tc.strategy, 200000, "other", false))
		if rebuilt := balancer() != old; rebuilt != tc.seed {
			t.Fatalf("%s: a reload that changed kv_events.model rebuilt the balancer: %v, want %v", tc.strategy, rebuilt, tc.seed)
		}
		old = balancer()
		applyDoc(t, p, doc(tc.strategy, 200000, "other", true))
		if rebuilt := balancer() != old; rebuilt != tc.engineLoad {
			t.Fatalf("%s: a reload that added [providers.engine_load] rebuilt the balancer: %v, want %v", tc.strategy, rebuilt, tc.engineLoad)
		}
	}
}

// ttftRoute returns a config builder for a predicted_ttft route "m" over
// the named providers of three upstreams (p0, p1, p2), with extra after
// the route's table.
func ttftRoute(t *testing.T) func(extra string, targets ...string) string {
	a, b, c := newUpstream(t, "a"), newUpstream(t, "b"), newUpstream(t, "c")
	return func(extra string, targets ...string) string {
		var ts []string
		for _, p := range targets {
			ts = append(ts, fmt.Sprintf("{ provider = %q }", p))
		}
		return openAuth + providers(a, b, c) + "[[routes]]\nmodel = \"m\"\nstrategy = \"predicted_ttft\"\n" +
			"targets = [" + strings.Join(ts, ", ") + "]\n" + extra
	}
}

// teachTTFT teaches a predicted_ttft balancer over two targets first
// tokens that fit a law, and a conversation held at target 1; it returns
// the conversation and the law.
func teachTTFT(t *testing.T, b routing.Balancer) (conv string, law routing.LawState) {
	t.Helper()
	for i := range 40 {
		tokens := 200 + 100*(i%17)
		ctx := &routing.Context{Prompt: strings.Repeat(fmt.Sprintf("prompt %d ", i), tokens/3)}
		b.Observe(i%2, ctx)
		ttft := 5*time.Millisecond + time.Duration(tokens)*50*time.Microsecond
		b.(routing.TTFTObserver).FirstToken(i%2, ctx, ttft, tokens)
		b.(routing.Learner).Learn(i%2, ctx, 0, ttft)
	}
	conv = strings.Repeat("a conversation held at p1. ", 400)
	held := &routing.Context{Prompt: conv}
	b.Observe(1, held)
	b.(routing.TTFTObserver).FirstToken(1, held, 20*time.Millisecond, 0)
	b.(routing.Learner).Learn(1, held, 0, 20*time.Millisecond)
	law = b.(routing.LawReporter).Law()
	if !law.Fitted {
		t.Fatalf("the taught balancer's law is not fitted: %+v", law)
	}
	return conv, law
}
