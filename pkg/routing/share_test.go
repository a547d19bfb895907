package routing_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"rolter.dev/pkg/routing"
)

// pair is two balancers of one strategy where what a observes reaches b
// through flush, as the fleet does over NATS (when share is set).
type pair struct {
	a, b      routing.Balancer
	queued    []queuedPick
	published int
}

type queuedPick struct {
	target int
	prompt string
}

func newPair(t *testing.T, spec routing.Spec, n int, share bool) *pair {
	t.Helper()
	p := &pair{}
	if share {
		spec.Share = func(target int, prompt string) { p.queued = append(p.queued, queuedPick{target, prompt}) }
	}
	p.a = newBalancer(t, spec, n)
	if share {
		spec.Share = func(int, string) {}
	}
	p.b = newBalancer(t, spec, n)
	return p
}

// flush records a's queued picks in its shared index and folds what it
// would publish into b.
func (p *pair) flush() {
	for _, q := range p.queued {
		chunks := p.a.(routing.SharedAffinity).RecordLocal(q.target, q.prompt, nil)
		p.published += len(chunks)
		p.b.(routing.SharedAffinity).FoldPeer(q.target, slices.Clone(chunks))
	}
	p.queued = nil
}

func TestSharedAffinityFollowsPeers(t *testing.T) {
	specs := []routing.Spec{
		{Strategy: routing.CacheAware},
		{Strategy: routing.Pipeline, Scorers: map[string]float64{routing.ScorerLeastLoad: 0.1, routing.ScorerStaticWeight: 0}},
	}
	for _, spec := range specs {
		for _, share := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s share=%v", spec.Strategy, share), func(t *testing.T) {
				const n = 4
				pr := newPair(t, spec, n, share)
				a, b := pr.a, pr.b
				// Proxy a sends each of four conversations to its own target.
				convs := make([]string, n)
				for i := range convs {
					convs[i] = fmt.Sprintf("conversation %d: %s", i, strings.Repeat(fmt.Sprintf("turn of %d. ", i), 40))
				}
				placed := make([]int, n)
				pa := &proxy{b: a, loads: make([]int, n)}
				for i, c := range convs {
					placed[i] = pa.send(&routing.Context{Prompt: c}, routing.Set{})
				}
				pr.flush()
				if share && pr.published == 0 {
					t.Fatal("nothing was published")
				}
				// Proxy b, which never saw these prompts, gets their next turns.
				hits := 0
				for i, c := range convs {
					next := b.Pick(&routing.Context{Prompt: c + " and the next turn"}, make([]int, n), routing.Set{})
					if next == placed[i] {
						hits++
					}
				}
				if share && hits != n {
					t.Fatalf("with sharing, %d of %d next turns went where their prefix is", hits, n)
				}
				if !share && hits == n {
					t.Fatal("without sharing every next turn followed its prefix: the test cannot tell sharing apart")
				}
			})
		}
	}
}

func TestSharedAffinityExportWarmsANewProxy(t *testing.T) {
	const n = 3
	pr := newPair(t, routing.Spec{Strategy: routing.CacheAware}, n, true)
	prompt := strings.Repeat("a long shared system prompt. ", 20)
	pr.a.Observe(2, &routing.Context{Prompt: prompt})
	if len(pr.queued) != 1 || pr.queued[0].target != 2 {
		t.Fatalf("Observe handed %v to Share", pr.queued)
	}
	if pr.a.(routing.SharedAffinity).SharedStats()[2].Chunks != 0 {
		t.Fatal("Observe did the index work on the request path")
	}
	pr.flush()
	fresh := newBalancer(t, routing.Spec{Strategy: routing.CacheAware, Share: func(int, string) {}}, n).(routing.SharedAffinity)
	for i := range n {
		fresh.FoldPeer(i, pr.a.(routing.SharedAffinity).ExportShared(i, nil, 0))
	}
	if got := fresh.(routing.Balancer).Pick(&routing.Context{Prompt: prompt + "question"}, []int{0, 0, 0}, routing.Set{}); got != 2 {
		t.Fatalf("warmed proxy picked %d, want 2", got)
	}
	st := fresh.SharedStats()
	if len(st) != n || st[2].Chunks == 0 || st[0].Chunks != 0 {
		t.Fatalf("shared stats %+v", st)
	}
}

func TestSharingOffByDefault(t *testing.T) {
	b := newBalancer(t, routing.Spec{Strategy: routing.CacheAware}, 2).(routing.SharedAffinity)
	b.FoldPeer(1, []uint64{1, 2, 3})
	if b.SharedStats() != nil || b.ExportShared(1, nil, 0) != nil {
		t.Fatal("a balancer built without Spec.Share keeps a shared index")
	}
}

// TestSharedAffinityConvergesAfterABurst: two proxies placed the same new
// prefix on different targets in the same instant, before either heard of
// the other. Once they have, the next requests of that prefix go to the same
// one of the two copies whichever proxy they reach (so the other copy ages
// out), though each proxy holds its own copy byte for byte and its peer's
// only to the last whole chunk; and different prefixes in that situation do
// not all prefer the same target.
func TestSharedAffinityConvergesAfterABurst(t *testing.T) {
	const n = 4
	var qa, qb []queuedPick
	a := newBalancer(t, routing.Spec{Strategy: routing.CacheAware, Share: func(tg int, p string) { qa = append(qa, queuedPick{tg, p}) }}, n)
	b := newBalancer(t, routing.Spec{Strategy: routing.CacheAware, Share: func(tg int, p string) { qb = append(qb, queuedPick{tg, p}) }}, n)
	exchange := func() {
		for _, q := range qa {
			b.(routing.SharedAffinity).FoldPeer(q.target, a.(routing.SharedAffinity).RecordLocal(q.target, q.prompt, nil))
		}
		for _, q := range qb {
			a.(routing.SharedAffinity).FoldPeer(q.target, b.(routing.SharedAffinity).RecordLocal(q.target, q.prompt, nil))
		}
		qa, qb = nil, nil
	}
	preferred := make([]int, n)
	for g := range 32 {
		sys := fmt.Sprintf("group %d. ", g) + systemPrompt
		first := &routing.Context{Prompt: sys + question(0)}
		a.Observe(1, first)
		b.Observe(2, first)
		exchange()
		loads := make([]int, n)
		for i := 1; i <= 3; i++ {
			next := &routing.Context{Prompt: sys + question(i)}
			pa, pb := a.Pick(next, loads, routing.All(n)), b.Pick(next, loads, routing.All(n))
			if pa != pb || (pa != 1 && pa != 2) {
				t.Fatalf("group %d, request %d: proxy a picked %d, proxy b %d; want the same of the copies on 1 and 2", g, i, pa, pb)
			}
			preferred[pa]++
		}
	}
	if preferred[1] == 0 || preferred[2] == 0 {
		t.Errorf("picks per target %v: every prefix prefers the same copy", preferred)
	}
}

// A prompt shorter than a chunk (no copy to agree on) keeps cache_aware's
// rule with sharing on: the greatest exact match wins when it clears the
// threshold.
func TestSharedAffinityShortPrompt(t *testing.T) {
	const n = 4
	b := newBalancer(t, routing.Spec{Strategy: routing.CacheAware, Share: func(int, string) {}}, n)
	b.Observe(3, &routing.Context{Prompt: "hi there, how are you"})
	for range 8 {
		if got := b.Pick(&routing.Context{Prompt: "hi there, how are you doing"}, make([]int, n), routing.All(n)); got != 3 {
			t.Fatalf("picked %d, want 3 (21 of 27 bytes match)", got)
		}
	}
}

// A prefix two targets hold: every pick prefers the same one, and when the
// load guard finds it overloaded the pick goes to the other holder, not to
// a least-loaded target without the prefix (only when every holder is
// overloaded does it spill).
func TestSharedAffinitySpreadsOverHolders(t *testing.T) {
	const n = 4
	b := newBalancer(t, routing.Spec{Strategy: routing.CacheAware, Share: func(int, string) {}}, n)
	ctx := &routing.Context{Prompt: systemPrompt + question(0)}
	b.Observe(1, ctx)
	b.Observe(2, ctx)
	next := &routing.Context{Prompt: systemPrompt + question(1)}
	first := b.Pick(next, make([]int, n), routing.All(n))
	if first != 1 && first != 2 {
		t.Fatalf("picked %d, want a holder (1 or 2)", first)
	}
	other := 3 - first
	loads := make([]int, n)
	loads[first] = 10
	if got := b.Pick(next, loads, routing.All(n)); got != other {
		t.Fatalf("preferred holder %d overloaded: picked %d, want the other holder %d", first, got, other)
	}
	loads[other] = 10
	if got := b.Pick(next, loads, routing.All(n)); got != 0 && got != 3 {
		t.Fatalf("both holders overloaded: picked %d, want a spill to 0 or 3", got)
	}
	d := b.(routing.DecisionCounter).Decisions()
	if d[routing.DecisionAffinityHit] != 2 || d[routing.DecisionLoadSpill] != 1 {
		t.Errorf("decisions %v: want 2 affinity hits and 1 spill", d)
	}
}
