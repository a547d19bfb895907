package sim

import (
	"math/rand/v2"
	"testing"
	"time"

	"rolter.dev/pkg/kvdelta"
	"rolter.dev/tests/vllmsim"
)

func flight(msgs ...Message) *Flight {
	r := &Request{Messages: msgs, Output: 1}
	return &Flight{Req: r, Ctx: RouteContext(r, false)}
}

func userMsg(key uint64, n int) Message {
	return Message{Role: "user", Content: []Segment{{Key(key), n}}}
}

func view(loads ...int) *View {
	return &View{Loads: loads, Waiting: make([]int, len(loads)), BlockSize: 16}
}

// observe routes f to target through p, as the simulator does right after
// p.Pick(f).
func observe(p Policy, target int, f *Flight, v *View) {
	f.Target = target
	p.Observe(target, f, v)
}

func TestSGLangPolicy(t *testing.T) {
	s := newSGLang(4, rand.New(rand.NewPCG(1, 1)))
	warm := flight(userMsg(1, 400))
	s.Pick(warm, view(0, 0, 0, 0))
	observe(s, 2, warm, view(0, 0, 0, 0))
	again := flight(userMsg(1, 400), userMsg(2, 10)) // shares ~97 % of its text with warm
	for _, tc := range []struct {
		name  string
		loads []int
		want  int
	}{
		{"balanced: best match", []int{3, 0, 9, 0}, 2},
		{"abs gap 64 not exceeded", []int{0, 1, 64, 1}, 2},
		{"imbalanced: shortest queue", []int{5, 1, 70, 3}, 1},
	} {
		if got := s.Pick(again, view(tc.loads...)); got != tc.want {
			t.Errorf("%s: picked %d, want %d", tc.name, got, tc.want)
		}
	}
	// A match below 30 % of the text goes to the least-loaded worker.
	low := flight(userMsg(1, 100), userMsg(3, 400))
	if got := s.Pick(low, view(3, 1, 0, 2)); got != 2 {
		t.Errorf("low match: picked %d, want 2 (least loaded)", got)
	}
	if got := s.Pick(low, view(3, 1, 2, 0)); got != 3 {
		t.Errorf("low match: picked %d, want 3 (least loaded)", got)
	}
}

func TestAIBrixPolicy(t *testing.T) {
	a := newAIBrix(4, rand.New(rand.NewPCG(1, 1)))
	warm := flight(userMsg(1, 200))
	v := view(0, 0, 0, 0)
	a.Pick(warm, v)
	observe(a, 0, warm, v)
	again := flight(userMsg(1, 200), userMsg(2, 5))
	// Equal loads: mean 1, stddev 0, the matching pod qualifies.
	if got := a.Pick(again, view(1, 1, 1, 1)); got != 0 {
		t.Errorf("equal loads: picked %d, want 0", got)
	}
	// Loads 1,0,0,0: mean 0.25 + stddev 0.43 < 1, the match is skipped
	// for a least-loaded pod.
	if got := a.Pick(again, view(1, 0, 0, 0)); got == 0 {
		t.Error("an over-loaded matching pod was picked")
	}
	// The imbalance gate (max - min > 8) restricts matching to the
	// least-loaded pods: at 9,9,9,0 the matching pod is within mean + 1
	// stddev (9 <= 6.75 + 3.9) but the gate sends the request to pod 3.
	// (The old model also required max > 2 (mean + 1) and kept the match.)
	if got := a.Pick(again, view(9, 9, 9, 0)); got != 3 {
		t.Errorf("gap 9: picked %d, want 3 (the gate)", got)
	}
	// A gap of exactly 8 does not fire it.
	if got := a.Pick(again, view(8, 8, 8, 0)); got != 0 {
		t.Errorf("gap 8: picked %d, want the matching pod 0", got)
	}
	// A pod within mean + 1 stddev keeps its match: loads 2,1,1,2 have
	// mean 1.5 and stddev 0.5.
	if got := a.Pick(again, view(2, 1, 1, 2)); got != 0 {
		t.Errorf("picked %d, want the matching pod 0 (2 <= 1.5 + 0.5)", got)
	}
}

// SGLang's router stores and matches the whole text: a 100K-token prompt
// seen before is a hit on its worker, even against lighter workers. (The old
// model kept 32 KiB of the text and divided by the whole length, so any
// prompt past ~21K tokens fell below the 0.3 threshold.)
func TestSGLangMatchesTheWholeText(t *testing.T) {
	s := newSGLang(4, rand.New(rand.NewPCG(1, 1)))
	long := flight(userMsg(1, 100_000))
	if text, _ := ContentText(long.Req.Messages, 0); len(text) < 10*MaxPromptBytes {
		t.Fatalf("the prompt is only %d bytes", len(text))
	}
	s.Pick(long, view(0, 0, 0, 0))
	observe(s, 2, long, view(0, 0, 0, 0))
	again := flight(userMsg(1, 100_000), userMsg(2, 50))
	if got := s.Pick(again, view(3, 1, 5, 2)); got != 2 {
		t.Fatalf("picked %d, want 2: the worker that served the same 100K tokens", got)
	}
}

// SGLang's tree grows past max_tree_size between eviction passes and is cut
// back to it every eviction_interval_secs.
func TestSGLangEvictsOnItsTimer(t *testing.T) {
	s := newSGLang(2, rand.New(rand.NewPCG(1, 1)))
	a, b := flight(userMsg(1, 300)), flight(userMsg(2, 300))
	v := view(0, 0)
	for _, f := range []*Flight{a, b} {
		s.Pick(f, v)
		observe(s, 0, f, v)
	}
	size := s.tree.Stats(0).Nodes
	s.maxSize = size - 1 // one prompt too many
	v.Now = sglangEvictInterval - time.Second
	if got := s.Pick(flight(userMsg(1, 300), userMsg(3, 5)), v); got != 0 || s.tree.Stats(0).Nodes != size {
		t.Fatalf("before the pass: picked %d with %d nodes, want 0 with %d (no eviction yet)", got, s.tree.Stats(0).Nodes, size)
	}
	v.Now = sglangEvictInterval
	s.Pick(flight(userMsg(9, 10)), v)
	if st := s.tree.Stats(0); st.Nodes > s.maxSize || st.Prompts != 1 {
		t.Fatalf("after the pass: %+v, want at most %d nodes and 1 prompt", st, s.maxSize)
	}
	// The older prompt went: a is no longer matched on worker 0.
	lens := make([]int, 2)
	text, _ := ContentText(a.Req.Messages, 0)
	s.tree.Match(text, lens)
	if lens[0] == len(text) {
		t.Fatal("the least recently used prompt survived the pass")
	}
}

func TestDynamoApproxPolicy(t *testing.T) {
	d := newDynamo(2, 16, false, rand.New(rand.NewPCG(1, 1)))
	v := view(0, 0)
	warm := flight(userMsg(1, 320))
	d.Pick(warm, v)
	observe(d, 0, warm, v)
	d.FirstToken(warm, 0)
	d.Done(warm, 0)
	again := flight(userMsg(1, 320), userMsg(2, 16))
	if got := d.Pick(again, v); got != 0 || d.overlap[0] != 20 || d.overlap[1] != 0 {
		t.Fatalf("picked %d with overlaps %v, want 0 with 20 blocks", got, d.overlap)
	}
	// The cost: worker 0 saves 20 prefill blocks; loading it with more than
	// 20 extra active blocks moves the request to worker 1.
	busy := flight(userMsg(9, 16*30))
	d.Pick(busy, v)
	observe(d, 0, busy, v)
	d.FirstToken(busy, 0)
	if got := d.Pick(again, v); got != 1 {
		t.Fatalf("picked %d, want 1: costs %v", got, d.costs)
	}
	// Blocks expire after 120 s.
	d.Done(busy, 0)
	v.Now = 121 * time.Second
	d.Pick(again, v)
	if d.overlap[0] != 0 {
		t.Fatalf("overlap %d after the TTL", d.overlap[0])
	}
}

// Dynamo's default indexer consumes the engines' KV events: the overlap is
// what a worker stored, not what the router sent it. (The old model ran the
// approximate indexer, which credits a worker with every routed block for
// 120 s, evicted or not, and never with blocks it did not route.)
func TestDynamoUsesKVEvents(t *testing.T) {
	d := newDynamo(2, 16, true, rand.New(rand.NewPCG(1, 1)))
	var _ kvConsumer = dynamoEvents{d}
	v := view(0, 0)
	warm := flight(userMsg(1, 320))
	d.Pick(warm, v)
	observe(d, 0, warm, v) // routed to 0, but no event yet
	d.Done(warm, 0)
	again := flight(userMsg(1, 320), userMsg(2, 16))
	d.Pick(again, v)
	if d.overlap[0] != 0 || d.overlap[1] != 0 {
		t.Fatalf("overlaps %v before any event, want none", d.overlap)
	}
	ids := (&identities{bs: 16}).get(warm.Req.Tokens())
	dynamoEvents{d}.applyKV(1, []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: ids}})
	if got := d.Pick(again, v); got != 1 || d.overlap[1] != 20 {
		t.Fatalf("picked %d with overlaps %v, want 1 with 20 blocks (stored on 1)", got, d.overlap)
	}
	dynamoEvents{d}.applyKV(1, []kvdelta.Op{{Kind: kvdelta.OpRemoved, IDs: ids[10:]}})
	if d.Pick(again, v); d.overlap[1] != 10 {
		t.Fatalf("overlap %d after 10 blocks were evicted, want 10", d.overlap[1])
	}
}

func llmdEnv(n int) Env { return Env{Replicas: n, BlockSize: 16, CapacityBlocks: 4096} }

// llm-d's shipped profile scores prefix 3, queue 2 and KV-cache utilization
// 2 over the metrics as last scraped. (The old model ran prefix 2, queue 1,
// active-request 1 on live queues and never read KV usage.)
func TestLLMDShippedProfile(t *testing.T) {
	l := newLLMD(llmdEnv(3), shippedLLMDApproxWeights(), rand.New(rand.NewPCG(1, 1)))
	if l.blockChars != 256 || l.maxBlocks != 2048 || l.lrus[0].cap != 4096 {
		t.Fatalf("block %d chars, %d blocks, LRU %d: want 16-token engine blocks raised to 64 pseudo-tokens x 4 bytes, "+
			"131,072 tokens' worth, and the engine's 4096 blocks", l.blockChars, l.maxBlocks, l.lrus[0].cap)
	}
	big := llmdEnv(3)
	big.BlockSize = 128
	if b := newLLMD(big, shippedLLMDApproxWeights(), rand.New(rand.NewPCG(1, 1))); b.blockChars != 512 || b.maxBlocks != 1024 {
		t.Fatalf("engine blocks of 128 tokens give %d-byte blocks, %d at most; want 512 and 1024", b.blockChars, b.maxBlocks)
	}
	w := shippedLLMDApproxWeights()
	w.lruBlocks = 31250
	if c := newLLMD(llmdEnv(3), w, rand.New(rand.NewPCG(1, 1))).lrus[0].cap; c != 31250 {
		t.Fatalf("lru_blocks 31250 gives an LRU of %d", c)
	}
	v := view(0, 0, 0)
	v.ScrapedWaiting, v.ScrapedKVUsage = []int{0, 0, 0}, []float64{0, 0, 0}
	warm := flight(userMsg(1, 300))
	l.Pick(warm, v)
	observe(l, 1, warm, v)
	again := flight(userMsg(1, 300), userMsg(2, 20))
	if got := l.Pick(again, v); got != 1 {
		t.Fatalf("picked %d, want 1 (the prefix); scores %v", got, l.scores)
	}
	// The trailing partial block is hashed: the same prompt again matches
	// every block, not all but the last.
	l.Pick(warm, v)
	n := len(RoleContentText(warm.Req.Messages, 0))
	if blocks := (n + l.blockChars - 1) / l.blockChars; n%l.blockChars == 0 || len(l.hashes) != blocks || l.matched[1] != blocks {
		t.Fatalf("the same %d-byte prompt matched %d of %d blocks, want %d of %d", n, l.matched[1], len(l.hashes), blocks, blocks)
	}
	// A queue formed on pod 1 since the last scrape: not seen yet.
	v.Waiting[1] = 5
	if got := l.Pick(again, v); got != 1 {
		t.Fatalf("picked %d, want 1: the queue is not scraped yet; scores %v", got, l.scores)
	}
	// Scraped: a full KV cache costs pod 1 the 2 points of the utilization
	// scorer and the queue 2 more; 6/7 x 3 of prefix does not make up 4.
	v.ScrapedWaiting[1], v.ScrapedKVUsage[1] = 5, 1
	if got := l.Pick(again, v); got == 1 {
		t.Fatalf("picked the loaded pod; scores %v", l.scores)
	}
	// With only the KV usage high, the prefix still wins (2.6 + 2 > 4).
	v.ScrapedWaiting[1] = 0
	if got := l.Pick(again, v); got != 1 {
		t.Fatalf("picked %d, want 1; scores %v", got, l.scores)
	}
	l.Done(warm, 0)
	// The LRU forgets the oldest blocks past its capacity.
	s := newLRUSet(2)
	s.add(1)
	s.add(2)
	s.add(1)
	if old, ok := s.add(3); !ok || old != 2 {
		t.Fatalf("evicted %d %v, want 2", old, ok)
	}
}

// The old weighting stays as llmd_approx_bench: its active-request scorer
// counts the scheduler's own requests in flight.
func TestLLMDApproxBench(t *testing.T) {
	l := newLLMD(llmdEnv(3), benchLLMDApproxWeights(), rand.New(rand.NewPCG(1, 1)))
	v := view(0, 0, 0)
	warm := flight(userMsg(1, 300))
	l.Pick(warm, v)
	observe(l, 1, warm, v)
	again := flight(userMsg(1, 300), userMsg(2, 20))
	// Pod 1: prefix ~0.9*2 + queue 1 + active 0; the others 0 + 1 + 1.
	if got := l.Pick(again, v); got != 1 {
		t.Fatalf("picked %d, want 1; scores %v", got, l.scores)
	}
	v.Waiting[1] = 3 // no scrape in this view: live queues
	if got := l.Pick(again, v); got == 1 {
		t.Fatalf("picked the queued pod; scores %v", l.scores)
	}
}

// The clairvoyant oracle sees the blocks that requests queued on a replica
// will write: a request sharing them goes there, not to an idle replica.
// (The old oracle saw only resident blocks.)
func TestClairvoyantSeesQueuedBlocks(t *testing.T) {
	caches := []*vllmsim.Cache{vllmsim.NewCache(16, 100, nil), vllmsim.NewCache(16, 100, nil), vllmsim.NewCache(16, 100, nil)}
	o := &clairvoyant{n: 3, rng: rand.New(rand.NewPCG(1, 1))}
	queuedReq := flight(userMsg(1, 300))
	queued := []map[uint64]int{{}, {}, {}}
	for _, h := range queuedReq.Req.BlockHashes(16) {
		queued[2][h]++
	}
	v := &View{Loads: []int{0, 1, 3}, Waiting: []int{0, 0, 1}, Caches: caches, Queued: queued, BlockSize: 16}
	again := flight(userMsg(1, 300), userMsg(2, 40))
	if got := o.Pick(again, v); got != 2 {
		t.Fatalf("picked %d, want 2: its queued request writes the prefix", got)
	}
	// Resident blocks count the same; the longer prefix wins over load.
	_, lease := caches[1].Admit(again.Req.Tokens())
	caches[1].Release(lease)
	if got := o.Pick(again, v); got != 1 {
		t.Fatalf("picked %d, want 1: it holds the whole prompt", got)
	}
	// Nothing anywhere: the least loaded.
	if got := o.Pick(flight(userMsg(7, 300)), v); got != 0 {
		t.Fatalf("cold: picked %d, want 0", got)
	}
}
