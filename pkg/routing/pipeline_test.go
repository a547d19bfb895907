package routing_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"rolter.dev/pkg/routing"
)

func TestPipelineTieBreakUniform(t *testing.T) {
	const n, picks = 6, 12000
	b := newBalancer(t, routing.Spec{Strategy: routing.Pipeline}, n)
	el := eligibleOf(0, 2, 3, 5)
	got := make([]int, 0, picks)
	for range picks {
		got = append(got, b.Pick(&routing.Context{}, nil, el))
	}
	c := tally(got, n)
	for i, v := range c {
		switch {
		case !el.Has(i) && v != 0:
			t.Fatalf("ineligible target %d picked %d times: %v", i, v, c)
		case el.Has(i) && (v < 2700 || v > 3300): // expected 3000, sd ≈ 47
			t.Fatalf("target %d picked %d of %d, want ≈3000: %v", i, v, picks, c)
		}
	}
}

func TestPipelineScorers(t *testing.T) {
	prompt := strings.Repeat("shared prefix ", 20)
	tests := []struct {
		name    string
		weights []int
		scorers map[string]float64
		observe map[int]*routing.Context
		ctx     *routing.Context
		loads   []int
		el      routing.Set
		want    int
	}{
		{"static weight", []int{1, 3, 2}, nil, nil, &routing.Context{}, nil, routing.All(3), 1},
		{"static weight among eligible", []int{1, 3, 2}, nil, nil, &routing.Context{}, nil, eligibleOf(0, 2), 2},
		{"least load", nil, nil, nil, &routing.Context{}, []int{5, 0, 5}, routing.All(3), 1},
		{"negative load counts as 0", nil, nil, nil, &routing.Context{}, []int{-7, 2, 2}, routing.All(3), 0},
		{"prefix cache", nil, nil, map[int]*routing.Context{2: {Prompt: prompt}}, &routing.Context{Prompt: prompt + "more"}, nil, routing.All(3), 2},
		{"session affinity", nil, nil, map[int]*routing.Context{1: {SessionKey: "s"}}, &routing.Context{SessionKey: "s"}, nil, routing.All(3), 1},
		{"session target ineligible", nil, nil, map[int]*routing.Context{1: {SessionKey: "s"}}, &routing.Context{SessionKey: "s"}, []int{0, 0, 3}, eligibleOf(0, 2), 0},
		{
			"weights trade off: session 1.0 beats load 0.5",
			nil, map[string]float64{routing.ScorerLeastLoad: 0.5},
			map[int]*routing.Context{2: {SessionKey: "s"}}, &routing.Context{SessionKey: "s"}, []int{0, 0, 4}, routing.All(3), 2,
		},
		{
			"weights trade off: load 2.0 beats session 1.0",
			nil, map[string]float64{routing.ScorerLeastLoad: 2},
			map[int]*routing.Context{2: {SessionKey: "s"}}, &routing.Context{SessionKey: "s"}, []int{1, 0, 4}, routing.All(3), 1,
		},
		{
			"a scorer weighted 0 is off",
			[]int{1, 9, 1}, map[string]float64{routing.ScorerStaticWeight: 0},
			nil, &routing.Context{}, []int{0, 3, 3}, routing.All(3), 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBalancer(t, routing.Spec{Strategy: routing.Pipeline, Weights: tt.weights, Scorers: tt.scorers}, 3)
			for i, ctx := range tt.observe {
				b.Observe(i, ctx)
			}
			for range 50 { // a wrong answer would show up as a random tie
				if got := b.Pick(tt.ctx, tt.loads, tt.el); got != tt.want {
					t.Fatalf("Pick = %d, want %d", got, tt.want)
				}
			}
		})
	}
}

func TestPipelineSessionTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBalancer(t, routing.Spec{Strategy: routing.Pipeline}, 4)
		ctx := &routing.Context{SessionKey: "conversation-1"}
		b.Observe(3, ctx)
		time.Sleep(routing.SessionTTL - time.Second)
		for range 20 {
			if got := b.Pick(ctx, nil, routing.All(4)); got != 3 {
				t.Fatalf("within the TTL: Pick = %d, want 3", got)
			}
		}
		time.Sleep(time.Second)
		seen := map[int]bool{}
		for range 200 {
			seen[b.Pick(ctx, nil, routing.All(4))] = true
		}
		if len(seen) < 4 {
			t.Fatalf("after the TTL picks still favour a target: %v", seen)
		}
		b.Observe(0, ctx) // served again: sticks again
		if got := b.Pick(ctx, nil, routing.All(4)); got != 0 {
			t.Fatalf("re-observed: Pick = %d, want 0", got)
		}
	})
}

// With Spec.Now the session TTL runs on the caller's clock (the simulator's
// virtual one), not the process's.
func TestPipelineSessionClock(t *testing.T) {
	var now time.Duration
	b := newBalancer(t, routing.Spec{Strategy: routing.Pipeline, Now: func() time.Duration { return now }}, 4)
	ctx := &routing.Context{SessionKey: "conversation-1"}
	b.Observe(2, ctx)
	now = routing.SessionTTL - time.Nanosecond
	for range 20 {
		if got := b.Pick(ctx, nil, routing.All(4)); got != 2 {
			t.Fatalf("within the TTL on the given clock: Pick = %d, want 2", got)
		}
	}
	now = routing.SessionTTL
	seen := map[int]bool{}
	for range 200 {
		seen[b.Pick(ctx, nil, routing.All(4))] = true
	}
	if len(seen) < 4 {
		t.Fatalf("the given clock passed the TTL, picks still favour a target: %v", seen)
	}
}

func TestPipelineTrieStats(t *testing.T) {
	b := newBalancer(t, routing.Spec{Strategy: routing.Pipeline, MaxTrieNodes: 10}, 2)
	b.Observe(1, &routing.Context{Prompt: "0123456789"})
	b.Observe(1, &routing.Context{Prompt: "abc"})
	st := b.(routing.TrieStats).TrieStats()
	if len(st) != 2 || st[1] != (routing.TreeStats{Nodes: 3, Prompts: 1, Evictions: 1}) || st[0] != (routing.TreeStats{}) {
		t.Fatalf("TrieStats = %+v", st)
	}
	off := newBalancer(t, routing.Spec{Strategy: routing.Pipeline, Scorers: map[string]float64{routing.ScorerPrefixCache: 0}}, 2)
	if st := off.(routing.TrieStats).TrieStats(); st != nil {
		t.Fatalf("prefix_cache off: TrieStats = %+v, want nil", st)
	}
}

func TestSpecValidation(t *testing.T) {
	tests := []struct {
		name string
		spec routing.Spec
		want string // substring of the error; "" means valid
	}{
		{"defaults", routing.Spec{Strategy: routing.CacheAware}, ""},
		{"explicit values", routing.Spec{Strategy: routing.CacheAware, Threshold: 0.8, BalanceAbs: 4, BalanceRel: 2, MaxTrieNodes: 10}, ""},
		{"threshold above 1 is allowed (never pins)", routing.Spec{Strategy: routing.CacheAware, Threshold: 1.5}, ""},
		{"negative threshold", routing.Spec{Strategy: routing.CacheAware, Threshold: -0.1}, "threshold"},
		{"NaN threshold", routing.Spec{Strategy: routing.CacheAware, Threshold: math.NaN()}, "threshold"},
		{"negative balance_abs", routing.Spec{Strategy: routing.CacheAware, BalanceAbs: -1}, "balance_abs"},
		{"infinite balance_rel", routing.Spec{Strategy: routing.CacheAware, BalanceRel: math.Inf(1)}, "balance_rel"},
		{"negative max_trie_nodes", routing.Spec{Strategy: routing.Pipeline, MaxTrieNodes: -5}, "max_trie_nodes"},
		{"unknown scorer", routing.Spec{Strategy: routing.Pipeline, Scorers: map[string]float64{"lora": 1}}, "scorers.lora: unknown scorer"},
		{"negative scorer weight", routing.Spec{Strategy: routing.Pipeline, Scorers: map[string]float64{routing.ScorerLeastLoad: -1}}, "scorers.least_load"},
		{"every scorer named", routing.Spec{Strategy: routing.Pipeline, Scorers: map[string]float64{
			routing.ScorerPrefixCache: 2, routing.ScorerLeastLoad: 0.5, routing.ScorerSessionAffinity: 0, routing.ScorerStaticWeight: 1,
		}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Weights = []int{1, 1}
			_, err := routing.New(tt.spec)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("New: err = %v, want one mentioning %q", err, tt.want)
			case errors.Is(err, routing.ErrUnknownStrategy):
				t.Fatalf("New: %v is not an unknown strategy", err)
			}
		})
	}
}
