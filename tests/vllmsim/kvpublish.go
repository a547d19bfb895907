package vllmsim

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"rolter.dev/pkg/kvevents"
)

// Defaults of [KVPublisherOptions], vLLM's KVEventsConfig defaults.
const (
	// DefaultKVEndpoint is vLLM's default PUB endpoint.
	DefaultKVEndpoint = "tcp://*:5557"
	// DefaultKVBufferSteps is the number of batches kept for replay.
	DefaultKVBufferSteps = 10000
	// DefaultKVQueueSize is the number of cache operations that may wait
	// for the publisher goroutine.
	DefaultKVQueueSize = 100000
	// DefaultKVHWM is the number of messages that may wait for one slow
	// subscriber before the next ones are dropped for it.
	DefaultKVHWM = 100000
)

// KVPublisherOptions configures a [KVPublisher]. The zero value publishes
// array-form events on [DefaultKVEndpoint] without replay.
type KVPublisherOptions struct {
	// Endpoint is the PUB endpoint, tcp://HOST:PORT or ipc://PATH. The
	// publisher binds it (HOST "*" is every IPv4 interface, port 0 an
	// ephemeral port: see [KVPublisher.Endpoint]), or connects to it when
	// Connect is set. Default DefaultKVEndpoint.
	Endpoint string
	// Connect makes the publisher connect to Endpoint (a watcher bound
	// there) instead of binding it; it reconnects when the connection
	// drops, as a ZMQ socket does.
	Connect bool
	// Topic is sent as the first frame of every message (vLLM's default
	// is empty; llm-d uses kv@<pod>@<model>).
	Topic string
	// ReplayEndpoint, if set, is bound by a ROUTER socket that answers
	// replay requests (vLLM's replay_endpoint).
	ReplayEndpoint string
	// Layout is the schema generation of the payloads: kvevents.LayoutArray
	// (vLLM 0.21–0.23, the default) or kvevents.LayoutMap (≥ 0.24), or an
	// older one.
	Layout kvevents.Layout
	// LegacyReplay sends replay replies without the topic frame, as vLLM
	// ≤ 0.25 does; the default is the layout of vLLM ≥ 0.26.
	LegacyReplay bool
	// DataParallelRank is sent in every batch.
	DataParallelRank int
	// BufferSteps is the number of batches kept for replay. Default
	// DefaultKVBufferSteps.
	BufferSteps int
	// QueueSize bounds the cache operations waiting to be published; when
	// it is full, further operations are dropped and counted (the cache
	// never waits). Default DefaultKVQueueSize.
	QueueSize int
	// HWM bounds the messages waiting for one subscriber; a subscriber
	// that falls further behind misses messages and sees a sequence gap,
	// as with ZMQ's high-water mark. Default DefaultKVHWM.
	HWM int
	// Logger receives operational logs. Default: discard.
	Logger *slog.Logger
}

func (o KVPublisherOptions) withDefaults() (KVPublisherOptions, error) {
	if o.Endpoint == "" {
		o.Endpoint = DefaultKVEndpoint
	}
	if o.Layout == (kvevents.Layout{}) {
		o.Layout = kvevents.LayoutArray
	}
	if o.BufferSteps == 0 {
		o.BufferSteps = DefaultKVBufferSteps
	}
	if o.QueueSize == 0 {
		o.QueueSize = DefaultKVQueueSize
	}
	if o.HWM == 0 {
		o.HWM = DefaultKVHWM
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	var errs []error
	if o.Layout.Form != kvevents.FormArray && o.Layout.Form != kvevents.FormMap {
		errs = append(errs, fmt.Errorf("vllmsim: kv layout: unknown form %d", o.Layout.Form))
	} else if _, err := kvevents.Encode(&kvevents.Batch{}, o.Layout); err != nil {
		errs = append(errs, fmt.Errorf("vllmsim: kv layout: %w", err))
	}
	if o.BufferSteps < 0 || o.QueueSize < 1 || o.HWM < 1 {
		errs = append(errs, fmt.Errorf("vllmsim: kv buffer_steps, queue_size and hwm must be positive"))
	}
	return o, errors.Join(errs...)
}

// ParseKVFormat maps a --kv-format value to a layout: "array" (vLLM
// 0.21–0.23, the seed's 0.22) or "map" (vLLM ≥ 0.24).
func ParseKVFormat(s string) (kvevents.Layout, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "array", "":
		return kvevents.LayoutArray, nil
	case "map":
		return kvevents.LayoutMap, nil
	}
	return kvevents.Layout{}, fmt.Errorf("kv format %q: want array or map", s)
}

// KVPublisher publishes a [Cache]'s KV events as vLLM's ZmqEventPublisher
// does: a PUB socket sending [topic, 8-byte big-endian sequence, msgpack
// KVEventBatch] with sequence numbers from 0, and optionally a ROUTER
// socket replaying the last BufferSteps batches. It is a [Listener]: set it
// as Options.Listener.
//
// Each cache operation (one Listener call: an admission, an extension or a
// clear) becomes one batch, the way one vLLM engine step does; a batch holds
// the operation's events in order (evictions, then the stored runs). The
// cache never waits for it: operations are handed to a goroutine through a
// bounded queue, and when the queue is full they are dropped and counted in
// [KVPublisherStats.Dropped] before they get a sequence number, so the
// sequence stays contiguous over the batches actually sent (a subscriber
// cannot see such a drop; size the queue so that it does not happen).
//
// A new KVPublisher starts again at sequence 0, as a restarted vLLM does.
type KVPublisher struct {
	opts   KVPublisherOptions
	logger *slog.Logger

	queue   chan []KVEvent
	stop    chan struct{} // closed by Close
	done    chan struct{} // closed when run returns
	closing atomic.Bool

	pub    *zmtpPub
	replay *replayServer // nil without ReplayEndpoint

	published, dropped atomic.Uint64

	mu     sync.Mutex // guards ring
	ring   []kvevents.Message
	head   int // index of the oldest entry once the ring is full
	closed sync.Once
}

var _ Listener = (*KVPublisher)(nil)

// NewKVPublisher binds (or starts connecting) its sockets and starts
// publishing. Close it to stop.
func NewKVPublisher(opts KVPublisherOptions) (*KVPublisher, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &KVPublisher{
		opts:   opts,
		logger: opts.Logger.With("component", "kvpublish"),
		queue:  make(chan []KVEvent, opts.QueueSize),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	p.pub, err = newZMTPPub(opts.Endpoint, opts.Connect, opts.HWM, p.logger)
	if err != nil {
		return nil, err
	}
	if opts.ReplayEndpoint != "" {
		p.replay, err = newReplayServer(opts.ReplayEndpoint, p, p.logger)
		if err != nil {
			p.pub.close()
			return nil, err
		}
	}
	go p.run()
	return p, nil
}

// Endpoint returns the PUB endpoint: the bound address (with the actual
// port) when binding, the configured endpoint when connecting.
func (p *KVPublisher) Endpoint() string { return p.pub.endpoint() }

// ReplayEndpoint returns the bound replay endpoint, or "" without replay.
func (p *KVPublisher) ReplayEndpoint() string {
	if p.replay == nil {
		return ""
	}
	return p.replay.endpoint()
}

// KVEvents queues one cache operation's events for publishing. It never
// blocks (see [KVPublisher]).
func (p *KVPublisher) KVEvents(batch []KVEvent) {
	if len(batch) == 0 {
		return
	}
	if p.closing.Load() {
		p.dropped.Add(1)
		return
	}
	select {
	case p.queue <- batch:
	default:
		if p.dropped.Add(1) == 1 {
			p.logger.Warn("kv event queue full: dropping cache operations", "queue_size", p.opts.QueueSize)
		}
	}
}

// KVPublisherStats are a [KVPublisher]'s counters.
type KVPublisherStats struct {
	// Published counts the batches sent; the next one has this sequence
	// number.
	Published uint64
	// Dropped counts cache operations dropped because the queue was full
	// (or the publisher closed); they took no sequence number.
	Dropped uint64
	// SubscriberDrops counts messages a slow subscriber missed (its queue
	// reached HWM); that subscriber sees a sequence gap.
	SubscriberDrops uint64
	// Subscribers is the number of connected subscribers that subscribed
	// to at least one topic prefix.
	Subscribers int
	// ReplayRequests counts the replay requests answered.
	ReplayRequests uint64
}

// Stats returns the publisher's counters.
func (p *KVPublisher) Stats() KVPublisherStats {
	s := KVPublisherStats{
		Published:       p.published.Load(),
		Dropped:         p.dropped.Load(),
		SubscriberDrops: p.pub.drops.Load(),
		Subscribers:     p.pub.subscribers(),
	}
	if p.replay != nil {
		s.ReplayRequests = p.replay.requests.Load()
	}
	return s
}

// Close publishes the operations already queued, flushes them to the
// subscribers (for at most a second), and closes the sockets. Events
// reported after Close are dropped. It is safe to call more than once.
func (p *KVPublisher) Close() error {
	p.closed.Do(func() {
		p.closing.Store(true)
		close(p.stop)
		<-p.done
		// Operations queued after run's last look are dropped.
		for {
			select {
			case <-p.queue:
				p.dropped.Add(1)
				continue
			default:
			}
			break
		}
		p.pub.close()
		if p.replay != nil {
			p.replay.close()
		}
	})
	return nil
}

// run publishes the queued operations, one batch each, until Close; then it
// publishes what was queued before Close and returns.
func (p *KVPublisher) run() {
	defer close(p.done)
	var buf []byte
	for {
		select {
		case ops := <-p.queue:
			buf = p.publish(buf, ops)
		case <-p.stop:
			for {
				select {
				case ops := <-p.queue:
					buf = p.publish(buf, ops)
				default:
					return
				}
			}
		}
	}
}

// publish encodes one operation's events as a batch, sends it with the next
// sequence number, and keeps it for replay.
func (p *KVPublisher) publish(buf []byte, ops []KVEvent) []byte {
	batch := &kvevents.Batch{
		TS:               float64(time.Now().UnixNano()) / 1e9,
		Events:           make([]kvevents.Event, 0, len(ops)),
		DataParallelRank: kvevents.Some(int64(p.opts.DataParallelRank)),
	}
	for _, op := range ops {
		if ev := toWireEvent(op); ev != nil {
			batch.Events = append(batch.Events, ev)
		}
	}
	var err error
	buf, err = kvevents.AppendBatch(buf[:0], batch, p.opts.Layout)
	if err != nil { // cannot happen: the layout was checked
		p.logger.Error("encode kv event batch", "err", err)
		return buf
	}
	// Counted before it is sent: a subscriber that has it must see it in
	// Stats (TestKVPublisherLiveEvents read 5 of 6 once).
	msg := kvevents.Message{
		Topic:   []byte(p.opts.Topic),
		Seq:     p.published.Add(1) - 1,
		Payload: append([]byte(nil), buf...),
	}
	p.pub.send(msg.Frames())
	p.remember(msg)
	return buf
}

// toWireEvent converts a cache event to vLLM's event, with the fields vLLM
// sets for a GPU prefix-cache block of a full-attention model: medium "GPU",
// one None extra key per block (a salted prompt's first block holds its
// salt), KV-cache group 0, spec kind
// "full_attention" (a layout that predates a field does not write it).
func toWireEvent(ev KVEvent) kvevents.Event {
	switch ev.Kind {
	case BlockStored:
		out := &kvevents.BlockStored{
			BlockHashes:     wireHashes(ev.BlockHashes),
			TokenIDs:        ev.TokenIDs,
			BlockSize:       ev.BlockSize,
			Medium:          kvevents.Some("GPU"),
			ExtraKeys:       make([]kvevents.ExtraKey, len(ev.BlockHashes)),
			GroupIdx:        kvevents.Some[int64](0),
			KVCacheSpecKind: kvevents.Some("full_attention"),
		}
		if out.TokenIDs == nil {
			out.TokenIDs = []uint32{}
		}
		if ev.Salt != "" && len(out.ExtraKeys) > 0 {
			// vLLM's extra keys of a salted prompt's first block: the
			// tuple (cache_salt,).
			out.ExtraKeys[0], _ = msgpack.Marshal([]any{ev.Salt})
		}
		if ev.HasParent {
			out.ParentBlockHash = kvevents.Some(kvevents.UintHash(ev.ParentBlockHash))
		}
		return out
	case BlockRemoved:
		return &kvevents.BlockRemoved{
			BlockHashes: wireHashes(ev.BlockHashes),
			Medium:      kvevents.Some("GPU"),
			GroupIdx:    kvevents.Some[int64](0),
		}
	case AllBlocksCleared:
		return &kvevents.AllBlocksCleared{}
	}
	return nil
}

func wireHashes(hs []uint64) []kvevents.Hash {
	out := make([]kvevents.Hash, len(hs))
	for i, h := range hs {
		out[i] = kvevents.UintHash(h)
	}
	return out
}

// remember keeps msg for replay, dropping the oldest beyond BufferSteps.
func (p *KVPublisher) remember(msg kvevents.Message) {
	if p.opts.BufferSteps == 0 || p.replay == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ring) < p.opts.BufferSteps {
		p.ring = append(p.ring, msg)
		return
	}
	p.ring[p.head] = msg
	p.head = (p.head + 1) % len(p.ring)
}

// since returns the buffered messages with a sequence ≥ start, oldest
// first. When start is older than the oldest kept, it starts at the oldest
// (vLLM does the same: the requester sees the first sequence is higher than
// it asked for).
func (p *KVPublisher) since(start uint64) []kvevents.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []kvevents.Message
	for i := range p.ring {
		m := p.ring[(p.head+i)%len(p.ring)]
		if m.Seq >= start {
			out = append(out, m)
		}
	}
	return out
}
