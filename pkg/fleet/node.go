package fleet

import (
	"crypto/rand"
	"encoding/hex"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"rolter.dev/pkg/routing"
	fleetv1 "rolter.dev/proto/rolter/fleet/v1"
)

// Defaults of [Options].
const (
	DefaultGroup         = "default"
	DefaultFlushInterval = 25 * time.Millisecond
	DefaultLoadInterval  = 100 * time.Millisecond
	// DefaultQueueInterval is how often queued prefill is published: a
	// prefill lasts tens of milliseconds, so a view 25 ms old (the flush)
	// misses much of what the peers queued since (docs/routing.md measures
	// 1, 5, 10 and 25 ms).
	DefaultQueueInterval = 5 * time.Millisecond
	// loadTTLIntervals is how many load intervals a report stays valid: a
	// peer's counts survive two lost reports.
	loadTTLIntervals = 3
)

// Options configure a Node; zero fields take the defaults.
type Options struct {
	// ID names this node to its peers; a random one by default.
	ID string
	// Group separates fleets sharing one NATS.
	Group string
	// FlushInterval is how often batched observations are published.
	FlushInterval time.Duration
	// LoadInterval is how often in-flight counts are published.
	LoadInterval time.Duration
	// QueueInterval is how often queued prefill is published.
	QueueInterval time.Duration
}

func (o Options) withDefaults() Options {
	if o.ID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.ID = hex.EncodeToString(b[:])
	}
	if o.Group == "" {
		o.Group = DefaultGroup
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.LoadInterval <= 0 {
		o.LoadInterval = DefaultLoadInterval
	}
	if o.QueueInterval <= 0 {
		o.QueueInterval = DefaultQueueInterval
	}
	return o
}

// Affinity is what a node needs of a balancer that shares its prefix
// affinity (rolter.dev/pkg/routing.SharedAffinity).
type Affinity interface {
	RecordLocal(target int, prompt string, dst []uint64) []uint64
	FoldPeer(target int, chunks []uint64)
	ExportShared(target int, dst []uint64, limit int) []uint64
}

// Queue is what a node needs of a balancer that shares the prefill it has
// queued at each target (rolter.dev/pkg/routing.SharedQueue).
type Queue interface {
	LocalQueue(target int) routing.QueueState
	FoldPeerQueue(peer string, target int, q routing.QueueState, ttl time.Duration)
	SetPlace(rank, size int)
}

// Speculation is what a node needs of a queue-sharing balancer that also
// shares the KV blocks its picks speculated
// (rolter.dev/pkg/routing.SharedSpeculation); they ride on its queue
// reports.
type Speculation interface {
	TakeSpeculated(target int, dst []uint64) []uint64
	FoldPeerSpeculated(target int, ids []uint64)
}

// Arrivals is what a node needs of a queue-sharing balancer that also
// shares when its requests arrive (rolter.dev/pkg/routing.SharedArrivals);
// they ride on its queue reports.
type Arrivals interface {
	TakeArrivals(dst []time.Duration) []time.Duration
	FoldPeerArrivals(ages []time.Duration)
}

// Node is one proxy's membership in the fleet. Its methods are safe for
// concurrent use.
type Node struct {
	opts Options

	mu      sync.Mutex
	routes  map[routeKey]*Route
	peers   map[string]*peer
	obsSeq  uint64
	loadSeq uint64
	// sent are the send times of the node's latest load reports, by seq
	// modulo its length, for the peers' echoes of them.
	sent [sentLoads]sentLoad
	// trip is how late the slowest live peer hears this node's messages
	// (half its measured round trip; 0: none measured).
	trip time.Duration
	// clock is how far the reference proxy's wall clock runs ahead of
	// this node's (see updateClock), as last handed to the balancers.
	clock time.Duration

	// unwarmed is signalled when a route is bound for the first time;
	// queuing when a route's balancer starts sharing its queue.
	unwarmed, queuing chan struct{}
	// urgent is signalled when a balancer asks for the queue reports to
	// leave at once (routing.ReportTrigger).
	urgent chan struct{}

	stats counters
}

type routeKey struct {
	name   string
	layout uint64
}

// peer is what a node knows of one other node. Guarded by Node.mu.
type peer struct {
	lastObs   uint64
	heard     time.Time
	loads     map[routeKey][]uint32
	loadsTill time.Time
	// loadSeq and loadAt are the peer's latest load report and when it
	// came, for this node's echo of it.
	loadSeq uint64
	loadAt  time.Time
	// rtt is the smoothed round trip to the peer (0: none measured).
	rtt time.Duration
	// offset is how far the peer's wall clock runs ahead of this node's,
	// smoothed (see sampleOffset); offsetSeen, whether it was measured.
	offset     time.Duration
	offsetSeen bool
}

// live reports whether p's latest load report still holds at now.
func (p *peer) live(now time.Time) bool { return p.loads != nil && now.Before(p.loadsTill) }

// sentLoad is one of the node's load reports: its seq and send time.
type sentLoad struct {
	seq uint64
	at  time.Time
}

// sentLoads is how many of its load reports a node remembers: a peer echoes
// the latest it heard, one or two load intervals old.
const sentLoads = 8

// maxEchoes bounds the echoes in a load report, one a peer: in a fleet of
// more proxies, those past the first 255 by id hear no echo from this
// node (their trip is measured from the others').
const maxEchoes = 255

// Route is one route's shared state on a node.
type Route struct {
	node *Node
	key  routeKey
	n    int

	mu     sync.Mutex
	queued []localPick // picks not yet recorded and published

	aff      atomic.Pointer[affinityBox]
	queue    atomic.Pointer[queueBox]
	own      atomic.Pointer[func(int) int]
	peerLoad []atomic.Int64
	// place is this node's rank among the nodes serving the route (its own
	// and the peers whose loads for it are live, ordered by id) and their
	// number, packed as rank<<32 | size; handed to the queue balancer.
	place atomic.Uint64

	// reported marks the targets whose last published queue was not empty
	// (so an emptied queue is published once, clearing the peers' copy).
	// Only TakeQueues touches it.
	reported []bool
}

type affinityBox struct{ Affinity }

type queueBox struct{ Queue }

// localPick is one local routing decision waiting for the flush.
type localPick struct {
	target int
	prompt string
}

// maxQueued bounds a route's picks waiting for the flush (at 25 ms, 160,000
// requests/s); past it picks are dropped and counted, never blocking a
// request.
const maxQueued = 4096

// NewNode returns a node with no routes.
func NewNode(o Options) *Node {
	return &Node{
		opts:     o.withDefaults(),
		routes:   make(map[routeKey]*Route),
		peers:    make(map[string]*peer),
		unwarmed: make(chan struct{}, 1),
		queuing:  make(chan struct{}, 1),
		urgent:   make(chan struct{}, 1),
	}
}

// ID returns the node's id.
func (n *Node) ID() string { return n.opts.ID }

// Options returns the node's options with defaults applied.
func (n *Node) Options() Options { return n.opts }

// Bind returns the node's state for a route of targets targets with the
// given layout digest, creating it when the node had none (and then asking
// peers, through Run, for a snapshot to warm up from).
func (n *Node) Bind(name string, layout uint64, targets int) *Route {
	k := routeKey{name, layout}
	n.mu.Lock()
	defer n.mu.Unlock()
	if r := n.routes[k]; r != nil && r.n == targets {
		return r
	}
	r := &Route{node: n, key: k, n: targets, peerLoad: make([]atomic.Int64, targets), reported: make([]bool, targets)}
	n.routes[k] = r
	n.sumLoads(r, time.Now())
	signal(n.unwarmed)
	return r
}

// Retain forgets every route but keep (the routes of the config now in
// force).
func (n *Node) Retain(keep []*Route) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, r := range n.routes {
		if !slices.Contains(keep, r) {
			delete(n.routes, k)
		}
	}
}

// SetAffinity connects the route's balancer; nil disconnects it.
func (r *Route) SetAffinity(a Affinity) {
	if a == nil {
		r.aff.Store(nil)
		return
	}
	r.aff.Store(&affinityBox{a})
}

// SetQueue connects the route's balancer's queue; nil disconnects it.
func (r *Route) SetQueue(q Queue) {
	if q == nil {
		r.queue.Store(nil)
		return
	}
	r.queue.Store(&queueBox{q})
	p := r.place.Load()
	q.SetPlace(int(p>>32), max(int(uint32(p)), 1))
	r.node.mu.Lock()
	if rp, ok := q.(routing.ReportPacer); ok {
		// How often the peers report (its turns in a burst): a fleet's
		// proxies share their options.
		rp.SetReportInterval(r.node.opts.QueueInterval)
		rp.SetReportTrip(r.node.trip)
	}
	if fc, ok := q.(routing.FleetClock); ok {
		fc.SetFleetClockOffset(r.node.clock)
	}
	if rt, ok := q.(routing.ReportTrigger); ok {
		urgent := r.node.urgent
		rt.SetReportTrigger(func() { signal(urgent) })
	}
	r.node.mu.Unlock()
	signal(r.node.queuing)
}

// Urgent is signalled when a balancer asks for the node's queue reports
// to leave at once (routing.ReportTrigger): Run publishes FlushUrgent on
// it; a caller that drives the node itself (the routing simulator) does.
func (n *Node) Urgent() <-chan struct{} { return n.urgent }

// sharesQueues reports whether a bound route's balancer shares its queue.
func (n *Node) sharesQueues() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, r := range n.routes {
		if r.queue.Load() != nil {
			return true
		}
	}
	return false
}

// SetOwnLoad sets how the node reads its own in-flight count of a target,
// for its load reports.
func (r *Route) SetOwnLoad(f func(target int) int) { r.own.Store(&f) }

// Record queues a local pick of target for prompt until the next flush,
// which records it in the balancer's shared index and publishes what is new
// (routing.Spec.Share). It only appends: the hashing and the index work run
// on the flush, off the request path.
func (r *Route) Record(target int, prompt string) {
	if r == nil || target < 0 || target >= r.n || prompt == "" {
		return
	}
	r.mu.Lock()
	if len(r.queued) >= maxQueued {
		r.mu.Unlock()
		r.node.stats.overflow.Add(1)
		return
	}
	r.queued = append(r.queued, localPick{target, prompt})
	r.mu.Unlock()
}

// PeerLoad is the sum of the peers' latest in-flight counts for target
// (0 for a nil route or a target out of range). It does not lock.
func (r *Route) PeerLoad(target int) int {
	if r == nil || target < 0 || target >= len(r.peerLoad) {
		return 0
	}
	return int(r.peerLoad[target].Load())
}

// boundRoutes returns the routes bound now.
func (n *Node) boundRoutes() []*Route {
	n.mu.Lock()
	defer n.mu.Unlock()
	routes := make([]*Route, 0, len(n.routes))
	for _, r := range n.routes {
		routes = append(routes, r)
	}
	return routes
}

// boundBox returns the route bound as (name, layout) and the balancer box
// get reads from it, or nils after counting the entry as for an unknown
// route (none bound, another layout, or no balancer connected). n.mu must
// be held.
func boundBox[B any](n *Node, name string, layout uint64, get func(*Route) *B) (*Route, *B) {
	if r := n.routes[routeKey{name, layout}]; r != nil {
		if box := get(r); box != nil {
			return r, box
		}
	}
	n.stats.unknownRoute.Add(1)
	return nil, nil
}

// TakeObservations records the picks queued since the last call in their
// balancers' shared indexes and returns what is new as the next batch, or
// nil when nothing is. A route whose balancer shares its queue is left to
// TakeQueues, which sends its picks with its queue reports.
func (n *Node) TakeObservations() *fleetv1.Observations {
	routes := n.boundRoutes()
	msg := &fleetv1.Observations{Proxy: n.opts.ID}
	for _, r := range routes {
		if r.queue.Load() != nil {
			continue
		}
		if rc := n.takeChunks(r); rc != nil {
			msg.Routes = append(msg.Routes, rc)
		}
	}
	if len(msg.Routes) == 0 {
		return nil
	}
	n.mu.Lock()
	n.obsSeq++
	msg.Seq = n.obsSeq
	n.mu.Unlock()
	return msg
}

// takeChunks records r's picks queued since the last call in its
// balancer's shared index and returns the chunks new there, or nil.
func (n *Node) takeChunks(r *Route) *fleetv1.RouteChunks {
	r.mu.Lock()
	picks := r.queued
	r.queued = nil
	r.mu.Unlock()
	box := r.aff.Load()
	if len(picks) == 0 || box == nil {
		return nil
	}
	perTarget := make([][]uint64, r.n)
	for _, p := range picks {
		perTarget[p.target] = box.RecordLocal(p.target, p.prompt, perTarget[p.target])
	}
	rc := &fleetv1.RouteChunks{Route: r.key.name, Layout: r.key.layout}
	for t, chunks := range perTarget {
		if len(chunks) > 0 {
			rc.Targets = append(rc.Targets, &fleetv1.TargetChunks{Target: uint32(t), Chunks: chunks})
		}
	}
	if len(rc.Targets) == 0 {
		return nil
	}
	return rc
}

// TakeQueues returns the queued prefill of every route whose balancer
// shares it (see takeQueues), with the chunks of the picks it made since
// (takeChunks), as the next batch, or nil when there is none. The picks
// ride with the queue reports, not the observation flush, so that a peer
// sees where a new prefix went within a queue interval: predicted_ttft's
// turns in a burst wait two of them, and through 4 proxies without KV
// events gsp went from 0.81–0.88× of one proxy's TTFT mean with the picks
// on the 25 ms flush to 0.94–1.00× (seeds 1–3; docs/routing.md, turns in
// a burst).
func (n *Node) TakeQueues() *fleetv1.Observations {
	routes := n.boundRoutes()
	msg := &fleetv1.Observations{Proxy: n.opts.ID}
	for _, r := range routes {
		if r.queue.Load() == nil {
			continue
		}
		if rc := n.takeChunks(r); rc != nil {
			msg.Routes = append(msg.Routes, rc)
		}
		if rq := n.takeQueues(r); rq != nil {
			msg.Queues = append(msg.Queues, rq)
		}
	}
	if len(msg.Queues) == 0 && len(msg.Routes) == 0 {
		return nil
	}
	msg.QueueTtlMs = uint32(max(queueTTLIntervals*n.opts.QueueInterval/time.Millisecond, 1))
	n.mu.Lock()
	n.obsSeq++
	msg.Seq = n.obsSeq
	n.mu.Unlock()
	return msg
}

// FlushQueues encodes TakeQueues; nil when there is nothing to publish.
func (n *Node) FlushQueues() []byte {
	msg := n.TakeQueues()
	if msg == nil {
		return nil
	}
	b := encode(msg)
	n.stats.published(len(b), msg)
	return b
}

// FlushUrgent is FlushQueues for a balancer that asked for its queue
// report at once (Urgent), counted as such.
func (n *Node) FlushUrgent() []byte {
	b := n.FlushQueues()
	if b != nil {
		n.stats.urgentReports.Add(1)
	}
	return b
}

// queueTTLIntervals is how many queue intervals a queue report stays
// valid: a non-empty queue is reported every interval, so it survives two
// lost reports, and a peer that went silent stops counting soon after.
const queueTTLIntervals = 3

// maxQueueTTL caps the validity a peer claims for its queue reports, so
// that a misconfigured or hostile peer cannot pin a stale queue: a real
// one re-reports a non-empty queue every queue interval.
const maxQueueTTL = 10 * time.Second

// takeQueues returns r's balancer's queue at each target that is not empty,
// or was at the last report, or saw a first token since it (which tells
// the peers when the target began serving their next request); nil when
// there is none. Only TakeQueues calls it, from one goroutine.
func (n *Node) takeQueues(r *Route) *fleetv1.RouteQueues {
	box := r.queue.Load()
	if box == nil {
		return nil
	}
	spec, _ := box.Queue.(Speculation)
	var rq *fleetv1.RouteQueues
	for t := range r.n {
		q := box.LocalQueue(t)
		var blocks []uint64
		if spec != nil {
			blocks = spec.TakeSpeculated(t, nil)
		}
		// Within two intervals, so that a late tick still reports it (a
		// report twice is harmless: peers keep the latest leave).
		recent := q.LeaveAge >= 0 && q.LeaveAge < 2*n.opts.QueueInterval
		if q.Requests <= 0 && !r.reported[t] && !recent && len(blocks) == 0 {
			continue
		}
		r.reported[t] = q.Requests > 0
		tq := &fleetv1.TargetQueue{Target: uint32(t), Requests: uint32(max(q.Requests, 0)), Tokens: uint64(max(q.Tokens, 0)),
			HeadTokens: uint64(max(q.HeadTokens, 0)), HeadAgeUs: uint64(max(q.HeadAge, 0) / time.Microsecond)}
		if q.LeaveAge >= 0 {
			tq.LeaveAgeUs = proto.Uint64(uint64(q.LeaveAge / time.Microsecond))
		}
		if q.AnswerAge >= 0 {
			tq.AnswerAgeUs = proto.Uint64(uint64(q.AnswerAge / time.Microsecond))
		}
		tq.KvBlocks = blocks
		if rq == nil {
			rq = &fleetv1.RouteQueues{Route: r.key.name, Layout: r.key.layout}
		}
		rq.Targets = append(rq.Targets, tq)
	}
	if ar, ok := box.Queue.(Arrivals); ok {
		if ages := ar.TakeArrivals(nil); len(ages) > 0 {
			if rq == nil {
				rq = &fleetv1.RouteQueues{Route: r.key.name, Layout: r.key.layout}
			}
			ages = ages[max(0, len(ages)-routing.MaxReportedArrivals):]
			rq.ArrivalAgesUs = make([]uint32, len(ages))
			for i, a := range ages {
				rq.ArrivalAgesUs[i] = uint32(min(a/time.Microsecond, math.MaxUint32))
			}
		}
	}
	return rq
}

// FlushObservations encodes TakeObservations; nil when there is nothing to
// publish.
func (n *Node) FlushObservations() []byte {
	msg := n.TakeObservations()
	if msg == nil {
		return nil
	}
	b := encode(msg)
	n.stats.published(len(b), msg)
	return b
}

// LoadReport encodes this node's in-flight counts for every bound route,
// sent now.
func (n *Node) LoadReport() []byte { return n.LoadReportAt(time.Now()) }

// LoadReportAt encodes this node's in-flight counts for every bound route,
// sent at now, with its echoes of the peers' latest load reports.
func (n *Node) LoadReportAt(now time.Time) []byte {
	n.mu.Lock()
	n.loadSeq++
	n.sent[n.loadSeq%sentLoads] = sentLoad{n.loadSeq, now}
	msg := &fleetv1.Loads{Proxy: n.opts.ID, Seq: n.loadSeq, TtlMs: uint32(loadTTLIntervals * n.opts.LoadInterval / time.Millisecond), SentUnixUs: now.UnixMicro()}
	for id, p := range n.peers {
		if held := now.Sub(p.loadAt); p.loadSeq != 0 && held >= 0 && held < loadTTLIntervals*n.opts.LoadInterval {
			msg.Echoes = append(msg.Echoes, &fleetv1.Echo{Proxy: id, Seq: p.loadSeq, HeldUs: uint64(held / time.Microsecond)})
		}
	}
	slices.SortFunc(msg.Echoes, func(a, b *fleetv1.Echo) int { return strings.Compare(a.Proxy, b.Proxy) })
	msg.Echoes = msg.Echoes[:min(len(msg.Echoes), maxEchoes)]
	for _, r := range n.routes {
		own := r.own.Load()
		rl := &fleetv1.RouteLoads{Route: r.key.name, Layout: r.key.layout, InFlight: make([]uint32, r.n)}
		if own != nil {
			for i := range rl.InFlight {
				rl.InFlight[i] = uint32(max((*own)(i), 0))
			}
		}
		msg.Routes = append(msg.Routes, rl)
	}
	n.mu.Unlock()
	b := encode(msg)
	n.stats.bytesPublished.Add(uint64(len(b)))
	return b
}

// HandleObservations folds a peer's batch. Malformed batches, a node's own
// and entries for unknown routes or layouts are counted and dropped.
func (n *Node) HandleObservations(data []byte, now time.Time) {
	msg, err := DecodeObservations(data)
	if err != nil {
		n.stats.malformed.Add(1)
		return
	}
	if msg.Proxy == n.opts.ID {
		return
	}
	n.mu.Lock()
	p := n.peer(msg.Proxy, now)
	if p.lastObs != 0 && msg.Seq > p.lastObs+1 {
		n.stats.lostBatches.Add(msg.Seq - p.lastObs - 1)
	}
	p.lastObs = max(p.lastObs, msg.Seq)
	n.mu.Unlock()
	n.stats.batchesReceived.Add(1)
	n.fold(msg.Routes)
	n.foldQueues(msg.Proxy, msg.Queues, min(time.Duration(msg.QueueTtlMs)*time.Millisecond, maxQueueTTL))
}

// foldQueues hands a peer's queue reports to the balancers of the routes
// this node has with the same layout, like fold.
func (n *Node) foldQueues(peer string, queues []*fleetv1.RouteQueues, ttl time.Duration) {
	type fold struct {
		q      Queue
		target int
		state  routing.QueueState
		blocks []uint64
	}
	type arrivals struct {
		a    Arrivals
		ages []time.Duration
	}
	var folds []fold
	var arrived []arrivals
	n.mu.Lock()
	// The arrivals' ages were measured at the peer's flush, a trip before
	// now: fleetBursts lines them up with this proxy's own. (The queues'
	// ages, aged alike, moved nothing in rolter-sim: docs/routing.md.)
	var trip time.Duration
	if p := n.peers[peer]; p != nil {
		trip = p.rtt / 2
	}
	for _, rq := range queues {
		r, box := boundBox(n, rq.Route, rq.Layout, func(r *Route) *queueBox { return r.queue.Load() })
		if box == nil {
			continue
		}
		if a, ok := box.Queue.(Arrivals); ok && len(rq.ArrivalAgesUs) > 0 {
			ages := make([]time.Duration, len(rq.ArrivalAgesUs))
			for i, us := range rq.ArrivalAgesUs {
				ages[i] = micros(uint64(us)) + trip
			}
			arrived = append(arrived, arrivals{a, ages})
		}
		for _, tq := range rq.Targets {
			if int(tq.Target) >= r.n {
				n.stats.malformed.Add(1)
				continue
			}
			st := routing.QueueState{Requests: int(tq.Requests), Tokens: clampInt(tq.Tokens), HeadTokens: clampInt(tq.HeadTokens),
				HeadAge: micros(tq.HeadAgeUs), LeaveAge: -1, AnswerAge: -1}
			if tq.LeaveAgeUs != nil {
				st.LeaveAge = micros(*tq.LeaveAgeUs)
			}
			if tq.AnswerAgeUs != nil {
				st.AnswerAge = micros(*tq.AnswerAgeUs)
			}
			folds = append(folds, fold{box.Queue, int(tq.Target), st, tq.KvBlocks})
		}
	}
	n.mu.Unlock()
	for _, f := range folds {
		f.q.FoldPeerQueue(peer, f.target, f.state, ttl)
		if sp, ok := f.q.(Speculation); ok && len(f.blocks) > 0 {
			sp.FoldPeerSpeculated(f.target, f.blocks)
			n.stats.blocksSpeculated.Add(uint64(len(f.blocks)))
		}
	}
	for _, a := range arrived {
		a.a.FoldPeerArrivals(a.ages)
		n.stats.arrivals.Add(uint64(len(a.ages)))
	}
	n.stats.queueReports.Add(uint64(len(folds)))
}

// clampInt converts a count from the wire, capped at MaxInt32 (a queue of
// more tokens is a malformed report, not a real one).
func clampInt(v uint64) int { return int(min(v, math.MaxInt32)) }

// micros converts microseconds from the wire, capped at an hour (an older
// report is nonsense; a pending prefill is dropped after minutes).
func micros(us uint64) time.Duration {
	return time.Duration(min(us, uint64(time.Hour/time.Microsecond))) * time.Microsecond
}

// fold folds a peer's per-route hashes (a batch or a snapshot) into the
// balancers of the routes this node has with the same layout and returns
// how many hashes it folded. Entries for other routes or layouts, or for a
// target out of range, are counted and dropped. The folds run outside
// n.mu: a balancer's index takes its own lock.
func (n *Node) fold(routes []*fleetv1.RouteChunks) int {
	type fold struct {
		aff    Affinity
		target int
		chunks []uint64
	}
	var folds []fold
	n.mu.Lock()
	for _, rc := range routes {
		r, box := boundBox(n, rc.Route, rc.Layout, func(r *Route) *affinityBox { return r.aff.Load() })
		if box == nil {
			continue
		}
		for _, tc := range rc.Targets {
			if int(tc.Target) >= r.n {
				n.stats.malformed.Add(1)
				continue
			}
			folds = append(folds, fold{box.Affinity, int(tc.Target), tc.Chunks})
		}
	}
	n.mu.Unlock()
	folded := 0
	for _, f := range folds {
		f.aff.FoldPeer(f.target, f.chunks)
		folded += len(f.chunks)
	}
	n.stats.chunksFolded.Add(uint64(folded))
	return folded
}

// HandleLoads takes a peer's in-flight counts.
func (n *Node) HandleLoads(data []byte, now time.Time) {
	msg, err := DecodeLoads(data)
	if err != nil {
		n.stats.malformed.Add(1)
		return
	}
	if msg.Proxy == n.opts.ID {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stats.loadReports.Add(1)
	p := n.peer(msg.Proxy, now)
	p.loads = make(map[routeKey][]uint32, len(msg.Routes))
	for _, rl := range msg.Routes {
		p.loads[routeKey{rl.Route, rl.Layout}] = rl.InFlight
	}
	p.loadsTill = now.Add(time.Duration(msg.TtlMs) * time.Millisecond)
	// The latest heard, even a lower seq: a peer that kept its id through
	// a restart counts from 1 again.
	p.loadSeq, p.loadAt = msg.Seq, now
	for _, e := range msg.Echoes {
		if e.Proxy == n.opts.ID {
			n.sampleTrip(p, e, now)
			break
		}
	}
	n.sampleOffset(p, msg.SentUnixUs, now)
	for _, r := range n.routes {
		n.sumLoads(r, now)
	}
	n.updateTrip(now)
	n.updateClock(now)
}

// sampleTrip takes the round trip to p that its echo e of this node's load
// report shows: from sending the report to hearing the echo, less the time
// p held it. n.mu must be held.
func (n *Node) sampleTrip(p *peer, e *fleetv1.Echo, now time.Time) {
	sent := n.sent[e.Seq%sentLoads]
	if sent.seq != e.Seq || e.Seq == 0 {
		return // older than the reports remembered
	}
	// A round trip as long as a load report stays valid is not a fleet's
	// network (or is a peer's lie): taken, it would stretch every turn in a
	// burst (routing.ReportPacer) past the time the loads are believed.
	rtt := now.Sub(sent.at) - micros(e.HeldUs)
	if rtt < 0 || rtt >= loadTTLIntervals*n.opts.LoadInterval {
		return
	}
	if p.rtt == 0 {
		p.rtt = rtt
		return
	}
	// Smoothed as TCP smooths its round trip (RFC 6298's 1/8).
	p.rtt += (rtt - p.rtt) / 8
}

// maxOffset bounds a peer's measured clock offset (see sampleOffset).
const maxOffset = 24 * time.Hour

// sampleOffset takes how far p's wall clock runs ahead of this node's from
// a load report p sent at sentUs (its clock) and this node heard at now:
// the report was sent half a round trip before it came, as NTP reckons.
// predicted_ttft's turns in a burst draw the proxies' order per slot of the
// wall clock, so clocks apart by a good part of a turn (10 ms) would order
// the requests near a slot's edge differently at different proxies:
// updateClock sets every proxy's slots to one reference clock by these
// offsets. Nothing is taken before the round trip is measured, nor from a
// peer that does not send its clock. n.mu must be held.
func (n *Node) sampleOffset(p *peer, sentUs int64, now time.Time) {
	if sentUs == 0 || p.rtt == 0 {
		return
	}
	// Clamped to a day either way: a clock that far off is shown as a day,
	// and the smoothing's arithmetic cannot overflow.
	d := min(max(time.UnixMicro(sentUs).Add(p.rtt/2).Sub(now), -maxOffset), maxOffset)
	if !p.offsetSeen {
		p.offset, p.offsetSeen = d, true
		return
	}
	p.offset += (d - p.offset) / 8 // as the round trip is smoothed
}

// updateTrip sets the node's trip, half the longest smoothed round trip to
// a live peer, and hands it to the routes' balancers that pace their turns
// by it. n.mu must be held.
func (n *Node) updateTrip(now time.Time) {
	var rtt time.Duration
	for _, p := range n.peers {
		if p.live(now) {
			rtt = max(rtt, p.rtt)
		}
	}
	if rtt/2 == n.trip {
		return
	}
	n.trip = rtt / 2
	for _, r := range n.routes {
		if q := r.queue.Load(); q != nil {
			if rp, ok := q.Queue.(routing.ReportPacer); ok {
				rp.SetReportTrip(n.trip)
			}
		}
	}
}

// updateClock sets how far the fleet's reference clock runs ahead of this
// node's and hands it to the routes' balancers that read the fleet's clock
// (routing.FleetClock). The reference is the live proxy with the smallest
// id, this node included, so every proxy sets its slots to the same clock;
// its offset as sampleOffset measured it (0 while not measured, or when
// this node is the reference). n.mu must be held.
func (n *Node) updateClock(now time.Time) {
	ref, clock := n.opts.ID, time.Duration(0)
	for id, p := range n.peers {
		if p.live(now) && id < ref {
			ref, clock = id, 0
			if p.offsetSeen {
				clock = p.offset
			}
		}
	}
	if clock == n.clock {
		return
	}
	n.clock = clock
	for _, r := range n.routes {
		if q := r.queue.Load(); q != nil {
			if fc, ok := q.Queue.(routing.FleetClock); ok {
				fc.SetFleetClockOffset(clock)
			}
		}
	}
}

// Expire forgets the loads of peers not heard within their TTL, and peers
// silent for long. It is called every load interval.
func (n *Node) Expire(now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	changed := false
	for id, p := range n.peers {
		if p.loads != nil && !p.live(now) {
			p.loads = nil
			changed = true
		}
		if now.Sub(p.heard) > 10*loadTTLIntervals*n.opts.LoadInterval {
			delete(n.peers, id)
		}
	}
	if changed {
		for _, r := range n.routes {
			n.sumLoads(r, now)
		}
		n.updateTrip(now)
		n.updateClock(now)
	}
}

// peer returns the record of peer id, creating it. n.mu must be held.
func (n *Node) peer(id string, now time.Time) *peer {
	p := n.peers[id]
	if p == nil {
		p = &peer{}
		n.peers[id] = p
	}
	if now.After(p.heard) {
		p.heard = now
	}
	return p
}

// sumLoads recomputes r's peer loads and this node's place among the nodes
// serving r (see Route.place). n.mu must be held.
func (n *Node) sumLoads(r *Route, now time.Time) {
	rank, size := 0, 1
	for id, p := range n.peers {
		if _, ok := p.loads[r.key]; ok && p.live(now) {
			size++
			if id < n.opts.ID {
				rank++
			}
		}
	}
	if place := uint64(rank)<<32 | uint64(size); r.place.Swap(place) != place {
		if q := r.queue.Load(); q != nil {
			q.SetPlace(rank, size)
		}
	}
	for i := range r.peerLoad {
		var sum int64
		for _, p := range n.peers {
			if c := p.loads[r.key]; i < len(c) && p.live(now) {
				sum += int64(c[i])
			}
		}
		r.peerLoad[i].Store(sum)
	}
}

// snapshotOverhead is left for everything but the hashes in a snapshot.
const snapshotOverhead = 4 << 10

// SnapshotReply answers a peer's snapshot request with this node's shared
// index, at most maxBytes long; nil for a malformed request or one of its
// own.
func (n *Node) SnapshotReply(req []byte, maxBytes int) []byte {
	msg, err := DecodeSnapshotRequest(req)
	if err != nil {
		n.stats.malformed.Add(1)
		return nil
	}
	if msg.Proxy == n.opts.ID {
		return nil
	}
	n.mu.Lock()
	var routes []*Route
	targets := 0
	for _, r := range n.routes {
		if r.aff.Load() != nil && (len(msg.Routes) == 0 || slices.Contains(msg.Routes, r.key.name)) {
			routes = append(routes, r)
			targets += r.n
		}
	}
	n.mu.Unlock()
	limit := 1
	if targets > 0 {
		// 9 bytes per packed hash leaves room for the per-target framing.
		limit = max((maxBytes-snapshotOverhead)/9/targets, 1)
	}
	snap := &fleetv1.Snapshot{Proxy: n.opts.ID}
	for _, r := range routes {
		box := r.aff.Load()
		if box == nil {
			continue
		}
		rc := &fleetv1.RouteChunks{Route: r.key.name, Layout: r.key.layout}
		for t := range r.n {
			chunks := box.ExportShared(t, nil, limit+1)
			if len(chunks) > limit {
				chunks = chunks[1:]
				snap.Truncated = true
			}
			if len(chunks) > 0 {
				rc.Targets = append(rc.Targets, &fleetv1.TargetChunks{Target: uint32(t), Chunks: chunks})
			}
		}
		snap.Routes = append(snap.Routes, rc)
	}
	n.stats.snapshotsServed.Add(1)
	b := encode(snap)
	n.stats.bytesPublished.Add(uint64(len(b)))
	return b
}

// SnapshotRequest encodes a request for the shared index of every route
// this node has bound.
func (n *Node) SnapshotRequest() []byte {
	n.mu.Lock()
	req := &fleetv1.SnapshotRequest{Proxy: n.opts.ID}
	for k := range n.routes {
		if !slices.Contains(req.Routes, k.name) {
			req.Routes = append(req.Routes, k.name)
		}
	}
	n.mu.Unlock()
	slices.Sort(req.Routes)
	return encode(req)
}

// ApplySnapshot folds a peer's snapshot reply and reports how many hashes it
// folded.
func (n *Node) ApplySnapshot(data []byte, now time.Time) (int, error) {
	snap, err := DecodeSnapshot(data)
	if err != nil {
		n.stats.malformed.Add(1)
		return 0, err
	}
	folded := n.fold(snap.Routes)
	n.stats.snapshotsApplied.Add(1)
	n.mu.Lock()
	n.peer(snap.Proxy, now)
	n.mu.Unlock()
	return folded, nil
}
