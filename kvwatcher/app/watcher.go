package app

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"rolter.dev/kvwatcher/internal/metrics"
)

// Defaults of [Options].
const (
	DefaultHeartbeat     = time.Second
	DefaultReplayTimeout = 10 * time.Second
	DefaultReplayIdle    = 2 * time.Second
	DefaultReconnectMin  = 100 * time.Millisecond
	DefaultReconnectMax  = 2 * time.Second
	DefaultQueue         = 1024
)

// Options configures a [Watcher].
type Options struct {
	// Source gives the providers to watch (required).
	Source Source
	// NATS is the connection deltas are published on and snapshot
	// requests answered on (required). The Watcher does not close it.
	NATS *nats.Conn
	// Logger receives operational logs; default: discard.
	Logger *slog.Logger
	// Registerer registers the metrics; default: a private registry.
	Registerer prometheus.Registerer
	// Epoch stamps every message; 0 picks a random one (the normal case:
	// each watcher start is a new epoch).
	Epoch uint64
	// Heartbeat is the period of status messages; default 1s. Keep it well
	// below the providers' stale_secs.
	Heartbeat time.Duration
	// ReplayTimeout bounds one replay exchange; default 10s.
	ReplayTimeout time.Duration
	// ReplayIdle bounds the wait for each replayed message; default 2s.
	ReplayIdle time.Duration
	// ReconnectMin and ReconnectMax bound the delay between attempts to
	// dial a publisher; default 100ms and 2s.
	ReconnectMin, ReconnectMax time.Duration
	// Queue is the number of messages buffered per provider between the
	// socket and the provider's goroutine (a replay blocks the goroutine
	// while live messages queue); default 1024.
	Queue int
	// TracerProvider receives the watcher's spans (see tracing.go);
	// default: none.
	TracerProvider trace.TracerProvider
}

// Watcher subscribes to the KV events and LMCache occupancy of the
// providers its Source gives and publishes their deltas over NATS.
//
// # Concurrency
//
// Run is called once. Each provider has one goroutine that owns its state
// and is the only publisher of its deltas (so its sequence numbers are
// published in order), plus a goroutine reading its socket (connect mode)
// or a shared one per bound endpoint (bind mode), and one polling LMCache.
// A provider's goroutines are cancelled and waited for when it leaves the
// Source's list or its configuration changes, and all of them when Run's
// context ends. Other methods are safe for concurrent use.
type Watcher struct {
	opts    Options
	log     *slog.Logger
	tracer  trace.Tracer
	metrics *metrics.Metrics
	epoch   uint64
	srcs    atomic.Uint64
	// configured is set once the Source has given a provider list.
	configured atomic.Bool

	mu      sync.Mutex // guards the fields below
	ctx     context.Context
	runners map[string]*runner
	binds   map[string]*binder
	seqs    map[string]uint64 // last sequence of stopped providers
}

// runner is one running provider.
type runner struct {
	spec   Provider
	worker *worker
	cancel context.CancelFunc
	done   chan struct{} // closed when the worker returned
	binds  []*binder     // bind mode: one per data-parallel rank's endpoint
}

// New checks opts and returns a Watcher; call Run.
func New(opts Options) (*Watcher, error) {
	if opts.Source == nil || opts.NATS == nil {
		return nil, errors.New("kvwatcher: Options.Source and Options.NATS are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Epoch == 0 {
		var b [8]byte
		for opts.Epoch == 0 {
			_, _ = rand.Read(b[:])
			opts.Epoch = binary.LittleEndian.Uint64(b[:])
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.Heartbeat, DefaultHeartbeat)
	def(&opts.ReplayTimeout, DefaultReplayTimeout)
	def(&opts.ReplayIdle, DefaultReplayIdle)
	def(&opts.ReconnectMin, DefaultReconnectMin)
	def(&opts.ReconnectMax, DefaultReconnectMax)
	if opts.Queue <= 0 {
		opts.Queue = DefaultQueue
	}
	if opts.TracerProvider == nil {
		opts.TracerProvider = noop.NewTracerProvider()
	}
	m, err := metrics.New(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("kvwatcher: metrics: %w", err)
	}
	return &Watcher{
		opts: opts, log: opts.Logger.With("component", "kvwatcher"), metrics: m, epoch: opts.Epoch,
		tracer:  opts.TracerProvider.Tracer(instrumentation),
		runners: map[string]*runner{}, binds: map[string]*binder{}, seqs: map[string]uint64{},
	}, nil
}

// Epoch returns the epoch that stamps this watcher's messages.
func (w *Watcher) Epoch() uint64 { return w.epoch }

// Run watches the Source's providers until ctx ends (it then returns nil)
// or the Source fails. Before returning it stops every provider, which
// publishes a clear and a not-synced status for each, and waits for all its
// goroutines.
func (w *Watcher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
	w.log.Info("kvwatcher started", "epoch", fmt.Sprintf("%016x", w.epoch))
	err := w.opts.Source.Run(ctx, func(list []Provider) {
		w.update(list)
		w.configured.Store(true)
	})
	w.update(nil)
	if err != nil {
		return fmt.Errorf("kvwatcher: source: %w", err)
	}
	return nil
}

// Configured reports whether the Source has given a provider list (from a
// config file, a control plane or the snapshot cache).
func (w *Watcher) Configured() bool { return w.configured.Load() }

// BoundEndpoint returns the address actually bound for a bind-mode
// endpoint (useful with port 0), and whether it is bound.
func (w *Watcher) BoundEndpoint(endpoint string) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.binds[endpoint]
	if !ok {
		return "", false
	}
	return b.ln.Endpoint(), true
}

func (w *Watcher) nextSrc() uint64 { return w.srcs.Add(1) }

// update makes the running providers match list: it stops the providers
// that left or changed (waiting for them), then starts the new and changed
// ones.
func (w *Watcher) update(list []Provider) {
	want := map[string]Provider{}
	bindTopics := map[[2]string]string{}
	for _, p := range list {
		if p.KV == nil && p.LM == nil {
			continue
		}
		if err := p.validate(); err != nil {
			w.log.Error("provider skipped", "err", err)
			w.metrics.ConfigApply.WithLabelValues("error").Inc()
			continue
		}
		if _, dup := want[p.Name]; dup {
			w.log.Error("provider skipped: duplicate name", "provider", p.Name)
			continue
		}
		if p.KV != nil && p.KV.Mode == ModeBind {
			var keys [][2]string
			for r := range p.KV.Ranks() {
				ep, _ := RankEndpoint(p.KV.Endpoint, r) // validated
				keys = append(keys, [2]string{ep, p.KV.Topic})
			}
			if other, dup := firstTaken(bindTopics, keys); dup {
				w.log.Error("provider skipped: another provider has its bind endpoint and topic", "provider", p.Name, "other", other, "topic", p.KV.Topic)
				continue
			}
			for _, key := range keys {
				bindTopics[key] = p.Name
			}
		}
		want[p.Name] = p
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	var stopping []*runner
	for name, r := range w.runners {
		if p, ok := want[name]; !ok || !p.Equal(r.spec) {
			r.cancel()
			stopping = append(stopping, r)
			delete(w.runners, name)
		}
	}
	for _, r := range stopping {
		<-r.done
		w.seqs[r.spec.Name] = r.worker.seq
		for _, b := range r.binds {
			b.remove(r.spec.KV.Topic)
			w.release(b)
		}
		if _, ok := want[r.spec.Name]; !ok {
			w.metrics.Forget(r.spec.Name)
			w.log.Info("provider stopped", "provider", r.spec.Name)
		}
	}
	if w.ctx == nil || w.ctx.Err() != nil {
		w.metrics.Providers.Set(float64(len(w.runners)))
		return
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, running := w.runners[name]; running {
			continue
		}
		w.start(want[name])
	}
	w.metrics.Providers.Set(float64(len(w.runners)))
	if list != nil {
		w.metrics.ConfigApply.WithLabelValues("ok").Inc()
	}
}

// start runs provider p. w.mu is held.
func (w *Watcher) start(p Provider) {
	ctx, cancel := context.WithCancel(w.ctx)
	k := newWorker(w, p, w.seqs[p.Name])
	r := &runner{spec: p, worker: k, cancel: cancel, done: make(chan struct{})}
	if p.KV != nil && p.KV.Mode == ModeBind {
		// vLLM offsets the port of a rank's endpoint whether it binds or
		// connects: rank r of a replica connects to our port + r.
		for rank := range p.KV.Ranks() {
			ep, _ := RankEndpoint(p.KV.Endpoint, rank) // validated
			b, err := w.acquire(ep)
			if err != nil {
				w.log.Error("cannot bind kv_events endpoint", "provider", p.Name, "endpoint", ep, "err", err)
				w.metrics.StreamFailures.WithLabelValues(p.Name, "bind").Inc()
			} else if err := b.add(p.KV.Topic, &route{inbox: k.stream, done: ctx.Done(), rank: rank}); err != nil {
				w.log.Error("kv_events topic", "provider", p.Name, "err", err)
				w.release(b)
			} else {
				r.binds = append(r.binds, b)
			}
		}
	}
	w.runners[p.Name] = r
	go func() {
		defer close(r.done)
		k.run(ctx)
	}()
	w.log.Info("provider started", "provider", p.Name, "kv", p.KV != nil, "lmcache", p.LM != nil)
}

// acquire returns the binder of endpoint, binding it if needed. w.mu is
// held.
func (w *Watcher) acquire(endpoint string) (*binder, error) {
	if b, ok := w.binds[endpoint]; ok {
		b.refs++
		return b, nil
	}
	b, err := newBinder(w.ctx, endpoint, w)
	if err != nil {
		return nil, err
	}
	b.refs = 1
	w.binds[endpoint] = b
	return b, nil
}

// release drops a reference to b, closing it with the last. w.mu is held.
func (w *Watcher) release(b *binder) {
	b.refs--
	if b.refs > 0 {
		return
	}
	delete(w.binds, b.endpoint)
	b.close()
}

// firstTaken returns the provider holding any of keys in taken.
func firstTaken(taken map[[2]string]string, keys [][2]string) (string, bool) {
	for _, k := range keys {
		if other, ok := taken[k]; ok {
			return other, true
		}
	}
	return "", false
}
