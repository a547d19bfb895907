package routing_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"rolter.dev/pkg/affinity"
	"rolter.dev/pkg/chunkindex"
	"rolter.dev/pkg/routing"
)

// ttftClock is a virtual clock for Spec.Now; tick advances it.
type ttftClock struct{ now time.Duration }

func (c *ttftClock) read() time.Duration { return c.now }
func (c *ttftClock) tick()               { c.now += time.Millisecond }

// words returns n bytes of distinct text seeded by seed (no shared prefix
// between seeds).
func words(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 7))
	var b strings.Builder
	for b.Len() < n {
		b.WriteByte(byte('a' + rng.IntN(26)))
		if rng.IntN(5) == 0 {
			b.WriteByte(' ')
		}
	}
	return b.String()[:n]
}

func newTTFT(tb testing.TB, n int, seed uint64, clock *ttftClock, mod func(*routing.Spec)) routing.Balancer {
	tb.Helper()
	spec := routing.Spec{Strategy: routing.PredictedTTFT, IntN: rand.New(rand.NewPCG(seed, 1)).IntN, Now: clock.read}
	if mod != nil {
		mod(&spec)
	}
	return newBalancer(tb, spec, n)
}

// served sends ctx to target and reports its first token: the target now
// holds the prompt and has nothing pending.
func served(b routing.Balancer, target int, ctx *routing.Context, clock *ttftClock) {
	b.Observe(target, ctx)
	clock.tick()
	b.(routing.TTFTObserver).FirstToken(target, ctx, 20*time.Millisecond, 0)
	clock.tick()
}

func TestPredictedTTFTPrefersHolderWhenQueuesEqual(t *testing.T) {
	sys := words(1, 4000)
	for seed := range uint64(20) {
		clock := &ttftClock{now: time.Second}
		b := newTTFT(t, 4, seed, clock, nil)
		served(b, 2, &routing.Context{Prompt: sys + words(2, 400)}, clock)
		got := b.Pick(&routing.Context{Prompt: sys + words(3, 400)}, []int{0, 0, 0, 0}, routing.All(4))
		if got != 2 {
			t.Fatalf("seed %d: picked %d, want the holder 2", seed, got)
		}
	}
}

func TestPredictedTTFTLeavesHotHolder(t *testing.T) {
	sys := words(1, 2000)
	clock := &ttftClock{now: time.Second}
	b := newTTFT(t, 2, 1, clock, nil)
	served(b, 0, &routing.Context{Prompt: sys + words(2, 400)}, clock)
	req := &routing.Context{Prompt: sys + words(3, 2000)}
	if got := b.Pick(req, nil, routing.All(2)); got != 0 {
		t.Fatalf("idle holder: picked %d, want 0", got)
	}
	// Queue 4 long unrelated prefills on the holder: 4 × 2,000 tokens
	// ahead outweigh the 500 tokens its cache saves.
	var queued []*routing.Context
	for i := range 4 {
		c := &routing.Context{Prompt: words(uint64(10+i), 8000)}
		b.Observe(0, c)
		queued = append(queued, c)
		clock.tick()
	}
	if got := b.Pick(req, nil, routing.All(2)); got != 1 {
		t.Fatalf("holder with 8,000 tokens queued: picked %d, want 1", got)
	}
	// Once their first tokens arrive (or they are abandoned), the holder
	// is worth its cache again.
	obs := b.(routing.TTFTObserver)
	for i, c := range queued {
		if i%2 == 0 {
			obs.FirstToken(0, c, 400*time.Millisecond, 2000)
		} else {
			obs.Abandon(0, c)
		}
	}
	if got := b.Pick(req, nil, routing.All(2)); got != 0 {
		t.Fatalf("queue drained: picked %d, want 0", got)
	}
}

// TestPredictedTTFTReadsNoCache: a request the engine prefills whole
// whatever it holds (prompt log probabilities) gains nothing from the
// holder of its prefix: it goes where the queue is shorter, while the same
// prompt reading the cache goes to the holder.
func TestPredictedTTFTReadsNoCache(t *testing.T) {
	sys := words(1, 8000)
	clock := &ttftClock{now: time.Second}
	b := newTTFT(t, 2, 1, clock, nil)
	served(b, 0, &routing.Context{Prompt: sys + words(2, 400)}, clock)
	b.Observe(0, &routing.Context{Prompt: words(5, 1000)}) // a short prefill queued on the holder
	clock.tick()
	req := routing.Context{Prompt: sys + words(3, 400)}
	if got := b.Pick(&req, nil, routing.All(2)); got != 0 {
		t.Fatalf("reading the cache: picked %d, want the holder 0", got)
	}
	req.ReadsNoCache = true
	if got := b.Pick(&req, nil, routing.All(2)); got != 1 {
		t.Fatalf("reading no cache: picked %d, want the idle 1", got)
	}
}

func TestPredictedTTFTColdStartSpreads(t *testing.T) {
	// A burst: every request in the same instant, nothing cached, loads
	// unknown. Each pick queues its prefill, so the next goes elsewhere.
	clock := &ttftClock{now: time.Second}
	b := newTTFT(t, 8, 3, clock, nil)
	counts := make([]int, 8)
	for i := range 64 {
		ctx := &routing.Context{Prompt: words(uint64(100+i), 4000)}
		target := b.Pick(ctx, nil, routing.All(8))
		b.Observe(target, ctx)
		counts[target]++
	}
	for i, c := range counts {
		if c != 8 {
			t.Fatalf("target %d got %d of 64 cold requests, want 8 each: %v", i, c, counts)
		}
	}
}

// In a burst of many distinct prefixes (a gsp-like benchmark starting all
// its clients at once), a follower of a prefix stays with its holder even
// while some targets are still idle: they will soon have new prefixes of
// their own, so a copy of the prefix there would delay them. (Estimating a
// target's later arrivals by its own arrivals so far, 0 for an idle one,
// copied the prefix.)
func TestPredictedTTFTBurstKeepsFollowerWithHolder(t *testing.T) {
	for seed := range uint64(10) {
		clock := &ttftClock{now: time.Second}
		b := newTTFT(t, 8, seed, clock, nil)
		holder := -1
		for g := range 3 {
			ctx := &routing.Context{Prompt: words(uint64(200+g), 8000) + words(uint64(300+g), 500)}
			target := b.Pick(ctx, nil, routing.All(8))
			b.Observe(target, ctx)
			if g == 0 {
				holder = target
			}
		}
		follower := &routing.Context{Prompt: words(200, 8000) + words(400, 500)}
		if got := b.Pick(follower, nil, routing.All(8)); got != holder {
			t.Fatalf("seed %d: follower picked %d, want its prefix's holder %d", seed, got, holder)
		}
	}
}

// In a burst where everyone shares one prefix (agents with one system
// prompt starting together, each session then sticking to its replica), the
// burst spreads over the targets instead of piling onto the prefix's first
// holder: an idle target expects no followers.
func TestPredictedTTFTBurstSpreadsOneSharedPrefix(t *testing.T) {
	sys := words(1, 16000)
	clock := &ttftClock{now: time.Second}
	b := newTTFT(t, 16, 5, clock, nil)
	counts := make([]int, 16)
	for a := range 64 {
		ctx := &routing.Context{Prompt: sys + words(uint64(500+a), 1000)}
		target := b.Pick(ctx, nil, routing.All(16))
		b.Observe(target, ctx)
		counts[target]++
	}
	for i, c := range counts {
		if c < 2 || c > 6 {
			t.Fatalf("target %d got %d of 64 sessions, want about 4 each: %v", i, c, counts)
		}
	}
}

// heldEverywhere serves prefix at each of n targets and completes it
// there: prompts that extend it are held by every target, not new
// prefixes, and tie on cost.
func heldEverywhere(b routing.Balancer, n int, prefix string, clock *ttftClock) {
	for i := range n {
		ctx := &routing.Context{Prompt: prefix}
		served(b, i, ctx, clock)
		b.(routing.Learner).Learn(i, ctx, 0, time.Millisecond)
	}
}

func TestPredictedTTFTTiesSpread(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	b := newTTFT(t, 4, 4, clock, nil)
	shared := words(6, 1000)
	heldEverywhere(b, 4, shared, clock)
	ctx := &routing.Context{Prompt: shared + words(5, 100)}
	// Equal predictions and loads: uniform.
	counts := make([]int, 4)
	for range 800 {
		counts[b.Pick(ctx, []int{1, 1, 1, 1}, routing.All(4))]++
	}
	for i, c := range counts {
		if c < 150 || c > 250 {
			t.Fatalf("target %d got %d of 800 tied picks: %v", i, c, counts)
		}
	}
	// Equal predictions, unequal loads: the least loaded of the tied.
	counts = make([]int, 4)
	for range 200 {
		counts[b.Pick(ctx, []int{3, 1, 2, 1}, routing.All(4))]++
	}
	if counts[0] != 0 || counts[2] != 0 || counts[1] == 0 || counts[3] == 0 {
		t.Fatalf("loads [3 1 2 1]: picks %v, want only 1 and 3, both", counts)
	}
	// Eligibility is honoured.
	for range 50 {
		if got := b.Pick(ctx, []int{0, 0, 0, 0}, eligibleOf(2)); got != 2 {
			t.Fatalf("eligible {2}: picked %d", got)
		}
		if got := b.Pick(ctx, []int{0, 5, 0, 5}, eligibleOf(1, 3)); got != 1 && got != 3 {
			t.Fatalf("eligible {1,3}: picked %d", got)
		}
	}
}

func TestPredictedTTFTForgetsPastCapacity(t *testing.T) {
	sys := words(1, 4000)
	for _, tc := range []struct {
		capacity   int
		wantHolder bool
	}{
		{capacity: 0, wantHolder: true},         // unknown: the seed's ceiling
		{capacity: 1_000_000, wantHolder: true}, // a large replica keeps it
		{capacity: 2_000, wantHolder: false},    // 2,000 tokens: gone after 4 other prompts, new to both
		{capacity: 20_000, wantHolder: true},    // 20,000 tokens hold all five
	} {
		holder := 0
		for seed := range uint64(10) {
			clock := &ttftClock{now: time.Second}
			b := newTTFT(t, 2, seed, clock, func(s *routing.Spec) { s.KVCapacityTokens = []int{tc.capacity, tc.capacity} })
			served(b, 0, &routing.Context{Prompt: sys + words(2, 100)}, clock)
			for i := range 4 {
				served(b, 0, &routing.Context{Prompt: words(uint64(20+i), 4000)}, clock)
			}
			if b.Pick(&routing.Context{Prompt: sys + words(3, 100)}, []int{0, 0}, routing.All(2)) == 0 {
				holder++
			}
		}
		if tc.wantHolder && holder != 10 {
			t.Errorf("capacity %d tokens: the holder won %d of 10, want all", tc.capacity, holder)
		}
		// Forgotten, the prompt is new to both targets, and a new prefix
		// goes to the target whose index holds less: target 1, empty.
		if !tc.wantHolder && holder != 0 {
			t.Errorf("capacity %d tokens: the holder won %d of 10, want none (forgotten)", tc.capacity, holder)
		}
	}
}

// fixedKV is a routing.KVSource with fixed scores.
type fixedKV struct {
	scores     []float64
	fresh      bool
	speculated []int
}

func (f *fixedKV) KVScores(_ []uint32, s []float64) bool { copy(s, f.scores); return f.fresh }
func (f *fixedKV) Speculate(target int, _ []uint32, _ time.Duration) {
	f.speculated = append(f.speculated, target)
}

func TestPredictedTTFTPreciseOverApproximate(t *testing.T) {
	sys := words(1, 4000)
	ids := make([]uint32, 1100)
	for _, fresh := range []bool{true, false} {
		kv := &fixedKV{scores: []float64{0, 1}, fresh: fresh}
		clock := &ttftClock{now: time.Second}
		b := newTTFT(t, 2, 1, clock, func(s *routing.Spec) { s.KV = kv })
		served(b, 0, &routing.Context{Prompt: sys}, clock) // the approximate index: target 0
		got := b.Pick(&routing.Context{Prompt: sys + words(3, 400), TokenIDs: ids}, []int{0, 0}, routing.All(2))
		want, decision := 1, routing.DecisionPrecise
		if !fresh {
			want, decision = 0, routing.DecisionApproximate
		}
		if got != want {
			t.Fatalf("KV state fresh=%v: picked %d, want %d", fresh, got, want)
		}
		if d := b.(routing.DecisionCounter).Decisions(); d[decision] != 1 {
			t.Fatalf("fresh=%v: decisions %v, want one %s", fresh, d, decision)
		}
	}
	kv := &fixedKV{scores: []float64{0, 0}, fresh: true}
	clock := &ttftClock{}
	b := newTTFT(t, 2, 1, clock, func(s *routing.Spec) { s.KV = kv })
	b.Observe(1, &routing.Context{Prompt: sys, TokenIDs: ids})
	b.Observe(0, &routing.Context{Prompt: sys})
	if len(kv.speculated) != 1 || kv.speculated[0] != 1 {
		t.Fatalf("speculated %v, want [1] (only requests with token ids)", kv.speculated)
	}
}

// staleKV is a routing.KVFreshSource whose targets' state is fresh where
// fresh says; a stale target scores 0.
type staleKV struct {
	scores []float64
	fresh  []bool
}

func (f *staleKV) KVScores(ids []uint32, s []float64) bool {
	return f.KVScoresFresh(ids, s, make([]bool, len(s)))
}

func (f *staleKV) KVScoresFresh(_ []uint32, s []float64, fresh []bool) bool {
	any := false
	for i := range s {
		s[i], fresh[i] = 0, f.fresh[i]
		if f.fresh[i] {
			s[i], any = f.scores[i], true
		}
	}
	return any
}

func (f *staleKV) Speculate(int, []uint32, time.Duration) {}

// A target whose KV state is stale while another's is fresh is matched on
// the approximate index, not read as holding nothing: the prompt sent to
// stale target 0 goes back there rather than to fresh target 1, which
// holds a tenth of it. Read as empty, target 0 lost every prompt it held
// and, serving nothing new, its engine sent no event to become fresh
// again.
func TestPredictedTTFTStaleTargetMatchesApproximately(t *testing.T) {
	sys := words(1, 4000)
	ids := make([]uint32, 1100)
	for _, stale := range []bool{true, false} {
		kv := &staleKV{scores: []float64{0, 0.1}, fresh: []bool{!stale, true}}
		clock := &ttftClock{now: time.Second}
		b := newTTFT(t, 2, 1, clock, func(s *routing.Spec) { s.KV = kv })
		served(b, 0, &routing.Context{Prompt: sys}, clock) // the approximate index: target 0
		got := b.Pick(&routing.Context{Prompt: sys + words(3, 400), TokenIDs: ids}, []int{0, 0}, routing.All(2))
		want := 1 // fresh, target 0 holds none of it
		if stale {
			want = 0
		}
		if got != want {
			t.Fatalf("target 0 stale=%v: picked %d, want %d", stale, got, want)
		}
		if d := b.(routing.DecisionCounter).Decisions(); d[routing.DecisionPrecise] != 1 {
			t.Fatalf("stale=%v: decisions %v, want one precise", stale, d)
		}
	}
}

// fixedEngine is a routing.EngineState scraped age ago; a negative count
// is stale, and without running counts none is running.
type fixedEngine struct {
	waiting, running []int
	capacity         int
	age              time.Duration
}

func (e *fixedEngine) Counts(i int) (waiting, running int, age time.Duration, ok bool) {
	if e.running != nil {
		running = e.running[i]
	}
	return e.waiting[i], running, e.age, e.waiting[i] >= 0 && running >= 0
}
func (e *fixedEngine) KVCapacityTokens(int) int { return e.capacity }

// holderWithEngine is a predicted_ttft balancer over two targets whose
// engines report eng (nothing running or waiting yet), after first, a
// 4,000-byte system prompt, was served at target 0; req extends it.
func holderWithEngine(t *testing.T) (b routing.Balancer, eng *fixedEngine, clock *ttftClock, first, req *routing.Context) {
	t.Helper()
	sys := words(1, 4000)
	clock = &ttftClock{now: time.Second}
	eng = &fixedEngine{waiting: []int{0, 0}, running: []int{0, 0}}
	b = newTTFT(t, 2, 1, clock, func(s *routing.Spec) { s.Engine = eng })
	first = &routing.Context{Prompt: sys}
	served(b, 0, first, clock)
	return b, eng, clock, first, &routing.Context{Prompt: sys + words(3, 400)}
}

// A replica whose batch is full (requests waiting while others run) keeps
// a new request waiting for a slot: before any request has completed that
// wait has no known bound, and a replica with a free slot wins over the
// full holder of the prefix; once completions show how long a request
// holds its slot (here 10 s), the wait is priced, still more than the
// prefill the holder saves; and when the holder has a free slot again it
// wins. Without the engine's running count nothing of this applies.
func TestPredictedTTFTWaitsForBatchSlot(t *testing.T) {
	b, eng, _, first, req := holderWithEngine(t)
	if got := b.Pick(req, nil, routing.All(2)); got != 0 {
		t.Fatalf("free slots everywhere: picked %d, want the holder 0", got)
	}
	eng.running[0], eng.waiting[0], eng.running[1] = 4, 1, 1
	if got := b.Pick(req, nil, routing.All(2)); got != 1 {
		t.Fatalf("holder full, no request completed yet: picked %d, want 1", got)
	}
	b.(routing.Learner).Learn(0, first, 0, 10*time.Second)
	if got := b.Pick(req, nil, routing.All(2)); got != 1 {
		t.Fatalf("holder full, a slot held 10 s: picked %d, want 1", got)
	}
	// The loads are current, the scrape is not: with one request in flight
	// at each target, the holder scraped full just now keeps the request
	// off; scraped a minute ago (slots turn over every 10 s / 5), what it
	// counted beyond that one request has finished.
	if got := b.Pick(req, []int{1, 1}, routing.All(2)); got != 1 {
		t.Fatalf("holder scraped full just now, 1 in flight: picked %d, want 1", got)
	}
	eng.age = time.Minute
	if got := b.Pick(req, []int{1, 1}, routing.All(2)); got != 0 {
		t.Fatalf("holder scraped full a minute ago, 1 in flight: picked %d, want the holder 0", got)
	}
	eng.age = 0
	eng.running[0], eng.waiting[0] = 3, 0 // a slot of the 4 it showed is free
	if got := b.Pick(req, nil, routing.All(2)); got != 0 {
		t.Fatalf("holder with a free slot: picked %d, want 0", got)
	}
	eng.running[0], eng.waiting[0] = 4, 1
	eng.running = nil
	if got := b.Pick(req, nil, routing.All(2)); got != 0 {
		t.Fatalf("no running counts: picked %d, want the holder 0", got)
	}
}

// Through one proxy every request an engine counts is one the proxy sent:
// the counts as scraped, less the proxy's own completions since, are the
// engine now. The holder, at its 4 slots, was scraped running the proxy's
// four requests 200 ms ago; two of them have completed since, so it has
// slots free and the request goes to it (faded instead, at slots held 10
// s, most of the two would still count). Scraped just now, before they
// completed, it is full.
func TestPredictedTTFTCountsLessOwnCompletionsSinceScrape(t *testing.T) {
	b, eng, clock, first, req := holderWithEngine(t)
	sys := first.Prompt
	eng.running[0], eng.waiting[0], eng.running[1] = 4, 1, 1
	b.Pick(req, []int{5, 1}, routing.All(2)) // seen full: 4 slots
	b.(routing.Learner).Learn(0, first, 0, 10*time.Second)
	running := make([]*routing.Context, 4)
	for k := range running {
		running[k] = &routing.Context{Prompt: sys + words(uint64(10+k), 400)}
		b.Observe(0, running[k])
		b.(routing.TTFTObserver).FirstToken(0, running[k], 20*time.Millisecond, 0)
	}
	eng.running[0], eng.waiting[0] = 4, 0
	if got := b.Pick(req, []int{4, 1}, routing.All(2)); got != 1 {
		t.Fatalf("holder running its 4 slots: picked %d, want 1", got)
	}
	clock.now += 100 * time.Millisecond // two complete 100 ms after the scrape
	for _, ctx := range running[:2] {
		b.(routing.Learner).Learn(0, ctx, 0, 10*time.Second)
	}
	clock.now += 100 * time.Millisecond
	eng.age = 200 * time.Millisecond
	if got := b.Pick(req, []int{2, 1}, routing.All(2)); got != 0 {
		t.Fatalf("holder scraped full 200 ms ago, two of its requests completed since: picked %d, want the holder 0", got)
	}
}

func TestPredictedTTFTEngineWaiting(t *testing.T) {
	sys := words(1, 4000)
	clock := &ttftClock{now: time.Second}
	eng := &fixedEngine{waiting: []int{0, 0}}
	b := newTTFT(t, 2, 1, clock, func(s *routing.Spec) { s.Engine = eng })
	served(b, 0, &routing.Context{Prompt: sys}, clock)
	req := &routing.Context{Prompt: sys + words(3, 400)}
	if got := b.Pick(req, nil, routing.All(2)); got != 0 {
		t.Fatalf("nothing waiting: picked %d, want the holder 0", got)
	}
	// Another proxy's requests wait on the holder: each is valued at this
	// request's own prefill when this proxy has none pending.
	eng.waiting[0] = 3
	if got := b.Pick(req, nil, routing.All(2)); got != 1 {
		t.Fatalf("3 waiting on the holder: picked %d, want 1", got)
	}
	eng.waiting[0] = -1 // stale
	if got := b.Pick(req, nil, routing.All(2)); got != 0 {
		t.Fatalf("stale waiting count: picked %d, want 0", got)
	}
	// A scraped capacity bounds the index like a configured one.
	eng.capacity = 1000
	for i := range 64 { // the capacity refresh runs every 64 observes
		served(b, 0, &routing.Context{Prompt: words(uint64(50+i), 400)}, clock)
	}
	if got := b.(routing.SharedAffinity).SharedStats()[0].Chunks; got > 1000*routing.DefaultBytesPerToken/64 {
		t.Fatalf("target 0 holds %d chunks, more than 1,000 tokens' worth", got)
	}
}

// A waiting count is as old as its scrape: the requests waiting then have
// had their first tokens since with probability 1 − exp(−age / mean TTFT),
// and what replaced them is what the counts usually show beyond the
// balancer's own view. Three waiting on the holder hold a request off it
// when just scraped; scraped a second ago, fifty mean TTFTs of 20 ms, they
// have drained and the request goes to the holder; where first tokens
// take 10 s, a second is not long enough. And a queue the balancer does
// not see that every fresh scrape has shown (clients of other proxies that
// do not share) is still there a second later.
func TestPredictedTTFTEngineWaitingAges(t *testing.T) {
	sys := words(1, 4000)
	req := &routing.Context{Prompt: sys + words(3, 400)}
	for _, c := range []struct {
		ttft, age  time.Duration
		freshPicks int // picks made on fresh scrapes first
		want       int
	}{
		{20 * time.Millisecond, 0, 0, 1},
		{20 * time.Millisecond, time.Second, 0, 0},
		{10 * time.Second, time.Second, 0, 1},
		{20 * time.Millisecond, time.Second, 500, 1},
	} {
		clock := &ttftClock{now: time.Second}
		eng := &fixedEngine{waiting: []int{3, 0}}
		b := newTTFT(t, 2, 1, clock, func(s *routing.Spec) { s.Engine = eng })
		seen := &routing.Context{Prompt: sys}
		b.Observe(0, seen)
		clock.tick()
		b.(routing.TTFTObserver).FirstToken(0, seen, c.ttft, 0)
		clock.tick()
		for range c.freshPicks {
			b.Pick(req, nil, routing.All(2))
		}
		eng.age = c.age
		if got := b.Pick(req, nil, routing.All(2)); got != c.want {
			t.Fatalf("mean TTFT %v, 3 waiting on the holder scraped %v ago after %d fresh picks: picked %d, want %d",
				c.ttft, c.age, c.freshPicks, got, c.want)
		}
	}
}

func TestPredictedTTFTRejectsNegativeCapacity(t *testing.T) {
	_, err := routing.New(routing.Spec{Strategy: routing.PredictedTTFT, Weights: []int{1, 1}, KVCapacityTokens: []int{10, -1}})
	if err == nil || !strings.Contains(err.Error(), "kv_capacity_tokens[1]") {
		t.Fatalf("New with a negative capacity: %v, want an error naming kv_capacity_tokens[1]", err)
	}
}

// pickedTargets returns the targets b picks for draws fresh prompts that no
// target holds.
func pickedTargets(b routing.Balancer, n, draws int) map[int]bool {
	seen := map[int]bool{}
	for i := range draws {
		seen[b.Pick(&routing.Context{Prompt: words(uint64(1000+i), 400)}, nil, routing.All(n))] = true
	}
	return seen
}

// Several proxies: what a peer has pending at a target counts as queued
// there, until the peer reports the queue emptied or its report expires.
func TestPredictedTTFTFoldsPeerQueue(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	a := newTTFT(t, 2, 1, clock, nil)
	peer := newTTFT(t, 2, 2, clock, nil)
	peer.Observe(0, &routing.Context{Prompt: words(1, 8000)})
	q := peer.(routing.SharedQueue).LocalQueue(0)
	if q.Requests != 1 || q.Tokens != 2000 || q.HeadTokens != 2000 || q.HeadAge != 0 || q.LeaveAge >= 0 {
		t.Fatalf("peer's queue %+v, want one request of 2,000 tokens, just sent, no first token yet", q)
	}
	if got := pickedTargets(a, 2, 40); !got[0] || !got[1] {
		t.Fatalf("before the report: picked %v, want both targets (a tie)", got)
	}
	const ttl = 75 * time.Millisecond
	a.(routing.SharedQueue).FoldPeerQueue("peer", 0, q, ttl)
	if pq := a.(routing.SharedQueue).PeerQueue(0); pq.Requests != 1 || pq.Tokens != 2000 {
		t.Fatalf("peers' queue at 0 %+v, want the report's one request of 2,000 tokens", pq)
	}
	if got := pickedTargets(a, 2, 40); got[0] {
		t.Fatalf("with the peer's 2,000 tokens queued at 0: picked %v, want 1 only", got)
	}
	a.(routing.SharedQueue).FoldPeerQueue("peer", 0, routing.QueueState{LeaveAge: 0, AnswerAge: -1}, ttl)
	if got := pickedTargets(a, 2, 40); !got[0] || !got[1] {
		t.Fatalf("after the peer reported its queue empty: picked %v, want both", got)
	}
	a.(routing.SharedQueue).FoldPeerQueue("peer", 0, q, ttl)
	clock.now += ttl + time.Millisecond
	if pq := a.(routing.SharedQueue).PeerQueue(0); pq.Requests != 0 || pq.Tokens != 0 {
		t.Fatalf("peers' queue at 0 after the report expired %+v, want none", pq)
	}
	if got := pickedTargets(a, 2, 40); !got[0] || !got[1] {
		t.Fatalf("after the report expired: picked %v, want both", got)
	}
}

// Among tied targets the least loaded wins while the loads are this
// balancer's own; once they include other proxies' requests (known late,
// and not at all for a peer's pick in the same instant) the less loaded of
// two drawn at random wins, so several proxies do not all send their next
// tied pick to the same target.
func TestPredictedTTFTTiesWithPeersLoadsDrawTwo(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	b := newTTFT(t, 4, 1, clock, nil)
	// One request of this balancer's own still in flight at target 0, its
	// first token seen: nothing pending anywhere, so fresh prompts tie.
	shared := words(2, 400)
	heldEverywhere(b, 4, shared, clock)
	own := &routing.Context{Prompt: words(1, 400)}
	served(b, 0, own, clock)
	for i := 1; i < 4; i++ { // as many arrivals at each target, completed
		ctx := &routing.Context{Prompt: words(uint64(10+i), 400)}
		served(b, i, ctx, clock)
		b.(routing.Learner).Learn(i, ctx, 0, time.Millisecond)
	}
	pick := func(loads []int) map[int]int {
		got := map[int]int{}
		for i := range 200 {
			got[b.Pick(&routing.Context{Prompt: shared + words(uint64(500+i), 40)}, loads, routing.All(4))]++
		}
		return got
	}
	if got := pick([]int{1, 0, 0, 0}); got[0] != 0 || len(got) != 3 {
		t.Fatalf("own loads only: picked %v, want the three least loaded (1-3), never 0", got)
	}
	got := pick([]int{1, 6, 6, 6})
	if got[0] == 200 || got[0] < 60 {
		t.Fatalf("with peers' loads: picked %v, want target 0 about half the time (when drawn) and the others otherwise", got)
	}
}

// A prompt no target holds any of is a new prefix, and among tied targets
// it goes to the one whose index holds least, whatever the loads: the
// requests that will extend it return there, and the smallest index is the
// target the fewest prefixes return to. A prompt some target holds is
// weighed by the loads alone.
func TestPredictedTTFTNewPrefixGoesToSmallestIndex(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	b := newTTFT(t, 3, 1, clock, nil)
	for target, prompts := range []int{3, 1, 2} {
		for k := range prompts {
			ctx := &routing.Context{Prompt: words(uint64(100*target+k), 400)}
			served(b, target, ctx, clock)
			b.(routing.Learner).Learn(target, ctx, 0, time.Millisecond)
		}
	}
	for i := range 20 {
		if got := b.Pick(&routing.Context{Prompt: words(uint64(1000+i), 400)}, []int{0, 5, 0}, routing.All(3)); got != 1 {
			t.Fatalf("new prefix %d: picked %d, want 1 (the smallest index, though the most loaded)", i, got)
		}
	}
	// Held by every target: the loads decide.
	shared := words(7, 400)
	for target := range 3 {
		ctx := &routing.Context{Prompt: shared}
		served(b, target, ctx, clock)
		b.(routing.Learner).Learn(target, ctx, 0, time.Millisecond)
	}
	for i := range 20 {
		if got := b.Pick(&routing.Context{Prompt: shared + words(uint64(2000+i), 40)}, []int{3, 5, 0}, routing.All(3)); got != 2 {
			t.Fatalf("prefix held everywhere, question %d: picked %d, want 2 (the least loaded)", i, got)
		}
	}
}

// Before the law is fitted, a new prefix goes to a target sent the fewest
// of them, whatever the lengths of the first prompts: each brings its
// followers. Balanced by the prefill queued, one long first prompt drew
// every short one after it to the other target.
func TestPredictedTTFTColdStartSpreadsNewPrefixesByCount(t *testing.T) {
	for seed := range uint64(10) {
		clock := &ttftClock{now: time.Second}
		b := newTTFT(t, 2, seed, clock, nil)
		sent := [2]int{}
		for i := range 5 {
			n := 400 // bytes: a short first prompt
			if i == 0 {
				n = 16000
			}
			ctx := &routing.Context{Prompt: words(uint64(100+i), n)}
			got := b.Pick(ctx, []int{sent[0], sent[1]}, routing.All(2))
			b.Observe(got, ctx) // no first token: every prompt stays queued
			sent[got]++
		}
		if sent[0] < 2 || sent[1] < 2 {
			t.Fatalf("seed %d: five new prefixes split %v, want at least 2 at each target", seed, sent)
		}
	}
}

// With peers (SetPlace), a proxy breaks ties among its own share of the
// targets first, so the proxies' picks of one burst do not collide; when
// none of its share is tied it takes any tied target.
func TestPredictedTTFTTiesPreferHomeWithPeers(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	pick := func(b routing.Balancer, n int) map[int]bool {
		seen := map[int]bool{}
		for i := range 60 {
			seen[b.Pick(&routing.Context{Prompt: words(uint64(700+i), 400)}, nil, routing.All(n))] = true
		}
		return seen
	}
	for rank, want := range [][]int{{0, 2}, {1, 3}} {
		b := newTTFT(t, 4, uint64(rank), clock, nil)
		b.(routing.SharedQueue).SetPlace(rank, 2)
		if got := pick(b, 4); len(got) != 2 || !got[want[0]] || !got[want[1]] {
			t.Fatalf("rank %d of 2: fresh prompts went to %v, want both of its home targets %v and no other", rank, got, want)
		}
	}
	// With loads, a tied target drawn at random takes the pick when it is
	// less loaded than the best of the home targets (for prompts every
	// target holds the start of: a new prefix is weighed by the indexes).
	shared := words(3, 400)
	count := func(b routing.Balancer, loads []int) map[int]int {
		got := map[int]int{}
		for i := range 200 {
			got[b.Pick(&routing.Context{Prompt: shared + words(uint64(900+i), 40)}, loads, routing.All(4))]++
		}
		return got
	}
	loaded := newTTFT(t, 4, 5, clock, nil)
	loaded.(routing.SharedQueue).SetPlace(0, 2)
	heldEverywhere(loaded, 4, shared, clock)
	if got := count(loaded, []int{0, 5, 0, 5}); got[1]+got[3] != 0 || got[0] == 0 || got[2] == 0 {
		t.Fatalf("home targets idle: picked %v, want 0 and 2 only", got)
	}
	if got := count(loaded, []int{5, 0, 5, 0}); got[1]+got[3] < 60 || got[0]+got[2] < 60 {
		t.Fatalf("home targets loaded: picked %v, want the idle 1 and 3 when drawn (about half) and home otherwise", got)
	}
	b := newTTFT(t, 4, 3, clock, nil)
	b.(routing.SharedQueue).SetPlace(0, 2)
	b.Observe(0, &routing.Context{Prompt: words(1, 8000)})
	b.Observe(2, &routing.Context{Prompt: words(2, 8000)})
	if got := pick(b, 4); len(got) != 2 || !got[1] || !got[3] {
		t.Fatalf("home targets 0 and 2 busy: picked %v, want the tied others, 1 and 3", got)
	}
	// Fewer targets than proxies: rank 2 of 3 has target 0 (2 mod 2).
	small := newTTFT(t, 2, 4, clock, nil)
	small.(routing.SharedQueue).SetPlace(2, 3)
	if got := pick(small, 2); len(got) != 1 || !got[0] {
		t.Fatalf("rank 2 of 3 on 2 targets: picked %v, want target 0 only", got)
	}
	// A place that makes no sense is being alone.
	small.(routing.SharedQueue).SetPlace(3, 3)
	if got := pick(small, 2); len(got) != 2 {
		t.Fatalf("rank 3 of 3: picked %v, want both targets (no home)", got)
	}
}

// With peers, a pick is not charged for the peers' picks of the last
// report gap that no report has shown yet: such a charge on the targets
// that are not this proxy's home sent follow-ups away from the replica
// holding their conversation whenever this proxy's arrivals came in bursts
// (docs/routing.md, a lottery per time slot). The turns in a burst (Defer)
// keep the proxies from picking blind instead. So the target holding the
// start of the prompt wins, though it is not home, with arrivals one at a
// time and in bursts alike.
func TestPredictedTTFTHoldersWinWithPeers(t *testing.T) {
	prefix := words(3, 200) // three 64-byte chunks of it are held at target 1
	pick := func(spacing time.Duration) int {
		clock := &ttftClock{now: time.Second}
		b := newTTFT(t, 4, 1, clock, nil)
		b.(routing.SharedQueue).SetPlace(0, 2) // home: 0 and 2
		// A peer reporting every 20 ms: its picks are invisible for that long.
		for range 2 {
			b.(routing.SharedQueue).FoldPeerQueue("peer", 3, routing.QueueState{LeaveAge: -1, AnswerAge: -1}, 60*time.Millisecond)
			clock.now += 20 * time.Millisecond
		}
		// Fresh prompts 2 ms apart plus spacing (fewer than the law's
		// samples: the unit law prices them).
		for i := range 6 {
			served(b, i%4, &routing.Context{Prompt: words(uint64(100+i), 800)}, clock)
			clock.now += spacing
		}
		served(b, 1, &routing.Context{Prompt: prefix}, clock)
		clock.now += time.Second
		return b.Pick(&routing.Context{Prompt: prefix + words(4, 200)}, nil, routing.All(4))
	}
	for _, spacing := range []time.Duration{time.Second, 0} {
		if got := pick(spacing); got != 1 {
			t.Fatalf("arrivals %v apart: picked %d, want 1 (holds the start of the prompt)", spacing, got)
		}
	}
}

// longChat is a chat completions body whose one user message is text.
func longChat(text string) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`)
}

// A prompt longer than the 32 KiB a context keeps is matched over its whole
// length (the chain pkg/affinity computes past the cut): two targets that
// hold the same first 32 KiB are told apart by what they hold beyond. With
// only the kept text they tie, and ties spread.
func TestPredictedTTFTMatchesPastTheCut(t *testing.T) {
	common := words(11, 48<<10)
	holder := affinity.Build(affinity.PathChatCompletions, longChat(common+words(12, 2000)), nil)
	partial := affinity.Build(affinity.PathChatCompletions, longChat(common[:36<<10]+words(13, 14<<10)), nil)
	if len(holder.Prompt) > affinity.MaxBytes || holder.PromptChain.Len <= len(holder.Prompt) {
		t.Fatalf("context keeps %d bytes and a chain of %d: want the text cut and the chain whole", len(holder.Prompt), holder.PromptChain.Len)
	}
	for seed := range uint64(20) {
		clock := &ttftClock{now: time.Second}
		b := newTTFT(t, 4, seed, clock, nil)
		served(b, 1, &partial, clock)
		served(b, 3, &holder, clock)
		next := affinity.Build(affinity.PathChatCompletions, longChat(common+words(14, 2000)), nil)
		if got := b.Pick(&next, []int{0, 0, 0, 0}, routing.All(4)); got != 3 {
			t.Fatalf("seed %d: picked %d, want 3, which holds 48 KiB of the prompt (1 holds 36)", seed, got)
		}
	}
}

// A request's prompt is recorded again when it completes, as a replica
// frees its blocks then: a prompt sent first but finished last outlives the
// prompts sent after it. Touched only at the send, it would be the oldest
// and forgotten, and the next request sharing its prefix would go to the
// other, empty target as a new prefix does.
func TestPredictedTTFTCompletionRefreshesIndex(t *testing.T) {
	sys := words(1, 4000)
	for _, complete := range []bool{true, false} {
		for seed := range uint64(10) {
			clock := &ttftClock{now: time.Second}
			// 10,000 tokens at the default 4 bytes a token: 40,000 bytes of
			// text, less than the long request and the five sent after it.
			b := newTTFT(t, 2, seed, clock, func(s *routing.Spec) { s.KVCapacityTokens = []int{10_000, 10_000} })
			long := &routing.Context{Prompt: sys + words(2, 100)}
			b.Observe(0, long)
			clock.tick()
			for i := range 5 {
				served(b, 0, &routing.Context{Prompt: words(uint64(20+i), 8000)}, clock)
			}
			b.(routing.TTFTObserver).FirstToken(0, long, 20*time.Millisecond, 0)
			if complete {
				b.(routing.Learner).Learn(0, long, 0, 2*time.Second)
			}
			clock.tick()
			got := b.Pick(&routing.Context{Prompt: sys + words(3, 100)}, []int{0, 0}, routing.All(2))
			if complete && got != 0 {
				t.Fatalf("seed %d: picked %d after the long request completed, want its holder 0", seed, got)
			}
			if !complete && got != 1 {
				t.Fatalf("seed %d: picked %d with no completion, want 1 (the prompt forgotten, a new prefix)", seed, got)
			}
		}
	}
}

// Through several proxies the completion's touch reaches the peers: proxy b
// keeps a prompt proxy a sent first and completed last, as a does, instead
// of forgetting it as its oldest send.
func TestPredictedTTFTCompletionTouchIsShared(t *testing.T) {
	sys := words(1, 4000)
	for seed := range uint64(10) {
		clock := &ttftClock{now: time.Second}
		var qa, qb []queuedPick
		spec := func(q *[]queuedPick) func(*routing.Spec) {
			return func(s *routing.Spec) {
				s.KVCapacityTokens = []int{10_000, 10_000}
				s.Share = func(tg int, p string) { *q = append(*q, queuedPick{tg, p}) }
			}
		}
		a, b := newTTFT(t, 2, seed, clock, spec(&qa)), newTTFT(t, 2, seed, clock, spec(&qb))
		deliver := func(from routing.Balancer, q *[]queuedPick, to routing.Balancer) {
			for _, p := range *q {
				to.(routing.SharedAffinity).FoldPeer(p.target, from.(routing.SharedAffinity).RecordLocal(p.target, p.prompt, nil))
			}
			*q = nil
		}
		long := &routing.Context{Prompt: sys + words(2, 100)}
		a.Observe(0, long)
		deliver(a, &qa, b)
		for i := range 5 {
			served(b, 0, &routing.Context{Prompt: words(uint64(20+i), 8000)}, clock)
		}
		a.(routing.TTFTObserver).FirstToken(0, long, 20*time.Millisecond, 0)
		a.(routing.Learner).Learn(0, long, 0, 2*time.Second)
		deliver(a, &qa, b)
		if got := b.Pick(&routing.Context{Prompt: sys + words(3, 100)}, []int{0, 0}, routing.All(2)); got != 0 {
			t.Fatalf("seed %d: the peer picked %d after the long request completed at a, want its holder 0", seed, got)
		}
	}
}

// A prompt sent and completed within one flush queues two fleet picks for
// the same (target, prompt): the first RecordLocal hands over both records
// in order (the send's new hashes, then the completion's touch), the
// second nothing more. It used to republish the prompt's whole
// fingerprint head first, so that peers aged the prompt in send order after
// all.
func TestPredictedTTFTRecordLocalPublishesOnce(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	var q []queuedPick
	bal := newTTFT(t, 2, 1, clock, func(s *routing.Spec) {
		s.Share = func(tg int, p string) { q = append(q, queuedPick{tg, p}) }
	})
	ctx := &routing.Context{Prompt: words(1, 2000)}
	bal.Observe(0, ctx)
	bal.(routing.TTFTObserver).FirstToken(0, ctx, 20*time.Millisecond, 0)
	bal.(routing.Learner).Learn(0, ctx, 0, time.Second)
	if len(q) != 2 {
		t.Fatalf("%d picks queued for a send and its completion, want 2", len(q))
	}
	// Both record the prompt tail first, as the replica frees it, and mark
	// where it ends for the peers' forget term.
	h := chunkindex.Hashes(nil, ctx.Prompt)
	end := []uint64{routing.PromptEndMark, h[len(ctx.Prompt)/chunkindex.ChunkBytes-1]}
	slices.Reverse(h)
	h = append(h, end...)
	want := append(slices.Clone(h), h...)
	rec := bal.(routing.SharedAffinity)
	if got := rec.RecordLocal(q[0].target, q[0].prompt, nil); !slices.Equal(got, want) {
		t.Fatalf("first answer: %d hashes, want the send's %d then the touch's %d", len(got), len(h), len(h))
	}
	if got := rec.RecordLocal(q[1].target, q[1].prompt, nil); len(got) != 0 {
		t.Fatalf("second answer for the same prompt: %d hashes, want none", len(got))
	}
	// Answered: a later send is recorded afresh (the index holds every
	// hash, so the send inserts none and only marks the end; its
	// completion touches them all).
	q = nil
	bal.Observe(0, ctx)
	bal.(routing.Learner).Learn(0, ctx, 0, time.Second)
	var got []uint64
	for _, p := range q {
		got = rec.RecordLocal(p.target, p.prompt, got)
	}
	if want := append(slices.Clone(end), h...); !slices.Equal(got, want) {
		t.Fatalf("after the flush: %d hashes, want the send's end mark and the touch's %d", len(got), len(h))
	}
}

// BenchmarkPredictedTTFTRequest is one request's whole life in the balancer
// (Pick, Observe, FirstToken, Learn) over 8 targets, for 64 sessions
// sharing a system prompt: the approximate index's hash walks and writes,
// the latency law, the pending queue. At 64 KiB the contexts carry the
// fingerprint past the 32 KiB cut. With events=1 the prefix comes from a
// fixed KV source (the request carries token ids), and once the law is
// fitted the index is walked as well, for where the prefix lives.
func BenchmarkPredictedTTFTRequest(b *testing.B) {
	for _, c := range []struct{ size, events int }{{4 << 10, 0}, {64 << 10, 0}, {4 << 10, 1}, {64 << 10, 1}} {
		size := c.size
		b.Run(fmt.Sprintf("prompt=%dKiB/events=%d", size>>10, c.events), func(b *testing.B) {
			sys := words(1, size/2)
			ctxs := make([]routing.Context, 64)
			for i := range ctxs {
				ctxs[i] = affinity.Build(affinity.PathChatCompletions, longChat(sys+words(uint64(10+i), size/2)), nil)
				if c.events == 1 {
					ctxs[i].TokenIDs = make([]uint32, size/4)
				}
			}
			clock := &ttftClock{now: time.Second}
			bal := newTTFT(b, 8, 1, clock, func(s *routing.Spec) {
				s.KVCapacityTokens = capacities(8, 1<<20)
				if c.events == 1 {
					s.KV = staticKV{0.5, 0.25, 0, 0, 0, 0, 0, 0}
				}
			})
			loads := make([]int, 8)
			obs := bal.(routing.TTFTObserver)
			learn := bal.(routing.Learner)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ctx := &ctxs[i%len(ctxs)]
				i++
				target := bal.Pick(ctx, loads, routing.All(8))
				bal.Observe(target, ctx)
				clock.tick()
				obs.FirstToken(target, ctx, 20*time.Millisecond, size/4)
				learn.Learn(target, ctx, 0, 100*time.Millisecond)
			}
		})
	}
}

// staticKV is a KVSource with fixed, fresh scores that records nothing.
type staticKV []float64

func (k staticKV) KVScores(_ []uint32, s []float64) bool { copy(s, k); return true }
func (staticKV) Speculate(int, []uint32, time.Duration)  {}

// capacities returns n copies of v.
func capacities(n, v int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// Law reports the unit law as not fitted, then the fitted law's weights
// once first tokens determine the engine's prefill rate: here 5 ms per
// request and 50 ms per 1,000 uncached tokens, each request alone.
func TestPredictedTTFTReportsItsLaw(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	b := newTTFT(t, 2, 1, clock, nil)
	lr := b.(routing.LawReporter)
	if l := lr.Law(); l.Fitted || l.Samples != 0 || l.FirstTokens != 0 || l.OwnMSPer1K != 0 {
		t.Fatalf("before any first token: %+v", l)
	}
	for i := range 40 {
		tokens := 200 + 100*(i%17)
		ctx := &routing.Context{Prompt: words(uint64(100+i), 3*tokens)}
		b.Observe(i%2, ctx)
		clock.tick()
		ttft := 5*time.Millisecond + time.Duration(tokens)*50*time.Microsecond
		b.(routing.TTFTObserver).FirstToken(i%2, ctx, ttft, tokens)
		b.(routing.Learner).Learn(i%2, ctx, 0, ttft)
		clock.tick()
	}
	l := lr.Law()
	if !l.Fitted || l.Samples < routing.PredictorMinSamples || l.FirstTokens != 40 {
		t.Fatalf("after 40 first tokens: %+v", l)
	}
	if math.Abs(l.OwnMSPer1K-50) > 1 || math.Abs(l.BaseMS-5) > 1 {
		t.Fatalf("law %+v, want about 5 ms per request and 50 per 1,000 own tokens", l)
	}
	if math.Abs(l.BytesPerToken-3) > 0.01 {
		t.Fatalf("bytes per token %v, want 3 (learned; the default is 4)", l.BytesPerToken)
	}
}
