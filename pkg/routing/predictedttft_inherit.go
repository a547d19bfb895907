package routing

// What predicted_ttft keeps when its route's targets change.
//
// A reload that adds or removes a target (an autoscaler's new replica, a
// drained one) builds a new balancer: the targets' indexes change meaning.
// (So does one that changes what the balancer reads of the providers when
// it is built: their KV capacity, engine-load table, KV identity model.)
// Built from nothing, it routed on the unit law and an empty index until
// it had learned the fleet again: every conversation lost its replica, and
// the cold start's spread scattered prefixes the replicas still held. What
// belongs to the engines and not to the set of targets is kept: the law
// (and the batch term's), the text/token ratios, how long a target may
// take to answer, how long a request holds its slot; and per kept target
// what it holds (its approximate index, in LRU order and with its ages),
// its batch limit, the new prefixes it was sent, and what its engine's
// counts usually show beyond this balancer's. The rates, queues and peers'
// reports are of the moment and start afresh, as after a restart.

// Inherit implements [Inheritor].
func (t *predictedTTFT) Inherit(old Balancer, from []int) bool {
	o, ok := old.(*predictedTTFT)
	if !ok || o == t {
		return false
	}
	src := t.fromOf(from, o.n)
	t.index = o.index.Remap(src, func() int64 { return int64(t.now()) })
	t.refreshCapacity()

	o.fitMu.Lock()
	t.pooled = o.pooled
	o.fitMu.Unlock()
	t.fleet.Store(o.fleet.Load())
	o.batch.mu.Lock()
	t.batch.fit = o.batch.fit
	o.batch.mu.Unlock()
	t.batch.law.Store(o.batch.law.Load())

	o.ratioMu.Lock()
	t.bytesSeen, t.indexedSeen, t.tokensSeen = o.bytesSeen, o.indexedSeen, o.tokensSeen
	o.ratioMu.Unlock()
	t.bytesPerToken.Store(o.bytesPerToken.Load())
	t.indexedPerToken.Store(o.indexedPerToken.Load())

	t.longFirst.cur.Store(max(o.longFirst.cur.Load(), o.longFirst.prev.Load()))
	t.longWhole.cur.Store(max(o.longWhole.cur.Load(), o.longWhole.prev.Load()))
	// The slot hold's sums (slotHold), whole: the new balancer reads them
	// over all of them until its own rates' window forms, and the counts
	// its metrics export as counters go on from the old one's.
	t.doneSum.Store(o.doneSum.Load())
	t.doneN.Store(o.doneN.Load())
	t.firstSum.Store(o.firstSum.Load())
	t.firstN.Store(o.firstN.Load())
	t.freeSum.Store(o.freeSum.Load())
	t.freeN.Store(o.freeN.Load())
	t.wholeN.Store(o.wholeN.Load())
	for k := range t.decisions { // exported as counters too
		t.decisions[k].Store(o.decisions[k].Load())
	}
	b := o.means()
	t.returns = o.returns
	t.anySlots.Store(o.anySlots.Load())

	for j, i := range src {
		if i < 0 {
			continue
		}
		t.maxRunning[j].Store(o.maxRunning[i].Load())
		t.seenFull[j].Store(o.seenFull[i].Load())
		newSince := o.newPrefixes[i].Load() // over the old balancer's window, as fewestNew reads them
		if i < len(b.newPrefixesAt) {
			newSince -= b.newPrefixesAt[i]
		}
		t.newPrefixes[j].Store(newSince)
		t.waitExcess[j].Store(o.waitExcess[i].Load())
		t.slotExcess[j].Store(o.slotExcess[i].Load())
		t.runExcess[j].Store(o.runExcess[i].Load())
	}
	return true
}

// fromOf returns from cut or padded to this balancer's targets, each entry
// -1 unless it names one of old's n targets not named before.
func (t *predictedTTFT) fromOf(from []int, n int) []int {
	out := make([]int, t.n)
	taken := make([]bool, n)
	for j := range out {
		out[j] = -1
		if j < len(from) && from[j] >= 0 && from[j] < n && !taken[from[j]] {
			out[j], taken[from[j]] = from[j], true
		}
	}
	return out
}

var _ Inheritor = (*predictedTTFT)(nil)
