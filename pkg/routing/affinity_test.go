package routing_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"rolter.dev/pkg/routing"
)

// affinityStrategies are the strategies that read the request context.
var affinityStrategies = []string{routing.ConsistentHash, routing.CacheAware, routing.Pipeline, routing.PredictedLatency, routing.PreciseCacheAware, routing.LMCacheAware}

// randomContext returns a context drawn from a small pool, so prompts share
// prefixes, sessions repeat and digests collide now and then.
func randomContext(rng *rand.Rand) *routing.Context {
	if rng.IntN(10) == 0 {
		return nil
	}
	ctx := &routing.Context{}
	if rng.IntN(4) != 0 {
		ctx.Prompt = fmt.Sprintf("system %d: %s user: %d", rng.IntN(3), strings.Repeat("policy ", rng.IntN(30)), rng.IntN(20))
	}
	if rng.IntN(3) == 0 {
		ctx.SessionKey = fmt.Sprintf("session-%d", rng.IntN(10))
	}
	if rng.IntN(3) == 0 {
		ctx.HasDigest, ctx.PromptDigest, ctx.PromptLen = true, rng.Uint64N(50), 40<<10
	}
	if rng.IntN(5) == 0 {
		ctx.TokenIDs = make([]uint32, rng.IntN(50))
	}
	return ctx
}

// TestAffinityEligibilityRandomized drives every context-reading strategy
// with random target counts, weights, loads, contexts and eligible subsets:
// a pick is always in range, never outside the eligible set while that set
// has a member below n, and anything in range when it has none.
func TestAffinityEligibilityRandomized(t *testing.T) {
	for _, s := range affinityStrategies {
		t.Run(s, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(42, uint64(len(s))))
			picks := 0
			for trial := range 300 {
				n := 1 + rng.IntN(16)
				if trial%10 == 0 {
					n = 1 + rng.IntN(routing.MaxTargets)
				}
				weights := make([]int, n)
				for i := range weights {
					weights[i] = rng.IntN(12) - 2
				}
				b := newBalancer(t, routing.Spec{Strategy: s, Weights: weights, MaxTrieNodes: 1 + rng.IntN(2000)}, n)
				var loads []int
				switch trial % 3 {
				case 1:
					loads = make([]int, n)
					for i := range loads {
						loads[i] = rng.IntN(6)
					}
				case 2:
					loads = make([]int, n+1)
				}
				var el routing.Set
				switch p := rng.Float64(); {
				case trial%7 == 0:
				case trial%11 == 0:
					for i := n; i < routing.MaxTargets; i += 3 {
						el.Add(i)
					}
				default:
					for i := range routing.MaxTargets {
						if rng.Float64() < p {
							el.Add(i)
						}
					}
				}
				below := el.Below(n)
				for range 40 {
					ctx := randomContext(rng)
					got := b.Pick(ctx, loads, el)
					picks++
					if got < 0 || got >= n {
						t.Fatalf("trial %d: Pick = %d out of [0,%d)", trial, got, n)
					}
					if !below.Empty() && !below.Has(got) {
						t.Fatalf("trial %d: Pick = %d not in eligible %v (n=%d)", trial, got, below, n)
					}
					b.Observe(got, ctx)
					if l, ok := b.(routing.Learner); ok {
						l.Learn(got, ctx, rng.IntN(5), time.Duration(rng.IntN(2000))*time.Millisecond)
					}
				}
			}
			if picks < 5000 {
				t.Fatalf("only %d picks", picks)
			}
		})
	}
}

func TestAffinityNoTargets(t *testing.T) {
	for _, s := range affinityStrategies {
		b := newBalancer(t, routing.Spec{Strategy: s}, 0)
		ctx := &routing.Context{Prompt: "p", SessionKey: "s"}
		for _, el := range []routing.Set{{}, eligibleOf(0, 1)} {
			if got := b.Pick(ctx, nil, el); got != -1 {
				t.Errorf("%s with n=0: Pick = %d, want -1", s, got)
			}
		}
		b.Observe(0, ctx)
		if l, ok := b.(routing.Learner); ok {
			l.Learn(0, ctx, 0, time.Second)
		}
	}
}

// TestAffinityEmptyEligibleWeighsAll: with nothing eligible every target is
// reachable.
func TestAffinityEmptyEligibleWeighsAll(t *testing.T) {
	const n = 6
	for _, s := range affinityStrategies {
		b := newBalancer(t, routing.Spec{Strategy: s}, n)
		seen := make([]int, n)
		for range 600 {
			seen[b.Pick(nil, nil, eligibleOf(n, 200))]++
		}
		for i, c := range seen {
			if c == 0 {
				t.Errorf("%s: target %d never picked: %v", s, i, seen)
			}
		}
	}
}

func TestAffinityPickDoesNotAllocate(t *testing.T) {
	prompt := strings.Repeat("system prompt ", 300) + "question"
	ctxs := []*routing.Context{
		nil,
		{},
		{Prompt: prompt},
		{Prompt: prompt, SessionKey: "session-1"},
		{Prompt: prompt, HasDigest: true, PromptDigest: 77, PromptLen: 50000, TokenIDs: make([]uint32, 30)},
	}
	for _, s := range affinityStrategies {
		for _, n := range []int{8, 64, routing.MaxTargets} {
			b := newBalancer(t, routing.Spec{Strategy: s}, n)
			loads := make([]int, n)
			for i := range n {
				b.Observe(i, &routing.Context{Prompt: prompt[:100*(i%20)], SessionKey: "session-1"})
				if l, ok := b.(routing.Learner); ok {
					for range 10 {
						l.Learn(i, ctxs[4], i%3, time.Duration(100+i)*time.Millisecond)
					}
				}
			}
			var half routing.Set
			for i := 0; i < n; i += 2 {
				half.Add(i)
			}
			for _, ctx := range ctxs {
				for _, el := range []routing.Set{routing.All(n), half, {}} {
					for _, l := range [][]int{loads, nil} {
						if a := testing.AllocsPerRun(50, func() { b.Pick(ctx, l, el) }); a != 0 {
							t.Errorf("%s n=%d ctx=%+v eligible=%d: %v allocs per pick", s, n, ctx != nil, el.Len(), a)
						}
					}
				}
			}
		}
	}
}

// TestAffinityConcurrent hammers each strategy from many goroutines under
// -race, observing and learning as the proxy does.
func TestAffinityConcurrent(t *testing.T) {
	const n, goroutines, per = 5, 8, 300
	for _, s := range affinityStrategies {
		t.Run(s, func(t *testing.T) {
			b := newBalancer(t, routing.Spec{Strategy: s, MaxTrieNodes: 5000}, n)
			el := eligibleOf(0, 1, 3, 4)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 9))
					loads := make([]int, n)
					for range per {
						ctx := randomContext(rng)
						got := b.Pick(ctx, loads, el)
						if !el.Has(got) {
							t.Errorf("Pick = %d not eligible", got)
							return
						}
						b.Observe(got, ctx)
						if l, ok := b.(routing.Learner); ok {
							l.Learn(got, ctx, loads[got], time.Duration(rng.IntN(500))*time.Millisecond)
						}
						loads[got] = rng.IntN(4)
					}
				})
			}
			wg.Go(func() {
				for range 50 {
					if ts, ok := b.(routing.TrieStats); ok {
						_ = ts.TrieStats()
					}
					if dc, ok := b.(routing.DecisionCounter); ok {
						_ = dc.Decisions()
					}
				}
			})
			wg.Wait()
		})
	}
}
