package routing

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// newTwoTargetTTFT is a predicted_ttft balancer over two targets on the
// virtual clock *now.
func newTwoTargetTTFT(t *testing.T, now *time.Duration) *predictedTTFT {
	t.Helper()
	b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1}, Now: func() time.Duration { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	return b.(*predictedTTFT)
}

// The fleet's law is the least-squares fit of the first tokens: a replica
// with 5 ms per request and 50 µs per token (the routing simulator's
// defaults) is recovered from noisy samples, where NLMS (predicted_latency's
// fit) settled at half the per-token cost. Queued and own prefill have
// their own weights: an engine that prefills one request at a time makes
// both 50 ms per 1,000 tokens, one that prefills every request on its own
// (vllmsim) leaves the queued weight at 0.
func TestPredictedTTFTFitsLaw(t *testing.T) {
	for _, queued := range []float64{50, 0} {
		var f lawFit
		rng := rand.New(rand.NewPCG(1, 2))
		for range 2000 {
			n := float64(rng.IntN(6))
			ahead := n * rng.Float64() * 4000
			own := 200 + rng.Float64()*8000
			x := [lawFeatures]float64{1, n, ahead / 1000, own / 1000}
			y := 5 + 5*n + queued*ahead/1000 + 50*own/1000 + rng.NormFloat64()*3
			f.add(x, y)
		}
		w, ok := f.solve()
		if !ok {
			t.Fatal("solve failed")
		}
		want := [lawFeatures]float64{5, 5, queued, 50}
		for i := range w {
			if math.Abs(w[i]-want[i]) > 0.5 {
				t.Fatalf("fitted %v, want about %v", w, want)
			}
		}
	}
	// A feature that never varied (no queue ever) gets weight 0, not a
	// singular system.
	var g lawFit
	for k := range 50 {
		own := float64(1000 + 100*k)
		g.add([lawFeatures]float64{1, 0, 0, own / 1000}, 5+50*own/1000)
	}
	w, ok := g.solve()
	if !ok || math.Abs(w[1]) > 1e-6 || math.Abs(w[2]) > 1e-6 || math.Abs(w[3]-50) > 0.01 {
		t.Fatalf("fit without a queue: %v %v, want [5 0 0 50]", w, ok)
	}
	// No weight is negative, even where noise makes the unconstrained fit
	// say more work is faster: the feature is dropped and the rest refit.
	var h lawFit
	for k := range 50 {
		n := float64(k % 5)
		own := float64(1000 + 100*k)
		h.add([lawFeatures]float64{1, n, n, own / 1000}, 20-3*n+50*own/1000)
	}
	w, ok = h.solve()
	if !ok || w[1] < 0 || w[2] < 0 || math.Abs(w[3]-50) > 1 {
		t.Fatalf("fit with a falling queue term: %v %v, want no negative weight and about 50 per 1,000 own tokens", w, ok)
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
	p := newTwoTargetTTFT(t, &now)
	if p.law() != p.unitLaw {
		t.Fatal("a fresh balancer has a fitted law")
	}
	for k := range PredictorMinSamples {
		ctx := &Context{Prompt: strings.Repeat(string(rune('a'+k)), 400*(k+1))}
		p.Observe(k%2, ctx)
		now += time.Millisecond
		tok := 100 * (k + 1)
		p.FirstToken(k%2, ctx, time.Duration(5+tok/20)*time.Millisecond, tok)
	}
	if m := p.law(); m == p.unitLaw || math.Abs(m.w[3]-50) > 1 {
		t.Fatalf("law after %d samples: %+v, want about 50 ms per 1,000 tokens", PredictorMinSamples, m)
	}
	if got := loadFloat(&p.bytesPerToken); got != 4 {
		t.Fatalf("bytes per token %v, want 4 (400 bytes per 100 tokens)", got)
	}
}

// The law waits for samples that determine the engine's prefill rate: first
// tokens of cache hits alone (own prefill about 0, latency noise) leave the
// unit law in place, where a fit would have priced own prefill at 0 and
// routed as if every replica held the prefix.
func TestPredictedTTFTLawWaitsForOwnWork(t *testing.T) {
	var now time.Duration
	p := newTwoTargetTTFT(t, &now)
	sys := strings.Repeat("s", 4000)
	p.Observe(0, &Context{Prompt: sys})
	rng := rand.New(rand.NewPCG(3, 4))
	for k := range 3 * PredictorMinSamples {
		ctx := &Context{Prompt: sys + strings.Repeat(string(rune('a'+k%26)), 8)}
		p.Observe(0, ctx)
		now += time.Millisecond
		p.FirstToken(0, ctx, time.Duration(2+rng.Float64()*4)*time.Millisecond, 1002)
	}
	if p.law() != p.unitLaw {
		t.Fatalf("law after cache hits only: %+v, want the unit law", p.law())
	}
	for k := range PredictorMinSamples {
		ctx := &Context{Prompt: strings.Repeat(string(rune('A'+k)), 4000*(k%3+1))}
		p.Observe(1, ctx)
		now += time.Millisecond
		tok := 1000 * (k%3 + 1)
		p.FirstToken(1, ctx, time.Duration(2+tok/20)*time.Millisecond, tok)
	}
	if m := p.law(); m == p.unitLaw || m.w[lawOwn] < 25 {
		t.Fatalf("law after cold prefills: %+v, want about 50 ms per 1,000 own tokens", m)
	}
}

// Behind sharing proxies the loads count every proxy's requests: the
// measured arrival rate is scaled by loads over own in-flight, summed over
// the picks of the rates' window (one pick's ratio, from a few requests in
// flight, swings widely).
func TestPredictedTTFTFleetScale(t *testing.T) {
	newP := func() (Balancer, *predictedTTFT) {
		b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1}})
		if err != nil {
			t.Fatal(err)
		}
		return b, b.(*predictedTTFT)
	}
	_, fresh := newP()
	if got := fresh.recordLoads([]int{3, 5}); got != 1 {
		t.Fatalf("nothing of its own in flight yet: scale %v, want 1", got)
	}
	b, p := newP()
	a, c := &Context{Prompt: "a"}, &Context{Prompt: "b"}
	b.Observe(0, a)
	b.Observe(1, c)
	if got := p.recordLoads([]int{1, 1}); got != 1 {
		t.Fatalf("one proxy: scale %v, want 1", got)
	}
	// Loads 4× its own at the next pick: (2 + 8) / (2 + 2) over both.
	if got := p.recordLoads([]int{4, 4}); got != 2.5 {
		t.Fatalf("loads 4× its own after a pick at 1×: scale %v, want 2.5", got)
	}
	for range 98 {
		p.recordLoads([]int{4, 4})
	}
	if got := p.recordLoads([]int{4, 4}); got < 3.9 || got >= 4 {
		t.Fatalf("loads 4× its own over 100 picks: scale %v, want nearly 4", got)
	}
	if got := p.recordLoads(nil); got != 1 {
		t.Fatalf("loads unknown: scale %v, want 1", got)
	}
	p.FirstToken(0, a, time.Millisecond, 0)
	p.Learn(0, a, 0, time.Second) // completed
	p.Abandon(1, c)               // failed before its first token
	if p.inflight[0].Load() != 0 || p.inflight[1].Load() != 0 {
		t.Fatalf("in flight after completion and abandon: %d %d", p.inflight[0].Load(), p.inflight[1].Load())
	}
	// Cut after its first token (a client gone, a broken stream): no
	// completion, and it leaves the count all the same.
	b.Observe(1, c)
	p.FirstToken(1, c, time.Millisecond, 0)
	p.Abandon(1, c)
	if got := p.inflight[1].Load(); got != 0 {
		t.Fatalf("in flight after an attempt cut past its first token: %d", got)
	}
}

// simLaw is the routing simulator's truth: 5 ms per request, 5 per request
// ahead, 50 per 1,000 tokens queued or own.
var simLaw = ttftLaw{w: [lawFeatures]float64{5, 5, 50, 50}, samples: 100}

// A replica that is prefilling a prefix right now is closer than when the
// prefill was sent: what it has prefilled since, at the law's rate, is no
// longer ahead. Counting the whole prefill as still queued made the busy
// holder tie an idle replica without the prefix, and the idle one won.
// Under the unit law, whose weights are not milliseconds, nothing is
// credited.
func TestPredictedTTFTCreditsPrefillInProgress(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	b.Observe(0, &Context{Prompt: strings.Repeat("x", 4400)}) // 1,100 tokens
	now += 50 * time.Millisecond
	// 50 ms less the request's 5 ms at 50 ms per 1,000 tokens: 900 done.
	if x := b.features(0, 0, 0, &simLaw, now, b.counts(0)); math.Abs(x[lawQueued]-0.2) > 1e-9 || x[lawAhead] != 1 {
		t.Fatalf("fitted law: features %v, want 1 request and 200 tokens ahead", x)
	}
	if x := b.features(0, 0, 0, &b.unitLaw, now, b.counts(0)); math.Abs(x[lawQueued]-1.1) > 1e-9 {
		t.Fatalf("unit law: features %v, want all 1,100 tokens ahead", x)
	}
}

// A peer's pending head has been in service since the last first token at
// the target (any proxy's), not since its dispatch: a head sent long ago
// behind a request that has only just left is still nearly all ahead.
func TestPredictedTTFTPeerHeadServedSinceLastLeave(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	q := QueueState{Requests: 1, Tokens: 2000, HeadTokens: 2000, HeadAge: 100 * time.Millisecond, LeaveAge: -1, AnswerAge: -1}
	b.FoldPeerQueue("peer", 0, q, time.Minute)
	// Served since its dispatch 100 ms ago: (100 - 5) / 50 × 1,000 = 1,900.
	if x := b.features(0, 0, 0, &simLaw, now, b.counts(0)); math.Abs(x[lawQueued]-0.1) > 1e-9 || x[lawAhead] != 1 {
		t.Fatalf("head served since dispatch: features %v, want 1 request and 100 tokens ahead", x)
	}
	// A first token there 10 ms ago: (10 - 5) / 50 × 1,000 = 100 served.
	q.LeaveAge = 10 * time.Millisecond
	b.FoldPeerQueue("peer", 0, q, time.Minute)
	if x := b.features(0, 0, 0, &simLaw, now, b.counts(0)); math.Abs(x[lawQueued]-1.9) > 1e-9 {
		t.Fatalf("head in service for 10 ms: features %v, want 1,900 tokens ahead", x)
	}
	// The other target is untouched by the peer's report.
	if x := b.features(1, 0, 0, &simLaw, now, b.counts(1)); x[lawAhead] != 0 || x[lawQueued] != 0 {
		t.Fatalf("target 1: features %v, want nothing ahead", x)
	}
}

// setQueueHistory gives a two-target balancer a history since time 0: its
// targets' prefill queues busy for busy0 and busy1, ten requests of 1,000
// uncached tokens each, five to each target, half of their prompts new.
func setQueueHistory(b *predictedTTFT, busy0, busy1 time.Duration) {
	b.start.Store(0)
	b.busyTotal[0].Store(int64(busy0))
	b.busyTotal[1].Store(int64(busy1))
	b.arrivals[0].Store(5)
	b.arrivals[1].Store(5)
	b.observes.Store(10)
	b.uncachedSum.Store(10 * 1000)
	b.novelty.Store(math.Float64bits(5))
}

// The traffic a pick draws to a target waits there, and delays the others
// there, as long as that target has been busy: a target whose prefill
// queue was busy half the time since the first request costs each
// follow-up ρ/(1 − ρ) = 1 mean service of its own wait (55 ms under the
// simulator's law, for 1,000-token requests: 5 a request, 50 the tokens)
// and ρ/(1 − ρ)² = 2 times its queued work of the others' (2 × 50 ms), an
// idle one nothing; with half the traffic novel, one follow-up per
// request. On an engine that prefills requests side by side (a queued
// token costing a tenth of an own one) others queue behind a tenth of the
// busy time: the delay is 0.05/0.95² × 5 ms. With no repeat traffic
// nothing follows, and the pick between two targets as busy as each other
// is a tie again.
func TestPredictedTTFTFollowWait(t *testing.T) {
	now := 10 * time.Second
	b := newTwoTargetTTFT(t, &now)
	setQueueHistory(b, 5*time.Second, 0)
	if got := b.followWait(0, b.followCost(&simLaw, now, b.fleetRates(now, 1, true), 0), now); math.Abs(got-155) > 1e-6 {
		t.Fatalf("busy half the time: follow wait %.3f ms, want 55 + 100", got)
	}
	parallel := ttftLaw{w: [lawFeatures]float64{5, 5, 5, 50}, samples: 100}
	want := 10.0 + 5*0.05/(0.95*0.95) // 1 × (5 + 5), and the delay
	if got := b.followWait(0, b.followCost(&parallel, now, b.fleetRates(now, 1, true), 0), now); math.Abs(got-want) > 1e-6 {
		t.Fatalf("side-by-side prefill, busy half the time: follow wait %.3f ms, want %.3f", got, want)
	}
	if got := b.followWait(1, b.followCost(&simLaw, now, b.fleetRates(now, 1, true), 0), now); got != 0 {
		t.Fatalf("never busy: follow wait %.3f ms, want 0", got)
	}
	// The pick, with the law fitted: the target that was idle, every time.
	b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
	for i := range 40 {
		if got := b.Pick(&Context{Prompt: strings.Repeat("x", 400+i)}, nil, Set{}); got != 1 {
			t.Fatalf("draw %d: picked %d, want 1 (target 0 was busy half the time)", i, got)
		}
	}
	b.novelty.Store(math.Float64bits(10)) // every request so far was new
	if got := b.followWait(0, b.followCost(&simLaw, now, b.fleetRates(now, 1, true), 0), now); got != 0 {
		t.Fatalf("no repeat traffic: follow wait %.3f ms, want 0", got)
	}
	// Target 1 busy as long as target 0 (a target never busy expects
	// nobody behind a request: see TestPredictedTTFTIdleTargetExternality).
	b.busyTotal[1].Store(int64(5 * time.Second))
	seen := map[int]bool{}
	for i := range 40 {
		seen[b.Pick(&Context{Prompt: strings.Repeat("y", 400+i)}, nil, Set{})] = true
	}
	if !seen[0] || !seen[1] {
		t.Fatalf("no repeat traffic: picked %v, want both targets (a tie)", seen)
	}
}

// A new prefix's follow-up waits differ by how busy each target was, read
// over the few requests each received: busy shares of 0.50 and 0.55 over
// five arrivals each are within one standard error (0.22), and the two
// targets tie; the tie goes to the target sent fewer new prefixes, here
// the busier one. Told apart (0.5 against 0: see
// TestPredictedTTFTFollowWait) the idle target wins as before.
func TestPredictedTTFTNewPrefixesWithinTheNoiseTie(t *testing.T) {
	now := 10 * time.Second
	b := newTwoTargetTTFT(t, &now)
	setQueueHistory(b, 5*time.Second, 5500*time.Millisecond)
	b.newPrefixes[0].Store(3)
	b.newPrefixes[1].Store(1)
	b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
	follow := b.followCost(&simLaw, now, b.fleetRates(now, 1, true), 0)
	if w0, w1 := b.followWait(0, follow, now), b.followWait(1, follow, now); w0 >= w1 {
		t.Fatalf("follow waits %.1f and %.1f ms: the test needs target 0 the cheaper", w0, w1)
	}
	for i := range 20 {
		if got := b.Pick(&Context{Prompt: strings.Repeat("z", 400+i)}, nil, Set{}); got != 1 {
			t.Fatalf("draw %d: picked %d, want 1 (as cheap within the noise, and sent fewer new prefixes)", i, got)
		}
	}
}

// Where every target's prefill queue is busy nearly all the time, the
// follow-up wait's M/M/1 factors are enormous and differ between targets
// by the noise in ρ_i; a target holding more of the prompt than another is
// charged at most the least wait plus what the followers pay to go there
// instead (this prompt prefilled again). Target 0 holds the prompt and was
// busy 99.9 % of the time (ρ capped at 0.99: 5,445 ms of followers' wait
// and 495,000 of their delay under the simulator's law), target 1 90 %
// (495 + 4,500 ms): unbounded, the holder lost by half a second per
// follower; bounded it is 100 ms (the 2,000 prompt tokens at 50 ms per
// 1,000) dearer than target 1, no more than what leaving it costs in this
// request's own prefill alone, and it keeps the prompt. Between targets
// that hold the same of the prompt nothing is bounded.
func TestPredictedTTFTFollowWaitBoundedAtSaturation(t *testing.T) {
	now := 10 * time.Second
	b := newTwoTargetTTFT(t, &now)
	b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
	first := &Context{Prompt: strings.Repeat("a", 8000)}
	b.Observe(0, first)
	b.FirstToken(0, first, 200*time.Millisecond, 2000)
	setQueueHistory(b, 9990*time.Millisecond, 9*time.Second)

	follow := b.followCost(&simLaw, now, b.fleetRates(now, 1, true), 2000)
	if follow.fallback != 100 {
		t.Fatalf("fallback %.3f ms, want 100 (2,000 tokens at 50 ms per 1,000, one follower)", follow.fallback)
	}
	var followed [2]float64
	b.followWaits(Set{}.OrAll(2), follow, now, []float64{2000, 0}, followed[:])
	want1 := 55*9 + 50*0.9/(0.1*0.1)
	if math.Abs(followed[1]-want1) > 1e-6 || math.Abs(followed[0]-(want1+100)) > 1e-6 {
		t.Fatalf("follow waits %v, want [%.3f %.3f] (target 0 bounded by target 1's plus the fallback)", followed, want1+100, want1)
	}
	raw := b.followWait(0, follow, now)
	if raw < 10*followed[0] {
		t.Fatalf("target 0's unbounded follow wait %.3f ms: the test no longer exercises the bound", raw)
	}
	b.followWaits(Set{}.OrAll(2), follow, now, []float64{500, 500}, followed[:])
	if followed[0] != raw || math.Abs(followed[1]-want1) > 1e-6 {
		t.Fatalf("equal matches: follow waits %v, want [%.3f %.3f] (nothing bounded)", followed, raw, want1)
	}
	for i := range 20 {
		if got := b.Pick(&Context{Prompt: strings.Repeat("a", 8000) + strings.Repeat("b", 400+i)}, nil, Set{}); got != 0 {
			t.Fatalf("draw %d: picked %d, want the holder 0", i, got)
		}
	}
}

// slotEngine is an EngineState with running and waiting counts.
type slotEngine struct {
	waiting, running []int
	age              time.Duration // how old every count is
}

func (e *slotEngine) Counts(i int) (int, int, time.Duration, bool) {
	return e.waiting[i], e.running[i], e.age, true
}
func (e *slotEngine) KVCapacityTokens(int) int { return 0 }

// A request sent before its target was known to be full (the first to
// overflow it) is marked as waiting for a slot as soon as the engine shows
// it waiting: from then on its wait is not the target's prefill being
// busy, and its first token teaches the law nothing. The slots are the
// most requests seen running, at the target once it was seen full, else at
// any target that was.
func TestPredictedTTFTMarksSlotWaiters(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	eng := &slotEngine{waiting: []int{0, 0}, running: []int{4, 0}}
	b.engine = eng
	ctx := &Context{Prompt: strings.Repeat("x", 4000)}
	b.Observe(0, ctx)
	if b.busySince[0].Load() < 0 || b.pending[0][ctx].slot {
		t.Fatal("sent to a replica with no waiting requests: want a busy prefill, not a slot wait")
	}
	now += 100 * time.Millisecond
	eng.waiting[0] = 1 // the request did not get a slot
	b.Pick(&Context{Prompt: "y"}, nil, Set{})
	if !b.pending[0][ctx].slot || b.slotPend[0].Load() != 1 || b.busySince[0].Load() >= 0 {
		t.Fatalf("engine shows it waiting: slot %v, waiters %d, busy since %d; want marked and the prefill idle",
			b.pending[0][ctx].slot, b.slotPend[0].Load(), b.busySince[0].Load())
	}
	if _, got := b.slotPlace(0, nil, b.counts(0)); got != 4 {
		t.Fatalf("learned %d slots, want the 4 running", got)
	}
	if got, _ := b.slotPlace(1, nil, b.counts(1)); got != 0 {
		t.Fatalf("idle target 1: place %d, want 0", got)
	}
	eng.running[1] = 4 // target 1, never seen full, takes target 0's limit
	if got, _ := b.slotPlace(1, nil, b.counts(1)); got != 1 {
		t.Fatalf("target 1 with 4 running: place %d, want 1", got)
	}
	eng.running[1] = 5 // running past it: not target 1's limit
	if got, _ := b.slotPlace(1, nil, b.counts(1)); got != 0 {
		t.Fatalf("target 1 with 5 running, none waiting: place %d, want 0", got)
	}
	b.FirstToken(0, ctx, 5*time.Second, 1000)
	if b.pooled.n != 0 || b.slotPend[0].Load() != 0 {
		t.Fatalf("a slot waiter's first token: %d law samples, %d waiters; want none", b.pooled.n, b.slotPend[0].Load())
	}
	// More run than were seen: the limit is higher. A request caught
	// waiting for one scheduler step with slots free does not lower it.
	eng.running[0], eng.waiting[0] = 6, 0
	if k, s := b.slotPlace(0, nil, b.counts(0)); k != 1 || s != 6 {
		t.Fatalf("6 running: place %d of %d slots, want 1 of 6", k, s)
	}
	eng.running[0], eng.waiting[0] = 3, 1
	if k, s := b.slotPlace(0, nil, b.counts(0)); k != 0 || s != 6 {
		t.Fatalf("3 running, 1 waiting: place %d of %d slots, want 0 of 6", k, s)
	}
}

// A request the engine shows waiting for a slot only at a later scrape
// was waiting since it was sent: once marked, the busy spell it alone kept
// open ends where the last request that prefilled there left, so the
// target's measured utilisation (which the follow-up wait reads) counts
// the prefill, not the wait for a slot.
func TestPredictedTTFTSlotWaiterMarkedLateIsNotBusy(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	eng := &slotEngine{waiting: []int{0, 0}, running: []int{0, 0}}
	b.engine = eng
	prefilled, waited := &Context{Prompt: strings.Repeat("a", 4000)}, &Context{Prompt: strings.Repeat("w", 4000)}
	b.Observe(0, prefilled)
	b.Observe(0, waited)
	now += 100 * time.Millisecond
	b.FirstToken(0, prefilled, 100*time.Millisecond, 1000)
	now += 150 * time.Millisecond         // within twice the longest first token: not a silent target
	eng.running[0], eng.waiting[0] = 1, 1 // the first scrape to show it
	b.Pick(&Context{Prompt: "y"}, nil, Set{})
	if !b.pending[0][waited].slot {
		t.Fatal("engine shows it waiting: want it marked")
	}
	if got := time.Duration(b.busyAt(0, now)); got != 100*time.Millisecond {
		t.Fatalf("busy %v, want the 100 ms of the request that prefilled", got)
	}
}

// The peers' report gap is the mean time between a peer's consecutive
// reports (the targets of one report are one, a silence of a report's ttl
// or more is an idle peer), and the concurrent own arrivals are, per own
// arrival since the gap was known, those within the gap on either side
// (Defer's estimate of the peers' blind picks before they report their
// arrivals).
func TestPredictedTTFTConcurrentArrivals(t *testing.T) {
	now := time.Second
	b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1, 1, 1}, Now: func() time.Duration { return now }})
	if err != nil {
		t.Fatal(err)
	}
	p := b.(*predictedTTFT)
	const ttl = 30 * time.Millisecond
	report := func() {
		for target := range 4 {
			p.FoldPeerQueue("peer", target, QueueState{LeaveAge: -1, AnswerAge: -1}, ttl)
		}
	}
	report()
	p.Observe(0, &Context{Prompt: strings.Repeat("a", 4000)}) // before any gap: not counted
	now += 10 * time.Millisecond
	report()
	now += 6 * time.Millisecond
	report()
	now += time.Second // silence: not a gap
	report()
	if gap := time.Duration(p.reportGap.Load()); gap != 8*time.Millisecond {
		t.Fatalf("report gap %v, want 8ms (the mean of 10 and 6 ms)", gap)
	}
	// Three arrivals 4 ms apart, then one alone: within 8 ms of each other
	// are the first and second, the second and third (4 ms), not the first
	// and third (8 ms); so 1, 2, 1 and 0 others, a mean of 1.
	for _, step := range []time.Duration{4, 4, 100} {
		p.Observe(1, &Context{Prompt: strings.Repeat("b", 4000)})
		now += step * time.Millisecond
	}
	p.Observe(2, &Context{Prompt: strings.Repeat("c", 4000)})
	if c := loadFloat(&p.concurrent); c != 1 {
		t.Fatalf("concurrent %v, want 1 (pairs within the gap counted for both)", c)
	}
}

// A follow-up leaves the target holding its prefix only when the wait
// there exceeds the re-prefill elsewhere twice over: once for its own
// first token, once for the work the fleet does again (waste). Under the
// simulator's law, with its 4,000-token prefix held by target 0 and 100
// new tokens, the follow-up costs 210 ms on idle target 1 plus 200 ms of
// waste; behind 6,000 queued tokens at target 0 (325 ms there) it stays,
// behind 12,000 (625 ms) it moves.
func TestPredictedTTFTWasteKeepsFollowUps(t *testing.T) {
	for _, tc := range []struct {
		queued int
		want   int
	}{{6000, 0}, {12000, 1}} {
		now := time.Second
		b := newTwoTargetTTFT(t, &now)
		b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
		first := &Context{Prompt: strings.Repeat("a", 16000)}
		b.Observe(0, first)
		b.FirstToken(0, first, 200*time.Millisecond, 4000)
		b.Observe(0, &Context{Prompt: strings.Repeat("z", 4*tc.queued)})
		b.novelty.Store(math.Float64bits(0)) // everything repeats: no spreading for new prefixes
		if got := b.Pick(&Context{Prompt: strings.Repeat("a", 16000) + strings.Repeat("b", 400)}, nil, Set{}); got != tc.want {
			t.Fatalf("%d tokens queued at the holder: picked %d, want %d", tc.queued, got, tc.want)
		}
	}
}

// A prefix other requests share is not waste: copying a system prompt
// that two sessions started with lets the next session spread. As in the
// test above (6,000 tokens queued at the holder, 325 ms there, 210 ms on
// the idle target), a request whose 4,000-token prefix only its own
// earlier turn sent stays with the holder; one whose prefix two sessions
// continued differently moves to the idle target.
func TestPredictedTTFTWasteSparesSharedPrefix(t *testing.T) {
	system := strings.Repeat("a", 16000)
	for _, tc := range []struct {
		sessions []string
		want     int
	}{{[]string{""}, 0}, {[]string{strings.Repeat("x", 128), strings.Repeat("y", 128)}, 1}} {
		now := time.Second
		b := newTwoTargetTTFT(t, &now)
		b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
		for _, s := range tc.sessions {
			c := &Context{Prompt: system + s}
			b.Observe(0, c)
			b.FirstToken(0, c, 200*time.Millisecond, len(c.Prompt)/4)
		}
		b.Observe(0, &Context{Prompt: strings.Repeat("z", 4*6000)})
		b.novelty.Store(math.Float64bits(0))
		if got := b.Pick(&Context{Prompt: system + strings.Repeat("b", 400)}, nil, Set{}); got != tc.want {
			t.Fatalf("%d sessions on the prefix: picked %d, want %d", len(tc.sessions), got, tc.want)
		}
	}
}

// The queue at the one target holding a prefix other requests share is
// counted behind a request of that prefix. A system prompt two sessions
// started with (4,000 tokens) is held at target 0 with 24 of the sessions'
// next requests queued there (148 ms there; counted, 24 × 6.6 ms more), and
// a new session draws the copy to an idle target (about 250 ms on either).
// Held at targets 0 and 1 both, the burst split between them, the new
// session goes to the shorter queue, target 1. A request continuing its own
// history (session x's next turn) is not counted, and stays with target 0.
func TestPredictedTTFTCountsTheSoleHoldersQueue(t *testing.T) {
	system := strings.Repeat("a", 16000)
	sessions := []string{strings.Repeat("x", 128), strings.Repeat("y", 128)}
	newSession, nextTurn := system+strings.Repeat("n", 128)+strings.Repeat("b", 400), system+sessions[0]+strings.Repeat("b", 400)
	for _, tc := range []struct {
		name    string
		holders []int
		queued  []int // the sessions' requests queued per target
		prompt  string
		want    []int // any of these
	}{
		{"sole holder", []int{0}, []int{24, 0, 0}, newSession, []int{1, 2}},
		{"two holders", []int{0, 1}, []int{24, 23, 0}, newSession, []int{1}},
		{"own history", []int{0}, []int{24, 0, 0}, nextTurn, []int{0}},
	} {
		now := time.Second
		b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1, 1}, Now: func() time.Duration { return now }})
		if err != nil {
			t.Fatal(err)
		}
		p := b.(*predictedTTFT)
		p.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
		for _, h := range tc.holders {
			for _, s := range sessions {
				c := &Context{Prompt: system + s}
				p.Observe(h, c)
				p.FirstToken(h, c, 200*time.Millisecond, len(c.Prompt)/4)
			}
		}
		now += 10 * time.Second // arrivals apart: a rate, not a burst
		for i, n := range tc.queued {
			for k := range n {
				p.Observe(i, &Context{Prompt: system + sessions[k%2] + strings.Repeat("q", 400+k)})
			}
		}
		p.novelty.Store(math.Float64bits(0.5 * float64(p.observes.Load())))
		if got := p.Pick(&Context{Prompt: tc.prompt}, nil, Set{}); !slices.Contains(tc.want, got) {
			t.Errorf("%s: picked %d, want one of %v", tc.name, got, tc.want)
		}
	}
}

// evictedKV is a KVSource whose engines hold none of any prompt: every
// block the events reported was removed again.
type evictedKV struct{}

func (evictedKV) KVScores(_ []uint32, s []float64) bool  { clear(s); return true }
func (evictedKV) Speculate(int, []uint32, time.Duration) {}

// A follow-up whose prefix the engine evicted stays where the approximate
// index last sent it when the waste term prices the move: under the
// simulator's law, with a 4,000-token history sent to target 0, 100 new
// tokens and 1,000 tokens queued at target 0, the follow-up costs 265 ms
// there and 210 ms on the idle target 1 plus 200 ms of waste. Read from
// the events alone (nothing held anywhere, so nothing wasted) it moves to
// target 1; so it does when the index never sent it anywhere.
func TestPredictedTTFTWasteReadsWhereAPrefixLives(t *testing.T) {
	history := strings.Repeat("a", 16000)
	for _, tc := range []struct {
		sent bool
		want int
	}{{true, 0}, {false, 1}} {
		now := time.Second
		b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1}, KV: evictedKV{}, Now: func() time.Duration { return now }})
		if err != nil {
			t.Fatal(err)
		}
		p := b.(*predictedTTFT)
		p.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
		if tc.sent {
			first := &Context{Prompt: history}
			p.Observe(0, first)
			p.FirstToken(0, first, 200*time.Millisecond, 4000)
		}
		now += 10 * time.Second // arrivals apart: a rate, not a burst
		p.Observe(0, &Context{Prompt: strings.Repeat("z", 4*1000)})
		p.novelty.Store(math.Float64bits(0))
		ids := make([]uint32, 4100)
		if got := p.Pick(&Context{Prompt: history + strings.Repeat("b", 400), TokenIDs: ids}, nil, Set{}); got != tc.want {
			t.Fatalf("history sent to target 0: %v; picked %d, want %d", tc.sent, got, tc.want)
		}
	}
}

// Heads sent in one instant, by two peers or by a peer and this balancer,
// are prefilled together: the head is their sum, whichever order the
// peers' reports are kept in (a map, so the simulator's 4-proxy runs were
// not repeatable while the first one found won the tie).
func TestPredictedTTFTHeadsInOneInstantAdd(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	q := func(tokens int) QueueState {
		return QueueState{Requests: 1, Tokens: tokens, HeadTokens: tokens, HeadAge: 10 * time.Millisecond, LeaveAge: -1, AnswerAge: -1}
	}
	b.FoldPeerQueue("peer-a", 0, q(300), time.Minute)
	b.FoldPeerQueue("peer-b", 0, q(500), time.Minute)
	b.FoldPeerQueue("peer-c", 0, QueueState{Requests: 1, Tokens: 700, HeadTokens: 700, HeadAge: 5 * time.Millisecond, LeaveAge: -1, AnswerAge: -1}, time.Minute)
	from, tokens, ok := b.head(0, b.peersAt(0, now))
	if !ok || tokens != 800 || from != int64(now-10*time.Millisecond) {
		t.Fatalf("peers' heads 10 ms old: head from %v with %d tokens (ok %v), want %v with 800", time.Duration(from), tokens, ok, now-10*time.Millisecond)
	}
	// This balancer's own head, sent in the same instant, joins them.
	now -= 10 * time.Millisecond
	b.Observe(0, &Context{Prompt: strings.Repeat("a", 400)})
	now += 10 * time.Millisecond
	own := b.headTokens[0].Load()
	if _, tokens, _ := b.head(0, b.peersAt(0, now)); own <= 0 || tokens != 800+own {
		t.Fatalf("own head of %d tokens in the same instant: head %d, want %d", own, tokens, 800+own)
	}
}

// A first token whose request a peer's unreported work may have been ahead
// of teaches the law nothing: the peer's next report showed its queue at
// the target grown since the report before the dispatch. One whose peer
// reported no growth, or whose growth was reported before its dispatch,
// teaches it.
func TestPredictedTTFTUnseenPeerWorkTeachesNothing(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	ttl := time.Minute
	empty := QueueState{LeaveAge: -1, AnswerAge: -1}
	one := QueueState{Requests: 1, Tokens: 500, HeadTokens: 500, LeaveAge: -1, AnswerAge: -1}
	learned := func() int { b.fitMu.Lock(); defer b.fitMu.Unlock(); return b.pooled.n }

	// Target 0: the peer reports an empty queue, then one request sent
	// after ours was.
	b.FoldPeerQueue("peer", 0, empty, ttl)
	a := &Context{Prompt: strings.Repeat("a", 400)}
	now += time.Millisecond
	b.Observe(0, a)
	now += 4 * time.Millisecond
	b.FoldPeerQueue("peer", 0, one, ttl)
	b.FirstToken(0, a, 20*time.Millisecond, 100)
	if got := learned(); got != 0 {
		t.Fatalf("a first token with a peer's request unseen at dispatch taught the law (%d samples)", got)
	}

	// Target 1: the peer's request was reported before ours was sent, and
	// nothing more came: the features saw it.
	b.FoldPeerQueue("peer", 1, one, ttl)
	c := &Context{Prompt: strings.Repeat("c", 400)}
	now += time.Millisecond
	b.Observe(1, c)
	now += 4 * time.Millisecond
	b.FoldPeerQueue("peer", 1, one, ttl)
	b.FirstToken(1, c, 20*time.Millisecond, 100)
	if got := learned(); got != 1 {
		t.Fatalf("a first token whose peer work was all reported: %d samples, want 1", got)
	}
}

// A replica that stalls (its process frozen, its engine stuck) answers
// nothing, so the requests sent to it stay pending; the prefix it holds
// kept drawing traffic into the stall, since each request there adds only
// its small uncached part to the queue. Its head's lateness is the
// evidence: once the oldest pending request has waited more than twice
// what the law gives it alone and the mean first token so far (100 ms
// here), the excess is added to the target's cost.
// Target 0 holds a 2,000-token prompt; a follow-up goes there while its
// head is on time, elsewhere once the head is a second late, and back once
// the head's first token came.
func TestPredictedTTFTOverdueHeadIsAStall(t *testing.T) {
	now := 10 * time.Second
	b := newTwoTargetTTFT(t, &now)
	b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
	sys := strings.Repeat("shared system prompt ", 400)
	first := &Context{Prompt: sys + "first"}
	b.Observe(0, first)
	now += 100 * time.Millisecond
	b.FirstToken(0, first, 100*time.Millisecond, 2000)
	next := func() *Context { return &Context{Prompt: sys + "next question " + now.String()} }

	head := &Context{Prompt: sys + "the head"}
	b.Observe(0, head)
	// The head's own prefill is its few uncached tokens: the law gives it
	// about 5 ms alone, so 8 ms in it is on time.
	now += 8 * time.Millisecond
	if got := b.overdue(0, &simLaw, now, b.typicalFirst()); got != 0 {
		t.Fatalf("head 8 ms in: overdue %.1f ms, want 0", got)
	}
	if got := b.Pick(next(), nil, Set{}); got != 0 {
		t.Fatalf("head on time: picked %d, want the holder 0", got)
	}
	now += time.Second
	if got := b.overdue(0, &simLaw, now, b.typicalFirst()); got < 790 || got > 810 {
		t.Fatalf("head 1,008 ms in: overdue %.1f ms, want 1,008 − 2 × (5 + 100)", got)
	}
	if got := b.Pick(next(), nil, Set{}); got != 1 {
		t.Fatalf("head a second late: picked %d, want 1", got)
	}
	// A full engine (requests waiting while others run) explains the
	// head's wait: it waits for a batch slot, which is queueing, not a
	// stall (rolter-sim --max-batch 16 on gsp: p99 ×3.4 when it counted).
	b.engine = &slotEngine{waiting: []int{1, 1}, running: []int{1, 1}}
	if got := b.Pick(next(), nil, Set{}); got != 0 {
		t.Fatalf("head late behind requests the engine reports waiting: picked %d, want the holder 0", got)
	}
	b.engine = nil
	b.FirstToken(0, head, time.Second, 2000)
	if got := b.overdue(0, &simLaw, now, b.typicalFirst()); got != 0 {
		t.Fatalf("after the head's first token: overdue %.1f ms, want 0", got)
	}
	if got := b.Pick(next(), nil, Set{}); got != 0 {
		t.Fatalf("stall over: picked %d, want the holder 0", got)
	}
	if got := b.overdue(1, &simLaw, now, b.typicalFirst()); got != 0 {
		t.Fatalf("nothing pending: overdue %.1f ms, want 0", got)
	}
}

// The queue rates are measured over the latest rateWindow arrivals: a
// replica that was busy once is not priced for it for the rest of the
// proxy's life. Target 0 is busy for 10 s; while that is within the
// window its utilisation makes a follower wait there, and once rateWindow
// arrivals at target 1 have passed it is forgotten.
func TestPredictedTTFTRatesForgetTheirPast(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
	// 20 long prefills one after another, each on time (about 500 ms).
	for k := range 20 {
		long := &Context{Prompt: fmt.Sprintf("%d %s", k, strings.Repeat("a long prefill ", 2600))}
		b.Observe(0, long)
		now += 500 * time.Millisecond
		b.FirstToken(0, long, 500*time.Millisecond, 10000)
	}
	follow := followFactors{wait: 1}
	send := func(n int) {
		for k := range n {
			ctx := &Context{Prompt: fmt.Sprintf("request %d at %v", k, now)}
			b.Observe(1, ctx)
			now += time.Millisecond
			b.FirstToken(1, ctx, time.Millisecond, 10)
			now += 9 * time.Millisecond
		}
	}
	send(rateWindow / 2)
	if w := b.followWait(0, follow, now); w < 1 {
		t.Fatalf("10 s busy, %d arrivals ago: follow-up wait %.2f, want the busy share priced (≥ 1 service)", rateWindow/2, w)
	}
	// The means too: the long prefills' ~10,000 tokens each are in the mean
	// uncached prefill while they are in the window, not after.
	if mean, _ := b.meanUncached(); mean < 100 {
		t.Fatalf("mean uncached prefill %.1f tokens with the big request in the window, want it counted", mean)
	}
	send(rateWindow)
	if w := b.followWait(0, follow, now); w != 0 {
		t.Fatalf("10 s busy, %d arrivals ago: follow-up wait %.2f, want 0 (outside the window)", rateWindow*3/2, w)
	}
	if mean, _ := b.meanUncached(); mean > 20 {
		t.Fatalf("mean uncached prefill %.1f tokens, want the latest requests' few (the long ones are outside the window)", mean)
	}
	r := b.fleetRates(now, 1, true)
	if r.arrivals < rateWindow || r.arrivals >= rateWindow+rateStep {
		t.Fatalf("rates over %.0f arrivals, want the latest %d to %d", r.arrivals, rateWindow, rateWindow+rateStep-1)
	}
	// 1 ms busy in every 10 ms at target 1, none at 0: ρ = 0.05 per target.
	if r.rho < 0.04 || r.rho > 0.06 {
		t.Fatalf("utilisation %.3f over the window, want 0.05", r.rho)
	}
}

// The law forgets its old samples: after the engines change (here their
// prefill gets twice as slow, an upgrade gone wrong or another model behind
// the route), three lawMemory samples later the fit is the new engine's
// within a few percent, where pooling every sample since the first would
// still be a weighted mean of the two (86 ms per 1,000 tokens here).
func TestPredictedTTFTLawFollowsAChangedEngine(t *testing.T) {
	var f lawFit
	rng := rand.New(rand.NewPCG(3, 4))
	sample := func(perK float64) {
		n := float64(rng.IntN(6))
		ahead := n * rng.Float64() * 4000
		own := 200 + rng.Float64()*8000
		x := [lawFeatures]float64{1, n, ahead / 1000, own / 1000}
		f.add(x, 5+5*n+perK*(ahead+own)/1000+rng.NormFloat64()*3)
	}
	for range 20000 {
		sample(50)
	}
	for range 3 * lawMemory {
		sample(100)
	}
	w, ok := f.solve()
	if !ok || !f.determined(w, lawOwn) {
		t.Fatalf("no determined fit: %v", w)
	}
	if w[lawOwn] < 93 || w[lawOwn] > 101 {
		t.Fatalf("own-work weight %.1f ms per 1,000 tokens after the change, want about 100 (the new engine's)", w[lawOwn])
	}
}

// A stall is not busy time: the time a head was overdue leaves the busy
// spell when a request leaves, so a replica that stalled and resumed is not
// priced as a busy one (its utilisation, which the follow-up wait reads).
// Target 0's head waits 10 s for a first token the law gives about 5 ms;
// the busy time kept is the on-time part, 2 × (its prediction + the mean
// first token), not the 10 s.
func TestPredictedTTFTStallIsNotBusy(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
	warm := &Context{Prompt: "warm"}
	b.Observe(1, warm)
	now += 100 * time.Millisecond
	b.FirstToken(1, warm, 100*time.Millisecond, 10)
	stuck := &Context{Prompt: "stuck"}
	b.Observe(0, stuck)
	now += 10 * time.Second
	b.FirstToken(0, stuck, 10*time.Second, 10)
	busy := time.Duration(b.busyAt(0, now))
	if busy > time.Second {
		t.Fatalf("busy %v after a 10 s stall, want only its on-time part (about 2 × (5 + 100) ms)", busy)
	}
	if busy < 200*time.Millisecond {
		t.Fatalf("busy %v, want the on-time part counted (about 210 ms)", busy)
	}
}

// With every slot taken, the prefill a request adds to its slot's hold
// delays the requests that wait for the slots after it. In a fleet whose
// first tokens mostly waited for a slot lately, a follow-up waits for a
// slot at its prefix's holder rather than re-prefill the prefix at the
// replica whose slot frees sooner; with no first token having waited, the
// sooner slot wins, as before the term.
func TestPredictedTTFTSlotExternality(t *testing.T) {
	for _, tc := range []struct {
		waited int64 // of 100 first tokens
		want   int
	}{{0, 1}, {90, 0}} {
		now := time.Second
		b := newTwoTargetTTFT(t, &now)
		b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
		// Both engines full: 4 slots, 2 waiting at the holder, 1 at target 1.
		b.engine = &slotEngine{waiting: []int{2, 1}, running: []int{4, 4}}
		first := &Context{Prompt: strings.Repeat("a", 16000)}
		b.Observe(0, first)
		b.FirstToken(0, first, 200*time.Millisecond, 4000)
		b.Learn(0, first, 0, 4*time.Second) // a slot is held 4 s
		b.firstN.Add(99)
		b.firstSum.Add(99 * int64(200*time.Millisecond))
		b.freeN.Add(99 - tc.waited)
		b.freeSum.Add((99 - tc.waited) * int64(200*time.Millisecond))
		setQueueHistory(b, 0, 0)
		b.arrivals[0].Store(1) // 2 arrivals over 1 s, one of them new
		b.arrivals[1].Store(1)
		b.novelty.Store(math.Float64bits(1))
		req := &Context{Prompt: strings.Repeat("a", 16000) + strings.Repeat("b", 400)}
		if got := b.Pick(req, nil, Set{}); got != tc.want {
			t.Fatalf("%d of 100 first tokens waited for a slot: picked %d, want %d (saturation %.2f)", tc.waited, got, tc.want, b.slotSaturation())
		}
	}
}

// randomPrompt is n bytes of random lowercase letters: a prompt no other
// shares any chunk of.
func randomPrompt(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return string(b)
}

// A request whose client does not stream shows no first token: once the
// law is fitted it leaves the queue when the law predicts its first token
// (less the law's fixed part), as if it had come then, and its whole
// answer, arriving later, still teaches the law.
func TestPredictedTTFTBufferedLeavesAtItsDue(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := &Context{Prompt: randomPrompt(rng, 16000), Buffered: true} // 4,000 tokens: 5 + 200 ms, due in 200 (the fixed part left out)
	b.Observe(0, ctx)
	if got := b.pendCount[0].Load(); got != 1 {
		t.Fatalf("after Observe: %d pending, want 1", got)
	}
	now += 150 * time.Millisecond
	b.Pick(&Context{Prompt: "y"}, nil, Set{})
	if got := b.pendCount[0].Load(); got != 1 {
		t.Fatalf("150 ms later (due at 200 ms): %d pending, want 1", got)
	}
	now += 100 * time.Millisecond
	b.Pick(&Context{Prompt: "y"}, nil, Set{})
	if got, leave := b.pendCount[0].Load(), b.lastLeave[0].Load(); got != 0 || leave != int64(time.Second+200*time.Millisecond) {
		t.Fatalf("250 ms later: %d pending, left at %v; want 0, at its due 1.2 s", got, time.Duration(leave))
	}
	samples := b.pooled.n
	b.WholeAnswer(0, ctx, 1500*time.Millisecond, 4000, 65)
	if b.pooled.n != samples+1 || b.wholeN.Load() != 1 {
		t.Fatalf("the whole answer added %d law samples (%d whole answers); want 1 (1)", b.pooled.n-samples, b.wholeN.Load())
	}
	if len(b.answered[0]) != 0 {
		t.Fatalf("%d answered attempts kept after the answer, want none", len(b.answered[0]))
	}
	// Streaming requests are not affected: a first token ends them.
	s := &Context{Prompt: randomPrompt(rng, 16000)}
	b.Observe(1, s)
	now += time.Hour
	b.Pick(&Context{Prompt: "y"}, nil, Set{})
	if got := b.pendCount[1].Load(); got != 1 {
		t.Fatalf("a streamed request an hour on: %d pending, want 1 until its first token", got)
	}
}

// Whole answers teach the law with their output tokens as a fifth input:
// answers of varying length recover the engine's prefill law and its
// decode rate apart (the routing simulator's 5 ms + 50 ms per 1,000
// tokens, 20 ms a token after the first), where taken as first tokens
// their latency would be the law.
func TestPredictedTTFTWholeAnswersTeachTheLaw(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 4 * PredictorMinSamples {
		now += 10 * time.Millisecond // the previous one left the queue (no law yet: at once)
		toks := 200 + rng.IntN(4000)
		out := 16 + rng.IntN(500)
		ctx := &Context{Prompt: randomPrompt(rng, 4*toks), Buffered: true}
		b.Observe(rng.IntN(2), ctx)
		ms := 5 + 50*float64(toks)/1000 + 20*float64(out-1)
		i := 0
		if _, ok := b.pending[1][ctx]; ok {
			i = 1
		}
		b.WholeAnswer(i, ctx, time.Duration(ms*float64(time.Millisecond)), toks, out)
	}
	l := b.Law()
	if !l.Fitted || math.Abs(l.BaseMS-5) > 0.5 || math.Abs(l.OwnMSPer1K-50) > 0.5 || math.Abs(l.DecodeMSPer1K-20000) > 5 {
		t.Fatalf("law %+v, want fitted at 5 ms + 50 per 1,000 own tokens, 20,000 per 1,000 output tokens", l)
	}
	if l.WholeAnswers != 4*PredictorMinSamples || l.FirstTokens != 0 {
		t.Fatalf("%d whole answers, %d first tokens; want %d, 0", l.WholeAnswers, l.FirstTokens, 4*PredictorMinSamples)
	}

	// Answers all of one length cannot tell their decode from a fixed
	// part, which carries it; the own prefill is still found.
	b = newTwoTargetTTFT(t, &now)
	for range 4 * PredictorMinSamples {
		now += 10 * time.Millisecond
		toks := 200 + rng.IntN(4000)
		ctx := &Context{Prompt: randomPrompt(rng, 4*toks), Buffered: true}
		b.Observe(0, ctx)
		b.WholeAnswer(0, ctx, time.Duration((5+50*float64(toks)/1000+20*255)*float64(time.Millisecond)), toks, 256)
	}
	if l := b.Law(); !l.Fitted || math.Abs(l.OwnMSPer1K-50) > 0.5 || math.Abs(l.BaseMS+l.DecodeMSPer1K*0.255-(5+20*255)) > 1 {
		t.Fatalf("law %+v from 256-token answers, want 50 ms per 1,000 own tokens, and the fixed part and the decode together 5,105 ms", l)
	}
}

// A replica that stops answering while it holds requests whose answers come
// back whole (they left the queue at their due, so no head is late) costs
// the time it has been silent beyond twice the longest whole answer lately: a prompt
// it holds goes elsewhere, and returns once an answer comes back.
func TestPredictedTTFTSilentTargetCosts(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	b.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
	rng := rand.New(rand.NewPCG(5, 6))
	held := randomPrompt(rng, 16000)
	// Whole answers of 1 s lately, one from each target; target 0 holds
	// the prompt.
	for i, prompt := range []string{held, randomPrompt(rng, 16000)} {
		ctx := &Context{Prompt: prompt, Buffered: true}
		b.Observe(i, ctx)
		now += time.Second
		b.WholeAnswer(i, ctx, time.Second, 4000, 50)
		b.Learn(i, ctx, 0, time.Second)
	}
	if got := b.longWhole.ms(); got != 1000 {
		t.Fatalf("longest whole answer lately %v ms, want 1000", got)
	}
	pick := func() int { return b.Pick(&Context{Prompt: held}, nil, Set{}) }
	if got := pick(); got != 0 {
		t.Fatalf("target 0 holds the prompt, both quiet: picked %d, want 0", got)
	}
	// Target 0 takes a request and says nothing for 2.5 s past its due
	// (when it left the queue): under twice the longest answer lately, it
	// is not silent; past it, it is.
	stuck := &Context{Prompt: randomPrompt(rng, 400), Buffered: true}
	b.Observe(0, stuck)
	due := time.Duration(b.pending[0][stuck].due)
	now = due + 1500*time.Millisecond
	if got := pick(); got != 0 {
		t.Fatalf("silent 1.5 s past its due (under twice the longest answer, 1 s): picked %d, want 0", got)
	}
	if len(b.answered[0]) != 1 || b.pendCount[0].Load() != 0 || b.answeredDue[0].Load() != int64(due) {
		t.Fatalf("past its due: %d answered, %d pending, earliest due %v; want 1, 0, %v", len(b.answered[0]), b.pendCount[0].Load(),
			time.Duration(b.answeredDue[0].Load()), due)
	}
	now = due + 2500*time.Millisecond
	if got, silent := pick(), b.silence(0, now, b.longWhole.ms()); got != 1 || silent != 500 {
		t.Fatalf("silent 2.5 s past its due: picked %d, silence %v ms; want 1, 500", got, silent)
	}
	// Target 1 answering does not speak for target 0.
	other := &Context{Prompt: randomPrompt(rng, 400)}
	b.Observe(1, other)
	b.FirstToken(1, other, 10*time.Millisecond, 100)
	if got := pick(); got != 1 {
		t.Fatalf("target 1 answered, target 0 still silent: picked %d, want 1", got)
	}
	// Target 0 answers: the silence ends.
	b.WholeAnswer(0, stuck, 2500*time.Millisecond, 100, 50)
	if got, silent := pick(), b.silence(0, now, b.longWhole.ms()); got != 0 || silent != 0 {
		t.Fatalf("target 0 answered: picked %d, silence %v ms; want 0, 0", got, silent)
	}
	if at := b.answeredDue[0].Load(); at != -1 {
		t.Fatalf("nothing left awaiting an answer at target 0, but its oldest is at %v", time.Duration(at))
	}
}

// Before the law is fitted (no time scale to price a stall in), a target
// that has answered nothing for twice the longest wait lately for what it
// owes is left out of the pick while another is not: streaming first
// tokens and whole answers alike.
func TestPredictedTTFTQuietTargetLeftOutBeforeTheLaw(t *testing.T) {
	for _, buffered := range []bool{false, true} {
		now := time.Second
		b := newTwoTargetTTFT(t, &now)
		rng := rand.New(rand.NewPCG(7, 8))
		held := randomPrompt(rng, 16000)
		// answer reports ctx's answer from target i, taking 10 ms (so the
		// longest stays 10 ms).
		answer := func(i int, ctx *Context, promptTokens int) {
			if buffered {
				b.WholeAnswer(i, ctx, 10*time.Millisecond, promptTokens, 1)
			} else {
				b.FirstToken(i, ctx, 10*time.Millisecond, promptTokens)
			}
		}
		// Answers of 10 ms lately, one from each target; target 0 holds the
		// prompt.
		for i, prompt := range []string{held, randomPrompt(rng, 16000)} {
			ctx := &Context{Prompt: prompt, Buffered: buffered}
			b.Observe(i, ctx)
			now += 10 * time.Millisecond
			answer(i, ctx, 4000)
			b.Learn(i, ctx, 0, 10*time.Millisecond)
		}
		if b.law() != b.unitLaw {
			t.Fatal("the law is fitted after two answers")
		}
		picks := func(want int, when string) {
			t.Helper()
			if got := b.Pick(&Context{Prompt: held}, nil, Set{}); got != want {
				t.Fatalf("buffered %v: %s: picked %d, want %d", buffered, when, got, want)
			}
		}
		picks(0, "target 0 holds the prompt")
		stuck := &Context{Prompt: randomPrompt(rng, 400), Buffered: buffered}
		b.Observe(0, stuck)
		now += 15 * time.Millisecond
		picks(0, "15 ms without an answer (the longest lately 10)")
		now += 10 * time.Millisecond
		picks(1, "25 ms without an answer (the longest lately 10)")
		// Left out only while another target is not.
		stuck1 := &Context{Prompt: randomPrompt(rng, 400), Buffered: buffered}
		b.Observe(1, stuck1)
		now += 25 * time.Millisecond
		picks(0, "both quiet (target 0 holds the prompt)")
		answer(1, stuck1, 100)
		picks(1, "target 1 answered, target 0 still quiet")
	}
}

// sharedKV is a KVSharedSource that marks every block of a request as new
// (block i of n tokens is identity i+1) and records what peers passed on.
type sharedKV struct {
	folded map[int][]uint64
}

func (s *sharedKV) KVScores(_ []uint32, scores []float64) bool { clear(scores); return true }
func (s *sharedKV) Speculate(int, []uint32, time.Duration)     {}
func (s *sharedKV) SpeculateIDs(target int, ids []uint64, _ time.Duration) {
	s.folded[target] = append(s.folded[target], ids...)
}
func (s *sharedKV) SpeculateAppend(_ int, tokenIDs []uint32, _ time.Duration, dst []uint64) []uint64 {
	for i := range len(tokenIDs) / 16 {
		dst = append(dst, uint64(i+1))
	}
	return dst
}

// A sharing balancer keeps what its picks speculated until the fleet takes
// it, once; what no fleet took within the speculative TTL is dropped, the
// total is bounded, and a balancer that does not share keeps nothing.
func TestPredictedTTFTKeepsSpeculationForPeers(t *testing.T) {
	now := time.Second
	kv := &sharedKV{folded: map[int][]uint64{}}
	newB := func(share func(int, string)) *predictedTTFT {
		b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1}, KV: kv, Share: share, Now: func() time.Duration { return now }})
		if err != nil {
			t.Fatal(err)
		}
		return b.(*predictedTTFT)
	}
	b := newB(func(int, string) {})
	send := func(blocks int) {
		b.Observe(1, &Context{Prompt: "p", TokenIDs: make([]uint32, 16*blocks)})
	}
	send(3)
	send(2)
	if got := b.TakeSpeculated(1, nil); len(got) != 5 {
		t.Fatalf("after two picks of 3 and 2 blocks: took %v, want 5 identities", got)
	}
	if got := b.TakeSpeculated(1, nil); len(got) != 0 {
		t.Fatalf("taken twice: %v", got)
	}
	if got := b.TakeSpeculated(0, nil); len(got) != 0 {
		t.Fatalf("target 0, never picked: %v", got)
	}
	// Untaken past the TTL (no fleet connected): dropped, not passed on.
	send(3)
	now += DefaultSpeculativeTTL + time.Millisecond
	if got := b.TakeSpeculated(1, nil); len(got) != 0 {
		t.Fatalf("speculation older than its TTL passed on: %v", got)
	}
	// Bounded: a prompt's leading blocks are kept, its tail past the bound not.
	send(maxSharedSpeculation - 10)
	send(20)
	if got := b.TakeSpeculated(1, nil); len(got) != maxSharedSpeculation || got[len(got)-1] != 10 {
		t.Fatalf("past the bound: took %d identities ending in %d, want %d ending in the second prompt's 10th", len(got), got[len(got)-1], maxSharedSpeculation)
	}
	b.FoldPeerSpeculated(0, []uint64{7, 8})
	if got := kv.folded[0]; len(got) != 2 || got[0] != 7 {
		t.Fatalf("a peer's identities reached the KV source as %v", got)
	}
	solo := newB(nil)
	solo.Observe(1, &Context{Prompt: "p", TokenIDs: make([]uint32, 48)})
	if got := solo.TakeSpeculated(1, nil); len(got) != 0 {
		t.Fatalf("a balancer that does not share kept %v", got)
	}
}

// A target is busy while a peer reports requests pending there, not only
// while this balancer has some: its busy time is the target's, so the
// utilisation read once peers are heard is not scaled by the fleet's size.
func TestPredictedTTFTPeersQueueCountsAsBusy(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	pending := QueueState{Requests: 2, Tokens: 800, HeadTokens: 400, LeaveAge: -1, AnswerAge: -1}
	b.FoldPeerQueue("peer", 0, pending, time.Minute)
	now += 100 * time.Millisecond
	if got := time.Duration(b.busyAt(0, now)); got != 100*time.Millisecond {
		t.Fatalf("a peer's queue pending for 100 ms: target 0 busy %v", got)
	}
	// Its own request overlaps the peer's: counted once.
	ctx := &Context{Prompt: strings.Repeat("a", 400)}
	b.Observe(0, ctx)
	now += 50 * time.Millisecond
	b.FirstToken(0, ctx, 50*time.Millisecond, 100)
	b.FoldPeerQueue("peer", 0, QueueState{LeaveAge: 0, AnswerAge: 0}, time.Minute)
	now += 100 * time.Millisecond
	if got := time.Duration(b.busyAt(0, now)); got != 150*time.Millisecond {
		t.Fatalf("busy 150 ms, own and the peer's overlapping, then idle 100 ms: busy %v", got)
	}
	if got := b.busyAt(1, now); got != 0 {
		t.Fatalf("target 1, no queue anywhere: busy %v", time.Duration(got))
	}
	// A peer that goes silent with requests pending (it died, or its
	// emptying report was lost) keeps target 1 busy until its report
	// expires, not until this balancer's next request there.
	b.FoldPeerQueue("gone", 1, pending, 20*time.Millisecond)
	now += time.Second
	if got := time.Duration(b.busyAt(1, now)); got != 20*time.Millisecond {
		t.Fatalf("a peer's report valid for 20 ms, then silence for a second: target 1 busy %v", got)
	}
	b.FoldPeerQueue("back", 1, pending, 20*time.Millisecond)
	now += 10 * time.Millisecond
	if got := time.Duration(b.busyAt(1, now)); got != 30*time.Millisecond {
		t.Fatalf("a new report 1 s later, 10 ms ago: target 1 busy %v, want 20 + 10 ms", got)
	}
	// Once a peer is heard the busy share is the targets', not scaled: with
	// the law fitted, ρ is the busy time over the targets and the time since
	// the first request, whatever the fleet scale.
	b.fleet.Store(&simLaw)
	r := b.fleetRates(now, 4, true)
	want := float64(150*time.Millisecond+30*time.Millisecond) / 2 / float64(now-time.Second-100*time.Millisecond)
	if !r.timed || math.Abs(r.rho-want) > 1e-9 {
		t.Fatalf("ρ %v (timed %v), want %v unscaled", r.rho, r.timed, want)
	}
}

// The externality charges the pooled arrival rate to a target whose prefill
// queue was busy over the rates' window, and nothing to one that was never
// busy in it: nobody arrived there, and nobody is expected behind the
// request. Target 0 busy half the time (ρ = 0.25 pooled over two
// targets; 10 arrivals in 10 s, 0.0005 per ms per target): 100 ms of own
// prefill on a queue that clears in 200 ms delays 0.0005 × 200 / 0.75
// arrivals by 100 ms each.
func TestPredictedTTFTIdleTargetExternality(t *testing.T) {
	now := 10 * time.Second
	b := newTwoTargetTTFT(t, &now)
	setQueueHistory(b, 5*time.Second, 0)
	r := b.fleetRates(now, 1, true)
	if !r.timed || math.Abs(r.rho-0.25) > 1e-9 || math.Abs(r.lambda-0.0005) > 1e-12 {
		t.Fatalf("rates %+v, want ρ 0.25 and λ 0.0005 per ms", r)
	}
	if got, want := b.externality(0, 100, 200, r, false), 100*0.0005*200/0.75; math.Abs(got-want) > 1e-9 {
		t.Fatalf("busy target: externality %.3f ms, want %.3f", got, want)
	}
	if got := b.externality(1, 100, 200, r, false); got != 0 {
		t.Fatalf("target never busy in the window: externality %.3f ms, want 0", got)
	}
	b.busyTotal[1].Store(int64(time.Millisecond))
	if got := b.externality(1, 100, 200, b.fleetRates(now, 1, true), false); got <= 0 {
		t.Fatalf("target busy 1 ms in the window: externality %.3f ms, want the pooled rate's", got)
	}
}

// Where the queue is counted (countQueued: a prompt of which no target holds
// more than a shared part, held by one target at most), the externality
// counts at least the requests queued at the target now, times
// the fleet scale: six pending at target 0 outnumber the pooled rate's
// 0.0005 × 200 / 0.75 arrivals, and through two proxies they stand for
// twelve. A prompt whose own history the target holds is charged the pooled
// rate alone, and so is a target with fewer queued than the rate expects.
func TestPredictedTTFTExternalityCountsTheQueueOfASharedPrefix(t *testing.T) {
	now := 10 * time.Second
	b := newTwoTargetTTFT(t, &now)
	setQueueHistory(b, 5*time.Second, 0)
	r := b.fleetRates(now, 1, true)
	pooled := 100 * 0.0005 * 200 / 0.75
	b.pendCount[0].Store(6)
	if got := b.externality(0, 100, 200, r, true); math.Abs(got-600) > 1e-9 {
		t.Fatalf("shared prefix, six queued: externality %.3f ms, want 6 × 100", got)
	}
	if got := b.externality(0, 100, 200, r, false); math.Abs(got-pooled) > 1e-9 {
		t.Fatalf("own history held, six queued: externality %.3f ms, want the pooled %.3f", got, pooled)
	}
	r.scale = 2
	if got := b.externality(0, 100, 200, r, true); math.Abs(got-1200) > 1e-9 {
		t.Fatalf("shared prefix, six queued through two proxies: externality %.3f ms, want 12 × 100", got)
	}
	r.scale = 1
	b.pendCount[0].Store(0)
	if got := b.externality(0, 100, 200, r, true); math.Abs(got-pooled) > 1e-9 {
		t.Fatalf("shared prefix, nothing queued: externality %.3f ms, want the pooled %.3f", got, pooled)
	}
}

// A flightLog sums the changes after a time, among those it still holds:
// the latest flightLogSize.
func TestFlightLogSince(t *testing.T) {
	var l flightLog
	if got := l.since(0); got != 0 {
		t.Fatalf("empty log: %d", got)
	}
	for at := int64(1); at <= 10; at++ {
		d := int8(1)
		if at%3 == 0 {
			d = -1
		}
		l.add(at, d) // +1 +1 −1 +1 +1 −1 +1 +1 −1 +1
	}
	for from, want := range map[int64]int64{0: 4, 1: 3, 5: 1, 9: 1, 10: 0, 11: 0} {
		if got := l.since(from); got != want {
			t.Errorf("since %d: %d, want %d", from, got, want)
		}
	}
	for k := range flightLogSize {
		l.add(int64(100+k), -1)
	}
	if got := l.since(0); got != -flightLogSize {
		t.Errorf("after wrapping: since 0 = %d, want the %d changes held", got, -flightLogSize)
	}
	if got := l.since(100 + flightLogSize - 3); got != -2 {
		t.Errorf("after wrapping: the last two = %d, want -2", got)
	}
}
