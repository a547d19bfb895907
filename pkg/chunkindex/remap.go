package chunkindex

// Remap returns a new index whose target j holds what x's target from[j]
// holds (nothing when from[j] is out of x's range or an earlier j already
// took it), in the same LRU order, with the same stamps, capacities and
// eviction counts, and the forks it knows of the hashes it keeps (see
// SharedLen): the index of a route whose targets changed (a replica added
// or removed) keeps what the others hold. now is the new index's clock
// (nil: none); every stamp moves by the difference between it and x's, so
// Tail's ages carry over. Its other settings (default capacity, tail-first
// eviction) are x's.
//
// x is only read, one target at a time under its read lock, so that the
// balancer still using x waits at most one target's copy (a few
// milliseconds for 62,500 chunks) rather than the whole index's; what x
// learns meanwhile may be missing from the copy.
func (x *Index) Remap(from []int, now func() int64) *Index {
	n := min(len(from), MaxTargets)
	x.mu.RLock()
	y := New(n, x.capacity)
	y.tailFirst, y.now = x.tailFirst, now
	y.holders = make(map[uint64]set, len(x.holders))
	tracks := x.next != nil
	var shift int64
	if x.now != nil && now != nil {
		shift = now() - x.now()
	}
	targets := len(x.targets)
	x.mu.RUnlock()
	if tracks {
		y.next = make(map[uint64]uint64)
	}
	taken := make([]bool, targets)
	var c targetCopy
	for j := range n {
		i := from[j]
		if i < 0 || i >= targets || taken[i] {
			continue
		}
		taken[i] = true
		x.copyTarget(i, tracks, &c)
		dst := &y.targets[j]
		dst.capacity, dst.inserts, dst.evictions = c.capacity, c.inserts, c.evictions
		dst.slots = make(map[uint64]int32, len(c.entries))
		dst.lru.Grow(len(c.entries))
		for _, e := range c.entries {
			if e.at != 0 {
				e.at += shift
			}
			y.hold(j, dst, e)
		}
		for _, p := range c.next {
			y.next[p[0]] = p[1]
		}
	}
	return y
}

// targetCopy is one target's state as Remap copies it.
type targetCopy struct {
	entries            []entry     // oldest first
	next               [][2]uint64 // (hash, successor) of the entries the index knows a successor of
	capacity           int
	inserts, evictions uint64
}

// copyTarget copies target i into c (its slices reused), with the forks
// of its hashes when tracks, under the read lock.
func (x *Index) copyTarget(i int, tracks bool, c *targetCopy) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	t := &x.targets[i]
	c.entries, c.next = c.entries[:0], c.next[:0]
	c.capacity, c.inserts, c.evictions = t.capacity, t.inserts, t.evictions
	for _, en := range t.lru.All() {
		c.entries = append(c.entries, *en)
		if tracks {
			if v, ok := x.next[en.hash]; ok {
				c.next = append(c.next, [2]uint64{en.hash, v})
			}
		}
	}
}
