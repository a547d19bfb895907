package chunkindex_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"rolter.dev/pkg/chunkindex"
)

// text returns n bytes of deterministic pseudo-random lowercase text.
func text(rng *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		b.WriteByte(byte('a' + rng.IntN(26)))
	}
	return b.String()
}

func TestHashesChainThePrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := text(rng, 3*chunkindex.ChunkBytes)
	a := chunkindex.Hashes(nil, base+"tail one")
	b := chunkindex.Hashes(nil, base+"tail two, longer")
	if len(a) != 4 || len(b) != 4 {
		t.Fatalf("fingerprint lengths %d, %d; want 3 chunks + tail", len(a), len(b))
	}
	if !slices.Equal(a[:3], b[:3]) {
		t.Fatal("prompts sharing 3 chunks do not share their first 3 hashes")
	}
	if a[3] == b[3] {
		t.Fatal("different tails hash alike")
	}
	// A change in the first chunk changes every later hash: hashes name whole prefixes.
	c := chunkindex.Hashes(nil, "X"+base[1:]+"tail one")
	for i := range c {
		if c[i] == a[i] {
			t.Fatalf("hash %d unchanged after the first byte changed", i)
		}
	}
	if got := chunkindex.Hashes(nil, base); len(got) != 3 || !slices.Equal(got, a[:3]) {
		t.Fatalf("exact multiple of the chunk size: %d hashes, want 3 equal to the chunk hashes", len(got))
	}
	// A tail is not mistaken for a full chunk of the same bytes.
	short := chunkindex.Hashes(nil, base[:chunkindex.ChunkBytes-1])
	full := chunkindex.Hashes(nil, base[:chunkindex.ChunkBytes])
	if short[0] == full[0] {
		t.Fatal("tail and chunk hashes collide")
	}
}

func TestMatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cb := chunkindex.ChunkBytes
	sys := text(rng, 2*cb)
	p0 := sys + text(rng, 100)
	p1 := text(rng, 5*cb)
	x := chunkindex.New(3, 0)
	x.Observe(0, p0, nil)
	x.Observe(1, p1, nil)
	x.Observe(2, sys+text(rng, 3*cb), nil)

	lens := make([]int, 3)
	cases := []struct {
		name   string
		prompt string
		want   []int
	}{
		{"identical prompt matches in full", p0, []int{len(p0), 0, 2 * cb}},
		{"longer prompt matches whole chunks", p0 + "more", []int{3 * cb, 0, 2 * cb}},
		{"another target's prompt", p1, []int{0, len(p1), 0}},
		{"prefix of p1 cut mid-chunk", p1[:2*cb+10], []int{0, 2 * cb, 0}},
		{"unknown prompt", text(rng, 300), []int{0, 0, 0}},
		{"shorter than a chunk", "hi", []int{0, 0, 0}},
	}
	for _, c := range cases {
		x.Match(c.prompt, lens)
		if !slices.Equal(lens, c.want) {
			t.Errorf("%s: match %v, want %v", c.name, lens, c.want)
		}
	}
	// lens longer than the index's targets: the extra entries are zeroed.
	long := []int{9, 9, 9, 9}
	x.Match(p0, long)
	if long[3] != 0 {
		t.Errorf("extra len not cleared: %v", long)
	}
}

// A receiver that folds everything an observer publishes matches every
// prompt exactly as the observer does (unbounded capacity).
func TestFoldReproducesObserver(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n = 4
	obs, recv := chunkindex.New(n, 0), chunkindex.New(n, 0)
	var prompts []string
	stems := []string{text(rng, 200), text(rng, 700), text(rng, 64)}
	for range 300 {
		p := stems[rng.IntN(len(stems))] + text(rng, rng.IntN(400))
		if rng.IntN(3) == 0 && len(prompts) > 0 {
			p = prompts[rng.IntN(len(prompts))] + text(rng, rng.IntN(200))
		}
		prompts = append(prompts, p)
		tgt := rng.IntN(n)
		recv.Fold(tgt, obs.Observe(tgt, p, nil))
	}
	a, b := make([]int, n), make([]int, n)
	for _, p := range append(prompts, stems...) {
		obs.Match(p, a)
		recv.Match(p, b)
		if !slices.Equal(a, b) {
			t.Fatalf("observer %v, receiver %v for a %d-byte prompt", a, b, len(p))
		}
	}
	// Nothing already held is published again (unbounded: no refresh).
	obs.Observe(0, prompts[0], nil)
	if got := obs.Observe(0, prompts[0], nil); len(got) != 0 {
		t.Fatalf("re-observing a held prompt published %d hashes", len(got))
	}
}

func TestCapacityEvictsLeastRecentlyUsed(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	cb := chunkindex.ChunkBytes
	x := chunkindex.New(1, 10)
	hot := text(rng, 2*cb)
	x.Observe(0, hot, nil)
	var cold []string
	for range 20 {
		p := text(rng, cb)
		cold = append(cold, p)
		x.Observe(0, p, nil)
		x.Observe(0, hot, nil) // keeps hot young
		if s := x.Stats(0); s.Chunks > 10 {
			t.Fatalf("holds %d hashes, capacity 10", s.Chunks)
		}
	}
	lens := make([]int, 1)
	x.Match(hot, lens)
	if lens[0] != len(hot) {
		t.Fatalf("the hot prompt was evicted (match %d)", lens[0])
	}
	x.Match(cold[0], lens)
	if lens[0] != 0 {
		t.Fatal("the oldest cold prompt survived")
	}
	x.Match(cold[len(cold)-1], lens)
	if lens[0] != cb {
		t.Fatal("the newest cold prompt was evicted")
	}
	if s := x.Stats(0); s.Evictions != 12 || s.Chunks != 10 {
		t.Fatalf("stats %+v, want 10 chunks and 12 evictions (22 hashes inserted)", s)
	}
	if got := x.Export(0, nil, 0); len(got) != 10 {
		t.Fatalf("export %d hashes, want 10", len(got))
	}
	if got := x.Export(0, nil, 3); len(got) != 3 || !slices.Equal(got, x.Export(0, nil, 0)[7:]) {
		t.Fatal("a limited export is not the newest hashes, oldest first")
	}
}

// A hot prompt is published once, then again only after half the
// capacity's worth of new hashes, and a peer's publication counts as this
// proxy's own.
func TestRepublishHalfWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	cb := chunkindex.ChunkBytes
	x := chunkindex.New(1, 8)
	hot := text(rng, cb)
	if got := x.Observe(0, hot, nil); len(got) != 1 {
		t.Fatalf("first observation published %d hashes, want 1", len(got))
	}
	republished := 0
	for i := range 12 {
		x.Observe(0, text(rng, cb), nil)
		if got := x.Observe(0, hot, nil); len(got) > 0 {
			republished++
			if i < 4 {
				t.Fatalf("republished after %d inserts, want more than 4", i+1)
			}
		}
	}
	if republished != 2 {
		t.Fatalf("hot prompt republished %d times over 12 inserts, want 2 (every 5th)", republished)
	}
	// A peer publishing it resets the clock.
	for range 4 {
		x.Observe(0, text(rng, cb), nil)
	}
	x.Fold(0, chunkindex.Hashes(nil, hot))
	for range 4 {
		x.Observe(0, text(rng, cb), nil)
	}
	if got := x.Observe(0, hot, nil); len(got) != 0 {
		t.Fatal("republished although a peer published it 4 inserts ago")
	}
}

func TestOutOfRangeIgnored(t *testing.T) {
	x := chunkindex.New(2, 0)
	if got := x.Observe(5, "prompt", nil); got != nil {
		t.Fatal("out-of-range observe published")
	}
	x.Observe(-1, "prompt", nil)
	x.Fold(2, []uint64{1})
	x.Observe(0, "", nil)
	if x.Stats(0).Chunks+x.Stats(1).Chunks != 0 || x.Export(9, nil, 0) != nil || x.Stats(-1) != (chunkindex.Stats{}) {
		t.Fatal("ignored input changed the index")
	}
	if chunkindex.New(1000, 0).Targets() != chunkindex.MaxTargets {
		t.Fatal("targets not clamped")
	}
}

func TestConcurrentUse(t *testing.T) {
	x := chunkindex.New(8, 100)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			lens := make([]int, 8)
			for i := range 500 {
				p := fmt.Sprintf("%d-%s", i%37, text(rng, 100+rng.IntN(200)))
				x.Match(p, lens)
				x.Fold(rng.IntN(8), x.Observe(rng.IntN(8), p, nil))
				x.Export(rng.IntN(8), nil, 10)
			}
		}()
	}
	wg.Wait()
	for i := range 8 {
		if c := x.Stats(i).Chunks; c > 100 {
			t.Fatalf("target %d holds %d > capacity", i, c)
		}
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	x := chunkindex.New(8, 0)
	p := text(rng, 8<<10)
	for i := range 8 {
		x.Observe(i, p[:1024*(i+1)], nil)
	}
	lens := make([]int, 8)
	if a := testing.AllocsPerRun(100, func() { x.Match(p, lens) }); a != 0 {
		t.Fatalf("Match allocates %.1f times", a)
	}
}

// SharedLen ends at the last chunk two observed prompts continued
// differently: a system prompt two sessions start with is shared, one
// conversation's history, each turn extending the last, is not.
func TestSharedLenStopsWherePromptsPart(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	system := text(rng, 4*chunkindex.ChunkBytes)
	turn1 := system + text(rng, 3*chunkindex.ChunkBytes+10) // ends in a tail chunk
	turn2 := turn1 + text(rng, 2*chunkindex.ChunkBytes)     // extends turn1's tail into full chunks
	x := chunkindex.New(2, 0)
	x.TrackForks()
	x.Observe(0, turn1, nil)
	x.Observe(0, turn2, nil)
	if got := x.SharedLen(turn2 + "next"); got != 0 {
		t.Fatalf("one conversation: shared %d bytes, want 0 (a history nobody else extends)", got)
	}
	other := system + text(rng, 2*chunkindex.ChunkBytes)
	x.Observe(1, other, nil)
	if got, want := x.SharedLen(turn2+"next"), len(system); got != want {
		t.Fatalf("two sessions: shared %d bytes, want the system prompt's %d", got, want)
	}
	if got := x.SharedLen(text(rng, 3*chunkindex.ChunkBytes)); got != 0 {
		t.Fatalf("unseen prompt: shared %d bytes, want 0", got)
	}
	untracked := chunkindex.New(2, 0)
	for i, p := range []string{turn1, turn2, other} {
		untracked.Observe(i%2, p, nil)
	}
	if got := untracked.SharedLen(turn2 + "next"); got != 0 {
		t.Fatalf("index without TrackForks: shared %d bytes, want 0", got)
	}
}

// What SharedLen knows goes with the last holder of a chunk.
func TestSharedLenForgetsEvicted(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	system := text(rng, 2*chunkindex.ChunkBytes)
	a := system + text(rng, chunkindex.ChunkBytes)
	b := system + text(rng, chunkindex.ChunkBytes)
	x := chunkindex.New(1, 0)
	x.TrackForks()
	x.Observe(0, a, nil)
	x.Observe(0, b, nil)
	if got := x.SharedLen(a); got != len(system) {
		t.Fatalf("shared %d bytes, want %d", got, len(system))
	}
	x.SetCapacity(0, 1) // keeps only the newest hash: b's last chunk
	if got := x.SharedLen(a); got != 0 {
		t.Fatalf("after eviction: shared %d bytes, want 0", got)
	}
}

// FuzzSharedLen: for any two prompts observed, SharedLen is a whole number
// of chunks within the prompt, and two prompts that part after a common
// run of full chunks, each with a full chunk after it, share that run; an
// index that evicts tail first (EvictTailFirst) holds the same hashes and
// forks, so its matches and SharedLen are the same.
func FuzzSharedLen(f *testing.F) {
	f.Add(strings.Repeat("s", 3*chunkindex.ChunkBytes)+strings.Repeat("a", 70), strings.Repeat("s", 3*chunkindex.ChunkBytes)+strings.Repeat("b", 64))
	f.Add("", "x")
	f.Add(strings.Repeat("q", 200), strings.Repeat("q", 200))
	f.Fuzz(func(t *testing.T, a, b string) {
		x, y := chunkindex.New(2, 0), chunkindex.New(2, 0)
		x.TrackForks()
		y.TrackForks()
		y.EvictTailFirst()
		var xp, yp []uint64
		xp = x.Observe(0, a, xp)
		xp = x.Observe(1, b, xp)
		yp = y.Observe(0, a, yp)
		yp = y.Observe(1, b, yp)
		if len(xp) != len(yp) {
			t.Fatalf("published %d hashes, tail first %d", len(xp), len(yp))
		}
		xl, yl := []int{0, 0}, []int{0, 0}
		for _, p := range []string{a, b} {
			n := x.SharedLen(p)
			if n < 0 || n > len(p) || n%chunkindex.ChunkBytes != 0 {
				t.Fatalf("SharedLen = %d for a %d-byte prompt", n, len(p))
			}
			x.Match(p, xl)
			y.Match(p, yl)
			if m := y.SharedLen(p); m != n || xl[0] != yl[0] || xl[1] != yl[1] {
				t.Fatalf("tail first: SharedLen %d and matches %v, first to last %d and %v", m, yl, n, xl)
			}
		}
		common := 0
		for common < min(len(a), len(b)) && a[common] == b[common] {
			common++
		}
		common -= common % chunkindex.ChunkBytes
		if common > 0 && len(a) >= common+chunkindex.ChunkBytes && len(b) >= common+chunkindex.ChunkBytes {
			if got := x.SharedLen(a); got < common {
				t.Fatalf("prompts parting after %d bytes: SharedLen = %d", common, got)
			}
		}
	})
}

// With EvictTailFirst a prompt pushed out of a full target loses its last
// chunk first, as a vLLM replica frees a finished request's blocks, and
// still matches the rest from its start; by default its first chunk goes
// first and nothing of it matches any more.
func TestEvictTailFirstKeepsTheHead(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	a := text(rng, 3*chunkindex.ChunkBytes)
	b := text(rng, chunkindex.ChunkBytes)
	for _, tc := range []struct {
		tailFirst bool
		want      int
	}{{false, 0}, {true, 2 * chunkindex.ChunkBytes}} {
		x := chunkindex.New(1, 3)
		if tc.tailFirst {
			x.EvictTailFirst()
		}
		x.Observe(0, a, nil)
		lens := []int{0}
		if x.Match(a, lens); lens[0] != len(a) {
			t.Fatalf("tail first %v: %d bytes of a match before the eviction, want %d", tc.tailFirst, lens[0], len(a))
		}
		x.Observe(0, b, nil) // one hash over the capacity: one of a's goes
		if x.Match(a, lens); lens[0] != tc.want {
			t.Errorf("tail first %v: %d bytes of a match after the eviction, want %d", tc.tailFirst, lens[0], tc.want)
		}
		if s := x.Stats(0); s.Chunks != 3 || s.Evictions != 1 {
			t.Errorf("tail first %v: %+v, want 3 chunks and 1 eviction", tc.tailFirst, s)
		}
	}
}

// Tail is the last observation of the oldest hash of a full target: a
// prompt observed again (locally or from a peer) is young again, and the
// tail is what nothing touched since; a target with room to spare, or an
// unbounded one, evicts nothing and has no tail.
func TestTailIsTheOldestObservation(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	cb := chunkindex.ChunkBytes
	now := int64(0)
	x := chunkindex.New(2, 3)
	x.SetClock(func() int64 { return now })
	x.SetCapacity(1, 0)
	a, b, c := text(rng, cb), text(rng, cb), text(rng, cb)
	for i, p := range []string{a, b} {
		now = int64(10 * (i + 1))
		x.Observe(0, p, nil)
		x.Observe(1, p, nil)
	}
	if _, full := x.Tail(0); full {
		t.Fatal("a target holding 2 of 3 hashes is full")
	}
	now = 30
	x.Observe(0, c, nil)
	x.Observe(1, c, nil)
	if at, full := x.Tail(0); !full || at != 10 {
		t.Fatalf("tail %d (full %v), want a's observation at 10", at, full)
	}
	now = 40
	x.Observe(0, a, nil) // a young again: b is the oldest
	if at, full := x.Tail(0); !full || at != 20 {
		t.Fatalf("tail %d (full %v), want b's observation at 20", at, full)
	}
	now = 50
	x.Fold(0, chunkindex.Hashes(nil, b)) // a peer sent b: c is the oldest
	if at, full := x.Tail(0); !full || at != 30 {
		t.Fatalf("tail %d (full %v), want c's observation at 30 after a peer's fold of b", at, full)
	}
	if _, full := x.Tail(1); full {
		t.Fatal("an unbounded target has a tail")
	}
	if _, full := x.Tail(2); full {
		t.Fatal("a target out of range has a tail")
	}
}
