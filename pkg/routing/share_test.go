package routing_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"rolter.dev/pkg/routing"
)

// pairOfProxies builds two balancers of one strategy where everything a
// publishes folds into b (when share is set), as the fleet does over NATS.
func pairOfProxies(t *testing.T, spec routing.Spec, n int, share bool) (a, b routing.Balancer, published *int) {
	t.Helper()
	var count int
	var sink routing.SharedAffinity
	if share {
		spec.Share = func(target int, chunks []uint64) {
			count += len(chunks)
			if sink != nil {
				sink.FoldPeer(target, slices.Clone(chunks))
			}
		}
	}
	a = newBalancer(t, spec, n)
	spec.Share = func(int, []uint64) {}
	if !share {
		spec.Share = nil
	}
	b = newBalancer(t, spec, n)
	if share {
		sink = b.(routing.SharedAffinity)
	}
	return a, b, &count
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
				a, b, published := pairOfProxies(t, spec, n, share)
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
				if share && *published == 0 {
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
	spec := routing.Spec{Strategy: routing.CacheAware, Share: func(int, []uint64) {}}
	old := newBalancer(t, spec, n)
	prompt := strings.Repeat("a long shared system prompt. ", 20)
	old.Observe(2, &routing.Context{Prompt: prompt})
	fresh := newBalancer(t, spec, n).(routing.SharedAffinity)
	for i := range n {
		fresh.FoldPeer(i, old.(routing.SharedAffinity).ExportShared(i, nil, 0))
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
