package routing

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// basicStrategies are the strategies of this file's scope.
var basicStrategies = []string{RoundRobin, Random, Weighted, PowerOfTwo, LeastLoad}

func mustNew(t testing.TB, strategy string, weights []int) Balancer {
	t.Helper()
	b, err := New(Spec{Strategy: strategy, Weights: weights})
	if err != nil {
		t.Fatalf("New(%s, %v): %v", strategy, weights, err)
	}
	if b.Name() != strategy {
		t.Fatalf("New(%s).Name() = %q", strategy, b.Name())
	}
	return b
}

func ones(n int) []int {
	w := make([]int, n)
	for i := range w {
		w[i] = 1
	}
	return w
}

func setOf(idx ...int) Set {
	var s Set
	for _, i := range idx {
		s.Add(i)
	}
	return s
}

func TestNew(t *testing.T) {
	for _, s := range basicStrategies {
		mustNew(t, s, ones(3))
		mustNew(t, s, nil)
	}
	if _, err := New(Spec{Strategy: "nope", Weights: ones(2)}); !errors.Is(err, ErrUnknownStrategy) {
		t.Fatalf("unknown strategy: err = %v", err)
	}
	if _, err := New(Spec{Strategy: RoundRobin, Weights: ones(MaxTargets + 1)}); err == nil {
		t.Fatal("more than MaxTargets targets: no error")
	}
	mustNew(t, RoundRobin, ones(MaxTargets))
}

func TestNoTargets(t *testing.T) {
	for _, s := range basicStrategies {
		b := mustNew(t, s, nil)
		for _, el := range []Set{{}, setOf(0), setOf(0, 1, 200)} {
			for _, loads := range [][]int{nil, {}, {1, 2}} {
				if got := b.Pick(&Context{}, loads, el); got != -1 {
					t.Errorf("%s with n=0: Pick(%v, %v) = %d, want -1", s, loads, el, got)
				}
			}
		}
		b.Observe(0, &Context{}) // no-op, must not panic
	}
}

// TestEligibilityRandomized drives every strategy with random target counts,
// weights, loads and eligible subsets from a fixed seed: a pick is always in
// range, never outside the eligible set while that set has a member below n,
// and anything in range when it has none.
func TestEligibilityRandomized(t *testing.T) {
	for _, s := range basicStrategies {
		t.Run(s, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(42, uint64(len(s))))
			picks := 0
			for trial := 0; trial < 300; trial++ {
				n := 1 + rng.IntN(16)
				if trial%10 == 0 {
					n = 1 + rng.IntN(MaxTargets)
				}
				weights := make([]int, n)
				for i := range weights {
					weights[i] = rng.IntN(12) - 2 // includes 0 and negatives (clamped to 1)
				}
				b := mustNew(t, s, weights)
				var loads []int
				switch trial % 3 {
				case 0: // unknown
				case 1:
					loads = make([]int, n)
					for i := range loads {
						loads[i] = rng.IntN(6)
					}
				case 2: // wrong length: treated as unknown
					loads = make([]int, n+1)
				}
				var el Set
				switch p := rng.Float64(); {
				case trial%7 == 0: // nothing eligible
				case trial%11 == 0: // only members at or above n: nothing eligible
					for i := n; i < MaxTargets; i += 3 {
						el.Add(i)
					}
				default:
					for i := 0; i < MaxTargets; i++ {
						if rng.Float64() < p {
							el.Add(i)
						}
					}
				}
				below := el.Below(n)
				for k := 0; k < 40; k++ {
					got := b.Pick(&Context{}, loads, el)
					b.Observe(got, &Context{})
					picks++
					if got < 0 || got >= n {
						t.Fatalf("trial %d: Pick = %d out of [0,%d)", trial, got, n)
					}
					if !below.Empty() && !below.Has(got) {
						t.Fatalf("trial %d: Pick = %d not in eligible %v (n=%d)", trial, got, below, n)
					}
					if s == LeastLoad && len(loads) == n {
						w := below.OrAll(n)
						for i := 0; i < n; i++ {
							if w.Has(i) && loads[i] < loads[got] {
								t.Fatalf("trial %d: least_load picked %d (load %d) but %d has load %d",
									trial, got, loads[got], i, loads[i])
							}
						}
					}
				}
			}
			if picks < 5000 {
				t.Fatalf("only %d picks", picks)
			}
		})
	}
}

// TestEmptyEligibleWeighsAll: with nothing eligible every target is reachable.
func TestEmptyEligibleWeighsAll(t *testing.T) {
	const n = 6
	for _, s := range basicStrategies {
		for _, el := range []Set{{}, setOf(n, n+1, 255)} {
			b := mustNew(t, s, ones(n))
			seen := make([]int, n)
			for k := 0; k < 600; k++ {
				seen[b.Pick(nil, nil, el)]++
			}
			for i, c := range seen {
				if c == 0 {
					t.Errorf("%s, eligible %v: target %d never picked: %v", s, el, i, seen)
				}
			}
		}
	}
}

func pickN(b Balancer, k int, loads []int, el Set) []int {
	out := make([]int, k)
	for i := range out {
		out[i] = b.Pick(nil, loads, el)
	}
	return out
}

func counts(picks []int, n int) []int {
	c := make([]int, n)
	for _, p := range picks {
		c[p]++
	}
	return c
}

func TestRoundRobin(t *testing.T) {
	tests := []struct {
		name  string
		n     int
		el    Set
		first []int
	}{
		{"all eligible cycles", 4, All(4), []int{0, 1, 2, 3, 0, 1, 2, 3, 0}},
		{"none eligible cycles all", 3, Set{}, []int{0, 1, 2, 0, 1, 2}},
		{"one ineligible skipped evenly", 4, setOf(0, 2, 3), []int{0, 2, 3, 0, 2, 3, 0}},
		{"single eligible", 5, setOf(4), []int{4, 4, 4}},
		{"high indexes", 200, setOf(70, 199), []int{70, 199, 70, 199}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustNew(t, RoundRobin, ones(tt.n))
			if got := pickN(b, len(tt.first), nil, tt.el); !slices.Equal(got, tt.first) {
				t.Fatalf("picks = %v, want %v", got, tt.first)
			}
		})
	}
	// Even shares: 4 targets, one ineligible, 3000 picks → exactly 1000 each.
	b := mustNew(t, RoundRobin, ones(4))
	if got := counts(pickN(b, 3000, []int{9, 9, 9, 9}, setOf(0, 1, 3)), 4); !slices.Equal(got, []int{1000, 1000, 0, 1000}) {
		t.Fatalf("counts = %v", got)
	}
}

func TestRandomUniform(t *testing.T) {
	b := mustNew(t, Random, ones(8))
	el := setOf(1, 3, 4, 7)
	c := counts(pickN(b, 8000, nil, el), 8)
	for i, v := range c {
		if el.Has(i) && (v < 1700 || v > 2300) { // expected 2000, sd ≈ 39
			t.Errorf("target %d picked %d times of 8000, want ≈2000: %v", i, v, c)
		}
		if !el.Has(i) && v != 0 {
			t.Errorf("ineligible target %d picked: %v", i, c)
		}
	}
}

// nginxSWRR is a straightforward reference implementation of smooth weighted
// round robin with eligibility.
type nginxSWRR struct{ w, cur []int }

func (r *nginxSWRR) pick(el Set) int {
	n := len(r.w)
	el = el.OrAll(n)
	best, total := -1, 0
	for i := 0; i < n; i++ {
		if !el.Has(i) {
			continue
		}
		r.cur[i] += r.w[i]
		total += r.w[i]
		if best < 0 || r.cur[i] > r.cur[best] {
			best = i
		}
	}
	r.cur[best] -= total
	return best
}

func TestWeightedSequence(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
		el      Set
		first   []int
	}{
		{"3,1", []int{3, 1}, All(2), []int{0, 0, 1, 0, 0, 0, 1, 0}},
		{"nginx 5,1,1", []int{5, 1, 1}, All(3), []int{0, 0, 1, 0, 2, 0, 0, 0, 0, 1, 0, 2, 0, 0}},
		{"clamped to 1", []int{0, -4, 1}, All(3), []int{0, 1, 2, 0, 1, 2}},
		{"all ineligible weighs all", []int{3, 1}, Set{}, []int{0, 0, 1, 0}},
		{"eligibility removes 0", []int{3, 1, 2}, setOf(1, 2), []int{2, 1, 2, 2, 1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustNew(t, Weighted, tt.weights)
			if got := pickN(b, len(tt.first), nil, tt.el); !slices.Equal(got, tt.first) {
				t.Fatalf("picks = %v, want %v", got, tt.first)
			}
		})
	}
	b := mustNew(t, Weighted, []int{3, 1})
	if got := counts(pickN(b, 40, nil, All(2)), 2); !slices.Equal(got, []int{30, 10}) {
		t.Fatalf("[3,1] over 40 picks = %v, want [30 10]", got)
	}
}

// TestWeightedMatchesNginx checks the lock-free state against the reference
// implementation, pick by pick, with the eligible set changing on every pick.
func TestWeightedMatchesNginx(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 100; trial++ {
		n := 1 + rng.IntN(12)
		if trial%10 == 0 {
			n = 60 + rng.IntN(MaxTargets-60)
		}
		w := make([]int, n)
		for i := range w {
			w[i] = 1 + rng.IntN(9)
		}
		ref := &nginxSWRR{w: w, cur: make([]int, n)}
		b := mustNew(t, Weighted, w)
		for k := 0; k < 200; k++ {
			var el Set
			if k%3 != 0 {
				el, _ = randomSet(rng, n, rng.Float64())
			}
			want := ref.pick(el)
			if got := b.Pick(nil, nil, el); got != want {
				t.Fatalf("trial %d pick %d (w=%v, eligible %v): got %d, want %d", trial, k, w, el, got, want)
			}
		}
	}
}

// TestWeightedEligibilityShare: a removed target's share goes to the others
// in proportion to their weights, and it resumes its share when restored.
func TestWeightedEligibilityShare(t *testing.T) {
	b := mustNew(t, Weighted, []int{2, 1, 3})
	if got := counts(pickN(b, 600, nil, setOf(1, 2)), 3); !slices.Equal(got, []int{0, 150, 450}) {
		t.Fatalf("without target 0: counts = %v, want [0 150 450]", got)
	}
	if got := counts(pickN(b, 600, nil, All(3)), 3); !slices.Equal(got, []int{200, 100, 300}) {
		t.Fatalf("all restored: counts = %v, want [200 100 300]", got)
	}
}

func TestPowerOfTwo(t *testing.T) {
	t.Run("two targets always lower load", func(t *testing.T) {
		b := mustNew(t, PowerOfTwo, ones(2))
		for _, loads := range [][]int{{5, 0}, {0, 5}} {
			want := 0
			if loads[1] < loads[0] {
				want = 1
			}
			for k := 0; k < 200; k++ {
				if got := b.Pick(nil, loads, Set{}); got != want {
					t.Fatalf("loads %v: Pick = %d, want %d", loads, got, want)
				}
			}
		}
	})
	t.Run("prefers lower load", func(t *testing.T) {
		const n, picks = 8, 8000
		b := mustNew(t, PowerOfTwo, ones(n))
		loads := []int{5, 5, 0, 5, 5, 5, 5, 9} // 2 is the unique min, 7 the unique max
		c := counts(pickN(b, picks, loads, All(n)), n)
		// Target 2 wins whenever it is drawn: P = 1 - (7/8)(6/7) = 1/4.
		if c[2] < picks*20/100 || c[2] > picks*30/100 {
			t.Errorf("min-load target picked %d/%d, want ≈25%%: %v", c[2], picks, c)
		}
		if c[7] != 0 {
			t.Errorf("unique max-load target picked %d times: %v", c[7], c)
		}
	})
	t.Run("single eligible", func(t *testing.T) {
		b := mustNew(t, PowerOfTwo, ones(8))
		for k := 0; k < 50; k++ {
			if got := b.Pick(nil, []int{0, 0, 0, 0, 0, 9, 0, 0}, setOf(5)); got != 5 {
				t.Fatalf("Pick = %d, want 5", got)
			}
		}
	})
	t.Run("eligibility beats load", func(t *testing.T) {
		b := mustNew(t, PowerOfTwo, ones(4))
		loads := []int{0, 9, 8, 7}
		c := counts(pickN(b, 3000, loads, setOf(1, 2, 3)), 4)
		if c[0] != 0 || c[1] != 0 || c[3] < c[2] {
			t.Fatalf("counts = %v: want 0 never, 1 never (max), 3 most", c)
		}
	})
	t.Run("unknown loads uniform", func(t *testing.T) {
		b := mustNew(t, PowerOfTwo, ones(4))
		c := counts(pickN(b, 8000, nil, All(4)), 4)
		for i, v := range c {
			if v < 1700 || v > 2300 {
				t.Errorf("target %d picked %d/8000, want ≈2000: %v", i, v, c)
			}
		}
	})
}

func TestLeastLoad(t *testing.T) {
	tests := []struct {
		name  string
		n     int
		loads []int
		el    Set
		first []int
	}{
		{"unique min", 4, []int{3, 1, 2, 5}, All(4), []int{1, 1, 1}},
		{"min among eligible", 4, []int{3, 0, 2, 5}, setOf(0, 2, 3), []int{2, 2, 2}},
		{"ties rotate", 5, []int{1, 0, 0, 1, 0}, All(5), []int{1, 2, 4, 1, 2, 4, 1}},
		{"ties rotate among eligible", 5, []int{1, 0, 0, 1, 0}, setOf(0, 2, 3, 4), []int{2, 4, 2, 4}},
		{"idle route spreads", 3, []int{0, 0, 0}, Set{}, []int{0, 1, 2, 0, 1, 2}},
		{"unknown loads rotate", 3, nil, All(3), []int{0, 1, 2, 0, 1, 2}},
		{"unknown loads rotate eligible", 3, nil, setOf(0, 2), []int{0, 2, 0, 2}},
		{"wrong-length loads rotate", 3, []int{0}, All(3), []int{0, 1, 2, 0}},
		{"negative loads", 3, []int{0, -1, 3}, All(3), []int{1, 1}},
		{"high indexes", 200, func() []int {
			l := make([]int, 200)
			for i := range l {
				l[i] = 5
			}
			l[150], l[190] = 1, 1
			return l
		}(), Set{}, []int{150, 190, 150}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustNew(t, LeastLoad, ones(tt.n))
			if got := pickN(b, len(tt.first), tt.loads, tt.el); !slices.Equal(got, tt.first) {
				t.Fatalf("picks = %v, want %v", got, tt.first)
			}
		})
	}
}

// TestConcurrentPicks hammers each strategy from many goroutines under -race.
func TestConcurrentPicks(t *testing.T) {
	const goroutines, per = 8, 500
	run := func(t *testing.T, b Balancer, n int, loads []int, el Set) []int {
		t.Helper()
		var mu sync.Mutex
		total := make([]int, n)
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			wg.Go(func() {
				local := make([]int, n)
				for k := 0; k < per; k++ {
					p := b.Pick(nil, loads, el)
					if p < 0 || p >= n {
						t.Errorf("Pick = %d out of range", p)
						return
					}
					b.Observe(p, nil)
					local[p]++
				}
				mu.Lock()
				for i, v := range local {
					total[i] += v
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		return total
	}
	exact := []int{1000, 1000, 1000, 1000}
	t.Run(RoundRobin, func(t *testing.T) {
		if got := run(t, mustNew(t, RoundRobin, ones(4)), 4, nil, All(4)); !slices.Equal(got, exact) {
			t.Fatalf("counts = %v, want %v", got, exact)
		}
		got := run(t, mustNew(t, RoundRobin, ones(5)), 5, nil, setOf(0, 1, 3, 4))
		if !slices.Equal(got, []int{1000, 1000, 0, 1000, 1000}) {
			t.Fatalf("with 2 ineligible: counts = %v", got)
		}
	})
	t.Run(LeastLoad, func(t *testing.T) {
		if got := run(t, mustNew(t, LeastLoad, ones(4)), 4, []int{2, 2, 2, 2}, All(4)); !slices.Equal(got, exact) {
			t.Fatalf("tied loads: counts = %v, want %v", got, exact)
		}
		if got := run(t, mustNew(t, LeastLoad, ones(4)), 4, nil, All(4)); !slices.Equal(got, exact) {
			t.Fatalf("unknown loads: counts = %v, want %v", got, exact)
		}
	})
	t.Run(Weighted, func(t *testing.T) {
		b := mustNew(t, Weighted, []int{3, 1})
		got := run(t, b, 2, nil, All(2))
		// Racing picks can shift a few picks; shares stay exact up to about
		// one pick per concurrent goroutine.
		if d := got[0] - 3000; d < -2*goroutines || d > 2*goroutines || got[0]+got[1] != 4000 {
			t.Fatalf("[3,1] counts = %v, want ≈[3000 1000]", got)
		}
		// The state is exactly nginx's for the picks made: current values
		// sum to 0 and stay within a few totals of 0.
		w := b.(*weighted)
		g, sum := w.picks.Load(), int64(0)
		for i := range w.w {
			cur := g*w.w[i] - w.debt[i].Load()
			sum += cur
			if cur < -int64(goroutines+1)*w.total || cur > int64(goroutines+1)*w.total {
				t.Errorf("current[%d] = %d after concurrent picks", i, cur)
			}
		}
		if sum != 0 {
			t.Errorf("sum of current = %d, want 0", sum)
		}
		c := run(t, mustNew(t, Weighted, []int{3, 1, 4}), 3, nil, setOf(0, 2))
		// 4000 * 3/7 = 1714.3 for target 0, 2285.7 for target 2.
		if c[1] != 0 || c[0] < 1714-2*goroutines || c[0] > 1715+2*goroutines {
			t.Fatalf("[3,1,4] without 1: counts = %v, want ≈[1714 0 2286]", c)
		}
	})
	for _, s := range []string{Random, PowerOfTwo} {
		t.Run(s, func(t *testing.T) {
			got := run(t, mustNew(t, s, ones(4)), 4, []int{0, 0, 0, 0}, setOf(0, 2, 3))
			if got[1] != 0 || got[0]+got[2]+got[3] != 4000 {
				t.Fatalf("counts = %v", got)
			}
			for _, i := range []int{0, 2, 3} {
				if got[i] < 1000 {
					t.Errorf("target %d got %d of 4000, want ≈1333: %v", i, got[i], got)
				}
			}
		})
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	for _, s := range basicStrategies {
		for _, n := range []int{8, 64, MaxTargets} {
			b := mustNew(t, s, ones(n))
			loads := make([]int, n)
			half := Set{}
			for i := 0; i < n; i += 2 {
				half.Add(i)
			}
			ctx := &Context{}
			for _, el := range []Set{All(n), half, {}} {
				if a := testing.AllocsPerRun(200, func() { b.Pick(ctx, loads, el); b.Observe(0, ctx) }); a != 0 {
					t.Errorf("%s n=%d eligible %d: %v allocs per pick", s, n, el.Len(), a)
				}
			}
		}
	}
}

func BenchmarkPick(b *testing.B) {
	for _, s := range basicStrategies {
		for _, n := range []int{8, 64} {
			weights := make([]int, n)
			loads := make([]int, n)
			half := Set{}
			for i := range n {
				weights[i] = 1 + i%4
				loads[i] = (i * 7) % 5
				if i%2 == 0 {
					half.Add(i)
				}
			}
			for _, c := range []struct {
				name string
				el   Set
			}{{"all", All(n)}, {"half", half}} {
				b.Run(fmt.Sprintf("%s/n=%d/%s", s, n, c.name), func(b *testing.B) {
					bal := mustNew(b, s, weights)
					ctx := &Context{}
					b.ReportAllocs()
					for b.Loop() {
						bal.Pick(ctx, loads, c.el)
					}
				})
			}
		}
	}
}

// TestSeededIntN: with Spec.IntN every random draw comes from it, so two
// balancers built with equally seeded sources pick the same sequence, and a
// constant source decides every draw.
func TestSeededIntN(t *testing.T) {
	seeded := func(seed uint64) func(int) int { return rand.New(rand.NewPCG(seed, 7)).IntN }
	ctx := &Context{Prompt: "the same prompt every time"}
	for _, s := range []string{Random, PowerOfTwo, Pipeline, PredictedLatency, PreciseCacheAware, LMCacheAware} {
		picks := func(seed uint64) []int {
			b, err := New(Spec{Strategy: s, Weights: ones(8), IntN: seeded(seed)})
			if err != nil {
				t.Fatal(err)
			}
			var out []int
			for range 64 {
				out = append(out, b.Pick(ctx, make([]int, 8), All(8)))
			}
			return out
		}
		a, b, c := picks(1), picks(1), picks(2)
		if !slices.Equal(a, b) {
			t.Errorf("%s: the same seed picked %v and %v", s, a, b)
		}
		if slices.Equal(a, c) {
			t.Errorf("%s: seeds 1 and 2 picked the same 64 targets %v: the source is not used", s, a)
		}
	}
	// A source that always answers 0: random takes the first eligible
	// target, and reservoir sampling replaces its pick at every tie, so a
	// tie break ends on the last tied target.
	zero := func(int) int { return 0 }
	for s, want := range map[string]int{Random: 1, Pipeline: 6, PreciseCacheAware: 6} {
		b, err := New(Spec{Strategy: s, Weights: ones(8), IntN: zero})
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Pick(ctx, make([]int, 8), setOf(1, 4, 6)); got != want {
			t.Errorf("%s with IntN = 0: picked %d, want %d", s, got, want)
		}
	}
}
