package routing

import "rolter.dev/pkg/chunkindex"

// What predicted_ttft keeps when its route's targets change.
//
// A reload that adds or removes a target (an autoscaler's new replica, a
// drained one) builds a new balancer: the targets' indexes change meaning.
// (So does one that changes what the balancer reads of the providers when
// it is built: their KV capacity, engine-load table, KV identity model.)
// Built from nothing, it routed on the unit law and an empty index until
// it had learned the fleet again: every conversation lost its replica, and
// the cold start's spread scattered prefixes the replicas still held. What
// belongs to the engines and not to the set of targets is kept (a
// ttftMemory, the same a restart reads back from disk:
// predictedttft_persist.go): the law (and the batch term's), the
// text/token ratios, how long a target may take to answer, the forget
// term's return times; and per kept target what it holds (its approximate
// index, in LRU order and with its ages), its batch limit, and what its
// engine's counts usually show beyond this balancer's. A reload also keeps
// how long a request holds its slot, the new prefixes each target was
// sent, and the counts the metrics export as counters, which go on. The
// rates, queues and peers' reports are of the moment and start afresh, as
// after a restart.

// ttftMemory is what a predicted_ttft balancer hands on (see above), over
// its n targets.
type ttftMemory struct {
	n        int
	pooled   lawFit
	fleet    *ttftLaw // nil: not fitted
	batchFit batchFit
	batchLaw *batchLaw // nil: no slope determined
	// The text/token ratios' sums and values (float64 bits).
	bytesSeen, indexedSeen, tokensSeen float64
	bytesPerToken, indexedPerToken     uint64
	longFirst, longWhole               int64 // ns
	anySlots                           int64
	// Per target.
	maxRunning                        []int64
	seenFull                          []bool
	waitExcess, slotExcess, runExcess []uint64 // float64 bits
	index                             *chunkindex.Index
	returns                           *returnLog
}

// memory reads what t hands on, its index and return log as they are
// (shared, not copied).
func (t *predictedTTFT) memory() *ttftMemory {
	m := &ttftMemory{n: t.n, index: t.index, returns: t.returns}
	t.fitMu.Lock()
	m.pooled = t.pooled
	t.fitMu.Unlock()
	m.fleet = t.fleet.Load()
	t.batch.mu.Lock()
	m.batchFit = t.batch.fit
	t.batch.mu.Unlock()
	m.batchLaw = t.batch.law.Load()
	t.ratioMu.Lock()
	m.bytesSeen, m.indexedSeen, m.tokensSeen = t.bytesSeen, t.indexedSeen, t.tokensSeen
	t.ratioMu.Unlock()
	m.bytesPerToken, m.indexedPerToken = t.bytesPerToken.Load(), t.indexedPerToken.Load()
	m.longFirst = max(t.longFirst.cur.Load(), t.longFirst.prev.Load())
	m.longWhole = max(t.longWhole.cur.Load(), t.longWhole.prev.Load())
	m.anySlots = t.anySlots.Load()
	m.maxRunning = make([]int64, t.n)
	m.seenFull = make([]bool, t.n)
	m.waitExcess, m.slotExcess, m.runExcess = make([]uint64, t.n), make([]uint64, t.n), make([]uint64, t.n)
	for i := range t.n {
		m.maxRunning[i] = t.maxRunning[i].Load()
		m.seenFull[i] = t.seenFull[i].Load()
		m.waitExcess[i], m.slotExcess[i], m.runExcess[i] = t.waitExcess[i].Load(), t.slotExcess[i].Load(), t.runExcess[i].Load()
	}
	return m
}

// adopt takes m into t, which no pick has used yet: src[j] is m's target
// for t's target j (-1: none; see fromOf). m's index is copied (Remap),
// unless owned (t may take it) and on t's clock already with its targets
// in t's order; its return log is shared.
func (t *predictedTTFT) adopt(m *ttftMemory, src []int, owned bool) {
	if owned && identity(src, m.index.Targets()) {
		t.index = m.index
	} else {
		t.index = m.index.Remap(src, func() int64 { return int64(t.now()) })
	}
	for j, i := range src {
		t.capKept[j].Store(i >= 0)
	}
	t.refreshCapacity()
	t.pooled = m.pooled
	t.fleet.Store(m.fleet)
	t.batch.fit = m.batchFit
	t.batch.law.Store(m.batchLaw)
	t.bytesSeen, t.indexedSeen, t.tokensSeen = m.bytesSeen, m.indexedSeen, m.tokensSeen
	t.bytesPerToken.Store(m.bytesPerToken)
	t.indexedPerToken.Store(m.indexedPerToken)
	t.longFirst.cur.Store(m.longFirst)
	t.longWhole.cur.Store(m.longWhole)
	t.returns = m.returns
	t.anySlots.Store(m.anySlots)
	for j, i := range src {
		if i < 0 {
			continue
		}
		t.maxRunning[j].Store(m.maxRunning[i])
		t.seenFull[j].Store(m.seenFull[i])
		t.waitExcess[j].Store(m.waitExcess[i])
		t.slotExcess[j].Store(m.slotExcess[i])
		t.runExcess[j].Store(m.runExcess[i])
	}
}

// Inherit implements [Inheritor].
func (t *predictedTTFT) Inherit(old Balancer, from []int) bool {
	o, ok := old.(*predictedTTFT)
	if !ok || o == t {
		return false
	}
	src := t.fromOf(from, o.n)
	t.adopt(o.memory(), src, false)

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
	for j, i := range src {
		if i < 0 {
			continue
		}
		newSince := o.newPrefixes[i].Load() // over the old balancer's window, as fewestNew reads them
		if i < len(b.newPrefixesAt) {
			newSince -= b.newPrefixesAt[i]
		}
		t.newPrefixes[j].Store(newSince)
	}
	return true
}

// identity reports whether src maps each of n targets to itself.
func identity(src []int, n int) bool {
	if len(src) != n {
		return false
	}
	for j, i := range src {
		if i != j {
			return false
		}
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
