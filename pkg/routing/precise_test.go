package routing_test

import (
	"testing"
	"time"

	"rolter.dev/pkg/routing"
)

// fakeKV is a KVSource with fixed per-target scores.
type fakeKV struct {
	scores     []float64
	fresh      bool
	speculated []int
	ttls       []time.Duration
}

func (f *fakeKV) KVScores(_ []uint32, out []float64) bool {
	copy(out, f.scores)
	return f.fresh
}

func (f *fakeKV) Speculate(target int, _ []uint32, ttl time.Duration) {
	f.speculated = append(f.speculated, target)
	f.ttls = append(f.ttls, ttl)
}

type fakeLM struct {
	scores []float64
	fresh  bool
}

func (f *fakeLM) LMCacheScores(out []float64) bool { copy(out, f.scores); return f.fresh }

func TestPreciseCacheAware(t *testing.T) {
	ids := &routing.Context{TokenIDs: []uint32{1, 2, 3}}
	tests := []struct {
		name   string
		kv     *fakeKV
		ctx    *routing.Context
		loads  []int
		el     routing.Set
		want   int
		decide string
		lw     float64 // load weight; 0: the default (1.0)
	}{
		{"the replica holding the prefix wins", &fakeKV{scores: []float64{0, 1, 0.2}, fresh: true}, ids, []int{0, 0, 0}, routing.All(3), 1, routing.DecisionScored, 0},
		{"load only shifts it by its weight", &fakeKV{scores: []float64{0, 1, 0}, fresh: true}, ids, []int{0, 4, 0}, routing.All(3), 1, routing.DecisionScored, 0.25},
		{"a busier holder keeps it while the others are busy too", &fakeKV{scores: []float64{0, 1, 0}, fresh: true}, ids, []int{1, 2, 1}, routing.All(3), 1, routing.DecisionScored, 0},
		{"with the default weight a full prefix outweighs less than a whole queue", &fakeKV{scores: []float64{0, 0.6, 0}, fresh: true}, ids, []int{0, 4, 2}, routing.All(3), 0, routing.DecisionScored, 0},
		{"ineligible holder loses", &fakeKV{scores: []float64{0, 1, 0.5}, fresh: true}, ids, []int{0, 0, 0}, eligibleOf(0, 2), 2, routing.DecisionScored, 0},
		{"stale state is neutral: least load", &fakeKV{scores: []float64{0, 1, 0}, fresh: false}, ids, []int{3, 2, 0}, routing.All(3), 2, routing.DecisionNeutral, 0},
		{"no token ids is neutral: least load", &fakeKV{scores: []float64{1, 0, 0}, fresh: true}, &routing.Context{}, []int{3, 0, 5}, routing.All(3), 1, routing.DecisionNeutral, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := routing.New(routing.Spec{Strategy: routing.PreciseCacheAware, Weights: []int{1, 1, 1}, KV: tc.kv, LoadWeight: tc.lw})
			if err != nil {
				t.Fatal(err)
			}
			if got := b.Pick(tc.ctx, tc.loads, tc.el); got != tc.want {
				t.Fatalf("Pick = %d, want %d", got, tc.want)
			}
			if d := b.(routing.DecisionCounter).Decisions(); d[tc.decide] != 1 {
				t.Fatalf("decisions %v", d)
			}
			b.Observe(tc.want, tc.ctx)
			if len(tc.ctx.TokenIDs) > 0 && (len(tc.kv.speculated) != 1 || tc.kv.speculated[0] != tc.want) {
				t.Fatalf("speculated %v, want [%d]", tc.kv.speculated, tc.want)
			}
		})
	}
}

func TestLMCacheAware(t *testing.T) {
	lm := &fakeLM{scores: []float64{0.1, 0.9, 0}, fresh: true}
	b, err := routing.New(routing.Spec{Strategy: routing.LMCacheAware, Weights: []int{1, 1, 1}, LMCache: lm})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Pick(&routing.Context{}, []int{0, 0, 0}, routing.All(3)); got != 1 {
		t.Fatalf("Pick = %d, want the emptiest cache (1)", got)
	}
	lm.fresh = false
	if got := b.Pick(&routing.Context{}, []int{2, 1, 0}, routing.All(3)); got != 2 {
		t.Fatalf("stale: Pick = %d, want least loaded (2)", got)
	}
	// Without a source configured the strategy is plain least load.
	b, _ = routing.New(routing.Spec{Strategy: routing.LMCacheAware, Weights: []int{1, 1}})
	if got := b.Pick(&routing.Context{}, []int{5, 1}, routing.All(2)); got != 1 {
		t.Fatalf("no source: Pick = %d", got)
	}
}

// TestSpeculativeTTL: Observe speculates for Spec.SpeculativeTTL, the
// default when it is 0, and not at all when it is negative.
func TestSpeculativeTTL(t *testing.T) {
	ctx := &routing.Context{TokenIDs: []uint32{1, 2, 3}}
	tests := []struct {
		name string
		ttl  time.Duration
		want []time.Duration
	}{
		{"default", 0, []time.Duration{routing.DefaultSpeculativeTTL}},
		{"configured", 1500 * time.Millisecond, []time.Duration{1500 * time.Millisecond}},
		{"off", routing.NoSpeculation, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kv := &fakeKV{scores: []float64{1, 0}, fresh: true}
			b, err := routing.New(routing.Spec{Strategy: routing.PreciseCacheAware, Weights: []int{1, 1}, KV: kv, SpeculativeTTL: tc.ttl})
			if err != nil {
				t.Fatal(err)
			}
			b.Observe(b.Pick(ctx, []int{0, 0}, routing.All(2)), ctx)
			if len(kv.ttls) != len(tc.want) || (len(tc.want) > 0 && kv.ttls[0] != tc.want[0]) {
				t.Errorf("speculated with %v, want %v", kv.ttls, tc.want)
			}
		})
	}
}
