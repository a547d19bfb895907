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
	state *kvstate.State // nil without KV
	dec   *kvevents.Decoder
	seq   uint64 // last delta published

	src       uint64 // the connection of the current stream; 0 before any
	connected bool
	haveSeq   bool   // last holds the stream's last sequence
	last      uint64 // last sequence applied
	desynced  bool   // an unrepaired gap: neutral until AllBlocksCleared
	lastEvent time.Time

	// A replay applied the live messages dupLo..dupHi of connection dupSrc
	// ahead of them; they are skipped when they arrive.
	dupSrc, dupLo, dupHi uint64

	lmAt      time.Time
	occupancy float64
	available bool

	buf   []byte
	idbuf []uint64
	hot   hotMetrics
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
	}
	if p.KV != nil {
		k.state = kvstate.New(p.KV.Model, p.KV.MaxBlocks)
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
		wg.Go(func() { k.dial(ctx) })
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
			k.connected = false
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
		k.startStream(ev.src)
		if k.spec.KV.ReplayEndpoint != "" {
			k.catchUp(ev.src)
		}
		k.publishStatus()
	case evDisconnected:
		if ev.src != k.src || !k.connected {
			return
		}
		k.connected = false
		k.w.metrics.StreamFailures.WithLabelValues(k.name, "disconnect").Inc()
		k.log.Info("kv events: stream ended; clearing", "err", ev.err)
		k.clear(kvdelta.ReasonReconnect)
	case evMessage:
		k.message(ev.src, ev.frames)
	}
}

// startStream begins a new stream from connection src: its first sequence
// is a baseline. A previous stream that is still up (bind mode: another
// connection took the topic) is cleared.
func (k *worker) startStream(src uint64) {
	if k.connected && k.src != 0 && k.src != src {
		k.w.metrics.StreamFailures.WithLabelValues(k.name, "disconnect").Inc()
		k.log.Info("kv events: a new connection took over the topic; clearing")
		k.clear(kvdelta.ReasonReconnect)
	}
	k.src, k.connected, k.haveSeq, k.desynced = src, true, false, false
}

// message handles one live message.
func (k *worker) message(src uint64, frames [][]byte) {
	msg, err := kvevents.ParseMessage(frames)
	if err != nil {
		k.w.metrics.Malformed.WithLabelValues(k.name, "frames").Inc()
		k.log.Debug("kv events: malformed message", "err", err)
		return
	}
	if src != k.src || !k.connected {
		k.startStream(src)
	}
	if src == k.dupSrc && msg.Seq >= k.dupLo && msg.Seq <= k.dupHi {
		return // a replay applied it already
	}
	switch {
	case !k.haveSeq:
		k.baseline(src, msg)
		return
	case msg.Seq <= k.last:
		k.w.metrics.StreamFailures.WithLabelValues(k.name, "restart").Inc()
		k.log.Info("kv events: sequence went back (publisher restarted); clearing", "seq", msg.Seq, "last", k.last)
		k.clear(kvdelta.ReasonRestart)
		k.desynced = false // a new process: its history starts here
		k.baseline(src, msg)
		return
	case msg.Seq > k.last+1:
		k.w.metrics.StreamFailures.WithLabelValues(k.name, "gap").Inc()
		k.log.Info("kv events: sequence gap", "seq", msg.Seq, "last", k.last)
		if k.spec.KV.ReplayEndpoint != "" && !k.desynced {
			err := k.replay(src, k.last+1, "gap")
			if k.last >= msg.Seq-1 {
				if k.last >= msg.Seq {
					k.dupSrc, k.dupLo, k.dupHi = src, msg.Seq, k.last
					return
				}
				break // the replay reached the message before: apply it
			}
			k.log.Warn("kv events: replay did not repair the gap", "err", err, "through", k.last, "seq", msg.Seq)
		}
		if !k.desynced {
			k.log.Warn("kv events: gap not repaired; clearing and neutral until the engine clears", "seq", msg.Seq, "last", k.last)
			k.clear(kvdelta.ReasonGap)
			k.desynced = true
		}
	}
	k.last = msg.Seq
	k.apply(msg.Payload, "live")
}

// catchUp replays, on a new connection, what the replica still buffers
// from sequence 0, so a watcher that (re)starts does not wait for new
// events to know the replica's cache. The live messages that the replay
// covers are skipped when they arrive.
func (k *worker) catchUp(src uint64) {
	k.haveSeq, k.last = false, 0
	if err := k.replay(src, 0, "catchup"); err != nil && k.haveSeq {
		// Part of the history was applied and the rest is unknown.
		k.clear(kvdelta.ReasonReconnect)
		k.haveSeq = false
	}
	if k.haveSeq {
		k.dupSrc, k.dupLo, k.dupHi = src, 0, k.last
	}
}

// baseline starts a stream at msg. With a replay endpoint it first catches
// up on what the replica still buffers from sequence 0.
func (k *worker) baseline(src uint64, msg kvevents.Message) {
	k.haveSeq = false
	if msg.Seq > 0 && k.spec.KV.ReplayEndpoint != "" {
		k.catchUp(src)
		if k.haveSeq && k.last >= msg.Seq {
			k.dupSrc, k.dupLo, k.dupHi = src, msg.Seq, k.last
			return
		}
		if k.haveSeq && k.last != msg.Seq-1 {
			k.clear(kvdelta.ReasonReconnect) // the replay ended short of msg
		}
	}
	k.haveSeq, k.last = true, msg.Seq
	k.apply(msg.Payload, "live")
}

// replay asks the replay endpoint for the batches from start on and
// applies them in order, advancing k.last (and setting k.haveSeq once one
// is applied). A gap replay fails when the first batch is later than start
// (the replica no longer buffers it); a catch-up starts wherever the
// replica's buffer does. Batches must follow each other.
func (k *worker) replay(src, start uint64, kind string) error {
	ctx, cancel := context.WithTimeout(k.ctx, k.w.opts.ReplayTimeout)
	defer cancel()
	next, first := start, true
	err := zmtp.Replay(ctx, k.spec.KV.ReplayEndpoint, start, k.w.opts.ReplayIdle, func(m kvevents.Message) error {
		if m.Seq < next {
			return nil
		}
		if m.Seq != next && (kind == "gap" || !first) {
			return fmt.Errorf("%w: got sequence %d, want %d", errHistoryLost, m.Seq, next)
		}
		first = false
		next = m.Seq + 1
		k.haveSeq, k.last = true, m.Seq
		k.apply(m.Payload, "replay")
		return nil
	})
	result := "ok"
	if err != nil {
		result = "failed"
		k.log.Warn("kv events: replay failed", "kind", kind, "start", start, "err", err)
	} else {
		k.log.Info("kv events: replayed", "kind", kind, "start", start, "batches", next-start)
	}
	k.w.metrics.ReplayAttempts.WithLabelValues(k.name, kind, result).Inc()
	return err
}

// apply decodes a batch and applies it, publishing the resulting delta.
func (k *worker) apply(payload []byte, source string) {
	m := k.w.metrics
	b, err := k.dec.Decode(payload)
	if err != nil {
		m.Malformed.WithLabelValues(k.name, "payload").Inc()
		k.log.Debug("kv events: undecodable payload", "err", err)
		return
	}
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
	if k.desynced {
		i := 0
		for i < len(events) && events[i].Kind() != kvevents.KindAllBlocksCleared {
			i++
		}
		if i == len(events) {
			skip("desynced", 1)
			return
		}
		k.log.Info("kv events: engine cleared; synced again")
		events, k.desynced = events[i:], false
	}
	ops, st := k.state.Apply(events)
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

// clear empties the state and publishes the clear.
func (k *worker) clear(r kvdelta.Reason) {
	k.state.Clear()
	k.w.metrics.Clears.WithLabelValues(k.name, r.String()).Inc()
	k.publishDelta([]kvdelta.Op{{Kind: kvdelta.OpCleared, Reason: r}})
}

func (k *worker) status() kvdelta.Status {
	now := time.Now()
	var s kvdelta.Status
	if kv := k.spec.KV; kv != nil {
		s.KV, s.Synced, s.KVStale = true, k.connected && !k.desynced, kv.Stale
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

func (k *worker) publishDelta(ops []kvdelta.Op) {
	k.seq++
	m := kvdelta.Message{Type: kvdelta.TypeDelta, Epoch: k.w.epoch, Seq: k.seq, Provider: k.name, Status: k.status(), Ops: ops}
	if k.publish(k.subject, &m) {
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
