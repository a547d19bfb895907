package kvindex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"rolter.dev/pkg/kvdelta"
)

// Defaults of [Options].
const (
	DefaultFailoverAfter   = 3 * time.Second
	DefaultSnapshotTimeout = 3 * time.Second
	DefaultRetryMin        = 200 * time.Millisecond
	DefaultRetryMax        = 5 * time.Second
	DefaultMaxPending      = 4096
	// DefaultMissedHeartbeats is how many of the followed watcher's
	// heartbeats may be missed before its view is stale.
	DefaultMissedHeartbeats = 3
)

// beatWindow is how many intervals between the followed watcher's status
// messages the index remembers to estimate its heartbeat period: the longest
// of them, since LMCache updates and reconnects only add statuses between
// beats.
const beatWindow = 8

// Options configures an [Index]. The zero value takes the defaults.
type Options struct {
	// Logger receives operational logs; default: discard.
	Logger *slog.Logger
	// FailoverAfter is how long the followed watcher (epoch) of a provider
	// may be silent before the index follows another one that publishes
	// for the provider; default 3s (three heartbeats).
	FailoverAfter time.Duration
	// SnapshotTimeout bounds one snapshot request; default 3s.
	SnapshotTimeout time.Duration
	// RetryMin and RetryMax bound the delay between failed snapshot
	// requests; default 200ms and 5s.
	RetryMin, RetryMax time.Duration
	// MaxPending bounds the deltas buffered while a snapshot is awaited;
	// default 4096.
	MaxPending int
	// MissedHeartbeats: a provider whose followed watcher has sent nothing
	// for this many of its heartbeat periods (the longest recent interval
	// between its messages) is stale, whatever its stale_secs; default 3.
	// A watcher that died is then noticed in seconds, not stale_secs.
	MissedHeartbeats int
	// TracerProvider receives a span per resync ("kvindex.resync"); default:
	// none. Deltas get no span: a proxy applies one per engine step of
	// every replica (thousands a second in a fleet), each in well under a
	// microsecond, so a span each would cost more than the work and drown
	// the trace backend; Stats and the metrics count them instead. A resync
	// is rare and slow (a NATS round trip, a state of up to max_blocks),
	// which is what a trace helps explain.
	TracerProvider trace.TracerProvider
}

// Index is a proxy's view of the providers' KV caches: per provider, the
// resident block identities published by rolter-kvwatcher over NATS (see
// rolter.dev/pkg/kvdelta), the freshness of that view, LMCache occupancy,
// and speculative entries the proxy adds after routing a request.
//
// # Consistency
//
// Per provider, the index follows one watcher epoch. It applies that
// epoch's deltas in sequence order; on a gap, when it starts, or when it
// fails over to another epoch (the followed one went silent, or lost sync
// while another is in sync), it requests a snapshot of the epoch and
// applies the deltas buffered meanwhile on top. Messages of other epochs
// are never applied, so two watchers for one provider never double count.
//
// # Concurrency
//
// All methods are safe for concurrent use. Reads (Fresh, PrefixMatch,
// Occupancy, BlockSize) take one provider's read lock and never wait for
// I/O; deltas are applied under that provider's write lock on the NATS
// subscription's goroutine. Each provider also has a goroutine that
// fetches snapshots; Close cancels and waits for all of them. Lock order:
// Index.mu (SetProviders, Close) may wait for a provider's goroutine, which
// takes only that provider's lock; no provider code takes Index.mu, and no
// lock is held across NATS I/O.
type Index struct {
	nc     *nats.Conn
	opts   Options
	log    *slog.Logger
	tracer trace.Tracer

	mu        sync.Mutex // serializes SetProviders and Close
	closed    bool
	providers atomic.Pointer[map[string]*provider]
}

// New returns an index of providers' state published on nc. It does not
// close nc.
func New(nc *nats.Conn, providers []string, opts Options) (*Index, error) {
	if nc == nil {
		return nil, errors.New("kvindex: nil NATS connection")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.FailoverAfter, DefaultFailoverAfter)
	def(&opts.SnapshotTimeout, DefaultSnapshotTimeout)
	def(&opts.RetryMin, DefaultRetryMin)
	def(&opts.RetryMax, DefaultRetryMax)
	if opts.MaxPending <= 0 {
		opts.MaxPending = DefaultMaxPending
	}
	if opts.MissedHeartbeats <= 0 {
		opts.MissedHeartbeats = DefaultMissedHeartbeats
	}
	if opts.TracerProvider == nil {
		opts.TracerProvider = noop.NewTracerProvider()
	}
	ix := &Index{nc: nc, opts: opts, log: opts.Logger.With("component", "kvindex"), tracer: opts.TracerProvider.Tracer("rolter.dev/pkg/kvindex")}
	empty := map[string]*provider{}
	ix.providers.Store(&empty)
	if err := ix.SetProviders(providers); err != nil {
		ix.Close()
		return nil, err
	}
	return ix, nil
}

// SetProviders makes the index follow exactly names: it subscribes to the
// new ones (and requests their snapshots) and drops the others, waiting
// for their goroutines. Providers kept keep their state.
func (ix *Index) SetProviders(names []string) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.closed {
		return errors.New("kvindex: closed")
	}
	old := *ix.providers.Load()
	next := make(map[string]*provider, len(names))
	var errs []error
	for _, name := range names {
		if _, dup := next[name]; dup {
			continue
		}
		if p, ok := old[name]; ok {
			next[name] = p
			continue
		}
		p, err := ix.subscribe(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		next[name] = p
	}
	ix.providers.Store(&next)
	for name, p := range old {
		if _, kept := next[name]; !kept {
			p.stop()
		}
	}
	return errors.Join(errs...)
}

// Close drops every provider and waits for the index's goroutines.
func (ix *Index) Close() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.closed {
		return
	}
	ix.closed = true
	old := *ix.providers.Load()
	empty := map[string]*provider{}
	ix.providers.Store(&empty)
	for _, p := range old {
		p.stop()
	}
}

// Providers returns the names followed, sorted.
func (ix *Index) Providers() []string {
	return slices.Sorted(maps.Keys(*ix.providers.Load()))
}

func (ix *Index) lookup(name string) *provider { return (*ix.providers.Load())[name] }

// Fresh reports whether the provider's resident set can be trusted for
// scoring: a snapshot is loaded and no resync is pending, the followed
// watcher is in sync with the engine and was heard from within the
// provider's stale_secs and within MissedHeartbeats of its heartbeat
// period, and the engine's last event is within stale_secs. A provider
// that is not fresh scores neutral.
func (ix *Index) Fresh(provider string) bool {
	p := ix.lookup(provider)
	if p == nil {
		return false
	}
	now := time.Now()
	p.mu.RLock()
	defer p.mu.RUnlock()
	since := now.Sub(p.statusAt)
	return p.loaded && !p.resyncing && kvFresh(p.status, since) && !p.silent(since)
}

// silent reports whether the followed watcher missed MissedHeartbeats of
// its beats; false until two intervals were seen. p.mu is held.
func (p *provider) silent(since time.Duration) bool {
	beat := p.beat()
	return beat > 0 && since > time.Duration(p.ix.opts.MissedHeartbeats)*beat
}

// beat is the followed watcher's heartbeat period (0: unknown): the longest
// of the intervals seen between its statuses, at least the period it
// announces. The announced period makes a watcher that dies before two
// intervals were seen (a proxy just started, a watcher just followed)
// silent after MissedHeartbeats of it rather than after stale_secs; the
// intervals leave room for a loaded host's late beats, and are all an
// older watcher, which announces none, gives. p.mu is held.
func (p *provider) beat() time.Duration {
	b := p.status.Heartbeat
	if p.nbeats < 2 {
		return b
	}
	for _, d := range p.beats[:min(p.nbeats, beatWindow)] {
		b = max(b, d)
	}
	return b
}

// heard records a message of the followed epoch at now. Only status
// messages time the period: the watcher sends one every heartbeat however
// many deltas it publishes, while a burst of deltas would fill the window
// with intervals far shorter than a beat and make a quiet moment after it
// look like a dead watcher. An interval long enough to have made the
// provider silent (NATS down, a partition) is an outage, not a period, and
// is not recorded, even when a delta came between (deltas after a
// reconnect often come first): kept, it made the period the outage's
// length, and a watcher killed soon after went unnoticed for three times
// that (rolter-outage, an 8 s NATS outage then an 8 s kvwatcher one:
// precise all the 8 s). p.mu is held.
func (p *provider) heard(now time.Time, status bool) {
	if status {
		if !p.beatAt.IsZero() {
			d := now.Sub(p.beatAt)
			if b := p.beat(); b == 0 || d <= time.Duration(p.ix.opts.MissedHeartbeats)*b {
				p.beats[p.nbeats%beatWindow] = d
				p.nbeats++
			}
		}
		p.beatAt = now
	}
	p.statusAt = now
}

func kvFresh(s kvdelta.Status, since time.Duration) bool {
	return s.KV && s.Synced && s.KVAge >= 0 && since < s.KVStale && since+s.KVAge < s.KVStale
}

func lmFresh(s kvdelta.Status, since time.Duration) bool {
	return s.LM && s.LMAge >= 0 && since < s.LMStale && since+s.LMAge < s.LMStale
}

// PrefixMatch returns how many of ids, from the first, are resident on the
// provider (or speculatively inserted and not expired): the length of the
// request's cached prefix in blocks. ids are the request's identities in
// chain order (see [Identities]). It does not check freshness (see
// [Index.Fresh]); an unknown provider matches 0.
func (ix *Index) PrefixMatch(provider string, ids []uint64) int {
	p := ix.lookup(provider)
	if p == nil {
		return 0
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	var now int64
	if p.blocks.Speculating() {
		now = time.Now().UnixNano()
	}
	return p.blocks.PrefixMatch(ids, now)
}

// BlockSize returns the provider's engine block size as the watcher last
// reported it (0 when unknown). Identities for the provider are computed
// with it.
func (ix *Index) BlockSize(provider string) int {
	p := ix.lookup(provider)
	if p == nil {
		return 0
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.status.BlockSize
}

// Occupancy returns the provider's LMCache occupancy in [0, 1], whether
// its cache is available, and whether the value is fresh (polled within
// the provider's lmcache stale_secs, by a watcher heard from within that
// time).
func (ix *Index) Occupancy(provider string) (occ float64, available, fresh bool) {
	p := ix.lookup(provider)
	if p == nil {
		return 0, false, false
	}
	now := time.Now()
	p.mu.RLock()
	defer p.mu.RUnlock()
	s, since := p.status, now.Sub(p.statusAt)
	return s.Occupancy, s.LMAvailable, lmFresh(s, since) && !p.silent(since)
}

// Speculate marks ids resident on the provider for ttl, or until an event
// stores or removes them: call it after routing a request there, for the
// blocks the request will create, to close the gap before the engine's
// events arrive. Unknown providers are ignored.
func (ix *Index) Speculate(provider string, ids []uint64, ttl time.Duration) {
	ix.speculate(provider, ids, ttl, nil, false)
}

// SpeculateAppend is Speculate, appending to dst the identities it marked
// (those not resident): what a balancer shares with its peers so that
// they count the blocks too before the events arrive.
func (ix *Index) SpeculateAppend(provider string, ids []uint64, ttl time.Duration, dst []uint64) []uint64 {
	return ix.speculate(provider, ids, ttl, dst, true)
}

// speculate is Speculate, and with collect SpeculateAppend.
func (ix *Index) speculate(provider string, ids []uint64, ttl time.Duration, dst []uint64, collect bool) []uint64 {
	p := ix.lookup(provider)
	if p == nil || len(ids) == 0 || ttl <= 0 {
		return dst
	}
	now := time.Now().UnixNano()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blocks.speculate(ids, now, ttl, dst, collect)
}

// Stats describes one provider's view.
type Stats struct {
	// Epoch and Seq are the followed watcher's epoch and the last delta
	// applied.
	Epoch, Seq uint64
	// Loaded is set once a snapshot was applied; Resyncing while one is
	// awaited.
	Loaded, Resyncing bool
	// Resident and Speculative count the identities held.
	Resident, Speculative int
	// Status is the followed watcher's last status, received Age ago
	// (its last delta or heartbeat; -1 before any).
	Status kvdelta.Status
	Age    time.Duration
	// Heartbeat is the followed watcher's estimated heartbeat period (0:
	// not known yet); Silent is set once it missed MissedHeartbeats of them.
	Heartbeat time.Duration
	Silent    bool
	// Counters since the provider was added.
	Deltas, Duplicates, Gaps, Resyncs, Failovers, Malformed uint64
}

// Stats returns the provider's view, and false for an unknown provider.
func (ix *Index) Stats(provider string) (Stats, bool) {
	p := ix.lookup(provider)
	if p == nil {
		return Stats{}, false
	}
	now := time.Now()
	p.mu.RLock()
	defer p.mu.RUnlock()
	s := Stats{
		Epoch: p.epoch, Seq: p.seq, Loaded: p.loaded, Resyncing: p.resyncing, Status: p.status,
		Deltas: p.deltas.Load(), Duplicates: p.dups.Load(), Gaps: p.gaps.Load(),
		Resyncs: p.resyncs.Load(), Failovers: p.failovers.Load(), Malformed: p.malformed.Load(),
	}
	s.Resident, s.Speculative = p.blocks.Len()
	s.Age = -1
	if !p.statusAt.IsZero() {
		s.Age = now.Sub(p.statusAt)
		s.Silent = p.silent(s.Age)
	}
	s.Heartbeat = p.beat()
	return s, true
}

// provider is one provider's view. The fields under mu are written by the
// NATS subscription's goroutine and the resync goroutine.
type provider struct {
	ix     *Index
	name   string
	sub    *nats.Subscription
	cancel context.CancelFunc
	done   chan struct{} // closed when the resync goroutine returns
	kick   chan struct{} // buffered 1: a resync is wanted

	deltas, dups, gaps, resyncs, failovers, malformed atomic.Uint64

	mu        sync.RWMutex
	epoch     uint64 // followed epoch; 0 before any message
	seq       uint64
	loaded    bool
	resyncing bool
	pending   []*kvdelta.Message
	blocks    Residency // on Unix time
	status    kvdelta.Status
	statusAt  time.Time
	beats     [beatWindow]time.Duration // recent intervals between the followed epoch's status messages
	beatAt    time.Time                 // the followed epoch's last status message
	nbeats    int
	sickSince time.Time            // since when the followed status is not healthy (zero: healthy)
	others    map[uint64]time.Time // other epochs → last heard
}

// subscribe starts following name. ix.mu is held.
func (ix *Index) subscribe(name string) (*provider, error) {
	ctx, cancel := context.WithCancel(context.Background())
	p := &provider{
		ix: ix, name: name, cancel: cancel, done: make(chan struct{}), kick: make(chan struct{}, 1),
		others:    map[uint64]time.Time{},
		resyncing: true,
	}
	sub, err := ix.nc.Subscribe(kvdelta.Subject(name), p.onMsg)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("kvindex: subscribe %s: %w", name, err)
	}
	p.sub = sub
	go func() {
		defer close(p.done)
		p.resyncLoop(ctx)
	}()
	p.wantResync()
	return p, nil
}

// stop unsubscribes and waits for the resync goroutine.
func (p *provider) stop() {
	_ = p.sub.Unsubscribe()
	p.cancel()
	<-p.done
}

func (p *provider) wantResync() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// onMsg handles a delta or status (on the subscription's goroutine).
func (p *provider) onMsg(msg *nats.Msg) {
	m, err := kvdelta.Decode(msg.Data)
	if err != nil || m.Provider != p.name || (m.Type != kvdelta.TypeDelta && m.Type != kvdelta.TypeStatus) {
		p.malformed.Add(1)
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.epoch == 0:
		p.epoch = m.Epoch
	case m.Epoch != p.epoch:
		p.others[m.Epoch] = now
		if !p.shouldFailover(now, m) {
			return
		}
		p.ix.log.Info("following another watcher", "provider", p.name,
			"from_epoch", fmt.Sprintf("%016x", p.epoch), "to_epoch", fmt.Sprintf("%016x", m.Epoch))
		p.failovers.Add(1)
		delete(p.others, m.Epoch)
		p.epoch = m.Epoch
		p.nbeats, p.statusAt, p.beatAt = 0, time.Time{}, time.Time{} // another watcher, another period
		p.startResync(nil)
	}
	p.status = m.Status
	p.heard(now, m.Type == kvdelta.TypeStatus)
	if healthy(m.Status, 0) {
		p.sickSince = time.Time{}
	} else if p.sickSince.IsZero() {
		p.sickSince = now
	}
	if m.Type == kvdelta.TypeStatus {
		if !p.resyncing && m.Seq > p.seq {
			p.gaps.Add(1)
			p.startResync(nil)
		}
		return
	}
	switch {
	case p.resyncing:
		p.buffer(m)
	case m.Seq <= p.seq:
		p.dups.Add(1)
	case m.Seq == p.seq+1:
		p.apply(m)
	default:
		p.gaps.Add(1)
		p.startResync(m)
	}
}

// shouldFailover decides whether to follow m's epoch instead: when the
// followed one went silent, or has not been healthy for FailoverAfter while
// m's is (the delay keeps two live watchers from trading places whenever
// one of them applies an event first). p.mu is held.
func (p *provider) shouldFailover(now time.Time, m *kvdelta.Message) bool {
	for e, at := range p.others {
		if now.Sub(at) > p.ix.opts.FailoverAfter {
			delete(p.others, e)
		}
	}
	if now.Sub(p.statusAt) > p.ix.opts.FailoverAfter {
		return true
	}
	if !healthy(m.Status, 0) {
		return false
	}
	if !healthy(p.status, now.Sub(p.statusAt)) && p.sickSince.IsZero() {
		p.sickSince = now // went stale without a message saying so
	}
	return !p.sickSince.IsZero() && now.Sub(p.sickSince) > p.ix.opts.FailoverAfter
}

// healthy reports whether a status describes usable telemetry.
func healthy(s kvdelta.Status, since time.Duration) bool {
	if s.KV {
		return kvFresh(s, since)
	}
	return lmFresh(s, since)
}

// startResync marks the provider as awaiting a snapshot, buffering m.
// p.mu is held.
func (p *provider) startResync(m *kvdelta.Message) {
	p.resyncing = true
	p.pending = p.pending[:0]
	if m != nil {
		p.pending = append(p.pending, m)
	}
	p.wantResync()
}

func (p *provider) buffer(m *kvdelta.Message) {
	if len(p.pending) >= p.ix.opts.MaxPending {
		// The snapshot to come will be newer than most of them; what is
		// missing then shows as a gap and is fetched again.
		p.pending = p.pending[:0]
	}
	p.pending = append(p.pending, m)
}

// apply applies a delta of the followed epoch. p.mu is held.
func (p *provider) apply(m *kvdelta.Message) {
	p.blocks.Apply(m.Ops)
	p.seq = m.Seq
	p.deltas.Add(1)
}

// resyncLoop fetches a snapshot whenever one is wanted, retrying with
// backoff, until ctx ends.
func (p *provider) resyncLoop(ctx context.Context) {
	delay := p.ix.opts.RetryMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		for {
			p.mu.RLock()
			need, epoch := p.resyncing, p.epoch
			p.mu.RUnlock()
			if !need {
				break
			}
			if p.resync(ctx, epoch) {
				delay = p.ix.opts.RetryMin
				continue
			}
			if ctx.Err() != nil {
				return
			}
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			delay = min(2*delay, p.ix.opts.RetryMax)
		}
	}
}

// resync fetches a snapshot of epoch and installs it, in a span; it
// reports whether it installed one.
func (p *provider) resync(ctx context.Context, epoch uint64) bool {
	sctx, span := p.ix.tracer.Start(ctx, "kvindex.resync", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("kv.provider", p.name), attribute.String("kv.epoch_wanted", fmt.Sprintf("%016x", epoch))))
	defer span.End()
	snap, err := p.fetch(sctx, epoch)
	if err != nil {
		if ctx.Err() == nil {
			p.ix.log.Debug("snapshot request failed", "provider", p.name, "err", err)
		}
		span.SetStatus(codes.Error, err.Error())
		return false
	}
	span.SetAttributes(attribute.String("kv.epoch", fmt.Sprintf("%016x", snap.epoch)), attribute.Int64("kv.seq", int64(snap.seq)),
		attribute.Int("kv.ids", len(snap.ids)), attribute.Int("kv.parts", snap.parts))
	applied, ok := p.install(snap)
	span.SetAttributes(attribute.Int("kv.pending_applied", applied))
	if !ok {
		span.SetStatus(codes.Error, "the followed epoch changed meanwhile")
	}
	return ok
}

// snapshot is an assembled snapshot reply.
type snapshot struct {
	epoch, seq uint64
	status     kvdelta.Status
	ids        []uint64
	parts      int
}

// fetch requests a snapshot of epoch (0: any) and assembles its parts.
func (p *provider) fetch(ctx context.Context, epoch uint64) (*snapshot, error) {
	nc := p.ix.nc
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("kvindex: subscribe %s: %w", inbox, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	req, err := kvdelta.Encode(&kvdelta.Message{Type: kvdelta.TypeSnapshotRequest, Epoch: epoch, Provider: p.name})
	if err != nil {
		return nil, err
	}
	if err := nc.PublishRequest(kvdelta.SnapshotSubject(p.name), inbox, req); err != nil {
		return nil, fmt.Errorf("kvindex: request snapshot of %s: %w", p.name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.ix.opts.SnapshotTimeout)
	defer cancel()
	type assembly struct {
		snap  snapshot
		parts [][]uint64
		got   int
	}
	asm := map[uint64]*assembly{}
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("kvindex: snapshot of %s: %w", p.name, err)
		}
		m, err := kvdelta.Decode(msg.Data)
		if err != nil || m.Type != kvdelta.TypeSnapshot || m.Provider != p.name || (epoch != 0 && m.Epoch != epoch) {
			p.malformed.Add(1)
			continue
		}
		a := asm[m.Epoch]
		if a == nil {
			a = &assembly{snap: snapshot{epoch: m.Epoch, seq: m.Seq, status: m.Status}, parts: make([][]uint64, m.Parts)}
			asm[m.Epoch] = a
		}
		if len(a.parts) != m.Parts || a.snap.seq != m.Seq {
			return nil, fmt.Errorf("kvindex: snapshot of %s: inconsistent parts", p.name)
		}
		if a.parts[m.Part] == nil {
			a.got++
			a.parts[m.Part] = m.IDs
			if m.IDs == nil {
				a.parts[m.Part] = []uint64{}
			}
		}
		if a.got == len(a.parts) {
			a.snap.ids = slices.Concat(a.parts...)
			a.snap.parts = len(a.parts)
			return &a.snap, nil
		}
	}
}

// install replaces the state by snap and applies the buffered deltas on
// top, returning how many. It returns false when the followed epoch changed
// meanwhile.
func (p *provider) install(snap *snapshot) (applied int, ok bool) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.epoch != 0 && p.epoch != snap.epoch {
		return 0, false
	}
	if p.epoch == 0 || p.statusAt.IsZero() {
		p.status, p.statusAt = snap.status, now
	}
	p.epoch = snap.epoch
	p.blocks.Replace(snap.ids)
	p.seq, p.loaded = snap.seq, true
	p.resyncs.Add(1)
	pending := p.pending
	p.pending = nil
	for i, m := range pending {
		if m.Epoch != p.epoch || m.Seq <= p.seq {
			continue
		}
		if m.Seq != p.seq+1 {
			p.gaps.Add(1)
			p.pending = append(p.pending[:0], pending[i:]...)
			return applied, true // still resyncing: the loop fetches again
		}
		p.apply(m)
		applied++
	}
	p.resyncing = false
	return applied, true
}
