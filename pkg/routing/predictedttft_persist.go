package routing

import (
	"encoding/binary"
	"fmt"

	"rolter.dev/pkg/chunkindex"
	"rolter.dev/pkg/wire"
)

// What predicted_ttft keeps across a restart of its proxy.
//
// Built from nothing, a restarted proxy's balancer routes on the unit law
// and an empty approximate index: without KV events every conversation
// loses its replica and is prefilled again, as after a reload that changed
// the route's targets before balancers inherited (predictedttft_inherit.go).
// The proxy writes each balancer's ttftMemory to disk now and then and at
// shutdown (AppendState), and the balancer built at the next start reads it
// back (RestoreState): what a reload keeps, less what the metrics export as
// counters (a restarted process's counters start at zero) and the sums and
// new-prefix counts read over the rates' window (they start afresh with
// it). Ages (the index's stamps, the return log's) are written as ages: the
// time the proxy was down is not counted.
//
// The binary form: integers are varints, floats 8 bytes little-endian, a
// bool one byte:
//
//	"rpt" 1                 magic and version
//	n                       targets
//	law fit                 xx (row by row), xy, yy, mass (floats), n
//	fleet law               present, [w (floats), samples]
//	batch fit               mass x y xx xy yy (floats), n
//	batch law               present, [slope]
//	ratios                  bytes, indexed, tokens seen; bytes per token, indexed per token (floats)
//	longest                 first token, whole answer (ns)
//	slots                   the most running at any full target
//	n × target              max running, seen full, wait, slot and running excess (floats)
//	return log              returns × (ns), requests × (extended), prompts × (hash (8 bytes), age (ns))
//	index                   length, chunkindex's binary form
const ttftStateMagic = "rpt\x01"

// AppendState implements [StateKeeper].
func (t *predictedTTFT) AppendState(dst []byte) ([]byte, error) {
	m := t.memory()
	dst = append(dst, ttftStateMagic...)
	dst = binary.AppendUvarint(dst, uint64(m.n))
	for r := range lawFeatures {
		for c := range lawFeatures {
			dst = wire.AppendFloat64(dst, m.pooled.xx[r][c])
		}
	}
	for _, v := range m.pooled.xy {
		dst = wire.AppendFloat64(dst, v)
	}
	dst = wire.AppendFloat64(dst, m.pooled.yy)
	dst = wire.AppendFloat64(dst, m.pooled.mass)
	dst = binary.AppendUvarint(dst, uint64(m.pooled.n))
	dst = wire.AppendBool(dst, m.fleet != nil)
	if m.fleet != nil {
		for _, v := range m.fleet.w {
			dst = wire.AppendFloat64(dst, v)
		}
		dst = binary.AppendUvarint(dst, uint64(m.fleet.samples))
	}
	f := &m.batchFit
	for _, v := range []float64{f.mass, f.x, f.y, f.xx, f.xy, f.yy} {
		dst = wire.AppendFloat64(dst, v)
	}
	dst = binary.AppendUvarint(dst, uint64(f.n))
	dst = wire.AppendBool(dst, m.batchLaw != nil)
	if m.batchLaw != nil {
		dst = wire.AppendFloat64(dst, m.batchLaw.slope)
	}
	for _, v := range []float64{m.bytesSeen, m.indexedSeen, m.tokensSeen} {
		dst = wire.AppendFloat64(dst, v)
	}
	dst = binary.LittleEndian.AppendUint64(dst, m.bytesPerToken)
	dst = binary.LittleEndian.AppendUint64(dst, m.indexedPerToken)
	dst = binary.AppendUvarint(dst, uint64(max(m.longFirst, 0)))
	dst = binary.AppendUvarint(dst, uint64(max(m.longWhole, 0)))
	dst = binary.AppendUvarint(dst, uint64(max(m.anySlots, 0)))
	for i := range m.n {
		dst = binary.AppendUvarint(dst, uint64(max(m.maxRunning[i], 0)))
		dst = wire.AppendBool(dst, m.seenFull[i])
		for _, v := range []uint64{m.waitExcess[i], m.slotExcess[i], m.runExcess[i]} {
			dst = binary.LittleEndian.AppendUint64(dst, v)
		}
	}
	dst = m.returns.appendBinary(dst, int64(t.now()))
	idx, err := m.index.AppendBinary(nil)
	if err != nil {
		return nil, err
	}
	return wire.AppendBytes(dst, idx), nil
}

// RestoreState implements [StateKeeper].
func (t *predictedTTFT) RestoreState(state []byte, from []int) error {
	r := wire.NewReader(state)
	r.Magic(ttftStateMagic)
	m := &ttftMemory{n: r.Count("targets", MaxTargets)}
	for i := range lawFeatures {
		for c := range lawFeatures {
			m.pooled.xx[i][c] = r.Float64("law fit")
		}
	}
	for i := range m.pooled.xy {
		m.pooled.xy[i] = r.Float64("law fit")
	}
	m.pooled.yy, m.pooled.mass = r.Float64("law fit"), r.Float64("law fit")
	m.pooled.n = r.Count("law samples", maxSamples)
	if r.Bool("law fitted") {
		m.fleet = &ttftLaw{}
		for i := range m.fleet.w {
			m.fleet.w[i] = r.Float64("law")
		}
		m.fleet.samples = r.Count("law samples", maxSamples)
	}
	f := &m.batchFit
	for _, v := range []*float64{&f.mass, &f.x, &f.y, &f.xx, &f.xy, &f.yy} {
		*v = r.Float64("batch fit")
	}
	f.n = r.Count("batch samples", maxSamples)
	if r.Bool("batch law") {
		m.batchLaw = &batchLaw{slope: r.Float64("batch slope")}
		if m.batchLaw.slope < 0 {
			r.Fail("batch slope %v below 0", m.batchLaw.slope)
		}
	}
	m.bytesSeen, m.indexedSeen, m.tokensSeen = r.Float64("bytes seen"), r.Float64("indexed seen"), r.Float64("tokens seen")
	m.bytesPerToken, m.indexedPerToken = floatBits(r, "bytes per token"), floatBits(r, "indexed per token")
	m.longFirst, m.longWhole = int64(r.Count("longest first token", maxNanos)), int64(r.Count("longest answer", maxNanos))
	m.anySlots = int64(r.Count("batch slots", maxSlots))
	m.maxRunning, m.seenFull = make([]int64, m.n), make([]bool, m.n)
	m.waitExcess, m.slotExcess, m.runExcess = make([]uint64, m.n), make([]uint64, m.n), make([]uint64, m.n)
	for i := range m.n {
		m.maxRunning[i] = int64(r.Count("batch limit", maxSlots))
		m.seenFull[i] = r.Bool("seen full")
		m.waitExcess[i], m.slotExcess[i], m.runExcess[i] = floatBits(r, "waiting excess"), floatBits(r, "slot excess"), floatBits(r, "running excess")
	}
	now := int64(t.now())
	m.returns = readReturnLog(r, now)
	idx := r.Bytes("index", r.Len())
	if err := r.Done(); err != nil {
		return fmt.Errorf("predicted_ttft state: %w", err)
	}
	index, err := chunkindex.Decode(idx, func() int64 { return int64(t.now()) })
	if err != nil {
		return fmt.Errorf("predicted_ttft state: %w", err)
	}
	if index.Targets() != m.n {
		return fmt.Errorf("predicted_ttft state: %w: an index of %d targets for %d", wire.ErrCorrupt, index.Targets(), m.n)
	}
	m.index = index
	t.adopt(m, t.fromOf(from, m.n), true)
	return nil
}

// Bounds on what a state may hold: samples (a law forgets beyond
// lawMemory, so counts far beyond any fleet's life are corrupt), a
// duration (about 292 years), batch slots.
const (
	maxSamples = 1 << 50
	maxNanos   = 1<<63 - 1
	maxSlots   = 1 << 20
)

// floatBits reads a finite float64 and returns its bits (the atomics'
// form).
func floatBits(r *wire.Reader, what string) uint64 {
	return binary.LittleEndian.Uint64(wire.AppendFloat64(nil, r.Float64(what)))
}

// appendBinary appends the log's binary form (see predictedttft_persist.go)
// with the prompts' ages at now.
func (l *returnLog) appendBinary(dst []byte, now int64) []byte {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := min(l.ringN, rateWindow)
	dst = binary.AppendUvarint(dst, uint64(n))
	for k := range n { // oldest first
		dst = binary.AppendUvarint(dst, uint64(max(l.ring[(l.ringN-n+k)%rateWindow], 0)))
	}
	n = min(l.requestsN, rateWindow)
	dst = binary.AppendUvarint(dst, uint64(n))
	for k := range n {
		dst = wire.AppendBool(dst, l.extends[(l.requestsN-n+k)%rateWindow])
	}
	dst = binary.AppendUvarint(dst, uint64(l.order.Len()))
	for _, p := range l.order.All() {
		dst = binary.LittleEndian.AppendUint64(dst, p.hash)
		dst = binary.AppendUvarint(dst, uint64(max(now-p.at, 0)))
	}
	return dst
}

// readReturnLog reads a log appendBinary wrote, its prompts' stamps now
// less their ages.
func readReturnLog(r *wire.Reader, now int64) *returnLog {
	l := newReturnLog()
	for range r.Items("returns", 1, rateWindow) {
		l.addReturn(int64(r.Count("return time", maxNanos)))
	}
	for range r.Items("requests", 1, rateWindow) {
		ext := r.Bool("extended")
		l.extends[l.requestsN] = ext
		if ext {
			l.extended++
		}
		l.requestsN++
	}
	for range r.Items("prompts", 9, returnMemory) {
		h, age := r.Uint64("prompt"), r.Count("prompt age", maxNanos)
		if r.Err() != nil {
			break
		}
		if _, dup := l.slots[h]; dup {
			r.Fail("prompt %#x twice", h)
			break
		}
		l.touchLocked(h, now-int64(age))
	}
	return l
}

var _ StateKeeper = (*predictedTTFT)(nil)
