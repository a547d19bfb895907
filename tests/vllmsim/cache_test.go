package vllmsim_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"rolter.dev/tests/vllmsim"
)

// seq returns n token ids starting at base.
func seq(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

func TestBlockHashes(t *testing.T) {
	toks := seq(1, 40)
	tests := []struct {
		name      string
		tokens    []uint32
		blockSize int
		want      int
	}{
		{name: "only full blocks are hashed", tokens: toks, blockSize: 16, want: 2},
		{name: "exact multiple", tokens: toks[:32], blockSize: 16, want: 2},
		{name: "shorter than a block", tokens: toks[:15], blockSize: 16, want: 0},
		{name: "block size below 1", tokens: toks, blockSize: 0, want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := vllmsim.BlockHashes(tc.tokens, tc.blockSize); len(got) != tc.want {
				t.Errorf("got %d hashes, want %d", len(got), tc.want)
			}
		})
	}

	full := vllmsim.BlockHashes(toks, 4)
	if prefix := vllmsim.BlockHashes(toks[:8], 4); !slices.Equal(prefix, full[:2]) {
		t.Errorf("hashes of a prefix differ from the prefix of the hashes")
	}
	changed := slices.Clone(toks)
	changed[0]++
	other := vllmsim.BlockHashes(changed, 4)
	for i := range full {
		if full[i] == other[i] {
			t.Errorf("block %d hash does not depend on the first block", i)
		}
	}
}

func TestCacheAdmit(t *testing.T) {
	base := seq(1000, 64)
	type step struct {
		tokens       []uint32
		wantCached   int
		wantResident int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name:  "first request hits nothing",
			steps: []step{{tokens: base[:40], wantCached: 0, wantResident: 2}},
		},
		{
			name: "repeated prompt hits its full blocks",
			steps: []step{
				{tokens: base[:40], wantCached: 0, wantResident: 2},
				{tokens: base[:40], wantCached: 32, wantResident: 2},
			},
		},
		{
			name: "block-aligned repeat recomputes its last block, as vLLM does",
			steps: []step{
				{tokens: base[:32], wantCached: 0, wantResident: 2},
				{tokens: base[:32], wantCached: 16, wantResident: 2},
			},
		},
		{
			name: "longer prompt hits the shared prefix",
			steps: []step{
				{tokens: base[:20], wantCached: 0, wantResident: 1},
				{tokens: base[:64], wantCached: 16, wantResident: 4},
				{tokens: base[:50], wantCached: 48, wantResident: 4},
			},
		},
		{
			name: "partial block is never cached",
			steps: []step{
				{tokens: base[:15], wantCached: 0, wantResident: 0},
				{tokens: base[:15], wantCached: 0, wantResident: 0},
			},
		},
		{
			name: "different first block misses everything",
			steps: []step{
				{tokens: base[:40], wantCached: 0, wantResident: 2},
				{tokens: append(seq(1, 1), base[1:40]...), wantCached: 0, wantResident: 4},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := vllmsim.NewCache(16, 100, nil)
			for i, s := range tc.steps {
				before := c.Stats()
				if got := c.Lookup(s.tokens); got != s.wantCached {
					t.Errorf("step %d: Lookup = %d, want %d", i, got, s.wantCached)
				}
				if c.Stats() != before {
					t.Errorf("step %d: Lookup changed the cache", i)
				}
				cached, lease := c.Admit(s.tokens)
				c.Release(lease)
				if cached != s.wantCached {
					t.Errorf("step %d: cached = %d, want %d", i, cached, s.wantCached)
				}
				if got := c.Stats().Resident; got != s.wantResident {
					t.Errorf("step %d: resident = %d, want %d", i, got, s.wantResident)
				}
			}
		})
	}
}

func TestCacheEvictsLeastRecentlyUsedLeavesFirst(t *testing.T) {
	c := vllmsim.NewCache(2, 4, nil)
	a := seq(100, 8) // 4 blocks: fills the cache
	_, la := c.Admit(a)
	c.Release(la)
	_, lb := c.Admit(seq(200, 4)) // 2 new blocks: evicts A's 2 deepest
	c.Release(lb)
	st := c.Stats()
	if st.Evictions != 2 || st.Resident != 4 {
		t.Fatalf("stats = %+v, want 2 evictions and 4 resident", st)
	}
	hashes := vllmsim.BlockHashes(a, 2)
	for i, want := range []bool{true, true, false, false} {
		if got := c.Has(hashes[i]); got != want {
			t.Errorf("block %d of A resident = %v, want %v", i, got, want)
		}
	}
	cached, lease := c.Admit(a)
	c.Release(lease)
	if cached != 4 {
		t.Errorf("A after eviction: cached = %d, want 4 (its first 2 blocks)", cached)
	}
}

func TestCacheDoesNotEvictHeldBlocks(t *testing.T) {
	c := vllmsim.NewCache(2, 2, nil)
	a, b := seq(100, 4), seq(200, 4)
	_, la := c.Admit(a) // holds both blocks
	_, lb := c.Admit(b)
	if lb.Blocks() != 0 {
		t.Errorf("B got %d blocks while A holds the whole cache", lb.Blocks())
	}
	c.Release(lb)
	if st := c.Stats(); st.Evictions != 0 || st.Pinned != 2 {
		t.Errorf("stats = %+v, want no eviction and 2 pinned", st)
	}
	c.Release(la)
	c.Release(la) // a second release is a no-op
	_, lb = c.Admit(b)
	c.Release(lb)
	if st := c.Stats(); st.Evictions != 2 || st.Pinned != 0 {
		t.Errorf("stats = %+v, want 2 evictions and 0 pinned", st)
	}
}

// Fits counts only the blocks running requests hold: a prompt fits while
// the unheld ones (free, or cached with no holder) can take its blocks.
func TestCacheFits(t *testing.T) {
	c := vllmsim.NewCache(2, 4, nil)
	a, b := seq(100, 4), seq(200, 4)
	if !c.Fits(a) {
		t.Fatal("an empty cache does not fit a two-block prompt")
	}
	_, la := c.Admit(a) // holds two of the four blocks
	if !c.Fits(b) || !c.Fits(seq(100, 8)) {
		t.Error("two free blocks do not fit a two-block prompt, or A's extension")
	}
	if c.Fits(seq(300, 6)) {
		t.Error("three new blocks fit beside two held of four")
	}
	_, lb := c.Admit(b)
	if c.Fits(seq(300, 2)) {
		t.Error("a new block fits a cache whose every block is held")
	}
	c.Release(la)
	if !c.Fits(seq(300, 4)) { // A's blocks stay cached but have no holder
		t.Error("a released request's blocks do not make room")
	}
	c.Release(lb)
}

func TestCacheExtendCachesOutputBlocks(t *testing.T) {
	c := vllmsim.NewCache(4, 100, nil)
	full := seq(1, 17)
	_, lease := c.Admit(full[:10]) // 2 blocks
	c.Extend(lease, full[:16])     // 4 blocks
	if lease.Blocks() != 4 {
		t.Fatalf("lease holds %d blocks, want 4", lease.Blocks())
	}
	c.Release(lease)
	c.Extend(lease, full) // no-op once released
	cached, lease := c.Admit(full)
	c.Release(lease)
	if cached != 16 {
		t.Errorf("cached = %d, want 16", cached)
	}
}

func TestCacheClear(t *testing.T) {
	var events []vllmsim.KVEvent
	c := vllmsim.NewCache(4, 100, vllmsim.ListenerFunc(func(b []vllmsim.KVEvent) { events = append(events, b...) }))
	_, held := c.Admit(seq(1, 8))
	c.Clear()
	if last := events[len(events)-1]; last.Kind != vllmsim.AllBlocksCleared {
		t.Fatalf("last event = %v, want AllBlocksCleared", last.Kind)
	}
	c.Extend(held, seq(1, 12)) // a lease from before the clear stores nothing
	c.Release(held)            // and releases nothing
	if st := c.Stats(); st.Resident != 0 || st.Pinned != 0 {
		t.Fatalf("after clear: %+v", st)
	}
	cached, lease := c.Admit(seq(1, 8))
	c.Release(lease)
	if cached != 0 {
		t.Errorf("cached after clear = %d, want 0", cached)
	}
}

// mirror applies KV events the way a KV-event consumer would, and checks
// their invariants as they arrive.
type mirror struct {
	t         *testing.T
	blockSize int
	mu        sync.Mutex
	blocks    map[uint64]bool
	stored    int
	removed   int
}

func (m *mirror) KVEvents(batch []vllmsim.KVEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range batch {
		switch e.Kind {
		case vllmsim.BlockStored:
			if e.HasParent && !m.blocks[e.ParentBlockHash] {
				m.t.Errorf("stored run's parent %x is not resident", e.ParentBlockHash)
			}
			if e.BlockSize != m.blockSize || len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
				m.t.Errorf("stored event has %d tokens for %d blocks of %d", len(e.TokenIDs), len(e.BlockHashes), e.BlockSize)
			}
			for _, h := range e.BlockHashes {
				if m.blocks[h] {
					m.t.Errorf("block %x stored twice", h)
				}
				m.blocks[h] = true
				m.stored++
			}
		case vllmsim.BlockRemoved:
			for _, h := range e.BlockHashes {
				if !m.blocks[h] {
					m.t.Errorf("block %x removed but not resident", h)
				}
				delete(m.blocks, h)
				m.removed++
			}
		case vllmsim.AllBlocksCleared:
			clear(m.blocks)
		default:
			m.t.Errorf("unknown event kind %v", e.Kind)
		}
	}
}

func (m *mirror) check(c *vllmsim.Cache) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if st := c.Stats(); st.Resident != len(m.blocks) {
		m.t.Errorf("cache holds %d blocks, events say %d", st.Resident, len(m.blocks))
	}
	for h := range m.blocks {
		if !c.Has(h) {
			m.t.Errorf("events say %x is resident, the cache does not", h)
		}
	}
}

func TestCacheListenerMirrorsCache(t *testing.T) {
	const blockSize = 4
	m := &mirror{t: t, blockSize: blockSize, blocks: map[uint64]bool{}}
	c := vllmsim.NewCache(blockSize, 12, m)
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := [][]uint32{seq(100, 24), seq(200, 24), seq(300, 24), seq(400, 24)}
	var held []*vllmsim.Lease
	for i := range 300 {
		p := prefixes[rng.IntN(len(prefixes))]
		prompt := append(slices.Clone(p[:4+rng.IntN(16)]), seq(1000+i, rng.IntN(9))...)
		_, lease := c.Admit(prompt)
		if rng.IntN(3) == 0 {
			c.Extend(lease, append(prompt, seq(5000+i, 8)...))
		}
		held = append(held, lease)
		for len(held) > 2 {
			j := rng.IntN(len(held))
			c.Release(held[j])
			held = slices.Delete(held, j, j+1)
		}
		if i == 150 {
			c.Clear()
		}
		m.check(c)
	}
	for _, l := range held {
		c.Release(l)
	}
	m.check(c)
	if m.removed == 0 || c.Stats().Evictions != uint64(m.removed) {
		t.Errorf("removed events = %d, evictions = %d; want equal and > 0", m.removed, c.Stats().Evictions)
	}
}

func TestCacheConcurrentUse(t *testing.T) {
	m := &mirror{t: t, blockSize: 4, blocks: map[uint64]bool{}}
	c := vllmsim.NewCache(4, 16, m)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				_, l := c.Admit(seq(100*(g%2)+i%7, 20))
				c.Release(l)
			}
		})
	}
	wg.Wait()
	m.check(c)
}

func BenchmarkCacheAdmit(b *testing.B) {
	for _, n := range []int{1024, 16384} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			c := vllmsim.NewCache(16, 4096, nil)
			prompt := seq(1, n)
			b.ReportAllocs()
			for b.Loop() {
				_, l := c.Admit(prompt)
				c.Release(l)
			}
		})
	}
}
