package routing

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// The batch fit recovers the TTFT each running request adds from noisy
// residuals, and determines nothing from residuals that do not grow with
// the batch, from too few samples, or from a batch that never varied.
func TestBatchFit(t *testing.T) {
	var f batchFit
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		r := float64(rng.IntN(20))
		f.add(r, 3+0.4*r+rng.NormFloat64()*2)
	}
	l, ok := f.solve()
	if !ok || math.Abs(l.slope-0.4) > 0.1 {
		t.Fatalf("residuals growing 0.4 ms per running request: law %+v %v, want a slope of about 0.4", l, ok)
	}
	var flat batchFit // a constant time per step, with rounding
	for k := range 2000 {
		flat.add(float64(k%20), 5+1e-12*float64(k%7))
	}
	if l, ok := flat.solve(); ok {
		t.Fatalf("residuals that do not grow with the batch: law %+v, want none", l)
	}
	var few batchFit
	for k := range PredictorMinSamples - 1 {
		few.add(float64(k), float64(10*k))
	}
	if l, ok := few.solve(); ok {
		t.Fatalf("%d samples: law %+v, want none", PredictorMinSamples-1, l)
	}
	var still batchFit // the batch never varied
	for k := range 100 {
		still.add(8, float64(k%10))
	}
	if l, ok := still.solve(); ok {
		t.Fatalf("a batch that never varied: law %+v, want none", l)
	}
	if got := (*batchLaw)(nil).cost(50); got != 0 {
		t.Fatalf("no law: cost %v, want 0", got)
	}
}

// heldKV is a KVSource whose targets hold the fractions in held of every
// prompt.
type heldKV struct{ held []float64 }

func (k *heldKV) KVScores(_ []uint32, s []float64) bool { copy(s, k.held); return true }
func (*heldKV) Speculate(int, []uint32, time.Duration)  {}

// tokenIDs is n token ids.
func tokenIDs(n int) []uint32 { return make([]uint32, n) }

// trainBatch serves 200 first tokens on two targets whose engines report
// running counts and whose KV events show none of the prompts (each new,
// its whole prefill the request's own): TTFT = 5 ms + 50 ms per 1,000
// tokens + perRunning × the running count.
func trainBatch(t *testing.T, b *predictedTTFT, eng *slotEngine, now *time.Duration, perRunning float64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(5, 6))
	for k := range 200 {
		target := k % 2
		eng.running[target] = rng.IntN(40)
		tok := 100 * (1 + rng.IntN(40))
		ctx := &Context{Prompt: randomPrompt(rng, 4*tok), TokenIDs: tokenIDs(tok)}
		b.Observe(target, ctx)
		ms := 5 + float64(tok)/20 + perRunning*float64(eng.running[target])
		*now += time.Duration(ms * float64(time.Millisecond))
		b.FirstToken(target, ctx, time.Duration(ms*float64(time.Millisecond)), tok)
		b.Learn(target, ctx, 0, time.Duration(ms*float64(time.Millisecond)))
	}
}

// An engine whose steps slow with its batch gives the replica holding a
// prompt's prefix a longer first token the more it runs: the balancer
// learns by how much from the first tokens and sends the request to the
// replica without the prefix once that costs more than the prefill it
// saves (the request's own and the fleet's for a second copy, see waste); an engine whose steps do not slow teaches nothing, and the holder
// keeps it however busy.
func TestPredictedTTFTBatchTerm(t *testing.T) {
	for _, perRunning := range []float64{3, 0} {
		now := time.Second
		b := newTwoTargetTTFT(t, &now)
		eng := &slotEngine{waiting: []int{0, 0}, running: []int{0, 0}}
		kv := &heldKV{held: []float64{0, 0}}
		b.engine, b.kv = eng, kv
		trainBatch(t, b, eng, &now, perRunning)
		if b.law() == b.unitLaw {
			t.Fatal("no law after 200 first tokens")
		}
		law := b.batch.law.Load()
		if perRunning == 0 {
			if law != nil {
				t.Fatalf("steps that do not slow with the batch: batch law %+v, want none", law)
			}
		} else if law == nil || math.Abs(law.slope-perRunning) > 0.3 {
			t.Fatalf("steps slowing 3 ms per running request: batch law %+v, want a slope of about 3", law)
		}
		if got := b.Law().PerRunningMS; law != nil && got != law.slope || law == nil && got != 0 {
			t.Fatalf("reported per_request_running %v, want the batch law's slope", got)
		}
		// Target 0 holds the next prompt's 2,000 tokens: 100 ms to prefill
		// at target 1.
		kv.held = []float64{1, 0}
		now += time.Second
		next := &Context{Prompt: randomPrompt(rand.New(rand.NewPCG(7, 8)), 8000), TokenIDs: tokenIDs(2000)}
		eng.running[0], eng.running[1] = 10, 0 // 30 ms at 3 ms each: less than the prefill saved
		if got := b.Pick(next, []int{10, 0}, Set{}); got != 0 {
			t.Fatalf("holder running 10 (%v ms each): picked %d, want the holder", perRunning, got)
		}
		// 450 ms: more than the prefill there and the waste of a second
		// copy (100 ms each).
		eng.running[0] = 150
		want := 1
		if perRunning == 0 {
			want = 0
		}
		if got := b.Pick(next, []int{150, 0}, Set{}); got != want {
			t.Fatalf("holder running 150 (%v ms each): picked %d, want %d", perRunning, got, want)
		}
	}
}

// Without KV events the law's inputs are the approximate index's guesses,
// whose errors grow with a replica's churn, and the batch term neither
// learns nor charges: a batch slowdown is not told from them.
func TestPredictedTTFTBatchTermNeedsKVEvents(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	eng := &slotEngine{waiting: []int{0, 0}, running: []int{0, 0}}
	b.engine = eng
	trainBatch(t, b, eng, &now, 3)
	if b.law() == b.unitLaw {
		t.Fatal("no law after 200 first tokens")
	}
	if law := b.batch.law.Load(); law != nil || b.batch.fit.n != 0 {
		t.Fatalf("approximate matches: batch law %+v from %d samples, want none", law, b.batch.fit.n)
	}
}

// The running count the batch term reads is the engine's when it is
// scraped, else this balancer's own requests past their first token.
func TestPredictedTTFTRunningAt(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	b.inflight[0].Store(3)
	b.pendCount[0].Store(1)
	if got := b.runningAt(0, b.counts(0)); got != 2 {
		t.Fatalf("no engine counts: running %v, want the own 2 past their first token", got)
	}
	b.engine = &slotEngine{waiting: []int{0, 0}, running: []int{7, 0}}
	if got := b.runningAt(0, b.counts(0)); got != 7 {
		t.Fatalf("engine counts: running %v, want the engine's 7", got)
	}
}

// The engine's running count is as old as its scrape: this balancer's own
// requests that completed since are taken off it (through one proxy the
// engine now), and what it showed beyond the own requests fades as the
// scrape ages.
func TestPredictedTTFTRunningAtAgesWithScrape(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	eng := &slotEngine{waiting: []int{0, 0}, running: []int{0, 0}}
	b.engine = eng
	reqs := make([]*Context, 4)
	for k := range reqs {
		reqs[k] = &Context{Prompt: randomPrompt(rand.New(rand.NewPCG(uint64(k), 1)), 400), TokenIDs: tokenIDs(100)}
		b.Observe(0, reqs[k])
		b.FirstToken(0, reqs[k], 10*time.Millisecond, 100)
	}
	eng.running[0] = 4
	if got := b.runningAt(0, b.counts(0)); got != 4 {
		t.Fatalf("scraped just now: running %v, want 4", got)
	}
	now += 200 * time.Millisecond
	for _, ctx := range reqs[:3] {
		b.Learn(0, ctx, 0, time.Second)
	}
	eng.age = 200 * time.Millisecond
	if got := b.runningAt(0, b.counts(0)); got != 1 {
		t.Fatalf("scraped 200 ms ago, 3 of the 4 completed since: running %v, want 1", got)
	}
	// Another proxy's 9 requests: counted as scraped just now, faded to
	// about the little the counts usually show beyond the own a minute on.
	eng.running[0], eng.age = 10, 0
	if got := b.runningAt(0, b.counts(0)); got != 10 {
		t.Fatalf("9 beyond the own 1 scraped just now: running %v, want 10", got)
	}
	eng.age = time.Minute
	if got := b.runningAt(0, b.counts(0)); got >= 2 {
		t.Fatalf("9 beyond the own 1 scraped a minute ago: running %v, want under 2", got)
	}

	// A request waiting at the scrape that has had its first token since
	// was not among the own requests running then: the 5 the engine ran
	// beyond them are still there (first tokens take 10 s here, so 100
	// ms fades next to nothing), beside the own 2.
	now += time.Second
	b = newTwoTargetTTFT(t, &now)
	eng = &slotEngine{waiting: []int{1, 0}, running: []int{6, 0}}
	b.engine = eng
	ran, waited := &Context{Prompt: "ran", TokenIDs: tokenIDs(100)}, &Context{Prompt: "waited", TokenIDs: tokenIDs(100)}
	b.Observe(0, ran)
	b.FirstToken(0, ran, 10*time.Second, 100)
	b.Observe(0, waited)
	if got := b.runningAt(0, b.counts(0)); got != 6 {
		t.Fatalf("own 1 running and 1 waiting, 5 more running: running %v, want 6", got)
	}
	now += 100 * time.Millisecond
	b.FirstToken(0, waited, 10*time.Second, 100)
	eng.age = 100 * time.Millisecond
	if got := b.runningAt(0, b.counts(0)); got < 6.9 || got > 7 {
		t.Fatalf("the own waiting one's first token since the scrape: running %v, want about 7", got)
	}
}

// Once a peer has been heard the batch term neither learns nor charges:
// a balancer that learned 3 ms per running request keeps the holder of a
// prompt however busy once it has a peer, its first tokens add no sample,
// and its law reports no slope (per_request_running 0).
func TestPredictedTTFTBatchTermOffWithPeers(t *testing.T) {
	now := time.Second
	b := newTwoTargetTTFT(t, &now)
	eng := &slotEngine{waiting: []int{0, 0}, running: []int{0, 0}}
	kv := &heldKV{held: []float64{0, 0}}
	b.engine, b.kv = eng, kv
	trainBatch(t, b, eng, &now, 3)
	if b.batch.law.Load() == nil {
		t.Fatal("no batch law learned alone")
	}
	kv.held = []float64{1, 0}
	eng.running[0] = 150
	next := &Context{Prompt: randomPrompt(rand.New(rand.NewPCG(7, 8)), 8000), TokenIDs: tokenIDs(2000)}
	if got := b.Pick(next, []int{150, 0}, Set{}); got != 1 {
		t.Fatalf("alone, holder running 150: picked %d, want 1", got)
	}
	if got := b.Law().PerRunningMS; got != b.batch.law.Load().slope {
		t.Fatalf("alone: reported per_request_running %v, want the batch law's slope", got)
	}
	b.peerHeard.Store(int64(now))
	if got := b.Pick(next, []int{150, 0}, Set{}); got != 0 {
		t.Fatalf("with a peer, holder running 150: picked %d, want the holder", got)
	}
	if got := b.Law().PerRunningMS; got != 0 {
		t.Fatalf("with a peer: reported per_request_running %v, want 0 (not charged)", got)
	}
	n := b.batch.fit.n
	ctx := &Context{Prompt: randomPrompt(rand.New(rand.NewPCG(9, 10)), 400), TokenIDs: tokenIDs(100)}
	b.Observe(1, ctx)
	b.FirstToken(1, ctx, 10*time.Millisecond, 100)
	if b.batch.fit.n != n {
		t.Fatalf("with a peer: %d batch samples after a first token, want %d", b.batch.fit.n, n)
	}
}
