package sim

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"rolter.dev/pkg/fleet"
	"rolter.dev/tests/vllmsim"
)

// Config describes the simulated fleet and client population.
type Config struct {
	// Replicas is the number of vLLM replicas (8).
	Replicas int
	// BlockSize and CapacityBlocks size each replica's prefix cache
	// (vllmsim defaults: 16 tokens, 4096 blocks).
	BlockSize      int
	CapacityBlocks int
	// MaxBatch is the number of requests a replica runs at once (vLLM's
	// max_num_seqs); more wait in its queue, first in first out.
	MaxBatch int
	// KVAdmission holds a request in its replica's queue until its
	// prompt's blocks fit beside those the running requests hold (vLLM's
	// scheduler: a waiting request that cannot be allocated stops the
	// admissions behind it). Off, a request is admitted whatever the cache
	// holds, and the blocks that find no room are computed but not cached.
	// A request alone on its replica is always admitted.
	KVAdmission bool
	// PrefillPerToken is the prefill time of one uncached prompt token, and
	// PrefillBase a fixed time per request (vllmsim's TTFT). Prefill is
	// compute bound, so a replica prefills one request at a time unless
	// ParallelPrefill (vllmsim's model: every running request prefills on
	// its own).
	PrefillPerToken time.Duration
	PrefillBase     time.Duration
	ParallelPrefill bool
	// DecodePerToken is the time between two output tokens (vllmsim's ITL).
	DecodePerToken time.Duration
	// DecodeGrowth lengthens an engine step for every other request running
	// at the replica when a request is admitted (vLLM's steps grow with the
	// batch, each reading every running request's KV cache): it is added to
	// DecodePerToken for each output token, and once to the prefill, for
	// the step that gives the first token (a long prompt's earlier chunk
	// steps carry the batch too; not modelled). 0, the default, keeps both
	// independent of what runs beside the request.
	DecodeGrowth time.Duration
	// Slowdown makes the fleet heterogeneous (older GPUs beside newer ones,
	// a replica with less tensor parallelism): replica i's prefill and
	// decode times are multiplied by Slowdown[i mod len(Slowdown)]. Empty:
	// every replica as configured.
	Slowdown []float64
	// Proxies is the number of proxies, each with its own balancer state and
	// its own in-flight counts; every request goes to a uniformly random one
	// (an L4 spread).
	Proxies int
	// Concurrency overrides the workload's number of closed-loop clients.
	Concurrency int
	// Ramp > 0 starts the closed loop's clients one by one, evenly over the
	// ramp, instead of all at time 0 (a load generator's ramp-up); with
	// several proxies an all-at-once start is a burst no proxy can hear of
	// from another in time.
	Ramp time.Duration
	// Rate > 0 replaces the closed loop by open-loop Poisson arrivals of
	// sessions per second (later turns still follow their predecessor).
	Rate float64
	// Seed drives every random choice of the simulator and of the peers'
	// policies.
	Seed uint64
	// SessionKeys sends each session's x-session-id.
	SessionKeys bool
	// KVEventDelay is how long a replica's KV cache change takes to reach
	// the proxies' indexes (precise_cache_aware, llmd_precise): the engine's
	// event publishing plus the trip through the watcher and NATS. Every
	// proxy receives every event after the same delay. Negative: events are
	// never delivered (a broken event path).
	KVEventDelay time.Duration
	// Share makes the proxies share their routing state (prefix
	// observations and in-flight counts) through pkg/fleet, as rolter-proxy
	// --nats does; only rolter's strategies share. ShareDelay is a message's
	// trip from one proxy to the others, ShareFlush, ShareQueueInterval
	// and ShareLoadInterval how often each proxy publishes observations,
	// queued prefill (predicted_ttft) and loads (zero: the defaults, 2 ms,
	// 25 ms, 5 ms and 100 ms).
	Share                                                         bool
	ShareDelay, ShareFlush, ShareQueueInterval, ShareLoadInterval time.Duration
	// ClockSkew sets the proxies' wall clocks apart: each reads the
	// virtual time plus an offset drawn uniformly from [0, ClockSkew) (a
	// fleet without NTP). Only predicted_ttft's turns read it; 0: every
	// proxy reads the same time.
	ClockSkew time.Duration
	// Progress, if set, is called once per completed request.
	Progress func()
}

// DefaultConfig returns the default fleet: 8 replicas with the vLLM
// simulator's cache (16-token blocks, 4096 blocks = 65,536 tokens each), 64
// running requests per replica, 50 µs per uncached prompt token (20,000
// tokens/s), 5 ms per request, 20 ms per output token, KV events delivered
// 50 ms after the change.
func DefaultConfig() Config {
	return Config{
		Replicas: 8, BlockSize: vllmsim.DefaultBlockSize, CapacityBlocks: vllmsim.DefaultCapacityBlocks,
		MaxBatch: 64, PrefillPerToken: 50 * time.Microsecond, PrefillBase: 5 * time.Millisecond,
		DecodePerToken: 20 * time.Millisecond, Proxies: 1, Seed: 1, KVEventDelay: DefaultKVEventDelay,
	}
}

// DefaultKVEventDelay is Config.KVEventDelay's default. It is pessimistic:
// docs/benchmarks.md measures 0.2 ms (p50) to 2 ms (p99) from the ZMQ socket
// to a proxy's index, and vLLM publishes a step's events at the end of the
// step, tens of milliseconds.
const DefaultKVEventDelay = 50 * time.Millisecond

func (c *Config) validate() error {
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Replicas < 1 || c.Replicas > 256, "replicas: %d, want 1..256", c.Replicas)
	check(c.BlockSize < 1, "block size: %d, want >= 1", c.BlockSize)
	check(c.CapacityBlocks < 1, "capacity: %d blocks, want >= 1", c.CapacityBlocks)
	check(c.MaxBatch < 1, "max batch: %d, want >= 1", c.MaxBatch)
	check(c.PrefillPerToken < 0 || c.PrefillBase < 0 || c.DecodePerToken < 0 || c.DecodeGrowth < 0, "negative service time")
	for _, f := range c.Slowdown {
		check(!(f > 0) || math.IsInf(f, 0), "slowdown: %v, want a finite factor > 0", f)
	}
	check(c.Proxies < 1, "proxies: %d, want >= 1", c.Proxies)
	check(c.ClockSkew < 0, "clock skew: %v, want >= 0", c.ClockSkew)
	check(c.Concurrency < 0, "concurrency: %d, want >= 0", c.Concurrency)
	check(c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0), "rate: %v, want a finite number >= 0", c.Rate)
	return errors.Join(errs...)
}

// ReplicaStats are one replica's totals.
type ReplicaStats struct {
	Requests     int           `json:"requests"`
	PromptTokens int64         `json:"prompt_tokens"`
	CachedTokens int64         `json:"cached_tokens"`
	Busy         time.Duration `json:"busy_ns"`
	// InflightArea is the time integral of the replica's requests in flight
	// (waiting or running), in request-seconds.
	InflightArea float64 `json:"inflight_area"`
}

// Result is one strategy's run on one workload.
type Result struct {
	Strategy string
	Workload string
	Proxies  int
	// Shared reports whether the proxies shared their routing state
	// (Config.Share with several proxies and a rolter strategy).
	Shared   bool
	Requests int
	// PromptTokens and CachedTokens add up every request's prompt tokens and
	// the prefix-cache hits the replicas reported.
	PromptTokens, CachedTokens int64
	// HitRate is CachedTokens / PromptTokens.
	HitRate float64
	// LoadImbalance is max/mean over replicas of the busy time: the prefill
	// and decode time of the requests each replica served.
	LoadImbalance float64
	// InflightImbalance is max/mean of the time-averaged requests in flight.
	InflightImbalance float64
	// TTFT statistics: from the client's send to the first token.
	TTFTMean, TTFTP50, TTFTP99 time.Duration
	// LatencyMean is the mean time from the client's send to the last token.
	LatencyMean time.Duration
	// Makespan runs from the first send to the last completion.
	Makespan time.Duration
	// Throughput is completed requests per second of makespan; OutputTPS
	// the output tokens per second.
	Throughput, OutputTPS float64
	// Replicas has per-replica totals.
	Replicas []ReplicaStats
	// Decisions sums the balancers' decision counts over proxies (rolter
	// strategies that count them).
	Decisions map[string]uint64
}

// replica is one simulated vLLM replica.
type replica struct {
	cache       *vllmsim.Cache
	queue       []*Flight
	running     int
	inflight    int
	lastChange  time.Duration
	prefillFree time.Duration
	stats       ReplicaStats
}

type proxy struct {
	policy Policy
	loads  []int
	kv     kvConsumer // policy, when it reads the KV events
	holder holder     // policy, when its router can hold requests back
	held   []*Flight  // requests its router holds back, oldest first
}

// event kinds
const (
	evIssue = iota // a session's next turn is sent
	evReady        // a closed-loop session is ready for its next turn
	evJoin         // a closed-loop client starts (Config.Ramp)
	evTurn         // a deferred request's turn in a burst comes (deferrer)
	evFirstToken
	evDone
	evKV // a replica's KV events reach the proxies
	// sharing among proxies (share.go)
	evShareFlush
	evShareQueue
	evShareLoad
	evShareDeliver
	evScrape // a metrics scrape of every replica (metricsScraper)
)

type event struct {
	at    time.Duration
	seq   uint64
	kind  uint8
	s     *sessionState
	f     *Flight
	kv    *kvBatch
	share *shareMsg
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type sessionState struct {
	s    *Session
	next int // next turn to send
}

// run is the state of one simulation.
type run struct {
	cfg      Config
	strategy Strategy
	w        *Workload
	now      time.Duration
	seq      uint64
	events   eventQueue
	rng      *rand.Rand
	replicas []*replica
	proxies  []*proxy
	caches   []*vllmsim.Cache
	waiting  []int
	running  []int     // per replica, requests holding a batch slot (View.Running)
	usage    []float64 // replicas' KV cache usage (View.KVUsage)
	// scraped copies of waiting and usage (View.Scraped*), refreshed every
	// scrapeEvery when a policy reads scraped metrics
	scrapedWaiting []int
	scrapedRunning []int
	scrapedAt      time.Duration
	scrapedUsage   []float64
	scrapeEvery    time.Duration
	total          int              // turns in the workload
	queued         []map[uint64]int // View.Queued, when a policy is a queueReader
	watchers       []*kvWatcher     // per replica, when a policy reads KV events
	share          *sharing         // nil unless the proxies share state
	skew           []time.Duration  // each proxy's wall clock less the virtual time (Config.ClockSkew)

	closed     bool
	clients    int
	active     int
	ready      []*sessionState
	ttfts      []time.Duration
	first      time.Duration
	firstSet   bool
	last       time.Duration
	completed  int
	outputToks int64
	latencySum time.Duration // Σ send to completion
	deferred   uint64        // requests that waited for their turn (deferrer)
}

// Run simulates the workload under one strategy and returns its result.
// The workload is not modified; the same workload can be run with every
// strategy.
func Run(cfg Config, w *Workload, st Strategy) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	if st.New == nil {
		return Result{}, fmt.Errorf("strategy %q has no constructor", st.Name)
	}
	r := &run{cfg: cfg, strategy: st, w: w, rng: rand.New(rand.NewPCG(cfg.Seed, 0x73696d))}
	r.cfg.ShareDelay = cmp.Or(r.cfg.ShareDelay, DefaultShareDelay)
	r.cfg.ShareFlush = cmp.Or(r.cfg.ShareFlush, fleet.DefaultFlushInterval)
	r.cfg.ShareLoadInterval = cmp.Or(r.cfg.ShareLoadInterval, fleet.DefaultLoadInterval)
	r.cfg.ShareQueueInterval = cmp.Or(r.cfg.ShareQueueInterval, fleet.DefaultQueueInterval)
	events := false
	r.skew = make([]time.Duration, cfg.Proxies)
	if cfg.ClockSkew > 0 {
		for p := range r.skew {
			r.skew[p] = time.Duration(rand.New(rand.NewPCG(Key(cfg.Seed, uint64(p)), 0x736b6577)).Int64N(int64(cfg.ClockSkew)))
		}
	}
	for p := range cfg.Proxies {
		env := Env{Replicas: cfg.Replicas, BlockSize: cfg.BlockSize, CapacityBlocks: cfg.CapacityBlocks,
			Seed: Key(cfg.Seed, uint64(p)), Now: func() time.Duration { return r.now }, Proxy: p}
		if off := r.skew[p]; off != 0 {
			env.FleetNow = func() time.Duration { return r.now + off }
		}
		if r.shareEnabled() {
			r.newShareNode(p, &env)
		}
		pol, err := st.New(env)
		if err != nil {
			return Result{}, fmt.Errorf("strategy %q: %w", st.Name, err)
		}
		px := &proxy{policy: pol, loads: make([]int, cfg.Replicas)}
		if r.share != nil {
			r.bindShare(p, px)
		}
		px.kv, _ = pol.(kvConsumer)
		px.holder, _ = pol.(holder)
		if t, ok := pol.(*ttftPolicy); ok && t.src == nil {
			px.kv = nil // predicted_ttft:kv_events=0 reads no events
		}
		events = events || px.kv != nil
		if m, ok := pol.(metricsScraper); ok {
			r.scrapeEvery = m.scrapeInterval()
		}
		if _, ok := pol.(queueReader); ok && r.queued == nil {
			r.queued = make([]map[uint64]int, cfg.Replicas)
			for i := range r.queued {
				r.queued[i] = map[uint64]int{}
			}
		}
		r.proxies = append(r.proxies, px)
	}
	for i := range cfg.Replicas {
		// The event path only when a policy reads it: translating every
		// stored block costs time on the long traces.
		var l vllmsim.Listener
		if events {
			r.watchers = append(r.watchers, newKVWatcher())
			l = vllmsim.ListenerFunc(func(b []vllmsim.KVEvent) { r.kvEvents(i, b) })
		}
		c := vllmsim.NewCache(cfg.BlockSize, cfg.CapacityBlocks, l)
		r.replicas = append(r.replicas, &replica{cache: c})
		r.caches = append(r.caches, c)
	}
	r.waiting = make([]int, cfg.Replicas)
	r.running = make([]int, cfg.Replicas)
	r.usage = make([]float64, cfg.Replicas)
	if r.scrapeEvery > 0 {
		r.total = w.Requests()
		r.scrapedWaiting = make([]int, cfg.Replicas)
		r.scrapedRunning = make([]int, cfg.Replicas)
		r.scrapedUsage = make([]float64, cfg.Replicas)
	}
	if r.share != nil {
		r.joinShare()
	}
	r.start()
	if r.share != nil {
		r.startShare()
	}
	if r.scrapeEvery > 0 {
		r.push(0, evScrape, nil, nil)
	}
	for r.events.Len() > 0 {
		e := heap.Pop(&r.events).(event)
		r.now = e.at
		switch e.kind {
		case evIssue:
			r.issue(e.s)
		case evJoin:
			r.clients++
			r.fill()
		case evTurn:
			r.route(e.f, e.f.Proxy)
		case evReady:
			r.ready = append(r.ready, e.s)
			r.fill()
		case evFirstToken:
			r.firstToken(e.f)
			r.release()
		case evDone:
			r.done(e.f)
			r.release()
		case evShareFlush, evShareQueue, evShareLoad, evShareDeliver:
			r.shareEvent(e)
		case evScrape:
			copy(r.scrapedWaiting, r.waiting)
			copy(r.scrapedRunning, r.running)
			r.scrapedAt = r.now
			copy(r.scrapedUsage, r.usage)
			if r.completed < r.total { // scraping stops once all completed
				r.push(r.now+r.scrapeEvery, evScrape, nil, nil)
			}
		case evKV:
			for _, px := range r.proxies {
				if px.kv != nil {
					px.kv.applyKV(e.kv.replica, e.kv.ops)
				}
			}
		}
	}
	return r.result(), nil
}

func (r *run) push(at time.Duration, kind uint8, s *sessionState, f *Flight) {
	r.seq++
	heap.Push(&r.events, event{at: at, seq: r.seq, kind: kind, s: s, f: f})
}

// kvEvents receives a replica's cache events (synchronously, from the cache
// operation that made them): its watcher translates them at once, and the
// proxies get them Config.KVEventDelay later.
func (r *run) kvEvents(replica int, batch []vllmsim.KVEvent) {
	ops := r.watchers[replica].translate(batch)
	if len(ops) == 0 || r.cfg.KVEventDelay < 0 {
		return
	}
	r.seq++
	heap.Push(&r.events, event{at: r.now + r.cfg.KVEventDelay, seq: r.seq, kind: evKV, kv: &kvBatch{replica, ops}})
}

// start schedules the first turns: at the sessions' trace times, as a
// Poisson process, or through a closed loop of clients.
func (r *run) start() {
	hasStarts := len(r.w.Sessions) > 0 && r.w.Sessions[0].Start >= 0
	switch {
	case r.cfg.Rate > 0:
		at := time.Duration(0)
		for _, s := range r.w.Sessions {
			at += time.Duration(r.rng.ExpFloat64() / r.cfg.Rate * float64(time.Second))
			r.push(at, evIssue, &sessionState{s: s}, nil)
		}
	case r.cfg.Concurrency == 0 && r.w.Concurrency == 0 && hasStarts:
		for _, s := range r.w.Sessions {
			r.push(max(s.Start, 0), evIssue, &sessionState{s: s}, nil)
		}
	default:
		r.closed = true
		r.clients = r.cfg.Concurrency
		if r.clients == 0 {
			r.clients = r.w.Concurrency
		}
		if r.clients == 0 {
			r.clients = 1
		}
		for _, s := range r.w.Sessions {
			r.ready = append(r.ready, &sessionState{s: s})
		}
		if r.cfg.Ramp > 0 {
			// Client k joins at k/clients of the ramp instead of all at 0.
			total := r.clients
			r.clients = 0
			for k := range total {
				r.push(r.cfg.Ramp*time.Duration(k)/time.Duration(total), evJoin, nil, nil)
			}
			return
		}
		r.fill()
	}
}

// fill lets idle closed-loop clients pick up ready sessions in order.
func (r *run) fill() {
	for r.active < r.clients && len(r.ready) > 0 {
		s := r.ready[0]
		r.ready = r.ready[1:]
		r.active++
		r.issue(s)
	}
}

// issue sends a session's next turn through a proxy to a replica.
func (r *run) issue(s *sessionState) {
	t := s.s.Turns[s.next]
	req := &Request{Session: s.s, Turn: s.next, Messages: t.Messages, Output: max(t.Output, 1)}
	s.next++
	f := &Flight{Req: req, Issued: r.now}
	f.Ctx = RouteContext(req, r.cfg.SessionKeys)
	if r.strategy.TokenIDs {
		// What affinity.Build parses from x-rolter-vllm-token-ids, without
		// the round trip through text (TestTokenIDsHeader checks they agree).
		f.Ctx.TokenIDs = req.Tokens()
	}
	if !r.firstSet {
		r.first, r.firstSet = r.now, true
	}
	p := 0
	if len(r.proxies) > 1 {
		p = r.rng.IntN(len(r.proxies))
	}
	f.sess = s
	if d, ok := r.proxies[p].policy.(deferrer); ok {
		wait := d.Defer(f, r.view(p))
		r.urgentShare(p) // a burst's start asks for a report
		if wait > 0 {
			r.deferred++
			f.Proxy = p
			r.push(r.now+wait, evTurn, nil, f)
			return
		}
	}
	r.route(f, p)
}

// deferrer is a policy whose proxy may hold a request back for its turn
// in a burst before picking (routing.Deferrer).
type deferrer interface {
	Defer(f *Flight, v *View) time.Duration
}

// route hands f to proxy p's router: held back while it holds (holder),
// else dispatched.
func (r *run) route(f *Flight, p int) {
	px := r.proxies[p]
	if px.holder != nil && (len(px.held) > 0 || px.holder.holds()) {
		px.held = append(px.held, f)
		return
	}
	r.dispatch(f, p)
}

// release dispatches, oldest first, the requests each proxy's router held
// back for as long as it no longer holds.
func (r *run) release() {
	for p, px := range r.proxies {
		for len(px.held) > 0 && !px.holder.holds() {
			f := px.held[0]
			px.held = px.held[1:]
			r.dispatch(f, p)
		}
	}
}

// dispatch routes f through proxy p to a replica's queue.
func (r *run) dispatch(f *Flight, p int) {
	req := f.Req
	px := r.proxies[p]
	v := r.view(p)
	target := px.policy.Pick(f, v)
	if target < 0 || target >= len(r.replicas) {
		panic(fmt.Sprintf("sim: strategy %s picked replica %d of %d", r.strategy.Name, target, len(r.replicas)))
	}
	f.Proxy, f.Target, f.Depth = p, target, v.Loads[target]
	px.policy.Observe(target, f, v)
	px.loads[target]++
	r.urgentShare(p)

	rep := r.replicas[target]
	r.account(rep)
	rep.inflight++
	rep.queue = append(rep.queue, f)
	r.waiting[target]++
	if r.queued != nil {
		for _, h := range req.BlockHashes(r.cfg.BlockSize) {
			r.queued[target][h]++
		}
	}
	r.schedule(target)
}

// view is what proxy p's policy may look at now.
func (r *run) view(p int) *View {
	return &View{Now: r.now, Loads: r.fleetLoads(p, r.proxies[p].loads), Waiting: r.waiting, Running: r.running, KVUsage: r.usage,
		ScrapedWaiting: r.scrapedWaiting, ScrapedRunning: r.scrapedRunning, ScrapedAt: r.scrapedAt, ScrapedKVUsage: r.scrapedUsage, Caches: r.caches, Queued: r.queued,
		BlockSize: r.cfg.BlockSize}
}

// updateUsage refreshes replica i's KV cache usage: the blocks its running
// requests hold over its capacity, as vLLM reports kv_cache_usage_perc
// (cached blocks no request holds count as free).
func (r *run) updateUsage(i int) {
	c := r.replicas[i].cache
	r.usage[i] = float64(c.Stats().Pinned) / float64(c.Capacity())
}

// account adds the replica's in-flight area up to now.
func (r *run) account(rep *replica) {
	rep.stats.InflightArea += float64(rep.inflight) * (r.now - rep.lastChange).Seconds()
	rep.lastChange = r.now
}

// schedule admits waiting requests to free batch slots: the prefix cache
// serves what it holds, the rest is prefilled, then the output is decoded.
func (r *run) schedule(i int) {
	rep := r.replicas[i]
	for rep.running < r.cfg.MaxBatch && len(rep.queue) > 0 {
		f := rep.queue[0]
		if r.cfg.KVAdmission && rep.running > 0 && !rep.cache.Fits(f.Req.Tokens()) {
			break
		}
		rep.queue = rep.queue[1:]
		r.waiting[i]--
		rep.running++
		r.running[i]++
		if r.queued != nil {
			q := r.queued[i]
			for _, h := range f.Req.BlockHashes(r.cfg.BlockSize) {
				if q[h]--; q[h] <= 0 {
					delete(q, h)
				}
			}
		}
		toks := f.Req.Tokens()
		f.Cached, f.lease = rep.cache.Admit(toks)
		r.updateUsage(i)
		f.Started = r.now
		beside := time.Duration(rep.running-1) * r.cfg.DecodeGrowth // the batch's share of every step
		prefill := r.slow(i, r.cfg.PrefillBase+time.Duration(len(toks)-f.Cached)*r.cfg.PrefillPerToken+beside)
		end := r.now + prefill
		if !r.cfg.ParallelPrefill {
			end = max(r.now, rep.prefillFree) + prefill
			rep.prefillFree = end
		}
		decode := r.slow(i, time.Duration(f.Req.Output-1)*(r.cfg.DecodePerToken+beside))
		rep.stats.Busy += prefill + decode
		rep.stats.Requests++
		rep.stats.PromptTokens += int64(len(toks))
		rep.stats.CachedTokens += int64(f.Cached)
		r.push(end, evFirstToken, nil, f)
		r.push(end+decode, evDone, nil, f)
	}
}

// slow scales replica i's service time d by its Config.Slowdown.
func (r *run) slow(i int, d time.Duration) time.Duration {
	if len(r.cfg.Slowdown) == 0 {
		return d
	}
	return time.Duration(float64(d) * r.cfg.Slowdown[i%len(r.cfg.Slowdown)])
}

func (r *run) firstToken(f *Flight) {
	f.FirstToken = r.now
	r.ttfts = append(r.ttfts, r.now-f.Issued)
	if l, ok := r.proxies[f.Proxy].policy.(lifecycle); ok {
		l.FirstToken(f, r.now)
	}
}

func (r *run) done(f *Flight) {
	f.Done = r.now
	rep := r.replicas[f.Target]
	rep.cache.Release(f.lease)
	f.lease = nil
	r.updateUsage(f.Target)
	r.account(rep)
	rep.inflight--
	rep.running--
	r.running[f.Target]--
	px := r.proxies[f.Proxy]
	px.loads[f.Target]--
	if l, ok := px.policy.(lifecycle); ok {
		l.Done(f, r.now)
	}
	f.Req.release()
	f.Ctx.TokenIDs = nil
	r.completed++
	r.outputToks += int64(f.Req.Output)
	r.latencySum += r.now - f.Issued
	r.last = r.now
	if r.cfg.Progress != nil {
		r.cfg.Progress()
	}
	s := f.sess
	f.sess = nil
	if r.closed {
		r.active--
		if s.next < len(s.s.Turns) {
			r.push(r.now+s.s.Turns[s.next].Think, evReady, s, nil)
		}
	} else if s.next < len(s.s.Turns) {
		r.push(r.now+s.s.Turns[s.next].Think, evIssue, s, nil)
	}
	r.schedule(f.Target)
	if r.closed {
		r.fill()
	}
}

func (r *run) result() Result {
	res := Result{
		Strategy: r.strategy.Name, Workload: r.w.Name, Proxies: r.cfg.Proxies, Shared: r.share != nil, Requests: r.completed,
	}
	var busy, area []float64
	for _, rep := range r.replicas {
		r.account(rep)
		res.Replicas = append(res.Replicas, rep.stats)
		res.PromptTokens += rep.stats.PromptTokens
		res.CachedTokens += rep.stats.CachedTokens
		busy = append(busy, rep.stats.Busy.Seconds())
		area = append(area, rep.stats.InflightArea)
	}
	if res.PromptTokens > 0 {
		res.HitRate = float64(res.CachedTokens) / float64(res.PromptTokens)
	}
	res.LoadImbalance = maxOverMean(busy)
	res.InflightImbalance = maxOverMean(area)
	if len(r.ttfts) > 0 {
		slices.Sort(r.ttfts)
		var sum time.Duration
		for _, t := range r.ttfts {
			sum += t
		}
		res.TTFTMean = sum / time.Duration(len(r.ttfts))
		res.TTFTP50 = percentile(r.ttfts, 0.50)
		res.TTFTP99 = percentile(r.ttfts, 0.99)
	}
	res.Makespan = r.last - r.first
	if r.completed > 0 {
		res.LatencyMean = r.latencySum / time.Duration(r.completed)
	}
	if s := res.Makespan.Seconds(); s > 0 {
		res.Throughput = float64(r.completed) / s
		res.OutputTPS = float64(r.outputToks) / s
	}
	// count adds to a decision count, making the map on the first.
	count := func(k string, v uint64) {
		if res.Decisions == nil {
			res.Decisions = map[string]uint64{}
		}
		res.Decisions[k] += v
	}
	for _, px := range r.proxies {
		d, ok := px.policy.(interface{ Decisions() map[string]uint64 })
		if !ok {
			continue
		}
		for k, v := range d.Decisions() {
			count(k, v)
		}
	}
	if r.deferred > 0 {
		count("deferred", r.deferred)
	}
	if r.share != nil && r.share.urgent > 0 {
		// Not decisions: the fleet's messages their turns cost.
		count("reports_at_once", r.share.urgent)
		count("reports_on_ticks", r.share.ticked)
	}
	return res
}

// percentile returns the nearest-rank p-quantile of sorted values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

// maxOverMean returns max(v)/mean(v), 1 for an all-zero or empty v.
func maxOverMean(v []float64) float64 {
	if len(v) == 0 {
		return 1
	}
	var sum, hi float64
	for _, x := range v {
		sum += x
		hi = max(hi, x)
	}
	if sum == 0 {
		return 1
	}
	return hi / (sum / float64(len(v)))
}
