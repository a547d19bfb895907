package prefixtree

import (
	"bytes"
	"strings"
	"sync"

	"rolter.dev/pkg/lrulist"
)

// DefaultMaxNodes is the per-tenant ceiling, in byte nodes, that callers use
// when they have no better figure (the reference trie's 1,000,000).
const DefaultMaxNodes = 1_000_000

// MaxTenants is the largest number of tenants a Tree can have.
const MaxTenants = 1 << 16

// Stats describes what one tenant holds.
type Stats struct {
	// Nodes is the tenant's size in byte nodes (see the package doc).
	Nodes int
	// Prompts is the number of the tenant's resident prompts.
	Prompts int
	// Evictions counts the prompts evicted from the tenant over the tree's
	// life.
	Evictions uint64
}

// Size describes the shape of a whole tree.
type Size struct {
	// Nodes is the number of radix nodes below the root.
	Nodes int
	// Bytes is the total length of their labels, which is also the number
	// of byte nodes of the union of all tenants.
	Bytes int
}

// Tree is a multi-tenant compressed radix tree of prompts with a per-tenant
// node ceiling. It is safe for concurrent use; see the package doc.
type Tree struct {
	mu       sync.RWMutex
	root     node
	tenants  []tenant
	maxNodes int
	size     Size
}

// node is one radix node. The root has an empty label and no refs.
type node struct {
	label    string  // the edge from the parent; owns its bytes
	parent   *node   // nil for the root
	keys     []byte  // keys[i] == children[i].label[0]
	children []*node // unordered
	refs     []ref   // one per tenant that holds the node
}

// ref is one tenant's hold on a node.
type ref struct {
	tenant uint16
	entry  int32  // the tenant's LRU entry of the prompt ending here, or -1
	count  uint32 // the tenant's resident prompts that pass through the node
}

// tenant is one tenant's bookkeeping: its size and an LRU list of its
// resident prompts, each the node it ends at (no allocation per prompt once
// the list has grown).
type tenant struct {
	nodes     int
	prompts   int
	evictions uint64
	lru       lrulist.List[*node]
}

// New returns an empty tree for tenants tenants (clamped to [0, MaxTenants])
// that holds at most maxNodes byte nodes per tenant; maxNodes <= 0 means
// unbounded.
func New(tenants, maxNodes int) *Tree {
	tenants = min(max(tenants, 0), MaxTenants)
	t := &Tree{tenants: make([]tenant, tenants), maxNodes: max(maxNodes, 0)}
	return t
}

// Tenants returns the number of tenants.
func (t *Tree) Tenants() int { return len(t.tenants) }

// MaxNodes returns the per-tenant ceiling (0 = unbounded).
func (t *Tree) MaxNodes() int { return t.maxNodes }

// Match sets lens[i], for every tenant i < len(lens), to the number of
// leading bytes of s that tenant i holds (0 for tenants at or above
// Tenants()). It takes the read lock and does not allocate.
func (t *Tree) Match(s string, lens []int) {
	clear(lens)
	if s == "" {
		return
	}
	t.mu.RLock()
	v, depth := &t.root, 0
	for depth < len(s) {
		i := bytes.IndexByte(v.keys, s[depth])
		if i < 0 {
			break
		}
		c := v.children[i]
		k := commonPrefix(c.label, s[depth:])
		depth += k
		for _, r := range c.refs {
			if int(r.tenant) < len(lens) {
				lens[r.tenant] = depth
			}
		}
		if k < len(c.label) {
			break
		}
		v = c
	}
	t.mu.RUnlock()
}

// Insert records that tenant served s. If s is resident for the tenant its
// age is refreshed; otherwise it is added and the tenant's oldest prompts are
// evicted while the tenant is above the ceiling. An empty s or a tenant out of
// range is ignored. It takes the write lock.
func (t *Tree) Insert(tenant int, s string) {
	if tenant < 0 || tenant >= len(t.tenants) || s == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ten := &t.tenants[tenant]
	end := t.place(s)
	if r := end.ref(tenant); r != nil && r.entry >= 0 {
		ten.lru.Touch(r.entry)
		return
	}
	for v := end; v != &t.root; v = v.parent {
		if r := v.ref(tenant); r != nil {
			r.count++
			continue
		}
		v.refs = append(v.refs, ref{tenant: uint16(tenant), entry: -1, count: 1})
		ten.nodes += len(v.label)
	}
	end.ref(tenant).entry = ten.lru.PushNewest(end)
	ten.prompts++
	for t.maxNodes > 0 && ten.nodes > t.maxNodes && ten.lru.Len() > 0 {
		t.evictOldest(tenant)
	}
}

// Trim evicts tenant's oldest prompts while the tenant holds more than
// maxNodes byte nodes: an eviction pass run on a timer, for a tree that is
// allowed to exceed its size between passes (New with maxNodes <= 0). A
// tenant out of range or maxNodes < 0 is ignored. It takes the write lock.
func (t *Tree) Trim(tenant, maxNodes int) {
	if tenant < 0 || tenant >= len(t.tenants) || maxNodes < 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ten := &t.tenants[tenant]
	for ten.nodes > maxNodes && ten.lru.Len() > 0 {
		t.evictOldest(tenant)
	}
}

// Stats returns what tenant holds (the zero Stats for a tenant out of
// range). It takes the read lock.
func (t *Tree) Stats(tenant int) Stats {
	if tenant < 0 || tenant >= len(t.tenants) {
		return Stats{}
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	ten := &t.tenants[tenant]
	return Stats{Nodes: ten.nodes, Prompts: ten.prompts, Evictions: ten.evictions}
}

// AppendStats appends every tenant's Stats, in tenant order, to dst under one
// read lock.
func (t *Tree) AppendStats(dst []Stats) []Stats {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for i := range t.tenants {
		ten := &t.tenants[i]
		dst = append(dst, Stats{Nodes: ten.nodes, Prompts: ten.prompts, Evictions: ten.evictions})
	}
	return dst
}

// Size returns the shape of the whole tree.
func (t *Tree) Size() Size {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.size
}

// place returns the node at which s ends, creating a leaf or splitting an edge
// as needed. Nodes it creates hold no tenant yet (a split copies the tenants
// of the node it splits). s must not be empty.
func (t *Tree) place(s string) *node {
	v, depth := &t.root, 0
	for {
		i := bytes.IndexByte(v.keys, s[depth])
		if i < 0 {
			leaf := &node{label: strings.Clone(s[depth:]), parent: v}
			v.keys = append(v.keys, leaf.label[0])
			v.children = append(v.children, leaf)
			t.size.Nodes++
			t.size.Bytes += len(leaf.label)
			return leaf
		}
		c := v.children[i]
		k := commonPrefix(c.label, s[depth:])
		if k < len(c.label) {
			c = t.split(v, i, k)
		}
		depth += k
		if depth == len(s) {
			return c
		}
		v = c
	}
}

// split cuts the edge to v.children[i] after its first k bytes (0 < k <
// len(label)) and returns the new upper node. The lower node keeps its
// identity, so LRU entries that point at it stay valid.
func (t *Tree) split(v *node, i, k int) *node {
	c := v.children[i]
	up := &node{
		label:    strings.Clone(c.label[:k]),
		parent:   v,
		keys:     []byte{c.label[k]},
		children: []*node{c},
		refs:     make([]ref, len(c.refs)),
	}
	for j, r := range c.refs {
		up.refs[j] = ref{tenant: r.tenant, entry: -1, count: r.count}
	}
	c.label = strings.Clone(c.label[k:])
	c.parent = up
	v.children[i] = up
	t.size.Nodes++
	return up
}

// evictOldest evicts tenant's least recently inserted or touched prompt.
func (t *Tree) evictOldest(tenant int) {
	ten := &t.tenants[tenant]
	e, _ := ten.lru.Oldest()
	end := *ten.lru.At(e)
	ten.lru.Remove(e)
	ten.prompts--
	ten.evictions++
	end.ref(tenant).entry = -1

	var cut *node // the parent of the highest node removed from the tree
	for v := end; v != &t.root; {
		p := v.parent
		r := v.ref(tenant)
		if r.count--; r.count == 0 {
			v.dropRef(tenant)
			ten.nodes -= len(v.label)
			if len(v.refs) == 0 { // no tenant holds v, so neither its children
				p.removeChild(v)
				t.size.Nodes--
				t.size.Bytes -= len(v.label)
				cut = p
			}
		}
		v = p
	}
	// Only two nodes can have lost compression: the end node, if it is still
	// in the tree (it no longer ends this prompt), or else the node that lost
	// a child. A removed node has a nil parent, which mergeIfChain skips.
	t.mergeIfChain(end)
	if cut != nil {
		t.mergeIfChain(cut)
	}
}

// mergeIfChain merges v into its only child when v is not the root, ends no
// prompt and has exactly one child. Every prompt through v then goes through
// the child, so the child's refs are v's, and the child keeps its identity.
func (t *Tree) mergeIfChain(v *node) {
	if v.parent == nil || len(v.children) != 1 {
		return
	}
	for _, r := range v.refs {
		if r.entry >= 0 {
			return
		}
	}
	c, p := v.children[0], v.parent
	c.label = v.label + c.label
	c.parent = p
	p.children[bytes.IndexByte(p.keys, v.label[0])] = c
	v.parent, v.children, v.keys, v.refs = nil, nil, nil, nil
	t.size.Nodes--
}

// ref returns tenant's ref on v, or nil.
func (v *node) ref(tenant int) *ref {
	for i := range v.refs {
		if int(v.refs[i].tenant) == tenant {
			return &v.refs[i]
		}
	}
	return nil
}

// dropRef removes tenant's ref from v.
func (v *node) dropRef(tenant int) {
	for i := range v.refs {
		if int(v.refs[i].tenant) == tenant {
			last := len(v.refs) - 1
			v.refs[i] = v.refs[last]
			v.refs = v.refs[:last]
			return
		}
	}
}

// removeChild detaches c from v and clears c's parent.
func (v *node) removeChild(c *node) {
	i := bytes.IndexByte(v.keys, c.label[0])
	last := len(v.children) - 1
	v.keys[i], v.children[i] = v.keys[last], v.children[last]
	v.children[last] = nil
	v.keys, v.children = v.keys[:last], v.children[:last]
	c.parent = nil
}

// commonPrefix returns the length of the longest common prefix of a and b.
// The whole-length comparison and the bisection both run on the runtime's
// vectorised string equality, so a long match costs about one pass over it.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	a, b = a[:n], b[:n]
	if a == b {
		return n
	}
	// a[:lo] == b[:lo] and a[:hi] != b[:hi].
	lo, hi := 0, n
	for hi-lo > 16 {
		mid := lo + (hi-lo)/2
		if a[lo:mid] == b[lo:mid] {
			lo = mid
		} else {
			hi = mid
		}
	}
	for a[lo] == b[lo] {
		lo++
	}
	return lo
}
