package prefixtree

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// model is the naive reference: per tenant, the resident prompts in LRU
// order (oldest first), sized as a byte trie of them.
type model struct {
	maxNodes  int
	resident  [][]string
	evictions []uint64
}

func newModel(tenants, maxNodes int) *model {
	return &model{maxNodes: maxNodes, resident: make([][]string, tenants), evictions: make([]uint64, tenants)}
}

func (m *model) insert(tenant int, s string) {
	if tenant < 0 || tenant >= len(m.resident) || s == "" {
		return
	}
	r := m.resident[tenant]
	if i := slices.Index(r, s); i >= 0 {
		r = append(slices.Delete(r, i, i+1), s)
		m.resident[tenant] = r
		return
	}
	r = append(r, s)
	for m.maxNodes > 0 && trieNodes(r) > m.maxNodes && len(r) > 0 {
		r = r[1:]
		m.evictions[tenant]++
	}
	m.resident[tenant] = r
}

func (m *model) match(tenant int, s string) int {
	best := 0
	for _, r := range m.resident[tenant] {
		best = max(best, lcp(r, s))
	}
	return best
}

func (m *model) nodes(tenant int) int { return trieNodes(m.resident[tenant]) }

// trieNodes is the node count of a byte trie of ss: the number of distinct
// non-empty prefixes, i.e. the sum of the lengths of the sorted distinct
// strings minus the common prefix of each with its predecessor.
func trieNodes(ss []string) int {
	sorted := slices.Clone(ss)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	n := 0
	for i, s := range sorted {
		n += len(s)
		if i > 0 {
			n -= lcp(s, sorted[i-1])
		}
	}
	return n
}

func lcp(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// check verifies every structural invariant of t, and that t agrees with m.
func check(t *Tree, m *model) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	nodes := make([]int, len(t.tenants))
	var size Size
	var walk func(v *node) error
	walk = func(v *node) error {
		if len(v.keys) != len(v.children) {
			return fmt.Errorf("node %q: %d keys, %d children", v.label, len(v.keys), len(v.children))
		}
		childSum := map[uint16]uint32{}
		for i, c := range v.children {
			if c.parent != v {
				return fmt.Errorf("node %q: child %q has the wrong parent", v.label, c.label)
			}
			if c.label == "" || v.keys[i] != c.label[0] {
				return fmt.Errorf("node %q: key %q for child %q", v.label, v.keys[i], c.label)
			}
			if slices.Index(v.keys, v.keys[i]) != i {
				return fmt.Errorf("node %q: duplicate key %q", v.label, v.keys[i])
			}
			for _, r := range c.refs {
				childSum[r.tenant] += r.count
			}
			if err := walk(c); err != nil {
				return err
			}
		}
		if v == &t.root {
			if len(v.refs) != 0 || v.label != "" {
				return fmt.Errorf("root has refs %v or label %q", v.refs, v.label)
			}
			return nil
		}
		size.Nodes++
		size.Bytes += len(v.label)
		if len(v.refs) == 0 {
			return fmt.Errorf("node %q is held by no tenant", v.label)
		}
		terminal := false
		seen := map[uint16]bool{}
		for _, r := range v.refs {
			if seen[r.tenant] {
				return fmt.Errorf("node %q: tenant %d twice", v.label, r.tenant)
			}
			seen[r.tenant] = true
			own := uint32(0)
			if r.entry >= 0 {
				terminal = true
				own = 1
				if e := *t.tenants[r.tenant].lru.At(r.entry); e != v {
					return fmt.Errorf("node %q: tenant %d entry %d points elsewhere", v.label, r.tenant, r.entry)
				}
			}
			if r.count != own+childSum[r.tenant] {
				return fmt.Errorf("node %q: tenant %d count %d, want %d", v.label, r.tenant, r.count, own+childSum[r.tenant])
			}
			delete(childSum, r.tenant)
			nodes[r.tenant] += len(v.label)
		}
		if len(childSum) != 0 {
			return fmt.Errorf("node %q: children held by tenants %v that it is not", v.label, childSum)
		}
		if !terminal && len(v.children) < 2 {
			return fmt.Errorf("node %q: not compressed (%d children, ends no prompt)", v.label, len(v.children))
		}
		return nil
	}
	if err := walk(&t.root); err != nil {
		return err
	}
	if size != t.size {
		return fmt.Errorf("size %+v, counted %+v", t.size, size)
	}
	for i := range t.tenants {
		ten := &t.tenants[i]
		if ten.nodes != nodes[i] {
			return fmt.Errorf("tenant %d: nodes %d, counted %d", i, ten.nodes, nodes[i])
		}
		// (The list's own links are checked in pkg/lrulist.)
		var lru []string
		for _, n := range ten.lru.All() {
			lru = append(lru, pathOf(*n))
		}
		if len(lru) != ten.prompts || ten.lru.Len() != ten.prompts {
			return fmt.Errorf("tenant %d: %d prompts, %d in the LRU list", i, ten.prompts, len(lru))
		}
		if m == nil {
			continue
		}
		if !slices.Equal(lru, m.resident[i]) {
			return fmt.Errorf("tenant %d: resident %q, model %q", i, lru, m.resident[i])
		}
		if want := m.nodes(i); ten.nodes != want {
			return fmt.Errorf("tenant %d: nodes %d, model %d", i, ten.nodes, want)
		}
		if ten.evictions != m.evictions[i] {
			return fmt.Errorf("tenant %d: evictions %d, model %d", i, ten.evictions, m.evictions[i])
		}
		if t.maxNodes > 0 && ten.nodes > t.maxNodes {
			return fmt.Errorf("tenant %d: %d nodes above the ceiling %d", i, ten.nodes, t.maxNodes)
		}
	}
	return nil
}

func pathOf(v *node) string {
	s := ""
	for ; v != nil; v = v.parent {
		s = v.label + s
	}
	return s
}

// checkMatch compares Match with the model for s.
func checkMatch(t *Tree, m *model, s string) error {
	lens := make([]int, t.Tenants()+1) // one extra: must read 0
	t.Match(s, lens)
	for i := range lens {
		want := 0
		if i < t.Tenants() {
			want = m.match(i, s)
		}
		if lens[i] != want {
			return fmt.Errorf("Match(%q)[%d] = %d, model %d", s, i, lens[i], want)
		}
	}
	return nil
}

// ops decodes a byte string into a sequence of inserts and matches over a
// three-letter alphabet (so prompts share prefixes often) and applies it to
// a tree and the model, checking them against each other after every step.
func runOps(tb testing.TB, data []byte) {
	tb.Helper()
	if len(data) == 0 {
		return
	}
	const tenants = 4
	maxNodes := 0
	if data[0]%4 != 0 {
		maxNodes = 4 + int(data[0])%60
	}
	data = data[1:]
	tr, m := New(tenants, maxNodes), newModel(tenants, maxNodes)
	var recent []string
	for len(data) >= 2 {
		op, n := data[0], 1+int(data[1])%24
		data = data[2:]
		var s []byte
		switch {
		case op&0x40 != 0 && len(recent) > 0: // extend or cut a recent prompt
			s = []byte(recent[int(op)%len(recent)])
			if op&0x80 != 0 {
				s = s[:min(len(s), n)]
			}
		}
		for ; n > 0 && len(data) > 0 && len(s) < 64; n-- {
			s = append(s, "abc"[data[0]%3])
			data = data[1:]
		}
		str := string(s)
		tenant := int(op) % tenants
		if op&0x20 != 0 {
			if err := checkMatch(tr, m, str); err != nil {
				tb.Fatal(err)
			}
			continue
		}
		tr.Insert(tenant, str)
		m.insert(tenant, str)
		if str != "" {
			recent = append(recent, str)
		}
		if err := check(tr, m); err != nil {
			tb.Fatalf("after Insert(%d, %q): %v", tenant, str, err)
		}
		if err := checkMatch(tr, m, str); err != nil {
			tb.Fatal(err)
		}
	}
}

func FuzzTree(f *testing.F) {
	f.Add([]byte{0, 0, 5, 0, 1, 2, 1, 5, 0, 1, 1})
	f.Add([]byte{1, 0, 30, 0, 0, 0, 0, 1, 1, 30, 0, 0, 0, 2, 0x41, 4, 2, 0x21, 9, 0, 0, 0, 1})
	f.Add([]byte("\x07\x00\x18abcabcabcabcabcabcabcabc\x01\x18abcabcabcabcabcabcabcaaa\xc2\x05ccc\x22\x10abcabcabcabcabca"))
	f.Fuzz(func(t *testing.T, data []byte) { runOps(t, data) })
}

// TestTreeMatchesModel runs long random operation sequences through runOps
// so that a plain `go test` covers far more than the fuzz seeds.
func TestTreeMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	trials := 400
	if testing.Short() {
		trials = 50
	}
	for trial := range trials {
		data := make([]byte, 200+rng.IntN(1200))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		data[0] = byte(trial)
		runOps(t, data)
	}
}

func TestCommonPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 3000 {
		n := rng.IntN(300)
		a := make([]byte, n)
		for i := range a {
			a[i] = byte('a' + rng.IntN(2))
		}
		b := slices.Clone(a)
		if trial%3 != 0 && n > 0 {
			k := rng.IntN(n)
			b[k] ^= 0x20
		}
		if trial%5 == 0 {
			b = b[:rng.IntN(len(b)+1)]
		}
		if got, want := commonPrefix(string(a), string(b)), lcp(string(a), string(b)); got != want {
			t.Fatalf("commonPrefix(%q, %q) = %d, want %d", a, b, got, want)
		}
	}
}
