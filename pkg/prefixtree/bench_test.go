package prefixtree_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"rolter.dev/pkg/prefixtree"
)

// workload is a synthetic chat fleet: a few long system prompts, each
// followed by a distinct conversation tail, spread over tenants the way a
// cache-aware router with load spill spreads them (every tenant ends up
// holding most system prompts).
type workload struct {
	rng     *rand.Rand
	systems []string
	tail    int
}

func newWorkload(seed uint64, systems, systemLen, tailLen int) *workload {
	w := &workload{rng: rand.New(rand.NewPCG(seed, seed+1)), tail: tailLen}
	for range systems {
		w.systems = append(w.systems, w.text(systemLen))
	}
	return w
}

// text returns n bytes of lowercase words.
func (w *workload) text(n int) string {
	var b strings.Builder
	b.Grow(n)
	for b.Len() < n {
		if w.rng.IntN(6) == 0 {
			b.WriteByte(' ')
		} else {
			b.WriteByte(byte('a' + w.rng.IntN(26)))
		}
	}
	return b.String()
}

func (w *workload) prompt() string {
	return w.systems[w.rng.IntN(len(w.systems))] + w.text(w.tail)
}

// fillTenant inserts prompts into tenant through insert until stats reports
// the first eviction (the tenant is full), returning the prompts inserted.
func (w *workload) fillTenant(insert func(string), stats func() prefixtree.Stats) []string {
	var ps []string
	for stats().Evictions == 0 {
		p := w.prompt()
		insert(p)
		ps = append(ps, p)
	}
	return ps
}

// fullTrees builds, from one workload, both layouts with every tenant full
// at maxNodes: one shared tree and one single-tenant tree per tenant. It
// returns a query that shares its system prompt with every tenant and 6 of
// its 8 KiB with tenant 5.
func fullTrees(tenants, maxNodes int) (shared *prefixtree.Tree, per []*prefixtree.Tree, query string) {
	w := newWorkload(1, 32, 4<<10, 4<<10)
	shared = prefixtree.New(tenants, maxNodes)
	per = make([]*prefixtree.Tree, tenants)
	var last string
	for i := range tenants {
		per[i] = prefixtree.New(1, maxNodes)
		ps := w.fillTenant(func(p string) {
			shared.Insert(i, p)
			per[i].Insert(0, p)
		}, func() prefixtree.Stats { return per[i].Stats(0) })
		if i == 5 {
			last = ps[len(ps)-1]
		}
	}
	return shared, per, last[:6<<10] + w.text(2<<10)
}

// BenchmarkMatch compares one walk of the shared tree with one walk per
// tenant of per-tenant trees, 16 tenants each full at 1 M byte nodes, for an
// 8 KiB prompt whose 4 KiB system prompt every tenant holds.
func BenchmarkMatch(b *testing.B) {
	const tenants = 16
	shared, per, q := fullTrees(tenants, prefixtree.DefaultMaxNodes)
	lens := make([]int, tenants)
	b.Run("layout=shared", func(b *testing.B) {
		b.SetBytes(int64(len(q)))
		b.ReportAllocs()
		for b.Loop() {
			shared.Match(q, lens)
		}
		if lens[5] < 6<<10 || lens[0] < 4<<10 {
			b.Fatalf("unexpected match %v", lens)
		}
	})
	b.Run("layout=per-tenant", func(b *testing.B) {
		b.SetBytes(int64(len(q)))
		b.ReportAllocs()
		for b.Loop() {
			for i, t := range per {
				t.Match(q, lens[i:i+1])
			}
		}
		if lens[5] < 6<<10 || lens[0] < 4<<10 {
			b.Fatalf("unexpected match %v", lens)
		}
	})
}

// BenchmarkInsert inserts 8 KiB prompts into tenants that are full at 1 M
// byte nodes, so every insert also evicts. "new" prompts share a system
// prompt and differ in their 4 KiB tail; "touch" re-observes a resident one.
func BenchmarkInsert(b *testing.B) {
	const tenants = 16
	shared, _, _ := fullTrees(tenants, prefixtree.DefaultMaxNodes)
	w := newWorkload(9, 32, 4<<10, 4<<10)
	b.Run("prompt=new", func(b *testing.B) {
		// One buffer, rewritten before each insert: the tree copies what it
		// keeps, so this measures Insert's own allocations only.
		buf := []byte(w.prompt())
		b.ReportAllocs()
		b.SetBytes(int64(len(buf)))
		i := 0
		for b.Loop() {
			i++
			binary.LittleEndian.PutUint64(buf[4<<10:], uint64(i))
			shared.Insert(i%tenants, unsafe.String(&buf[0], len(buf)))
		}
	})
	b.Run("prompt=touch", func(b *testing.B) {
		p := w.prompt()
		shared.Insert(3, p)
		b.ReportAllocs()
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			shared.Insert(3, p)
		}
	})
}

// BenchmarkMemoryPerNode builds trees and reports the heap they hold per
// byte node (B/node: heap / sum of the tenants' byte nodes, the unit of the
// ceiling) and per distinct stored byte (B/byte: heap / label bytes).
func BenchmarkMemoryPerNode(b *testing.B) {
	const tenants, maxNodes = 16, 200_000
	type build func() (trees []*prefixtree.Tree, nodes int)
	chat := func(shared bool) build {
		return func() ([]*prefixtree.Tree, int) {
			w := newWorkload(3, 32, 4<<10, 4<<10)
			if shared {
				t := prefixtree.New(tenants, maxNodes)
				for i := range tenants {
					w.fillTenant(func(p string) { t.Insert(i, p) }, func() prefixtree.Stats { return t.Stats(i) })
				}
				return []*prefixtree.Tree{t}, sumNodes(t)
			}
			var ts []*prefixtree.Tree
			nodes := 0
			for range tenants {
				t := prefixtree.New(1, maxNodes)
				w.fillTenant(func(p string) { t.Insert(0, p) }, func() prefixtree.Stats { return t.Stats(0) })
				ts = append(ts, t)
				nodes += sumNodes(t)
			}
			return ts, nodes
		}
	}
	// branchy is the worst case for a radix tree: short random strings over
	// a 4-letter alphabet branch every few bytes, so nodes are short.
	branchy := func() ([]*prefixtree.Tree, int) {
		rng := rand.New(rand.NewPCG(4, 4))
		t := prefixtree.New(tenants, maxNodes/8)
		for i := range tenants {
			for t.Stats(i).Evictions == 0 {
				var sb strings.Builder
				for range 32 {
					sb.WriteByte("acgt"[rng.IntN(4)])
				}
				t.Insert(i, sb.String())
			}
		}
		return []*prefixtree.Tree{t}, sumNodes(t)
	}
	for _, c := range []struct {
		name  string
		build build
	}{
		{"workload=chat/layout=shared", chat(true)},
		{"workload=chat/layout=per-tenant", chat(false)},
		{"workload=branchy/layout=shared", branchy},
	} {
		b.Run(c.name, func(b *testing.B) {
			var perNode, perByte, perRadix float64
			for b.Loop() {
				before := heapInUse()
				trees, nodes := c.build()
				heap := float64(heapInUse() - before)
				var size prefixtree.Size
				for _, t := range trees {
					s := t.Size()
					size.Nodes += s.Nodes
					size.Bytes += s.Bytes
				}
				perNode = heap / float64(nodes)
				perByte = heap / float64(size.Bytes)
				perRadix = float64(size.Bytes) / float64(size.Nodes)
				runtime.KeepAlive(trees)
			}
			b.ReportMetric(perNode, "B/node")
			b.ReportMetric(perByte, "B/byte")
			b.ReportMetric(perRadix, "bytes/radix-node")
		})
	}
}

func sumNodes(t *prefixtree.Tree) int {
	n := 0
	for _, s := range t.AppendStats(nil) {
		n += s.Nodes
	}
	return n
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func ExampleTree() {
	t := prefixtree.New(3, prefixtree.DefaultMaxNodes)
	t.Insert(0, "You are terse. Q: capital of France?")
	t.Insert(1, "You are terse. Q: capital of Peru?")
	lens := make([]int, 3)
	t.Match("You are terse. Q: capital of Peru? A: Lima. Q: and Chile?", lens)
	fmt.Println(lens, t.Stats(1).Nodes)
	// Output: [29 34 0] 34
}
