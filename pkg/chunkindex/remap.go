package chunkindex

// Remap returns a new index whose target j holds what x's target from[j]
// holds (nothing when from[j] is out of x's range or an earlier j already
// took it), in the same LRU order, with the same stamps, capacities and
// eviction counts, and the forks it knows of the hashes it keeps (see
// SharedLen): the index of a route whose targets changed (a replica added
// or removed) keeps what the others hold. now is the new index's clock
// (nil: none); every stamp moves by the difference between it and x's, so
// Tail's ages carry over. Its other settings (default capacity, tail-first
// eviction) are x's. x is only read.
func (x *Index) Remap(from []int, now func() int64) *Index {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := min(len(from), MaxTargets)
	y := New(n, x.capacity)
	y.tailFirst, y.now = x.tailFirst, now
	var shift int64
	if x.now != nil && now != nil {
		shift = now() - x.now()
	}
	taken := make([]bool, len(x.targets))
	for j := range n {
		i := from[j]
		if i < 0 || i >= len(x.targets) || taken[i] {
			continue
		}
		taken[i] = true
		src, dst := &x.targets[i], &y.targets[j]
		dst.capacity, dst.inserts, dst.evictions = src.capacity, src.inserts, src.evictions
		for _, en := range src.lru.All() {
			e := *en
			if e.at != 0 {
				e.at += shift
			}
			dst.slots[e.hash] = dst.lru.PushNewest(e)
			hs := y.holders[e.hash]
			hs.add(j)
			y.holders[e.hash] = hs
		}
	}
	if x.next != nil {
		y.next = make(map[uint64]uint64)
		for h, v := range x.next {
			if _, ok := y.holders[h]; ok {
				y.next[h] = v
			}
		}
	}
	return y
}
