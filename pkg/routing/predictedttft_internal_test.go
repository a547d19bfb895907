package routing

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The fleet's law is the least-squares fit of the first tokens: a replica
// with 5 ms per request and 50 µs per token (the routing simulator's
// defaults) is recovered from noisy samples, where NLMS (predicted_latency's
// fit) settled at half the per-token cost.
func TestPredictedTTFTFitsLaw(t *testing.T) {
	var f lawFit
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := float64(rng.IntN(6))
		work := 200 + rng.Float64()*8000
		x := [3]float64{1, n, work / 1000}
		y := 5 + 5*n + 50*work/1000 + rng.NormFloat64()*3
		f.add(x, y)
	}
	w, ok := f.solve()
	if !ok {
		t.Fatal("solve failed")
	}
	want := [3]float64{5, 5, 50}
	for i := range w {
		if math.Abs(w[i]-want[i]) > 0.5 {
			t.Fatalf("fitted %v, want about %v", w, want)
		}
	}
	// A feature that never varied (no queue ever) gets weight 0, not a
	// singular system.
	var g lawFit
	for k := range 50 {
		work := float64(1000 + 100*k)
		g.add([3]float64{1, 0, work / 1000}, 5+50*work/1000)
	}
	w, ok = g.solve()
	if !ok || math.Abs(w[1]) > 1e-6 || math.Abs(w[2]-50) > 0.01 {
		t.Fatalf("fit without a queue: %v %v, want [5 0 50]", w, ok)
	}
	var empty lawFit
	if _, ok := empty.solve(); ok {
		t.Fatal("an empty fit solved")
	}
}

// After PredictorMinSamples first tokens the balancer predicts with the
// fitted law.
func TestPredictedTTFTLearnsFleetLaw(t *testing.T) {
	var now time.Duration
	b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1}, Now: func() time.Duration { return now }})
	if err != nil {
		t.Fatal(err)
	}
	p := b.(*predictedTTFT)
	if p.law() != p.unitLaw {
		t.Fatal("a fresh balancer has a fitted law")
	}
	for k := range PredictorMinSamples {
		ctx := &Context{Prompt: strings.Repeat(string(rune('a'+k)), 400*(k+1))}
		b.Observe(k%2, ctx)
		now += time.Millisecond
		tok := 100 * (k + 1)
		p.FirstToken(k%2, ctx, time.Duration(5+tok/20)*time.Millisecond, tok)
	}
	if m := p.law(); m == p.unitLaw || math.Abs(m.w[2]-50) > 1 {
		t.Fatalf("law after %d samples: %+v, want about 50 ms per 1,000 tokens", PredictorMinSamples, m)
	}
	if got := loadFloat(&p.bytesPerToken); got != 4 {
		t.Fatalf("bytes per token %v, want 4 (400 bytes per 100 tokens)", got)
	}
}

// Behind sharing proxies the loads count every proxy's requests: the
// measured rate and utilisation are scaled by loads over own in-flight.
func TestPredictedTTFTFleetScale(t *testing.T) {
	b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	p := b.(*predictedTTFT)
	if got := p.fleetScale([]int{3, 5}); got != 1 {
		t.Fatalf("nothing of its own in flight: scale %v, want 1", got)
	}
	a, c := &Context{Prompt: "a"}, &Context{Prompt: "b"}
	b.Observe(0, a)
	b.Observe(1, c)
	if got := p.fleetScale([]int{1, 1}); got != 1 {
		t.Fatalf("one proxy: scale %v, want 1", got)
	}
	if got := p.fleetScale([]int{4, 4}); got != 4 {
		t.Fatalf("loads 4× its own: scale %v, want 4", got)
	}
	if got := p.fleetScale(nil); got != 1 {
		t.Fatalf("loads unknown: scale %v, want 1", got)
	}
	p.FirstToken(0, a, time.Millisecond, 0)
	p.Learn(0, a, 0, time.Second) // completed
	p.Abandon(1, c)               // failed before its first token
	if p.inflight[0].Load() != 0 || p.inflight[1].Load() != 0 {
		t.Fatalf("in flight after completion and abandon: %d %d", p.inflight[0].Load(), p.inflight[1].Load())
	}
}
