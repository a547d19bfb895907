package routing_test

import (
	"testing"
	"time"

	"rolter.dev/pkg/routing"
)

func predictedLatency(tb testing.TB, n int) routing.Balancer {
	return newBalancer(tb, routing.Spec{Strategy: routing.PredictedLatency}, n)
}

func learn(b routing.Balancer, target, samples, depth int, ctx *routing.Context, latency time.Duration) {
	for range samples {
		b.(routing.Learner).Learn(target, ctx, depth, latency)
	}
}

func TestPredictedLatencyLearnsSlowTarget(t *testing.T) {
	ctx := &routing.Context{Prompt: "hello", PromptLen: 8000}
	b := predictedLatency(t, 3)
	learn(b, 0, 30, 1, ctx, 1200*time.Millisecond)
	learn(b, 1, 30, 1, ctx, 150*time.Millisecond)
	learn(b, 2, 30, 1, ctx, 700*time.Millisecond)
	for range 50 {
		if got := b.Pick(ctx, []int{1, 1, 1}, routing.All(3)); got != 1 {
			t.Fatalf("Pick = %d, want the fast target 1", got)
		}
	}
	if got := b.Pick(ctx, []int{1, 1, 1}, eligibleOf(0, 2)); got != 2 {
		t.Fatalf("fast target ineligible: Pick = %d, want 2", got)
	}
	if d := b.(routing.DecisionCounter).Decisions(); d[routing.DecisionPredicted] != 51 || d[routing.DecisionUnpredicted] != 0 {
		t.Fatalf("decisions %v", d)
	}
}

func TestPredictedLatencyFallsBackToLoad(t *testing.T) {
	type sample struct {
		target, samples int
		latency         time.Duration
	}
	tests := []struct {
		name  string
		learn []sample
		loads []int
		el    routing.Set
		want  int
	}{
		{"no model: least load", nil, []int{3, 0, 3}, routing.All(3), 1},
		{"7 samples are too few", []sample{{2, 7, time.Second}, {1, 7, 9 * time.Second}}, []int{3, 0, 3}, routing.All(3), 1},
		{"no model, least load among eligible", nil, []int{3, 0, 2}, eligibleOf(0, 2), 2},
		// A single prediction has nothing to be ranked against: every
		// target ranks 1 and load decides.
		{"one prediction ranks nothing", []sample{{0, 8, 100 * time.Millisecond}}, []int{4, 0, 3}, routing.All(3), 1},
		// Fast ranks 1, slow 0, unknown 0.5; a quarter of load cannot make
		// up the gap between fast and unknown.
		{
			"fast known beats unknown beats slow",
			[]sample{{0, 8, 100 * time.Millisecond}, {1, 8, 500 * time.Millisecond}}, []int{4, 0, 0}, routing.All(3), 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := predictedLatency(t, 3)
			for _, s := range tt.learn {
				learn(b, s.target, s.samples, 0, nil, s.latency)
			}
			for range 20 {
				if got := b.Pick(nil, tt.loads, tt.el); got != tt.want {
					t.Fatalf("Pick = %d, want %d", got, tt.want)
				}
			}
		})
	}
}

// TestPredictedLatencyQueueDepth: two targets with the same per-request cost,
// but target 0 is slower per queued request; at equal depth the model prefers
// target 1, and a deep enough queue on 1 flips the choice.
func TestPredictedLatencyQueueDepth(t *testing.T) {
	b := predictedLatency(t, 2)
	for k := range 400 {
		d := k % 6
		learn(b, 0, 1, d, nil, time.Duration(100+80*d)*time.Millisecond)
		learn(b, 1, 1, d, nil, time.Duration(100+20*d)*time.Millisecond)
	}
	if got := b.Pick(nil, []int{3, 3}, routing.All(2)); got != 1 {
		t.Fatalf("equal depth: Pick = %d, want 1", got)
	}
	if got := b.Pick(nil, []int{0, 5}, routing.All(2)); got != 0 {
		t.Fatalf("depth 0 vs 5: Pick = %d, want 0 (100 ms vs 200 ms)", got)
	}
}

func TestPredictedLatencyIgnoresBadSamples(t *testing.T) {
	b := predictedLatency(t, 2)
	l := b.(routing.Learner)
	for range 20 {
		l.Learn(-1, nil, 0, time.Second)
		l.Learn(2, nil, 0, time.Second)
		l.Learn(0, nil, 0, -time.Second)
	}
	b.Pick(nil, nil, routing.All(2))
	if d := b.(routing.DecisionCounter).Decisions(); d[routing.DecisionUnpredicted] != 1 {
		t.Fatalf("bad samples taught the model: decisions %v", d)
	}
}
