package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"rolter.dev/kvwatcher/internal/kvstate"
	"rolter.dev/kvwatcher/internal/zmtp"
	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/kvevents"
)

// snapshotQueue bounds the snapshot requests waiting for a provider's
// goroutine; more are dropped (the requester retries).
const snapshotQueue = 16

// errHistoryLost aborts a gap replay whose first message is later than the
// first one missing: the replica no longer buffers it.
var errHistoryLost = errors.New("replay: history lost")

// worker is one provider's goroutine and its state. Every field below the
// channels is owned by run's goroutine.
type worker struct {
	w       *Watcher
	spec    Provider
	name    string
	log     *slog.Logger
	subject string

	stream chan streamEvent // from the socket side; buffered opts.Queue, never closed
	snaps  chan string      // reply subjects of snapshot requests; buffered snapshotQueue, never closed
	lm     chan lmResult    // from the LMCache poller; buffered 1, never closed

	ctx   context.Context
	state *kvstate.Ranks // nil without KV
	ranks []*rankStream  // one per data-parallel rank; nil without KV
	dec   *kvevents.Decoder
	rdec  *kvevents.Decoder // replays: a live batch stays valid across one
	seq   uint64            // last delta published

	lastEvent time.Time

	lmAt      time.Time
	occupancy float64
	available bool

	buf   []byte
	idbuf []uint64
	split []kvdelta.Op
	hot   hotMetrics
	span  trace.Span      // the batch being applied, if any
	tctx  context.Context // the replay's context while one runs (parent of its batches' spans)
}

// rankStream is the sequence state of one data-parallel rank's event
// stream: vLLM numbers each rank's batches on its own from 0.
type rankStream struct {
	rank   int
	replay string // the rank's replay endpoint; empty for none

	src       uint64 // the connection of the current stream; 0 before any
	connected bool
	haveSeq   bool   // last holds the stream's last sequence
	last      uint64 // last sequence applied
	desynced  bool   // an unrepaired gap: neutral until AllBlocksCleared

	// A replay applied the live messages dupLo..dupHi of connection dupSrc
	// ahead of them; they are skipped when they arrive.
	dupSrc, dupLo, dupHi uint64
}

// hotMetrics are the per-batch counters, resolved once per provider.
type hotMetrics struct {
	liveBatches, replayBatches  prometheus.Counter
	stored, removed, cleared    prometheus.Counter
	deltas, statuses            prometheus.Counter
	storedBlocks, removedBlocks prometheus.Counter
}

func newWorker(w *Watcher, p Provider, seq uint64) *worker {
	k := &worker{
		w: w, spec: p, name: p.Name, seq: seq,
		log:     w.log.With("provider", p.Name),
		subject: kvdelta.Subject(p.Name),
		stream:  make(chan streamEvent, w.opts.Queue),
		snaps:   make(chan string, snapshotQueue),
		lm:      make(chan lmResult, 1),
		dec:     kvevents.NewDecoder(),
		rdec:    kvevents.NewDecoder(),
	}
	if kv := p.KV; kv != nil {
		k.state = kvstate.NewRanks(kv.Model, kv.MaxBlocks, kv.Ranks())
		for r := range kv.Ranks() {
			_, replay, _ := kv.RankEndpoints(r) // validated
			k.ranks = append(k.ranks, &rankStream{rank: r, replay: replay})
		}
	}
	m, n := w.metrics, p.Name
	k.hot = hotMetrics{
		liveBatches: m.Batches.WithLabelValues(n, "live"), replayBatches: m.Batches.WithLabelValues(n, "replay"),
		stored: m.Events.WithLabelValues(n, "block_stored"), removed: m.Events.WithLabelValues(n, "block_removed"),
		cleared: m.Events.WithLabelValues(n, "all_blocks_cleared"),
		deltas:  m.Published.WithLabelValues(n, kvdelta.TypeDelta.String()), statuses: m.Published.WithLabelValues(n, kvdelta.TypeStatus.String()),
		storedBlocks: m.PublishedBlocks.WithLabelValues(n, kvdelta.OpStored.String()), removedBlocks: m.PublishedBlocks.WithLabelValues(n, kvdelta.OpRemoved.String()),
	}
	return k
}

// run serves the provider until ctx ends, then publishes a clear and a
// not-synced status and waits for its goroutines.
func (k *worker) run(ctx context.Context) {
	k.ctx = ctx
	var wg sync.WaitGroup
	defer wg.Wait()
	sub, err := k.w.opts.NATS.Subscribe(kvdelta.SnapshotSubject(k.name), k.onSnapshotRequest)
	if err != nil {
		k.log.Error("cannot subscribe to snapshot requests", "err", err)
	} else {
		defer func() { _ = sub.Unsubscribe() }()
	}
	if kv := k.spec.KV; kv != nil && kv.Mode == ModeConnect {
		for r := range kv.Ranks() {
			ep, _, _ := kv.RankEndpoints(r) // validated
			wg.Go(func() { k.dial(ctx, r, ep) })
		}
	}
	if k.spec.LM != nil {
		wg.Go(func() { k.poll(ctx) })
	}
	k.publishStatus()
	hb := time.NewTicker(k.w.opts.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-ctx.Done():
			for _, rs := range k.ranks {
				rs.connected = false
			}
			if k.state != nil {
				k.clear(kvdelta.ReasonConfig)
			}
			k.publishStatus()
			return
		case ev := <-k.stream:
			k.handle(ev)
		case reply := <-k.snaps:
			k.serveSnapshot(reply)
		case res := <-k.lm:
			k.lmAt, k.occupancy, k.available = res.at, res.occupancy, res.available
			k.publishStatus()
		case <-hb.C:
			k.publishStatus()
		}
	}
}

func (k *worker) handle(ev streamEvent) {
	switch ev.kind {
	case evConnected:
		rs := k.ranks[ev.rank]
		k.startStream(rs, ev.src)
		if rs.replay != "" {
			k.catchUp(rs, ev.src)
		}
		k.publishStatus()
	case evDisconnected:
		// In bind mode a connection's rank is the one its batches named:
		// find the stream by its connection.
		for _, rs := range k.ranks {
			if rs.src != ev.src || !rs.connected {
				continue
			}
			rs.connected = false
			k.w.metrics.StreamFailures.WithLabelValues(k.name, "disconnect").Inc()
			k.log.Info("kv events: stream ended; clearing", "rank", rs.rank, "err", ev.err)
			k.clearRank(rs, kvdelta.ReasonReconnect)
		}
	case evMessage:
		k.message(ev.src, ev.rank, ev.frames)
	}
}

// startStream begins a new stream of rank rs from connection src: its
// first sequence is a baseline. A previous stream of the rank that is still
// up (bind mode: another connection took the topic) is cleared.
func (k *worker) startStream(rs *rankStream, src uint64) {
	if rs.connected && rs.src != 0 && rs.src != src {
		k.w.metrics.StreamFailures.WithLabelValues(k.name, "disconnect").Inc()
		k.log.Info("kv events: a new connection took over the topic; clearing", "rank", rs.rank)
		k.clearRank(rs, kvdelta.ReasonReconnect)
	}
	rs.src, rs.connected, rs.haveSeq, rs.desynced = src, true, false, false
}

// batch is a live message's payload, decoded before its sequence is
// handled (bind mode needs its rank).
type batch struct {
	b   *kvevents.Batch
	err error
}

// message handles one live message from connection src of rank's endpoint.
func (k *worker) message(src uint64, rank int, frames [][]byte) {
	msg, err := kvevents.ParseMessage(frames)
	if err != nil {
		k.w.metrics.Malformed.WithLabelValues(k.name, "frames").Inc()
		k.log.Debug("kv events: malformed message", "err", err)
		return
	}
	var live batch
	live.b, live.err = k.dec.Decode(msg.Payload)
	if k.spec.KV.Mode == ModeBind && len(k.ranks) > 1 && live.err == nil && live.b.DataParallelRank.Valid {
		// Bound endpoints are shared: the batch says which rank sent it.
		r := live.b.DataParallelRank.V
		if r < 0 || r >= int64(len(k.ranks)) {
			k.w.metrics.Malformed.WithLabelValues(k.name, "rank").Inc()
			k.log.Debug("kv events: data_parallel_rank out of range", "rank", r, "ranks", len(k.ranks))
			return
		}
		rank = int(r)
	}
	rs := k.ranks[rank]
	if src != rs.src || !rs.connected {
		k.startStream(rs, src)
	}
	if src == rs.dupSrc && msg.Seq >= rs.dupLo && msg.Seq <= rs.dupHi {
		return // a replay applied it already
	}
	switch {
	case !rs.haveSeq:
		k.baseline(rs, src, msg.Seq, live)
		return
	case msg.Seq <= rs.last:
		k.w.metrics.StreamFailures.WithLabelValues(k.name, "restart").Inc()
		k.log.Info("kv events: sequence went back (publisher restarted); clearing", "rank", rs.rank, "seq", msg.Seq, "last", rs.last)
		k.clearRank(rs, kvdelta.ReasonRestart)
		rs.desynced = false // a new process: its history starts here
		k.baseline(rs, src, msg.Seq, live)
		return
	case msg.Seq > rs.last+1:
		k.w.metrics.StreamFailures.WithLabelValues(k.name, "gap").Inc()
		k.log.Info("kv events: sequence gap", "rank", rs.rank, "seq", msg.Seq, "last", rs.last)
		if rs.replay != "" && !rs.desynced {
			err := k.replay(rs, rs.last+1, "gap")
			if rs.last >= msg.Seq-1 {
				if rs.last >= msg.Seq {
					rs.dupSrc, rs.dupLo, rs.dupHi = src, msg.Seq, rs.last
					return
				}
				break // the replay reached the message before: apply it
			}
			k.log.Warn("kv events: replay did not repair the gap", "rank", rs.rank, "err", err, "through", rs.last, "seq", msg.Seq)
		}
		if !rs.desynced {
			k.log.Warn("kv events: gap not repaired; clearing the rank, neutral until the engine clears", "rank", rs.rank, "seq", msg.Seq, "last", rs.last)
			k.clearRank(rs, kvdelta.ReasonGap)
			rs.desynced = true
		}
	}
	rs.last = msg.Seq
	k.apply(rs, msg.Seq, live, "live")
}

// catchUp replays, on a new connection, what the replica still buffers
// from sequence 0, so a watcher that (re)starts does not wait for new
// events to know the replica's cache. The live messages that the replay
// covers are skipped when they arrive.
func (k *worker) catchUp(rs *rankStream, src uint64) {
	rs.haveSeq, rs.last = false, 0
	if err := k.replay(rs, 0, "catchup"); err != nil && rs.haveSeq {
		// Part of the history was applied and the rest is unknown.
		k.clearRank(rs, kvdelta.ReasonReconnect)
		rs.haveSeq = false
	}
	if rs.haveSeq {
		rs.dupSrc, rs.dupLo, rs.dupHi = src, 0, rs.last
	}
}

// baseline starts a stream at the live message seq. With a replay endpoint
// it first catches up on what the replica still buffers from sequence 0.
func (k *worker) baseline(rs *rankStream, src, seq uint64, live batch) {
	rs.haveSeq = false
	if seq > 0 && rs.replay != "" {
		k.catchUp(rs, src)
		if rs.haveSeq && rs.last >= seq {
			rs.dupSrc, rs.dupLo, rs.dupHi = src, seq, rs.last
			return
		}
		if rs.haveSeq && rs.last != seq-1 {
			k.clearRank(rs, kvdelta.ReasonReconnect) // the replay ended short of msg
		}
	}
	rs.haveSeq, rs.last = true, seq
	k.apply(rs, seq, live, "live")
}

// replay asks the rank's replay endpoint for the batches from start on and
// applies them in order, advancing rs.last (and setting rs.haveSeq once one
// is applied). A gap replay fails when the first batch is later than start
// (the replica no longer buffers it); a catch-up starts wherever the
// replica's buffer does. Batches must follow each other.
func (k *worker) replay(rs *rankStream, start uint64, kind string) error {
	ctx, cancel := context.WithTimeout(k.ctx, k.w.opts.ReplayTimeout)
	defer cancel()
	ctx, span := k.w.tracer.Start(ctx, "kvwatcher.replay", trace.WithAttributes(
		attrProvider.String(k.name), attrRank.Int(rs.rank), attribute.String("kv.replay.kind", kind), attribute.Int64("kv.replay.start", int64(start))))
	defer span.End()
	k.tctx = ctx
	defer func() { k.tctx = nil }()
	next, first := start, true
	err := zmtp.Replay(ctx, rs.replay, start, k.w.opts.ReplayIdle, func(m kvevents.Message) error {
		if m.Seq < next {
			return nil
		}
		if m.Seq != next && (kind == "gap" || !first) {
			return fmt.Errorf("%w: got sequence %d, want %d", errHistoryLost, m.Seq, next)
		}
		first = false
		next = m.Seq + 1
		rs.haveSeq, rs.last = true, m.Seq
		var b batch
		b.b, b.err = k.rdec.Decode(m.Payload)
		k.apply(rs, m.Seq, b, "replay")
		return nil
	})
	result := "ok"
	if err != nil {
		result = "failed"
		span.SetStatus(codes.Error, err.Error())
		k.log.Warn("kv events: replay failed", "rank", rs.rank, "kind", kind, "start", start, "err", err)
	} else {
		k.log.Info("kv events: replayed", "rank", rs.rank, "kind", kind, "start", start, "batches", next-start)
	}
	span.SetAttributes(attribute.Int64("kv.replay.batches", int64(next-start)))
	k.w.metrics.ReplayAttempts.WithLabelValues(k.name, kind, result).Inc()
	return err
}

// apply applies a decoded batch of rank rs (engine sequence seq),
// publishing the resulting delta, in a span of its own.
func (k *worker) apply(rs *rankStream, seq uint64, live batch, source string) {
	m := k.w.metrics
	if live.err != nil {
		m.Malformed.WithLabelValues(k.name, "payload").Inc()
		k.log.Debug("kv events: undecodable payload", "err", live.err)
		return
	}
	b := live.b
	tctx := k.ctx
	if k.tctx != nil {
		tctx = k.tctx
	}
	_, span := k.w.tracer.Start(tctx, "kvwatcher.apply", trace.WithAttributes(
		attrProvider.String(k.name), attrRank.Int(rs.rank), attribute.String("kv.source", source),
		attribute.Int64("kv.engine_seq", int64(seq)), attribute.Int("kv.events", len(b.Events))))
	k.span = span
	defer func() { k.span = nil; span.End() }()
	if source == "replay" {
		k.hot.replayBatches.Inc()
	} else {
		k.hot.liveBatches.Inc()
	}
	skip := func(reason string, n int) {
		if n > 0 {
			m.Skipped.WithLabelValues(k.name, reason).Add(float64(n))
		}
	}
	skip("unknown_event", b.UnknownEvents)
	skip("invalid_event", b.InvalidEvents)
	skip("unknown_field", b.UnknownFields)
	events := b.Events
	if rs.desynced {
		i := 0
		for i < len(events) && events[i].Kind() != kvevents.KindAllBlocksCleared {
			i++
		}
		if i == len(events) {
			skip("desynced", 1)
			return
		}
		k.log.Info("kv events: engine cleared; synced again", "rank", rs.rank)
		events, rs.desynced = events[i:], false
	}
	ops, st := k.state.Apply(rs.rank, events)
	k.lastEvent = time.Now()
	k.hot.stored.Add(float64(st.Stored))
	k.hot.removed.Add(float64(st.Removed))
	if st.Cleared > 0 {
		k.hot.cleared.Add(float64(st.Cleared))
		m.Clears.WithLabelValues(k.name, kvdelta.ReasonEngine.String()).Add(float64(st.Cleared))
	}
	skip("medium", st.SkippedMedium)
	skip("kind", st.SkippedKind)
	skip("parent", st.SkippedParent)
	skip("extra_keys", st.SkippedExtraKeys)
	skip("lora_id", st.SkippedLoRA)
	skip("block_size", st.SkippedInvalid)
	skip("unknown_removal", st.UnknownRemovals)
	if st.Evictions > 0 {
		m.Evictions.WithLabelValues(k.name).Add(float64(st.Evictions))
	}
	if len(ops) > 0 {
		k.publishDelta(ops)
	}
}

// clearRank empties one rank's state and publishes what that removes from
// the provider's (its identities that no other rank holds).
func (k *worker) clearRank(rs *rankStream, r kvdelta.Reason) {
	k.w.metrics.Clears.WithLabelValues(k.name, r.String()).Inc()
	if ops := k.state.ClearRank(rs.rank, r); len(ops) > 0 {
		k.publishDelta(ops)
	}
}

// clear empties every rank's state and publishes the clear.
func (k *worker) clear(r kvdelta.Reason) {
	k.state.Clear()
	k.w.metrics.Clears.WithLabelValues(k.name, r.String()).Inc()
	k.publishDelta([]kvdelta.Op{{Kind: kvdelta.OpCleared, Reason: r}})
}

// synced reports whether every rank's stream is up and in sync: a rank
// missing makes the provider's view partial, which scores neutral.
func (k *worker) synced() bool {
	for _, rs := range k.ranks {
		if !rs.connected || rs.desynced {
			return false
		}
	}
	return true
}

func (k *worker) status() kvdelta.Status {
	now := time.Now()
	s := kvdelta.Status{Heartbeat: k.w.opts.Heartbeat}
	if kv := k.spec.KV; kv != nil {
		s.KV, s.Synced, s.KVStale = true, k.synced(), kv.Stale
		s.KVAge = age(now, k.lastEvent)
		s.BlockSize, s.Blocks = k.state.BlockSize(), k.state.Len()
	}
	if lm := k.spec.LM; lm != nil {
		s.LM, s.LMAvailable, s.Occupancy, s.LMStale = true, k.available, k.occupancy, lm.Stale
		s.LMAge = age(now, k.lmAt)
	}
	return s
}

func age(now, t time.Time) time.Duration {
	if t.IsZero() {
		return -1
	}
	return max(now.Sub(t), 0)
}

// publishDelta publishes ops as one delta, or as several in order when
// their identities would not fit the server's maximum payload (a rank's
// clear can remove a whole cache).
func (k *worker) publishDelta(ops []kvdelta.Op) {
	// An op's framing (its tags, lengths and parent) takes at most 24
	// bytes: three identities' worth.
	per := kvdelta.PartIDs(int(k.w.opts.NATS.MaxPayload()), k.name) - 3*len(ops)
	n := 0
	for _, op := range ops {
		n += len(op.IDs)
	}
	if n <= per || per < 1 {
		k.publishOps(ops)
		return
	}
	k.split = k.split[:0]
	room := per
	flush := func() {
		if len(k.split) > 0 {
			k.publishOps(k.split)
			k.split, room = k.split[:0], per
		}
	}
	for _, op := range ops {
		if op.Kind == kvdelta.OpCleared {
			k.split = append(k.split, op)
			continue
		}
		for ids := op.IDs; len(ids) > 0; {
			if room == 0 {
				flush()
			}
			part := op
			part.IDs = ids[:min(room, len(ids))]
			k.split = append(k.split, part)
			room -= len(part.IDs)
			ids = ids[len(part.IDs):]
			// A stored chain goes on from the last identity sent.
			op.Parent, op.HasParent = part.IDs[len(part.IDs)-1], true
		}
	}
	flush()
}

func (k *worker) publishOps(ops []kvdelta.Op) {
	k.seq++
	m := kvdelta.Message{Type: kvdelta.TypeDelta, Epoch: k.w.epoch, Seq: k.seq, Provider: k.name, Status: k.status(), Ops: ops}
	ctx := k.ctx
	if k.span != nil {
		ctx = trace.ContextWithSpan(ctx, k.span)
	}
	_, span := k.w.tracer.Start(ctx, "kvwatcher.publish", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrProvider.String(k.name), attribute.Int64("kv.seq", int64(k.seq)), attribute.Int("kv.ops", len(ops))))
	defer span.End()
	ok := k.publish(k.subject, &m)
	span.SetAttributes(attribute.Int("messaging.message.body.size", len(k.buf)))
	if !ok {
		span.SetStatus(codes.Error, "publish failed")
	}
	if ok {
		for _, op := range ops {
			switch op.Kind {
			case kvdelta.OpStored:
				k.hot.storedBlocks.Add(float64(len(op.IDs)))
			case kvdelta.OpRemoved:
				k.hot.removedBlocks.Add(float64(len(op.IDs)))
			}
		}
	}
}

func (k *worker) publishStatus() {
	m := kvdelta.Message{Type: kvdelta.TypeStatus, Epoch: k.w.epoch, Seq: k.seq, Provider: k.name, Status: k.status()}
	k.publish(k.subject, &m)
	mt := k.w.metrics
	if k.spec.KV != nil {
		mt.StateBlocks.WithLabelValues(k.name).Set(float64(m.Status.Blocks))
		mt.Synced.WithLabelValues(k.name).Set(b2f(m.Status.Synced))
		mt.Age.WithLabelValues(k.name, "vllm").Set(ageSeconds(m.Status.KVAge))
	}
	if k.spec.LM != nil {
		mt.Age.WithLabelValues(k.name, "lmcache").Set(ageSeconds(m.Status.LMAge))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func ageSeconds(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return d.Seconds()
}

// publish encodes m and publishes it on subject; false on failure (counted
// and logged).
func (k *worker) publish(subject string, m *kvdelta.Message) bool {
	var err error
	k.buf, err = m.Append(k.buf[:0])
	if err == nil {
		err = k.w.opts.NATS.Publish(subject, k.buf)
	}
	if err != nil {
		k.w.metrics.PublishErrors.WithLabelValues(k.name).Inc()
		k.log.Debug("publish failed", "type", m.Type.String(), "err", err)
		return false
	}
	switch m.Type {
	case kvdelta.TypeDelta:
		k.hot.deltas.Inc()
	case kvdelta.TypeStatus:
		k.hot.statuses.Inc()
	default:
		k.w.metrics.Published.WithLabelValues(k.name, m.Type.String()).Inc()
	}
	return true
}

// onSnapshotRequest runs on a NATS goroutine: it queues a valid request
// for run's goroutine, or drops it.
func (k *worker) onSnapshotRequest(msg *nats.Msg) {
	req, err := kvdelta.Decode(msg.Data)
	if err != nil || req.Type != kvdelta.TypeSnapshotRequest || req.Provider != k.name || msg.Reply == "" {
		return
	}
	if req.Epoch != 0 && req.Epoch != k.w.epoch {
		return
	}
	select {
	case k.snaps <- msg.Reply:
	default:
	}
}

// serveSnapshot publishes the provider's full state to reply, in parts that
// fit the server's maximum payload.
func (k *worker) serveSnapshot(reply string) {
	k.w.metrics.SnapshotRequests.WithLabelValues(k.name).Inc()
	ids := k.idbuf[:0]
	if k.state != nil {
		ids = k.state.AppendIDs(ids)
	}
	k.idbuf = ids
	per := kvdelta.PartIDs(int(k.w.opts.NATS.MaxPayload()), k.name)
	parts := max((len(ids)+per-1)/per, 1)
	st := k.status()
	for i := range parts {
		part := ids[min(i*per, len(ids)):min((i+1)*per, len(ids))]
		m := kvdelta.Message{Type: kvdelta.TypeSnapshot, Epoch: k.w.epoch, Seq: k.seq, Provider: k.name, Status: st,
			Part: i, Parts: parts, IDs: part}
		if !k.publish(reply, &m) {
			return
		}
	}
}
