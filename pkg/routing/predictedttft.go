package routing

import (
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/chunkindex"
)

// EngineState is what the replicas report about themselves, read by
// predicted_ttft. The data plane implements it over [providers.engine_load]
// scrapes; nil means nothing is scraped.
type EngineState interface {
	// Counts returns target's vllm:num_requests_waiting and
	// vllm:num_requests_running (the requests holding a batch slot), both
	// of one scrape, how long ago that scrape was, and whether they are
	// fresh.
	Counts(target int) (waiting, running int, age time.Duration, ok bool)
	// KVCapacityTokens returns target's KV cache capacity in tokens
	// (num_gpu_blocks × block_size of vllm:cache_config_info), 0 when not
	// known.
	KVCapacityTokens(target int) int
}

// TTFTObserver is implemented by balancers that learn from first tokens
// (predicted_ttft). For every attempt the balancer observed (Observe), the
// proxy calls, with the same target and the same *Context it passed to
// Observe, FirstToken at most once, when the first token arrives, and then
// exactly one of Learner.Learn, when the attempt completed, or Abandon,
// when it ended any other way (an error, a retry, a client gone, a stream
// cut after its first token).
type TTFTObserver interface {
	// FirstToken reports the attempt's time to first token, measured from
	// dispatch, and the engine's prompt token count (usage.prompt_tokens),
	// or 0 when not known.
	FirstToken(target int, ctx *Context, ttft time.Duration, promptTokens int)
	// WholeAnswer reports that the answer of an attempt whose client does
	// not stream (Context.Buffered) arrived whole, latency after dispatch,
	// with the engine's prompt and output token counts (usage; 0 when not
	// known). Such an attempt shows no first token: the proxy reports this
	// instead of FirstToken, before Learn.
	WholeAnswer(target int, ctx *Context, latency time.Duration, promptTokens, outputTokens int)
	// Abandon reports that the attempt ended without completing, before
	// or after its first token.
	Abandon(target int, ctx *Context)
}

// Constants of predicted_ttft. None is a weight between objectives: each is
// a unit conversion used until the real value is learned, or a safety net.
const (
	// DefaultBytesPerToken converts prompt bytes to tokens until an engine's
	// prompt token count has been seen (OpenAI's rule of thumb for English
	// text; predicted_latency's estimate too). Learned afterwards as
	// Σ prompt bytes / Σ prompt tokens.
	DefaultBytesPerToken = 4
	// TTFTPendingTimeout drops a pending prefill whose end the proxy never
	// reported (a safety net; the proxy reports every attempt's end): far
	// longer than any first token a client waits for.
	TTFTPendingTimeout = 10 * time.Minute
)

// Decision outcomes of predicted_ttft.
const (
	// DecisionPrecise: the matched prefixes came from the engines' KV
	// events (token ids known, state fresh).
	DecisionPrecise = "precise"
	// DecisionApproximate: they came from the approximate index of what
	// the proxies sent to each target.
	DecisionApproximate = "approximate"
)

// predictedTTFT picks the target with the lowest predicted time to first
// token for this request.
//
// Prediction for target i, over the eligible set E:
//
//	ahead_n(i)   = pending(i) + max(0, waiting(i) - pending(i))
//	ahead_tok(i) = pending_tokens(i) - served(i) + that excess × mean pending tokens
//	own(i)       = prompt_tokens - matched(i)
//	ttft(i)      = w0 + w1·ahead_n(i) + w2·ahead_tok(i)/1000 + w3·own(i)/1000
//	cost(i)      = ttft(i) + externality + followWait + waste + forget (see each;
//	               forget in predictedttft_forget.go)
//	             + max(0, slot(i) + ttft_alone(i) − ttft(i)) + slotExternality
//
// followWait is bounded where a target holds more of the prompt than
// another (see followWaits). There and in waste a target holds what
// placedAt says: with KV events, what it holds or was last sent.
//
// slot(i) is the wait for a batch slot when the engine is full (see
// slotWaits), while the prefill ahead proceeds: the request's own prefill
// (ttft_alone, ttft with nothing ahead) starts after both. There, its own
// prefill also delays the requests that will wait for those slots after it
// (slotExternality).
//
// With peers (SetPlace), before its pick a request that arrives in a
// burst may wait for its turn (Defer, predictedttft_turns.go), so that the
// proxies place a burst one after another instead of blind; ties go to
// this proxy's home targets first (homeTie). A pick is not charged for the
// peers' picks of the last report gap that no report has shown yet: that
// charge (blindCollision, before the turns drew an order per time slot)
// took follow-ups away from the replicas holding their conversations
// (docs/routing.md, a lottery per time slot).
//
// pending(i) and pending_tokens(i) are the requests this balancer sent to i
// (Observe) that have no first token yet and their uncached prefill tokens,
// as estimated when they were sent; served(i) is what i has prefilled of
// the oldest of them since it began serving it, at the law's rate (see
// served); waiting(i) is the engine's
// num_requests_waiting when Spec.Engine has it fresh (it counts every
// proxy's requests, so it covers what a peer sent); the excess is valued at
// the mean uncached prefill of the requests this balancer has sent (the
// request's whole prompt before any). matched(i) is the prefix target i holds, in
// tokens: from Spec.KV (the engines' KV events, speculated for
// Spec.SpeculativeTTL after each pick) when the request has token ids and
// the state is fresh, else from the approximate index: the chained 64-byte
// chunk hashes (rolter.dev/pkg/chunkindex) of the prompts sent to i, whole
// (Context.PromptChain past the text's 32 KiB cut), matched bytes scaled to
// tokens. prompt_tokens is len(TokenIDs), else the prompt's bytes / the
// learned bytes per token.
//
// w is the fleet's latency law: the least-squares fit, no weight negative,
// of y = TTFT in ms on x = (1, ahead_n, ahead_tok/1000, own/1000) as
// predicted at Observe, over every target's first tokens (pooled: see
// law). It is used from PredictorMinSamples samples on, once its own-work
// weight is determined (see lawFit.determined); before that the unit law
// w = (0, 0, 1, 1) (Dynamo's cost with overlap weight 1 and no decode
// term), under which homogeneous replicas already rank correctly: the law
// only scales. The pick is the argmin of cost; costs within 1e-6 of the
// minimum tie (a cold start: nothing cached, nothing pending), and among
// the tied the lightest, then a uniform draw, wins: the least loaded
// (loads, when known), and for a prompt no target holds any of, first the
// one whose approximate index holds least (tieWeigher); with peers
// (SetPlace), the lightest of this proxy's own share of the tied first
// (homeTie); when the loads include other proxies' requests, the lighter
// of two tied targets drawn at random (tiedOfTwo).
//
// Capacity: the approximate index holds, per target, at most
// capacity_tokens(i) × indexed bytes per token / 64 chunks, where
// capacity_tokens is Spec.Engine's scraped KV capacity, else
// Spec.KVCapacityTokens[i], else unknown ([DefaultMaxTrieNodes] bytes of
// chunks, the seed's ceiling), and indexed bytes per token (the text the
// index sees of a prompt, all of it but tool traffic and media) is learned
// from FirstToken's prompt token counts. So the index forgets, oldest first,
// at the rate the replica's LRU does, a prompt's tail before its head, as
// the replica frees a finished request's blocks
// (chunkindex.Index.EvictTailFirst), and it ages a prompt from its
// request's completion (Learn), when the replica frees the blocks.
//
// State keyed by the *Context pointer: Observe records the attempt under
// (target, ctx) until FirstToken or Abandon; the pointer is only a key and
// is never read after Observe returns.
//
// Sharing (Spec.Share): the approximate index is the shared one; peers'
// observations fold into it (SharedAffinity). Each proxy also publishes its
// pending prefill per target (SharedQueue, every few milliseconds through
// rolter.dev/pkg/fleet), and pending(i), pending_tokens(i) and the head
// served() credits then cover the peers' requests too: each proxy sends
// only part of a target's queue. A peer's report is valid for a few of its
// intervals; the engines' waiting counts still cover what no report does.
type predictedTTFT struct {
	n       int
	kv      KVSource
	engine  EngineState
	capCfg  []int
	specTTL time.Duration
	intn    func(int) int
	now     func() time.Duration
	// fleetNow is the clock the fleet's proxies share, for the turns'
	// order (Spec.FleetNow).
	fleetNow func() time.Duration

	index   *chunkindex.Index
	publish func(int, string)

	fitMu      sync.Mutex
	pooled     lawFit                  // every target's first tokens, under fitMu
	fleet      atomic.Pointer[ttftLaw] // the pooled fit; nil until fitted
	pendTokens []atomic.Int64
	pendCount  []atomic.Int64
	// Per target, for its queue's utilisation and arrival rate: time with
	// a pending prefill (ns, up to busySince), when the current busy spell
	// began (-1: idle), arrivals; since the first Observe (start, ns).
	busyTotal, busySince, arrivals []atomic.Int64
	// newPrefixes counts, per target, the prompts sent there that no
	// target held any of: the cold start's spread (fewestNew).
	newPrefixes []atomic.Int64
	// inflight counts this balancer's attempts per target from Observe to
	// Learn (success) or Abandon; against the route's loads (every proxy's
	// in-flight) it gives the share of the traffic this proxy sees.
	inflight []atomic.Int64
	// flights logs, per target, when inflight changed (flightLog): what
	// changed since an engine scrape.
	flights []flightLog
	// pendLog logs, per target, when its pending count (pendCount)
	// changed: with flights, the requests past their first token at an
	// engine scrape (runningAt).
	pendLog []flightLog
	start   atomic.Int64
	// base is where the rates are measured from once this balancer has
	// seen rateWindow arrivals (nil before: from start); the ring of
	// snapshots it is taken from, one per rateStep arrivals, under mu.
	base   atomic.Pointer[rateBase]
	bases  [rateWindow / rateStep]*rateBase
	basesN int
	// Per target, the pending prefill at the head of its queue (the oldest):
	// its tokens and its dispatch (ns, -1: none), and this balancer's latest
	// first token there (ns, -1: none). The replica has served the head
	// since the later of the two (see served); what it has prefilled of it
	// is not ahead of a new request.
	headTokens, headAt, lastLeave []atomic.Int64
	seq                           uint64 // dispatch order, under mu

	// What peer proxies have pending at each target (Spec.Share): per peer
	// and target under peerMu, and per target their sum, which Pick reads.
	peerMu     sync.Mutex
	peerQueues map[string][]peerQueue
	peerSum    []atomic.Pointer[peerQueue]
	// peerLeave is, per target, the latest first token a peer reported
	// there (ns on t.now's clock, -1: none). It outlives the reports: a
	// peer whose queue emptied stops reporting, but the time its last
	// request left still bounds when the target began serving the next.
	peerLeave []atomic.Int64
	// peerBusyUntil is, per target, when the latest peer report showing
	// requests pending there expires (ns, -1: none): a busy spell that only
	// peers' requests kept open ends then at the latest, should the report
	// that emptied it be lost or its peer gone (see busyEnd).
	peerBusyUntil []atomic.Int64
	// peerHeard is when the latest peer queue report was folded (ns on
	// t.now's clock, -1: never).
	peerHeard atomic.Int64
	// place is this proxy's rank among the proxies serving the route and
	// their number (SetPlace), packed as rank<<32 | size; size ≤ 1: alone.
	place atomic.Uint64
	// The peers' report gap (see concurrent): per peer its latest
	// report's time, the sum and count of the gaps between a peer's
	// consecutive reports (under peerMu), and their mean (ns).
	peerLast  map[string]time.Duration
	gapSum    float64
	gapN      int
	reportGap atomic.Int64
	// turns holds what Defer needs (predictedttft_turns.go).
	turns burstTurns

	mu      sync.Mutex
	pending []map[*Context]pendingPrefill
	// Attempts whose answers come back whole (Context.Buffered): their
	// predicted first tokens in time order, the earliest (ns; MaxInt64:
	// none), and per target those past it, out of the queue until their
	// answer teaches the law (see expireDue).
	dues     dueHeap
	nextDue  atomic.Int64
	answered []map[*Context]pendingPrefill
	// Per target, the earliest due of the attempts in answered (ns, -1:
	// none), and the latest answer there, a first token or a completion,
	// to this balancer or, as its reports tell, to a peer (ns, -1: none):
	// see silence.
	answeredDue, lastBack []atomic.Int64
	slotPend              []atomic.Int64 // per target, the pending requests waiting for a batch slot (written under mu)
	lastSweep             time.Duration
	unsent                map[unsentKey]*unsentHashes // what each (target, prompt) has to publish, until RecordLocal hands it over
	shared                sharedSpec                  // the KV blocks speculated for the peers, until TakeSpeculated
	// Σ over every pick of the targets' in-flight requests and of this
	// balancer's own share of them (see recordLoads).
	loadSum, ownSum atomic.Int64

	// Learned text/token ratios: Σ whole-prompt bytes, Σ bounded (indexed)
	// bytes and Σ engine prompt tokens of the attempts that reported them.
	ratioMu                            sync.Mutex
	bytesSeen, indexedSeen, tokensSeen float64
	bytesPerToken, indexedPerToken     atomic.Uint64 // float64 bits
	observes                           atomic.Uint64
	uncachedSum                        atomic.Int64 // Σ uncached prefill tokens of every Observe
	// novelty is Σ over every Observe of the share of its prompt that no
	// target held (float64 bits, written under mu): how much of the traffic
	// so far was new to the whole fleet.
	novelty    atomic.Uint64
	noveltySum float64          // under mu
	decisions  [2]atomic.Uint64 // precise, approximate
	// The latest own arrivals' times (a ring, ns), and over the arrivals
	// since a peer's report gap was known, Σ of the own arrivals within
	// that gap on either side and their count (under mu); concurrent is
	// their mean (float64 bits): how many requests each peer receives
	// around each of this proxy's, before the peers report their arrivals
	// (Defer's blind picks).
	recent           [recentArrivals]int64
	recentN          int
	closeSum, closeN float64
	concurrent       atomic.Uint64
	// Per target, the most requests the engine showed running, and whether
	// it was seen full (requests waiting while others ran); anySlots, the
	// most seen running at any target seen full: the batch limits (see
	// slotPlace).
	maxRunning []atomic.Int64
	seenFull   []atomic.Bool
	anySlots   atomic.Int64
	// Per target, what the engine's counts usually show beyond what this
	// balancer sees (the waiting count beyond the requests ahead, the
	// occupied slots beyond what the loads held at the scrape), as float64
	// bits: the baselines a scrape's excess fades to as it ages
	// (staleExcess).
	waitExcess, slotExcess, runExcess []atomic.Uint64
	// Σ latency of the completed attempts (Learn), Σ TTFT of the first
	// tokens and Σ TTFT of those that did not wait for a batch slot (ns),
	// and their counts: how long a request holds its slot (slotHold).
	doneSum, doneN, firstSum, firstN, freeSum, freeN atomic.Int64
	wholeN                                           atomic.Int64 // whole answers reported (WholeAnswer)
	// The longest first token and whole answer lately: how long a target
	// may rightly take to answer (see quiet and silence).
	longFirst, longWhole longestAnswer

	unitLaw ttftLaw
	batch   batchState // the batch term (predictedttft_batch.go)
	returns *returnLog // the forget term's return times (predictedttft_forget.go)
}

type pendingPrefill struct {
	tokens   int
	x        [lawFeatures]float64
	at       time.Duration
	bytes    int // whole prompt bytes
	indexed  int // bounded prompt bytes
	knownTok int // len(TokenIDs), 0 when unknown
	seq      uint64
	// slot: the engine was full at dispatch, so the request waited for a
	// batch slot (see slotWaits); its TTFT teaches the law nothing.
	slot bool
	// blind: no peer had been heard from at dispatch, so x misses what
	// peers had queued if there are peers (see FirstToken).
	blind bool
	// unseen: a peer's next report after the dispatch showed it had sent
	// the target more since its previous report, some of it perhaps
	// ahead of this request, so x may miss it (see FoldPeerQueue).
	unseen bool
	// due: for an attempt whose answer comes back whole (Context.Buffered),
	// when its first token is predicted, and it leaves the queue (see
	// expireDue); 0 for the others.
	due time.Duration
	// running: the requests running at the target at dispatch (runningAt),
	// which the batch term fits the law's residual against; -1 when the
	// prefix was matched approximately (see batchState).
	running float64
}

// peerQueue is a peer's pending prefill at a target, on this balancer's
// clock (t.now): a QueueState as received, or the sum over peers (the
// oldest head, the earliest expiry).
type peerQueue struct {
	requests, tokens, headTokens int64
	headAt, until                time.Duration
	at                           time.Duration // when it was received (a peer's report)
}

type unsentKey struct {
	target int
	digest uint64
}

// unsentHashes are the hashes one (target, prompt) has to publish, in
// order, and the fleet picks queued for it that RecordLocal has not yet
// answered: the first answer hands over every hash, the later ones (the
// same prompt sent, or sent and completed, within one flush) nothing more.
type unsentHashes struct {
	hashes []uint64
	picks  int
}

// maxUtilisation caps the measured utilisation in the queueing delay
// factor 1/(1-ρ), which is unbounded at saturation.
const maxUtilisation = 0.99

// maxUnsent bounds the (target, prompt) entries kept for RecordLocal. When
// it is reached they are all dropped, and RecordLocal republishes the
// whole fingerprint of each prompt it finds no entry for: a superset, head
// first. That also clears the entries of picks the fleet dropped (its queue
// is bounded), which RecordLocal would never be asked for.
const maxUnsent = 4096

// recentArrivals bounds the own arrivals kept to count those within a
// peer's report gap (see concurrent): a burst larger than this counts
// as this many.
const recentArrivals = 64

var (
	_ Balancer          = (*predictedTTFT)(nil)
	_ TTFTObserver      = (*predictedTTFT)(nil)
	_ Learner           = (*predictedTTFT)(nil)
	_ DecisionCounter   = (*predictedTTFT)(nil)
	_ SilenceReporter   = (*predictedTTFT)(nil)
	_ SharedAffinity    = (*predictedTTFT)(nil)
	_ SharedQueue       = (*predictedTTFT)(nil)
	_ FleetClock        = (*predictedTTFT)(nil)
	_ SharedSpeculation = (*predictedTTFT)(nil)
)

func newPredictedTTFT(spec *Spec, p params) *predictedTTFT {
	n := len(spec.Weights)
	t := &predictedTTFT{
		n: n, kv: spec.KV, engine: spec.Engine, capCfg: spec.KVCapacityTokens,
		specTTL: spec.SpeculativeTTL, intn: p.intn, now: p.now, fleetNow: p.fleetNow, publish: spec.Share,
		index:       chunkindex.New(n, max(DefaultMaxTrieNodes/chunkindex.ChunkBytes, 1)),
		pendTokens:  make([]atomic.Int64, n),
		pendCount:   make([]atomic.Int64, n),
		busyTotal:   make([]atomic.Int64, n),
		busySince:   make([]atomic.Int64, n),
		arrivals:    make([]atomic.Int64, n),
		newPrefixes: make([]atomic.Int64, n),
		inflight:    make([]atomic.Int64, n), flights: make([]flightLog, n), pendLog: make([]flightLog, n),
		maxRunning: make([]atomic.Int64, n), seenFull: make([]atomic.Bool, n),
		waitExcess: make([]atomic.Uint64, n), slotExcess: make([]atomic.Uint64, n), runExcess: make([]atomic.Uint64, n),
		headTokens: make([]atomic.Int64, n), headAt: make([]atomic.Int64, n), lastLeave: make([]atomic.Int64, n),
		peerQueues: map[string][]peerQueue{}, peerLast: map[string]time.Duration{}, peerSum: make([]atomic.Pointer[peerQueue], n), peerLeave: make([]atomic.Int64, n),
		peerBusyUntil: make([]atomic.Int64, n),
		pending:       make([]map[*Context]pendingPrefill, n), slotPend: make([]atomic.Int64, n),
		answered: make([]map[*Context]pendingPrefill, n), answeredDue: make([]atomic.Int64, n), lastBack: make([]atomic.Int64, n),
		unsent:  map[unsentKey]*unsentHashes{},
		unitLaw: ttftLaw{w: [lawFeatures]float64{0, 0, 1, 1, 0}, samples: PredictorMinSamples},
		returns: newReturnLog(),
	}
	if t.specTTL == 0 {
		t.specTTL = DefaultSpeculativeTTL
	}
	t.shared.init(n)
	if t.now == nil {
		start := time.Now()
		t.now = func() time.Duration { return time.Since(start) }
	}
	for i := range t.pending {
		t.pending[i] = map[*Context]pendingPrefill{}
		t.answered[i] = map[*Context]pendingPrefill{}
		t.busySince[i].Store(-1)
		t.headAt[i].Store(-1)
		t.lastLeave[i].Store(-1)
		t.peerLeave[i].Store(-1)
		t.peerBusyUntil[i].Store(-1)
		t.answeredDue[i].Store(-1)
		t.lastBack[i].Store(-1)
	}
	t.start.Store(-1)
	t.nextDue.Store(math.MaxInt64)
	t.peerHeard.Store(-1)
	t.turns.lastArrival.Store(-1)
	t.turns.burstUntil.Store(-1)
	t.bytesPerToken.Store(math.Float64bits(DefaultBytesPerToken))
	t.indexedPerToken.Store(math.Float64bits(DefaultBytesPerToken))
	t.index.TrackForks()     // for waste's shared part
	t.index.EvictTailFirst() // forget as the replica does: tail first
	// Stamped on t.now's clock, for the forget term's keep(i).
	t.index.SetClock(func() int64 { return int64(t.now()) })
	t.refreshCapacity()
	return t
}

// Name implements Balancer.
func (*predictedTTFT) Name() string { return PredictedTTFT }

func loadFloat(a *atomic.Uint64) float64 { return math.Float64frombits(a.Load()) }

// promptBytes is the whole prompt's length in bytes.
func promptBytes(ctx *Context) int {
	if ctx.PromptLen > 0 {
		return ctx.PromptLen
	}
	return len(ctx.Prompt)
}

// publishHashes hands the fleet these hashes of prompt, sent to target, for
// its next flush (RecordLocal gives them back when it asks for prompt).
func (t *predictedTTFT) publishHashes(target int, prompt string, hashes []uint64) {
	k := unsentKey{target, xxh3.HashString(prompt)}
	t.mu.Lock()
	u := t.unsent[k]
	if u == nil {
		if len(t.unsent) >= maxUnsent {
			clear(t.unsent)
		}
		u = &unsentHashes{}
		t.unsent[k] = u
	}
	u.hashes = append(u.hashes, hashes...)
	u.picks++
	t.mu.Unlock()
	t.publish(target, prompt)
}

// touchCompleted records ctx's prompt in the approximate index again when
// its request completed (see Learn) and, with peers, publishes its whole
// fingerprint in the order touched (tail first), so that every proxy's
// index ages it from the completion too: published only at the send, the
// peers' entries kept the send order and each proxy forgot its peers'
// running sessions first (rolter-sim agent through 4 proxies without KV
// events: 47.1 % hit rate, 58.4 with the completions shared; docs/routing.md).
func (t *predictedTTFT) touchCompleted(target int, ctx *Context) {
	// One fingerprint records, ends the prompt for the forget term and,
	// reversed in a copy (it is not this balancer's to reorder), is
	// published.
	var hbuf [promptHashBuf]uint64
	c := promptChain(ctx, hbuf[:])
	hs := fullHashes(c)
	if len(hs) > 0 {
		t.returns.answered(hs[len(hs)-1], int64(t.now()))
	}
	t.index.ObserveChain(target, c, nil)
	if t.publish == nil {
		return
	}
	touched := slices.Clone(c.Hashes)
	slices.Reverse(touched)
	t.publishHashes(target, ctx.Prompt, withPromptEnd(touched, hs))
}

// hasChain reports whether ctx carries the fingerprint of a prompt longer
// than its Prompt, which the approximate index then uses instead: a prefix
// shared past the text's cut (pkg/affinity's 32 KiB) still matches. On the
// Mooncake traces, prompts of 15 K tokens on average, matching only the
// first 32 KiB cost the approximate index up to 7 points of hit rate
// (docs/routing.md).
func hasChain(ctx *Context) bool {
	return len(ctx.PromptChain.Hashes) > 0 && ctx.PromptChain.Len > len(ctx.Prompt)
}

// indexedBytes is the length of the text the approximate index sees of ctx.
func indexedBytes(ctx *Context) int {
	if hasChain(ctx) {
		return ctx.PromptChain.Len
	}
	return len(ctx.Prompt)
}

// promptChain returns ctx's prompt's fingerprint, the one the approximate
// index records: the chain it carries when that is longer than its text
// (see hasChain), else its text's hashed into buf.
func promptChain(ctx *Context, buf []uint64) chunkindex.Chain {
	if hasChain(ctx) {
		return ctx.PromptChain
	}
	return chunkindex.Chain{Hashes: chunkindex.Hashes(buf[:0], ctx.Prompt), Len: len(ctx.Prompt)}
}

// tokensPerByte converts a length of ctx's prompt text to tokens, at the
// request's own ratio; ctx.Prompt must not be empty.
func tokensPerByte(ctx *Context, tokens int) float64 {
	return float64(tokens) / float64(promptBytes(ctx))
}

// tokens estimates the request's prompt tokens.
func (t *predictedTTFT) tokens(ctx *Context) int {
	if len(ctx.TokenIDs) > 0 {
		return len(ctx.TokenIDs)
	}
	return int(math.Ceil(float64(promptBytes(ctx)) / loadFloat(&t.bytesPerToken)))
}

// matched sets match[i] to the prefix tokens target i holds and reports
// whether they came from the KV events. A target whose events are not
// fresh while others' are is matched on the approximate index: read as
// holding nothing, it lost the prompts it held to the fresh targets and
// drew no new ones from ties, so its engine, serving nothing new, sent no
// event to become fresh again (rolter-outage: a restarted kvwatcher's
// view of one replica stayed stale for 51 s).
func (t *predictedTTFT) matched(ctx *Context, tokens int, match []float64) bool {
	clear(match)
	if t.kv != nil && len(ctx.TokenIDs) > 0 {
		sigp := signalBufs.Get().(*[MaxTargets]float64)
		sig := sigp[:t.n]
		clear(sig)
		var fbuf [MaxTargets]bool
		var fresh []bool // nil: a source that cannot tell, every target fresh
		var ok bool
		if fs, each := t.kv.(KVFreshSource); each {
			fresh = fbuf[:t.n]
			ok = fs.KVScoresFresh(ctx.TokenIDs, sig, fresh)
		} else {
			ok = t.kv.KVScores(ctx.TokenIDs, sig)
		}
		if ok {
			for i := range match {
				match[i] = min(max(sig[i], 0), 1) * float64(tokens)
			}
		}
		signalBufs.Put(sigp)
		if ok {
			if slices.Contains(fresh, false) {
				var abuf [MaxTargets]float64
				approx := abuf[:t.n]
				t.indexMatch(ctx, tokens, approx)
				for i, f := range fresh {
					if !f {
						match[i] = approx[i]
					}
				}
			}
			return true
		}
	}
	t.indexMatch(ctx, tokens, match)
	return false
}

// indexMatch sets match[i] to the prefix tokens of the prompt the
// approximate index records at target i (0 without a prompt).
func (t *predictedTTFT) indexMatch(ctx *Context, tokens int, match []float64) {
	clear(match)
	if ctx.Prompt == "" {
		return
	}
	var lbuf [MaxTargets]int
	lens := lbuf[:t.n]
	if hasChain(ctx) {
		t.index.MatchChain(ctx.PromptChain, lens)
	} else {
		t.index.Match(ctx.Prompt, lens)
	}
	scale := tokensPerByte(ctx, tokens)
	for i, l := range lens {
		match[i] = min(float64(l)*scale, float64(tokens))
	}
}

// placedAt sets placed[i] to the prefix of the prompt that lives at target
// i: what i holds (match), or more where the approximate index records
// that more of it was sent there and has not aged out of i's capacity.
// The KV events tell what a replica holds now; under cache pressure its
// LRU evicts part of a prefix whose requests keep returning to it, and
// priced by the events alone the next request saw nothing wasted in
// leaving: it went to a shorter queue and prefilled the whole prefix again
// there. Read where the prefix lives, a session stays where it was (and
// its prefix is rebuilt there), as llm-d's index, which does not see
// evictions, keeps it. The waste term and the follow-up wait's bound read
// placed; the prediction itself still reads match (rolter-sim agent at 4
// replicas, hit rate 41.2 -> 42.4 %, TTFT mean 3,573 -> 3,514 ms;
// docs/routing.md, where a prefix lives).
func (t *predictedTTFT) placedAt(ctx *Context, tokens int, match, placed []float64) {
	t.indexMatch(ctx, tokens, placed)
	for i, m := range match {
		placed[i] = max(placed[i], m)
	}
}

// law returns the fleet's latency law (the least-squares fit over every
// target's first tokens), or the unit law before it has
// PredictorMinSamples of them with a determined own-work weight. One fit
// pools every target: on a homogeneous fleet per-target fits differ by
// noise alone, and that noise steered traffic (rolter-sim unique: imbalance
// 1.64 with per-target laws, 1.03 pooled; docs/routing.md).
func (t *predictedTTFT) law() ttftLaw {
	if m := t.fleet.Load(); m != nil {
		return *m
	}
	return t.unitLaw
}

func (m *ttftLaw) predict(x [lawFeatures]float64) float64 {
	var y float64
	for i, v := range x {
		y += m.w[i] * v
	}
	return y
}

// The inputs of predicted_ttft's latency law, by index: 1, the requests
// ahead, the queued prefill tokens ahead (thousands), this request's own
// uncached tokens (thousands), and the output tokens (thousands) of an
// answer that arrived whole (see WholeAnswer; 0 for a first token, and in
// every prediction). Queued and own work have their own weights: an
// engine that prefills one request at a time (vLLM's token budget per
// step) charges both, one that prefills every request on its own (vllmsim)
// only the own, and the fit learns which. The decode weight lets the
// latency of a whole answer teach the rest: its first token is that
// latency less the decode, which the fit separates.
const (
	lawBase = iota
	lawAhead
	lawQueued
	lawOwn
	lawDecode
	lawFeatures
)

// ttftLaw is predicted_ttft's latency law: TTFT (ms) = w·x.
type ttftLaw struct {
	w       [lawFeatures]float64
	samples int
}

// lawFit accumulates the normal equations of the least-squares fit of
// y = w·x, each sample weighted lawKeep^k after k later ones (mass: Σ
// weights; n: samples added).
type lawFit struct {
	xx   [lawFeatures][lawFeatures]float64
	xy   [lawFeatures]float64
	yy   float64
	mass float64
	n    int
}

// The law forgets: a sample's weight halves about every 0.69 × lawMemory
// later samples (exponential forgetting, as in recursive least squares).
// Pooled since the first, a fit a week old followed a change of the engines
// (an upgrade, a new GPU, another model behind the route) only as 1/n.
// 16,384 samples fit the law's four weights many times over and change no
// judged count (4,096 neither, with a little more movement: the settings'
// hit rate −0.08 point on average); docs/routing.md, the law forgets.
const (
	lawMemory = 16384
	lawKeep   = 1 - 1.0/lawMemory
)

func (f *lawFit) add(x [lawFeatures]float64, y float64) {
	for r := range x {
		for c := range x {
			f.xx[r][c] = f.xx[r][c]*lawKeep + x[r]*x[c]
		}
		f.xy[r] = f.xy[r]*lawKeep + x[r]*y
	}
	f.yy = f.yy*lawKeep + y*y
	f.mass = f.mass*lawKeep + 1
	f.n++
}

// solve returns the least-squares weights, none negative (every input of
// the law is work that can only delay a first token; an unconstrained fit
// on a few noisy samples gave own prefill a negative weight, so the replica
// without the prefix looked fastest), with a ridge of 1e-9 of the mean
// diagonal so that a feature that never varied (no queue yet) gets weight 0
// instead of a singular system; false when there is nothing to fit. The
// constraint is met by refitting without the most negative weight until
// none is left (the active-set idea of Lawson and Hanson's NNLS).
func (f *lawFit) solve() ([lawFeatures]float64, bool) {
	var active [lawFeatures]bool
	for i := range active {
		active[i] = true
	}
	for {
		w, ok := f.solveActive(active)
		if !ok {
			return w, false
		}
		worst := -1
		for i, v := range w {
			if active[i] && v < 0 && (worst < 0 || v < w[worst]) {
				worst = i
			}
		}
		if worst < 0 {
			return w, true
		}
		active[worst] = false
	}
}

// solveActive solves the normal equations with the inactive features'
// weights held at 0.
func (f *lawFit) solveActive(active [lawFeatures]bool) ([lawFeatures]float64, bool) {
	a, ok := f.normal(active)
	if !ok {
		return [lawFeatures]float64{}, false
	}
	b := f.xy
	for i := range b {
		if !active[i] {
			b[i] = 0
		}
	}
	return gauss(a, b)
}

// normal returns the normal matrix with the ridge, the inactive features'
// rows and columns replaced by the identity's.
func (f *lawFit) normal(active [lawFeatures]bool) ([lawFeatures][lawFeatures]float64, bool) {
	a := f.xx
	var trace float64
	for i := range a {
		trace += a[i][i]
	}
	inputs := float64(lawFeatures)
	if a[lawDecode][lawDecode] == 0 {
		inputs-- // no whole answer: the decode input is not there
	}
	ridge := 1e-9 * trace / inputs
	if ridge <= 0 {
		return a, false
	}
	for i := range a {
		if !active[i] {
			a[i] = [lawFeatures]float64{}
			for r := range a {
				a[r][i] = 0
			}
			a[i][i] = 1
			continue
		}
		a[i][i] += ridge
	}
	return a, true
}

// determined reports whether the samples determine weight k of the fit w:
// it exceeds twice its standard error (the conventional 95 % level). A law
// fitted before the own prefill ever varied (the first first tokens are
// often all cache hits) has an own-work weight that is noise, often 0, and
// would route as if prefill were free.
func (f *lawFit) determined(w [lawFeatures]float64, k int) bool {
	var active [lawFeatures]bool
	p := 0
	for i, v := range w {
		active[i] = v != 0
		if active[i] {
			p++
		}
	}
	if !active[k] || f.mass <= float64(p) {
		return false
	}
	rss := f.yy
	for i := range w {
		rss -= 2 * w[i] * f.xy[i]
		for j := range w {
			rss += w[i] * f.xx[i][j] * w[j]
		}
	}
	a, ok := f.normal(active)
	if !ok {
		return false
	}
	var e [lawFeatures]float64
	e[k] = 1
	inv, ok := gauss(a, e)
	if !ok || inv[k] <= 0 {
		return false
	}
	se := math.Sqrt(max(rss, 0) / (f.mass - float64(p)) * inv[k])
	return w[k] > 2*se
}

// gauss solves a·w = b by Gaussian elimination with partial pivoting.
func gauss(a [lawFeatures][lawFeatures]float64, b [lawFeatures]float64) ([lawFeatures]float64, bool) {
	for c := range lawFeatures {
		p := c
		for r := c + 1; r < lawFeatures; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		a[c], a[p] = a[p], a[c]
		b[c], b[p] = b[p], b[c]
		if a[c][c] == 0 {
			return [lawFeatures]float64{}, false
		}
		for r := c + 1; r < lawFeatures; r++ {
			k := a[r][c] / a[c][c]
			for j := c; j < lawFeatures; j++ {
				a[r][j] -= k * a[c][j]
			}
			b[r] -= k * b[c]
		}
	}
	var w [lawFeatures]float64
	for r := lawFeatures - 1; r >= 0; r-- {
		v := b[r]
		for j := r + 1; j < lawFeatures; j++ {
			v -= a[r][j] * w[j]
		}
		w[r] = v / a[r][r]
	}
	for _, v := range w {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return [lawFeatures]float64{}, false
		}
	}
	return w, true
}

// engineCounts are a target's engine counts (EngineState.Counts), read
// once per target and pick.
type engineCounts struct {
	waiting, running int
	ok               bool
	// age is how old the scrape is, and at when it was (ns on t.now's
	// clock): what a flightLog changed since the scrape is since(at).
	age time.Duration
	at  int64
}

// counts reads target i's engine counts (none without Spec.Engine).
func (t *predictedTTFT) counts(i int) engineCounts {
	if t.engine == nil {
		return engineCounts{}
	}
	w, r, age, ok := t.engine.Counts(i)
	age = max(age, 0)
	return engineCounts{waiting: w, running: r, ok: ok, age: age, at: int64(t.now() - age)}
}

// staleExcess is what an engine count showed beyond what this balancer
// sees (excess, as scraped age ago) is likely to be now. A scrape is up
// to an interval old (500 ms by default) while the balancer's own view is
// current: the excess seen then has since turned over with probability 1
// − exp(−age / turnMS), turnMS the time its requests take to leave (a
// waiting request's TTFT, a slot's share of the hold), and what replaced
// it is what the counts usually show beyond the view: the baseline, a
// mean of the excess over the readings, each weighed by its freshness
// (about the last excessReadings fresh ones). So a queue of this fleet's
// own that drained since the scrape (the balancer's view holds what is
// left of it) fades to the little the counts usually add, and the
// steady queue of clients the balancer does not see (other proxies that
// do not share) stays. Read as scraped, rolter-sim unique on 2 replicas
// at --prefill-us 1 through 2 sharing proxies went from 50 ms with live
// counts to 88, worse than with no counts at all (60); faded to zero
// instead of the baseline, the trace through 8 proxies that do not share
// went from 1,270 to 1,492 ms (docs/routing.md, random settings).
func staleExcess(baseline *atomic.Uint64, excess float64, age time.Duration, turnMS float64) float64 {
	fresh := 1.0
	if turnMS > 0 {
		fresh = math.Exp(-float64(age) / float64(time.Millisecond) / turnMS)
	}
	b := math.Float64frombits(baseline.Load())
	baseline.Store(math.Float64bits(b + fresh*(excess-b)/excessReadings))
	return b + (excess-b)*fresh
}

// flightLog is a target's latest changes of one of a balancer's counts
// (its in-flight count: +1 a dispatch, −1 a completion or an abandon; its
// pending count: +1 a dispatch, −1 a first token or a leave without one)
// with their times (ns on t.now's clock), newest last, for what changed
// since an engine scrape. Through one proxy every request an engine
// counts is one the proxy sent, so the count as scraped less the changes
// since is the engine now: a full batch whose requests finished since the
// scrape is seen free (rolter-sim gsp on 32 replicas at --max-batch 4:
// TTFT mean 741 ms with the counts faded as they age, 267 with this;
// docs/routing.md, counts as old as their scrape).
type flightLog struct {
	mu sync.Mutex
	// at, d and total hold each change's time, the change, and the sum
	// of every change up to and including it, in a ring: since is a
	// search, not a scan.
	at    [flightLogSize]int64
	d     [flightLogSize]int8
	total [flightLogSize]int64
	next  int // where the next change goes
	n     int // changes held, up to flightLogSize
}

// flightLogSize bounds a flightLog: changes older than the latest
// flightLogSize are forgotten (at 500 ms between scrapes, a thousand
// requests a second to one target).
const flightLogSize = 1024

func (l *flightLog) add(at int64, d int8) {
	l.mu.Lock()
	last := int64(0)
	if l.n > 0 {
		prev := (l.next - 1 + flightLogSize) % flightLogSize
		last = l.total[prev]
		// A whole answer's first token is logged at its estimated time,
		// which can precede the latest change: kept in order for since.
		at = max(at, l.at[prev])
	}
	l.at[l.next], l.d[l.next], l.total[l.next] = at, d, last+int64(d)
	l.next = (l.next + 1) % flightLogSize
	l.n = min(l.n+1, flightLogSize)
	l.mu.Unlock()
}

// since returns the sum of the changes held that came after from.
func (l *flightLog) since(from int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == 0 {
		return 0
	}
	oldest := (l.next - l.n + flightLogSize) % flightLogSize
	pos := func(k int) int { return (oldest + k) % flightLogSize } // k-th oldest
	// The first change after from, by its place among those held.
	k := sort.Search(l.n, func(k int) bool { return l.at[pos(k)] > from })
	if k == l.n {
		return 0
	}
	// The sum before the k-th: its total less its own change.
	return l.total[pos(l.n-1)] - (l.total[pos(k)] - int64(l.d[pos(k)]))
}

// excessReadings is how many fresh readings staleExcess's baseline
// averages over: a few scrapes' worth of picks, short against a load that
// changes over seconds.
const excessReadings = 64

// features returns target i's prediction inputs for a request whose own
// uncached prefill is own tokens; c is i's engine counts.
func (t *predictedTTFT) features(i int, own float64, tokens int, m *ttftLaw, now time.Duration, c engineCounts) [lawFeatures]float64 {
	peers := t.peersAt(i, now)
	aheadN := float64(t.pendCount[i].Load() + peers.requests)
	aheadTok := max(float64(t.pendTokens[i].Load()+peers.tokens)-t.served(i, m, now, peers), 0)
	if c.ok {
		if excess := staleExcess(&t.waitExcess[i], max(float64(c.waiting)-aheadN, 0), c.age, t.typicalFirst()); excess > 0 {
			mean, ok := t.meanUncached()
			if !ok {
				mean = float64(tokens)
			}
			aheadTok += excess * mean
			aheadN += excess
		}
	}
	return [lawFeatures]float64{1, aheadN, aheadTok / 1000, max(own, 0) / 1000}
}

// served estimates the tokens target i has already prefilled of the request
// at the head of its queue: the time since it began serving it at the
// engine's prefill rate (the own-work weight, ms per 1,000 tokens), at most
// the head's tokens. Without it a replica busy prefilling a prefix looks as
// far away as when that prefill was sent, and an idle replica without the
// prefix wins the tie. The head is the oldest pending request of this
// balancer's and its peers' (peers), and the replica began serving it at
// the later of its dispatch and the last first token there.
func (t *predictedTTFT) served(i int, m *ttftLaw, now time.Duration, peers peerQueue) float64 {
	// The unit law's weights are not milliseconds (see externality): until
	// the law is fitted there is no rate to credit elapsed time at.
	if m.w[lawOwn] <= 0 || *m == t.unitLaw {
		return 0
	}
	from, headTok, ok := t.head(i, peers)
	if !ok || int64(now) <= from {
		return 0
	}
	// The head's fixed part (the per-request weight, what a request costs
	// beyond its tokens) is served first.
	ms := float64(int64(now)-from)/float64(time.Millisecond) - max(m.w[lawAhead], 0)
	if ms <= 0 {
		return 0
	}
	return min(ms*1000/m.w[lawOwn], float64(headTok))
}

// head returns target i's head, the oldest pending request of this
// balancer's and its peers' (peers): when the replica could begin it (the
// later of its dispatch and the last first token there, ns) and its
// tokens; false when nothing is pending there.
func (t *predictedTTFT) head(i int, peers peerQueue) (from, tokens int64, ok bool) {
	headAt, headTok := t.headAt[i].Load(), t.headTokens[i].Load()
	if peers.requests > 0 {
		headAt, headTok = earlierHead(headAt, headTok, int64(peers.headAt), peers.headTokens)
	}
	if headAt < 0 {
		return 0, 0, false
	}
	return max(headAt, t.lastLeave[i].Load(), t.peerLeave[i].Load()), headTok, true
}

// earlierHead returns the head (its dispatch, ns, and tokens) of two
// queues' heads, at (-1: none) and other: the earlier, or both added when
// sent in one instant, since the replica prefills them together (a sum
// that also keeps peers' heads free of the order they are met in).
func earlierHead(at, tokens, otherAt, otherTokens int64) (int64, int64) {
	switch {
	case at < 0 || otherAt < at:
		return otherAt, otherTokens
	case otherAt == at:
		return at, tokens + otherTokens
	}
	return at, tokens
}

// overdue is how long target i's head (see head) has waited, since the
// replica could begin it, beyond twice what the law gives it alone and the
// mean first token lately (typical, ms; see typicalFirst), in ms; 0 when it
// has not, under the unit law (no time scale), and while the engine is full
// (the head waits for a batch slot, which slotWait prices). A replica that
// stalls (a stuck engine, a frozen process: connections open, nothing
// answered) otherwise looks no busier than the requests sent to it, and a
// prefix it holds keeps drawing traffic into the stall; its head's lateness
// is the evidence, and a wait that has lasted that long is expected to last
// about as long again. The margin keeps it a stall detector: of the 188 lines of
// the judged grid and the simulator's other sets it changed one (agent at
// --rate 6, for the better), where twice the head's own prediction alone
// fired on noise (agent at --capacity 1024: p99 ×1.05). Measured in
// docs/routing.md and docs/operations.md.
func (t *predictedTTFT) overdue(i int, m *ttftLaw, now time.Duration, typical float64) float64 {
	if *m == t.unitLaw || t.slotPend[i].Load() > 0 {
		return 0
	}
	from, headTok, ok := t.head(i, t.peersAt(i, now))
	if !ok {
		return 0
	}
	var alone [lawFeatures]float64
	alone[lawBase], alone[lawOwn] = 1, float64(headTok)/1000
	waited := float64(int64(now)-from) / float64(time.Millisecond)
	return max(0, waited-2*(max(0, m.predict(alone))+typical))
}

// typicalFirst is the mean first token (ms) over the rates' window.
func (t *predictedTTFT) typicalFirst() float64 {
	b := t.means()
	mean, _ := windowMean(t.firstSum.Load(), t.firstN.Load(), b.first, b.firstN)
	return mean / float64(time.Millisecond)
}

// Pick implements Balancer.
func (t *predictedTTFT) Pick(ctx *Context, loads []int, eligible Set) int {
	if t.n <= 0 {
		return -1
	}
	el := eligible.OrAll(t.n)
	if el.Len() == 1 {
		return el.Nth(0, t.n)
	}
	var mbuf, pbuf [MaxTargets]float64
	match, pred := mbuf[:t.n], pbuf[:t.n]
	c := t.costs(ctx, loads, el, t.recordLoads(loads), match, pred)
	if ctx != nil {
		if c.precise {
			t.decisions[0].Add(1)
		} else {
			t.decisions[1].Add(1)
		}
	}
	el, best, rates := c.el, c.best, c.rates
	// Among the tied minimum: with peers, this proxy's own share of the
	// targets first (homeTie); then the lightest (see tieWeigher), then
	// uniform; with loads partly not this balancer's own (see tiedOfTwo),
	// the lighter of two drawn at random.
	tw := tieWeigher{t: t, loads: loads, cold: true}
	for _, v := range match {
		if v > 0 {
			tw.cold = false
			break
		}
	}
	if _, size := t.placeOf(); tw.cold && !c.fitted && size <= 1 {
		el, best = t.fewestNew(el, pred)
	}
	var tbuf [MaxTargets]uint8
	tied := tiedAt(pred, el, best, tbuf[:0])
	if i, ok := t.homeTie(tied, tw); ok {
		return i
	}
	if len(loads) == t.n && rates.scale > 1 {
		if i, ok := t.tiedOfTwo(tied, tw); ok {
			return i
		}
	}
	pick, _ := t.lightest(tied, tw, nil)
	return pick
}

// pickCosts is what costs leaves for Pick's tie rules and for Defer.
type pickCosts struct {
	el      Set     // the eligible targets costed (quiet ones left out before the law is fitted)
	best    float64 // the least cost over el
	precise bool    // match came from the engines' KV events
	fitted  bool    // the costs are the fitted law's, not the unit law's
	rates   queueRates
}

// fewestNew narrows el to the targets that were sent the fewest new
// prefixes (prompts no target held any of) and returns them with the
// least cost among them: the cold start's rule for a new prefix, before
// the law is fitted. A new prefix brings the requests that will extend it
// (a conversation's turns, a group's questions), and how many follow does
// not grow with its first prompt's length; the unit law's cost, which
// balances the prefill tokens queued, spread the first burst's sessions by
// their first prompts' lengths, and they stayed where they began: rolter-sim
// multiturn --mt-request-len 1024 --mt-rounds 8 --mt-clients 64 (64
// conversations at once, lengths ±50 %) put 7 to 10 on a replica,
// imbalance 1.28 (1.31 at worst over seeds 1–6); counted, 1.19 at worst
// (docs/routing.md, the cold start's new prefixes). Once the law is
// fitted, the follow-up wait weighs each target's sessions. Not with peers
// (Pick): a proxy counts only its own new prefixes, and the costs carry
// the peers' queues, which place a burst in turns.
func (t *predictedTTFT) fewestNew(el Set, pred []float64) (Set, float64) {
	fewest := int64(math.MaxInt64)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			fewest = min(fewest, t.newPrefixes[wi*64+bitIndex(w)].Load())
		}
	}
	var out Set
	best := math.Inf(1)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			if i := wi*64 + bitIndex(w); t.newPrefixes[i].Load() == fewest {
				out.Add(i)
				best = min(best, pred[i])
			}
		}
	}
	return out, best
}

// costs sets pred[i], for every target i of el, to the cost Pick
// minimises (see predictedTTFT), and match[i] to the prefix i holds; scale
// is the fleet's load over this balancer's own (loadScale).
func (t *predictedTTFT) costs(ctx *Context, loads []int, el Set, scale float64, match, pred []float64) pickCosts {
	var hbuf [MaxTargets]float64
	tokens, precise := 0, false
	if ctx != nil {
		tokens = t.tokens(ctx)
		precise = t.matched(ctx, tokens, match)
	}
	now := t.now()
	t.expireDue(now)
	m := t.law()
	fitted := m != t.unitLaw
	if !fitted {
		el = t.withoutQuiet(el, now)
	}
	placed := match // read by the waste term and the follow-up wait's bound, which need the law
	if precise && fitted {
		placed = hbuf[:t.n]
		t.placedAt(ctx, tokens, match, placed)
	}
	rates := t.fleetRates(now, scale, fitted)
	var follow followFactors
	if fitted {
		follow = t.followCost(&m, now, rates, tokens)
	}
	var wbuf [MaxTargets]float64
	var cbuf [MaxTargets]engineCounts
	slotWait, counts := wbuf[:t.n], cbuf[:t.n]
	if t.engine != nil {
		for wi, w := range el.w {
			for ; w != 0; w &= w - 1 {
				i := wi*64 + bitIndex(w)
				counts[i] = t.counts(i)
			}
		}
	}
	var sbuf [MaxTargets]float64
	slots := sbuf[:t.n]
	el = t.slotWaits(el, loads, counts, slotWait, slots)
	var saturation float64              // slotExternality's busy-period factor, once per pick
	if rates.timed && t.engine != nil { // no engine counts: no slot waits
		saturation = t.slotSaturation()
	}
	held, shared := 0.0, 0.0 // the longest prefix an eligible target holds, and its shared part (see waste)
	if fitted {
		for wi, w := range el.w {
			for ; w != 0; w &= w - 1 {
				held = max(held, placed[wi*64+bitIndex(w)])
			}
		}
		// The shared part is read from the kept text alone (its first 32
		// KiB): read over the whole chain, forks deep in long prompts (a
		// conversation resent with another continuation) made histories
		// "shared" and cost the trace up to 1.1 points of hit rate
		// (docs/routing.md, whole prompts for the approximate index).
		if held > 0 && ctx.Prompt != "" {
			shared = float64(t.index.SharedLen(ctx.Prompt)) * tokensPerByte(ctx, tokens)
		}
	}
	var fbuf [MaxTargets]float64
	followed := fbuf[:t.n]
	if follow.wait > 0 {
		t.followWaits(el, follow, now, placed, followed)
	}
	var gbuf [MaxTargets]float64
	forgot := gbuf[:t.n]
	if fitted {
		t.forget(el, &m, tokens, int64(now), forgot)
	}
	var typical, longWhole float64 // overdue's and silence's margins, once per pick
	var batch *batchLaw            // nil unless the engines' steps slow with their batch
	if fitted {
		typical, longWhole = t.typicalFirst(), t.longWhole.ms()
	}
	if fitted && precise && t.batchOn() {
		batch = t.batch.law.Load()
	}
	best := math.Inf(1)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			own := max(float64(tokens)-match[i], 0)
			x := t.features(i, own, tokens, &m, now, counts[i])
			ttft := max(0, m.predict(x))
			pred[i] = ttft + t.externality(i, max(0, m.w[lawQueued])*own/1000, ttft, rates) + waste(&m, held-max(placed[i], shared)) + followed[i] + forgot[i]
			stall := t.silence(i, now, longWhole)
			if slotWait[i] == 0 {
				stall = max(stall, t.overdue(i, &m, now, typical))
			}
			pred[i] += stall
			if batch != nil {
				pred[i] += batch.cost(t.runningAt(i, counts[i]))
			}
			if slot := slotWait[i]; slot > 0 {
				// The prefill ahead proceeds while the request waits for
				// its slot: it starts its own after both.
				alone := x
				alone[lawAhead], alone[lawQueued] = 0, 0
				first := slot + max(0, m.predict(alone)) // its first token there
				pred[i] += max(0, first-ttft)
				// Its own prefill holds the slot longer, at the engine's
				// own-prefill rate whether or not it prefills requests
				// one at a time.
				pred[i] += slotExternality(max(0, m.w[lawOwn])*own/1000, slots[i], first, rates.lambda, saturation)
			}
			best = min(best, pred[i])
		}
	}
	return pickCosts{el: el, best: best, precise: precise, fitted: fitted, rates: rates}
}

// waste is the price of re-prefilling tokens of a prefix that lives at
// another eligible target (it holds them, or was sent them and may have
// evicted part: see placedAt) and no other request shares: the work
// itself, at the law's own-work rate, once. The request's own TTFT
// already pays for that prefill (own(i)), but the fleet pays for it too:
// it is GPU time no placement needed, which the requests queued behind it wait for, and a
// second copy that displaces other prefixes from the cache while the first
// goes unused. Without it a follow-up left the replica holding its
// conversation whenever that replica was busier for a moment, and the
// conversation's history was prefilled again elsewhere (rolter-sim trace
// at 131,072 blocks: 38 such moves lost 1.1 points of the 27.0 % hit rate a
// single cache gets). The tokens counted stop at the part other requests
// share (where the approximate index saw prompts part, Index.SharedLen): a
// copy of a system prompt many sessions start with is replication the
// fleet needs to spread them, and charging it piled sessions arriving one
// by one onto the first holders (agents with a 2 s client ramp at 16
// replicas: TTFT mean 123 -> 178 ms). Measured in docs/routing.md. Zero
// for the holder, and until the law is fitted (the unit law's weights are
// not milliseconds).
func waste(m *ttftLaw, tokens float64) float64 {
	return max(0, m.w[lawOwn]) * max(tokens, 0) / 1000
}

// tieWeigher weighs tied targets against one another: by their loads (0
// when unknown), and for a prompt no target holds any of (a new prefix) by
// what each target's approximate index holds instead. A new prefix brings
// the requests that will extend it, and a target's index is what the
// traffic it already draws left there: the smallest index is the target
// the fewest prefixes return to (SGLang's rule for a cache miss, its
// smallest tree), where the loads are a moment's state. By loads, a new
// group's prompts went to the replica whose first requests had all just
// finished, and it ended with 11 of 64 groups (rolter-sim gsp
// --parallel-prefill, imbalance 1.38). Measured in docs/routing.md (the
// loads as a second key, for indexes of equal size, did worse).
type tieWeigher struct {
	t     *predictedTTFT
	loads []int
	cold  bool
}

// weight returns target i's weight: lighter wins.
func (w tieWeigher) weight(i int) int64 {
	if w.cold {
		return int64(w.t.index.Stats(i).Chunks)
	}
	if len(w.loads) == w.t.n {
		return int64(max(w.loads[i], 0))
	}
	return 0
}

// known reports whether weights tell targets apart: the prompt is new
// (the index is always known), or the loads are known.
func (w tieWeigher) known() bool { return w.cold || len(w.loads) == w.t.n }

// lightest returns the lightest of the tied targets that keep accepts
// (all when keep is nil), uniformly among equals, and its weight; -1 when
// none is accepted.
func (t *predictedTTFT) lightest(tied []uint8, w tieWeigher, keep func(int) bool) (pick int, minWeight int64) {
	pick, ties := -1, 0
	for _, c := range tied {
		i := int(c)
		if keep != nil && !keep(i) {
			continue
		}
		l := w.weight(i)
		switch {
		case pick < 0 || l < minWeight:
			pick, minWeight, ties = i, l, 1
		case l == minWeight:
			ties++
			if t.intn(ties) == 0 {
				pick = i
			}
		}
	}
	return pick, minWeight
}

// homeTie breaks a tie between the tied targets when this proxy has peers
// (SetPlace): the lightest (then uniform) of those that are its home,
// unless a tied target drawn at random is lighter still (see tieWeigher). Target i is
// home to the proxy of rank i mod size, or, with fewer targets than
// proxies, target rank mod n to rank. False when there are no peers or no
// home target is tied (then tiedOfTwo decides).
//
// The proxies of a fleet see the same costs, the same stale loads and the
// same ties at the same instant (a burst spread over them by the L4
// balancer), and each is unaware of the others' picks for a few
// milliseconds: broken by load alone, or by independent random draws,
// their ties often land on the same target. Their homes are disjoint, so
// their first picks of a burst are too; the random draw is two choices
// against the loads (tiedOfTwo), without which a proxy's share of new
// sessions stays on its few home targets whatever their load.
// rolter-sim, 4 proxies against one (docs/routing.md, before followWait):
// the trace's buckets 0.74–0.75× of the TTFT instead of 0.68–0.70× (home
// alone 0.79–0.82×, but agent 0.90× instead of 0.98× with its clients
// starting over 1 s).
func (t *predictedTTFT) homeTie(tied []uint8, w tieWeigher) (int, bool) {
	rank, size := t.placeOf()
	if size <= 1 {
		return -1, false
	}
	pick, minWeight := t.lightest(tied, w, func(i int) bool { return t.isHome(i, rank, size) })
	if pick < 0 {
		return -1, false
	}
	if w.known() {
		if b := int(tied[t.intn(len(tied))]); w.weight(b) < minWeight {
			return b, true
		}
	}
	return pick, true
}

// tiedOfTwo returns the lighter (see tieWeigher) of two of the tied
// targets drawn at random; false when at most two are tied (then the
// lightest is the same pick). It is the tie rule when the loads include
// other proxies' requests (a fleet scale above 1, see recordLoads): their
// counts arrive late (every load interval) and miss what the peers picked
// in the same instant, so every proxy would send its next tied pick to the
// same least-loaded target and they would pile up there; two random
// choices keep most of the balance and spread a burst (Mitzenmacher, "How
// useful is old information?", 2000). Measured in docs/routing.md (several
// proxies).
func (t *predictedTTFT) tiedOfTwo(tied []uint8, w tieWeigher) (int, bool) {
	if len(tied) <= 2 {
		return -1, false
	}
	a := int(tied[t.intn(len(tied))])
	b := int(tied[t.intn(len(tied)-1)])
	if b == a {
		b = int(tied[len(tied)-1]) // the draw skipped a
	}
	if w.weight(b) < w.weight(a) {
		return b, true
	}
	return a, true
}

// meanService is one request's mean service on the law m (ms): its
// per-request weight and its queued-token weight for the mean uncached
// prefill, what a peer's blind pick adds where it lands (blindPickCost);
// false before any request was sent.
func (t *predictedTTFT) meanService(m *ttftLaw) (float64, bool) {
	mean, ok := t.meanUncached()
	if !ok {
		return 0, false
	}
	return max(0, m.w[lawAhead]) + max(0, m.w[lawQueued])*mean/1000, true
}

// tiedAt appends to dst the targets of el whose pred is at most best +
// tieEpsilon × max(1, best) (a tie), and returns it.
func tiedAt(pred []float64, el Set, best float64, dst []uint8) []uint8 {
	limit := best + tieEpsilon*max(1, best)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			if i := wi*64 + bitIndex(w); pred[i] <= limit {
				dst = append(dst, uint8(i))
			}
		}
	}
	return dst
}

// arriveLocked counts an own arrival at now for concurrent: the own
// arrivals within a peer's report gap before it, twice
// (each such pair is within the gap of both); t.mu must be held.
func (t *predictedTTFT) arriveLocked(now time.Duration) {
	gap := time.Duration(t.reportGap.Load())
	if gap <= 0 {
		return
	}
	near := 0
	for k := range min(t.recentN, recentArrivals) {
		at := t.recent[(t.recentN-1-k)%recentArrivals]
		if int64(now)-at >= int64(gap) {
			break
		}
		near++
	}
	t.recent[t.recentN%recentArrivals] = int64(now)
	t.recentN++
	t.closeSum += 2 * float64(near)
	t.closeN++
	t.concurrent.Store(math.Float64bits(t.closeSum / t.closeN))
}

// gapLocked learns the peers' report gap from peer's report at now: the
// mean time between a peer's consecutive reports, those under ttl apart (a
// longer silence is an idle peer, not its interval); t.peerMu must be
// held.
func (t *predictedTTFT) gapLocked(peer string, now, ttl time.Duration) {
	last, ok := t.peerLast[peer]
	t.peerLast[peer] = now
	if !ok || now <= last || now-last >= ttl {
		return
	}
	t.gapSum += float64(now - last)
	t.gapN++
	t.reportGap.Store(int64(t.gapSum / float64(t.gapN)))
}

// heardPeer reports whether a peer's queue report has been folded: the
// balancer is one of several sharing proxies.
func (t *predictedTTFT) heardPeer() bool { return t.peerHeard.Load() >= 0 }

// teachesNothing reports whether e's first token or whole answer must not
// teach the law (see FirstToken): sent blind before a peer was heard by a
// balancer that has heard one since, or waiting for a batch slot, or behind
// a peer's work no report had shown.
func (t *predictedTTFT) teachesNothing(e *pendingPrefill) bool {
	return e.blind && t.heardPeer() || e.slot || e.unseen
}

// Observe implements Balancer: the request joins target's pending prefill
// and its prompt the target's approximate index.
func (t *predictedTTFT) Observe(target int, ctx *Context) {
	if target < 0 || target >= t.n || ctx == nil {
		return
	}
	tokens := t.tokens(ctx)
	var mbuf [MaxTargets]float64
	match := mbuf[:t.n]
	precise := t.matched(ctx, tokens, match)
	own := max(float64(tokens)-match[target], 0)
	now := t.now()
	t.expireDue(now)
	m := t.law()
	c := t.counts(target)
	e := pendingPrefill{tokens: int(own), x: t.features(target, own, tokens, &m, now, c), at: now,
		bytes: promptBytes(ctx), indexed: indexedBytes(ctx), knownTok: len(ctx.TokenIDs), blind: !t.heardPeer(),
		slot: t.slotWaiter(target, c), running: -1}
	if precise && t.batchOn() {
		e.running = t.runningAt(target, c)
	}
	if ctx.Buffered && !e.slot {
		// No first token will be seen: the request leaves the queue when
		// the law says it has one, less the law's fixed part (where whole
		// answers of about one length put their decode, which no fit can
		// tell from a fixed cost). Before the law (no time scale), at
		// once: kept until its answer, the queue it showed was mostly
		// decode, and a law fitted on it learned that (gsp --rate 20, no
		// client streaming: imbalance 2.66, TTFT mean 25.9 ms against 19.4
		// streaming). Waiting for a slot, it leaves at its answer.
		e.due = now + 1
		if m != t.unitLaw {
			e.due = now + max(time.Duration((m.predict(e.x)-m.w[lawBase])*float64(time.Millisecond)), 1)
		}
	}

	held := 0.0
	for _, v := range match {
		held = max(held, v)
	}

	t.mu.Lock()
	t.seq++
	e.seq = t.seq
	if tokens > 0 {
		t.noveltySum += 1 - min(held/float64(tokens), 1)
		t.novelty.Store(math.Float64bits(t.noveltySum))
	}
	if held == 0 {
		t.newPrefixes[target].Add(1)
	}
	t.start.CompareAndSwap(-1, int64(now))
	t.arriveLocked(now)
	t.arrivals[target].Add(1)
	t.inflight[target].Add(1)
	t.flights[target].add(int64(now), 1)
	if t.seq%rateStep == 0 {
		t.snapshotLocked(now)
	}
	if old, ok := t.pending[target][ctx]; ok {
		t.pendLocked(target, -1, -old.tokens, old.slot, now)
	}
	t.pending[target][ctx] = e
	t.pendLocked(target, 1, e.tokens, e.slot, now)
	if e.due > 0 {
		t.pushDueLocked(dueItem{at: e.due, target: target, ctx: ctx, seq: e.seq})
	}
	if now-t.lastSweep > time.Second {
		t.lastSweep = now
		t.sweepLocked(now)
	}
	t.mu.Unlock()

	if ctx.Prompt != "" {
		var hbuf [promptHashBuf]uint64
		c := promptChain(ctx, hbuf[:])
		published := t.index.ObserveChain(target, c, nil)
		if t.publish != nil {
			t.publishHashes(target, ctx.Prompt, withPromptEnd(published, fullHashes(c)))
		}
		t.returns.sent(fullHashes(c), int64(now))
	}
	if t.kv != nil && t.specTTL > 0 && len(ctx.TokenIDs) > 0 {
		t.speculate(target, ctx.TokenIDs, now)
	}
	// Last, so that the report carries what the lines above recorded.
	t.reportBurstPick(now)
	t.uncachedSum.Add(int64(e.tokens))
	if t.observes.Add(1)%64 == 0 {
		t.refreshCapacity()
	}
}

// sweepLocked drops pending prefills older than TTFTPendingTimeout; t.mu
// must be held.
func (t *predictedTTFT) sweepLocked(now time.Duration) {
	for i, m := range t.pending {
		for k, e := range m {
			if now-e.at > TTFTPendingTimeout {
				delete(m, k)
				t.pendLocked(i, -1, -e.tokens, e.slot, now)
			}
		}
	}
	for i, m := range t.answered {
		for k, e := range m {
			if now-e.at > TTFTPendingTimeout {
				delete(m, k)
			}
		}
		t.answeredDueLocked(i)
	}
}

// take removes and returns the pending prefill of (target, ctx), or with
// answered, if it is not pending, the attempt that left the queue at its
// due (see expireDue).
func (t *predictedTTFT) take(target int, ctx *Context, answered bool) (pendingPrefill, bool) {
	if target < 0 || target >= t.n || ctx == nil {
		return pendingPrefill{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.pending[target][ctx]
	if ok {
		delete(t.pending[target], ctx)
		t.pendLocked(target, -1, -e.tokens, e.slot, t.now())
		return e, true
	}
	if answered {
		if e, ok = t.answered[target][ctx]; ok {
			delete(t.answered[target], ctx)
			if e.due <= time.Duration(t.answeredDue[target].Load()) {
				t.answeredDueLocked(target)
			}
		}
	}
	return e, ok
}

// pendLocked changes target's pending count and tokens (slot: the request
// was sent to wait for a batch slot) and keeps its busy time; t.mu must be
// held.
func (t *predictedTTFT) pendLocked(target int, dn, dtok int, slot bool, now time.Duration) {
	t.pendTokens[target].Add(int64(dtok))
	t.pendCount[target].Add(int64(dn))
	t.pendLog[target].add(int64(now), int8(dn))
	if slot {
		t.slotPend[target].Add(int64(dn))
	}
	if dn < 0 {
		t.settleStallLocked(target, now)
		t.lastLeave[target].Store(int64(now))
	}
	t.headLocked(target)
	t.busyLocked(target, now)
}

// settleStallLocked takes the time target's head was overdue (see overdue)
// out of its busy spell as a request leaves (the leave restarts the
// overdue clock): a replica that stalled was not serving, and counted busy
// it kept the utilisation the follow-up wait reads (over the rates'
// window) high after it resumed, so it drew no new prefix for a minute
// (rolter-outage, a replica frozen for 8 s; docs/routing.md). Not while the
// engine is full (see overdue). t.mu must be held, before the leaving
// request is out of the head.
func (t *predictedTTFT) settleStallLocked(target int, now time.Duration) {
	since := t.busySince[target].Load()
	if since < 0 {
		return
	}
	m := t.law()
	if stalled := t.overdue(target, &m, now, t.typicalFirst()); stalled > 0 {
		t.busySince[target].Store(min(since+int64(stalled*float64(time.Millisecond)), int64(now)))
	}
}

// busyLocked starts or ends target's busy spell: its prefill is busy while
// it has pending requests that are not waiting for a batch slot (those do
// not occupy the prefill), or while a peer's unexpired report shows
// requests pending there (FoldPeerQueue calls it too). With the peers'
// queues counted the busy time is the target's, not this proxy's share,
// and fleetRates does not scale it (see there). t.mu must be held.
func (t *predictedTTFT) busyLocked(target int, now time.Duration) {
	own := t.prefilling(target)
	if since := t.busySince[target].Load(); since >= 0 && own <= 0 {
		// A spell that only peers' reports kept open, and whose last
		// report has expired, ended at its expiry: a new one starts now.
		if end := t.busyEnd(target, since, now); end < int64(now) {
			t.endSpellLocked(target, since, end)
		}
	}
	after := own
	if after <= 0 && t.peersAt(target, now).requests > 0 {
		after = 1
	}
	switch {
	case after > 0 && t.busySince[target].Load() < 0:
		t.busySince[target].Store(int64(now))
	case after <= 0:
		if since := t.busySince[target].Load(); since >= 0 {
			t.endSpellLocked(target, since, int64(now))
		}
	}
}

// endSpellLocked ends target's busy spell, begun at since, at end: its
// length joins the busy total. t.mu must be held.
func (t *predictedTTFT) endSpellLocked(target int, since, end int64) {
	t.busyTotal[target].Add(max(end-since, 0))
	t.busySince[target].Store(-1)
}

// prefilling is how many of this balancer's pending requests at target
// occupy its prefill: those not waiting for a batch slot.
func (t *predictedTTFT) prefilling(target int) int64 {
	return t.pendCount[target].Load() - t.slotPend[target].Load()
}

// busyEnd is when target's open busy spell, begun at since, ends by now at
// the latest: now, or, when this balancer has nothing pending there and the
// peers' last report showing requests expired before now, that expiry (or
// this balancer's last request's leave, if later). A peer that died with
// requests pending, or whose emptying report was lost, otherwise left the
// target busy until this balancer's next request there, and the idle time
// in between raised the utilisation every pick reads.
func (t *predictedTTFT) busyEnd(target int, since int64, now time.Duration) int64 {
	if t.prefilling(target) > 0 {
		return int64(now)
	}
	until := t.peerBusyUntil[target].Load()
	if until < 0 || until >= int64(now) {
		return int64(now)
	}
	return min(max(until, t.lastLeave[target].Load(), since), int64(now))
}

// headLocked finds target's oldest pending prefill, the one the replica
// serves first; t.mu must be held.
func (t *predictedTTFT) headLocked(target int) {
	var head pendingPrefill
	found := false
	for _, e := range t.pending[target] {
		if !found || e.seq < head.seq {
			head, found = e, true
		}
	}
	if !found {
		t.headTokens[target].Store(0)
		t.headAt[target].Store(-1)
		return
	}
	t.headTokens[target].Store(int64(head.tokens))
	t.headAt[target].Store(int64(head.at))
}

// LocalQueue implements [SharedQueue].
func (t *predictedTTFT) LocalQueue(target int) QueueState {
	if target < 0 || target >= t.n {
		return QueueState{LeaveAge: -1, AnswerAge: -1}
	}
	now := t.now()
	t.expireDue(now)
	t.mu.Lock()
	defer t.mu.Unlock()
	q := QueueState{Requests: int(t.pendCount[target].Load()), Tokens: int(t.pendTokens[target].Load()), LeaveAge: -1, AnswerAge: -1}
	if at := t.headAt[target].Load(); at >= 0 {
		q.HeadTokens, q.HeadAge = int(t.headTokens[target].Load()), max(now-time.Duration(at), 0)
	}
	if at := t.lastLeave[target].Load(); at >= 0 {
		q.LeaveAge = max(now-time.Duration(at), 0)
	}
	if at := t.lastBack[target].Load(); at >= 0 {
		q.AnswerAge = max(now-time.Duration(at), 0)
	}
	return q
}

// PeerQueue implements [SharedQueue].
func (t *predictedTTFT) PeerQueue(target int) QueueState {
	if target < 0 || target >= t.n {
		return QueueState{LeaveAge: -1, AnswerAge: -1}
	}
	p := t.peersAt(target, t.now())
	return QueueState{Requests: int(p.requests), Tokens: int(p.tokens), LeaveAge: -1, AnswerAge: -1}
}

// FoldPeerQueue implements [SharedQueue]: the report's ages become instants
// on this balancer's clock (the trip from the peer, a millisecond or two,
// is not subtracted).
func (t *predictedTTFT) FoldPeerQueue(peer string, target int, q QueueState, ttl time.Duration) {
	if target < 0 || target >= t.n || ttl <= 0 {
		return
	}
	now := t.now()
	t.peerHeard.Store(int64(now))
	pq := peerQueue{requests: int64(max(q.Requests, 0)), tokens: int64(max(q.Tokens, 0)),
		headTokens: int64(max(q.HeadTokens, 0)), headAt: now - max(q.HeadAge, 0), until: now + ttl}
	if q.LeaveAge >= 0 {
		raise(&t.peerLeave[target], int64(now-q.LeaveAge))
	}
	if q.AnswerAge >= 0 {
		raise(&t.lastBack[target], int64(now-q.AnswerAge))
	}
	pq.at = now
	t.peerMu.Lock()
	t.gapLocked(peer, now, ttl)
	qs := t.peerQueues[peer]
	if qs == nil {
		qs = make([]peerQueue, t.n)
		for i := range qs {
			qs[i].until = -1
		}
		t.peerQueues[peer] = qs
	}
	prev := qs[target]
	qs[target] = pq
	t.sumPeersLocked(target, now)
	t.peerMu.Unlock()
	t.mu.Lock()
	t.busyLocked(target, now) // first: a spell left by an expired report ends at its expiry
	if pq.requests > 0 {
		raise(&t.peerBusyUntil[target], int64(pq.until))
	}
	t.markUnseenLocked(target, prev, pq, now)
	t.mu.Unlock()
}

// markUnseenLocked marks the requests this balancer sent to target that a
// peer's report (pq, received at now; prev the one before it) shows may
// have had that peer's work ahead of them that no report had shown at
// their dispatch: the peer's pending there grew since its previous report
// (or, when that one has expired, from nothing one report gap ago: a peer
// does not go on reporting an empty queue), and they were sent in between.
// Their features miss that work, and they teach the law nothing
// (FirstToken): through 4 sharing proxies in rolter-sim, the law learned
// from every first token was 156-212 ms per request on the Mooncake trace
// where the engines' truth is 5 (the features missed a mean 164 ms of
// peers' work), and from these alone 5.1 (docs/routing.md, the law through
// several proxies). FoldPeerQueue calls it with t.mu held, in the same
// section that counts the report as busy time, so a pick between the two
// sees both or neither.
func (t *predictedTTFT) markUnseenLocked(target int, prev, pq peerQueue, now time.Duration) {
	from, n, tok := prev.at, prev.requests, prev.tokens
	if prev.until < now {
		n, tok = 0, 0
		from = now - time.Duration(t.reportGap.Load())
	}
	if from >= now || pq.requests <= n && pq.tokens <= tok {
		return
	}
	for k, e := range t.pending[target] {
		if e.at > from && !e.unseen {
			e.unseen = true
			t.pending[target][k] = e
		}
	}
}

// isHome reports whether target i is home to the proxy of rank among size
// (see homeTie): i mod size is rank, or with fewer targets than proxies,
// i is rank mod the targets.
func (t *predictedTTFT) isHome(i, rank, size int) bool {
	if t.n < size {
		return i == rank%t.n
	}
	return i%size == rank
}

// placeOf returns this proxy's rank among the proxies serving the route and
// their number (SetPlace; 0, 1 when alone).
func (t *predictedTTFT) placeOf() (rank, size int) {
	p := t.place.Load()
	return int(p >> 32), max(int(uint32(p)), 1)
}

// SetPlace implements [SharedQueue].
func (t *predictedTTFT) SetPlace(rank, size int) {
	if size < 1 || rank < 0 || rank >= size {
		rank, size = 0, 1
	}
	t.place.Store(uint64(rank)<<32 | uint64(size))
}

// peersAt returns what t's peers have pending at target i, summed.
func (t *predictedTTFT) peersAt(i int, now time.Duration) peerQueue {
	p := t.peerSum[i].Load()
	if p == nil {
		return peerQueue{headAt: -1}
	}
	if now > p.until {
		t.peerMu.Lock()
		t.sumPeersLocked(i, now)
		p = t.peerSum[i].Load()
		t.peerMu.Unlock()
		if p == nil {
			return peerQueue{headAt: -1}
		}
	}
	return *p
}

// sumPeersLocked recomputes peerSum[i] from the peers' unexpired reports,
// forgetting peers with none left; t.peerMu must be held.
func (t *predictedTTFT) sumPeersLocked(i int, now time.Duration) {
	sum := peerQueue{headAt: -1, until: -1}
	live := false
	for id, qs := range t.peerQueues {
		q := qs[i]
		if q.until < now {
			qs[i].until = -1
			if !slices.ContainsFunc(qs, func(q peerQueue) bool { return q.until >= now }) {
				delete(t.peerQueues, id)
				delete(t.peerLast, id)
			}
			continue
		}
		if !live || q.until < sum.until {
			sum.until = q.until
		}
		live = true
		sum.requests += q.requests
		sum.tokens += q.tokens
		if q.requests > 0 {
			at, tok := earlierHead(int64(sum.headAt), sum.headTokens, int64(q.headAt), q.headTokens)
			sum.headAt, sum.headTokens = time.Duration(at), tok
		}
	}
	if !live {
		t.peerSum[i].Store(nil)
		return
	}
	t.peerSum[i].Store(&sum)
}

// externality is the delay that adding own ms of prefill to a target whose
// queue would then take ttft ms to clear imposes on the requests that
// arrive there meanwhile: own × λ × ttft / (1 − ρ) (an M/G/1 queue: the
// busy period the work extends lasts ttft / (1 − ρ), and every arrival in
// it waits own longer). λ is the fleet's mean arrival rate per target and ρ
// the mean share of time a target's prefill queue was busy, both since the
// first request; pooled over the targets because a target's own rate
// mostly reflects how routing treated it so far (an avoided replica looks
// idle), and the pooled figures routed better (docs/routing.md).
//
// A target whose prefill queue was not busy once over the rates' window
// received none of its arrivals, and nobody is expected to queue behind
// this request there: its externality is 0. Charged the pooled rate like
// the others, an avoided replica stayed avoided for good, the cold
// prefill that would make it a second holder of a popular prefix priced
// as if the fleet's mean traffic waited behind it (rolter-sim gsp with 2
// groups of 6,144-token system prompts and 3-token answers at 15 requests/s:
// 5 of 8 replicas never used, TTFT p99 110 ms against Dynamo's 72;
// with the rule none idle and 41 ms; docs/routing.md, a replica nobody
// uses).
//
// Until the law is fitted there is no time scale (the unit law's
// milliseconds are nominal), and when every request so far arrived in one
// instant (a burst: a load generator's clients starting together) there is
// no rate; then the arrivals so far stand in for what is still to come: as many arrivals again, of which
// the share q that were new to every target (the mean share of a prompt no
// target held, novelty) spread evenly, and the rest follow what each target
// already holds, as many at i as i has had. So i expects
// (1 − q)·arrivals(i) + q·arrivals/n later arrivals. With q ≈ 1 (many
// distinct prefixes) a holder's follower stays with it rather than copying
// the prefix to a target that will soon have new prefixes of its own; with
// q ≈ 0 (one prefix shared by everyone, e.g. agents with one system prompt)
// an idle target expects nobody and takes the next session, so the burst
// spreads instead of piling onto the first holder (docs/routing.md).
func (t *predictedTTFT) externality(i int, ownMS, ttftMS float64, r queueRates) float64 {
	if !r.started || ownMS <= 0 {
		return 0
	}
	if !r.timed {
		if r.arrivals <= 0 {
			return 0
		}
		return ownMS * ((1-r.q)*float64(t.arrivals[i].Load()) + r.q*r.arrivals/float64(t.n))
	}
	if r.rho > 0 && t.busyFrom(i, r.now, r.base) == 0 {
		return 0
	}
	return ownMS * r.lambda * ttftMS / (1 - r.rho)
}

// queueRates are the pooled figures externality and followCost read, taken
// once per pick (the same for every target): whether any request was sent,
// the novelty share q and the arrivals so far, the fleet scale, and once
// the law is fitted and time has passed (timed) the mean arrival rate per
// target λ (per ms) and utilisation ρ, with the window's base and the
// pick's instant they were read over.
type queueRates struct {
	started, timed     bool
	q, arrivals, scale float64
	lambda, rho        float64
	base               *rateBase
	now                time.Duration
}

// fleetRates returns the queueRates at now.
func (t *predictedTTFT) fleetRates(now time.Duration, scale float64, fitted bool) queueRates {
	r := queueRates{scale: scale}
	base, from := t.rateFrom()
	if from < 0 {
		return r
	}
	r.started = true
	r.q, r.arrivals = t.noveltyShare(base)
	elapsed := float64(int64(now)-from) / float64(time.Millisecond)
	if elapsed <= 0 || !fitted {
		return r
	}
	var busy float64
	for j := range t.n {
		busy += t.busyFrom(j, now, base)
	}
	k := float64(t.n)
	r.timed, r.base, r.now = true, base, now
	// Once a peer has been heard the busy time counts the peers' reported
	// queues (busyLocked): it is the targets', and only the arrivals are
	// scaled. This proxy's own busy share scaled by the fleet's size, as ρ
	// was, counted the overlapping spells of several proxies up to P
	// times: under load ρ stood near its cap and the externality scattered
	// prefixes (rolter-sim agent --rate 8 through 4 proxies: 0.78× of one
	// proxy's TTFT mean with it, 1.03× without, docs/routing.md item 8).
	rhoScale := scale
	if t.heardPeer() {
		rhoScale = 1
	}
	r.rho = min(rhoScale*busy/k/float64(time.Millisecond)/elapsed, maxUtilisation)
	r.lambda = scale * r.arrivals / k / elapsed
	return r
}

// followWait is the queueing delay that the traffic this pick draws to
// target i will cause there. A request leaves its prompt at i, and the
// requests that extend it (a conversation's next turn, an agent's next
// step, the next question to a group's system prompt) follow it to i,
// since i then holds their prefix. In an M/M/1 queue each of them waits
// ρ_i/(1 − ρ_i) mean services, ρ_i being the share of time since the first
// request that i had a prefill pending (this balancer's or, as their
// reports tell, its peers'; see busyLocked); and its own work
// delays those queued at i meanwhile by b/(1 − b)² times that work (the
// marginal wait of the others, d(λ·W)/dλ less its own wait), b = ρ_i ×
// blocking being the share of time i's prefill made others queue. How many
// follow: the share of the traffic that repeats what some target held is
// 1 − q (q, the novelty, as in externality), so a request is followed by
// (1 − q)/q more on average (a chain in which each request is a follow-up
// with probability 1 − q). A mean service is what a request ahead costs,
// the law's per-request and queued-token weights for the mean uncached
// prefill; the work others wait behind is priced at the queued-token
// weight alone (on an engine that prefills every request on its own,
// vllmsim, that weight is small, and so are both parts).
//
// Without it nothing in the cost looks past the current queue, and the
// replica that first holds a prefix everyone shares (an agents' system
// prompt) takes every new session while its queue is short, then keeps
// them: rolter-sim agent with its clients starting over 5 s, imbalance 1.59
// without it, 1.48 with the followers' own waits only, 1.23 with the delay
// they cause too (16 replicas over 2 s: 1.93, 1.44, 1.20; docs/routing.md).
// The delay at ρ_i itself, not b, made a replica of vllmsim, which has
// some prefill pending 90 % of the time, cost 300 ms more per pick. Scaled
// by the fleet scale (recordLoads), as an earlier form of the term read ρ_i, this proxy's own
// share overstated one target's (multiturn through 4 proxies lost up to 5 %
// of its hit rate). follow is followCost, computed once per pick.
func (t *predictedTTFT) followWait(i int, follow followFactors, now time.Duration) float64 {
	base, from := t.rateFrom()
	if from < 0 || int64(now) <= from {
		return 0
	}
	rho := min(t.busyFrom(i, now, base)/float64(int64(now)-from), maxUtilisation)
	b := rho * follow.blocking
	return follow.wait*rho/(1-rho) + follow.delay*b/((1-b)*(1-b))
}

// followWaits sets followed[i] to followWait(i) for every eligible target,
// bounded where it would override what the cache saves: a target holding
// more of the prompt (match: placedAt's when the law is fitted) than the
// eligible target that holds least is charged at most the least follow-up
// wait plus follow.fallback. The followers are not bound to the target
// this pick sends the prompt to: each can go where the follow-up wait is
// least and prefill this prompt again there.
//
// Without the bound the wait's M/M/1 factors grow without limit as ρ_i
// nears 1 (b/(1 − b)² is 10⁴ at the 0.99 cap), and where every target's
// prefill queue is busy nearly all the time their differences are the
// noise in ρ_i, seconds apart, which outweighed the cache: rolter-sim gsp
// with short answers (--itl-ms 8 --gsp-output-len 64), whose queues are
// busy 93-100 % of the time, sent a group's questions away from the
// replica holding its system prompt (hit rate 81.4 against 87.6 %, TTFT
// mean 148 against SGLang's 107 ms; bounded: 87.6 %, 101 ms). Among
// targets that hold the same of the prompt (a new prompt: none of it, or
// only what every target shares) nothing is saved either way, and the
// unbounded wait is what spreads new prompts by each target's long-run
// busy share; bounded there too, the trace under heavy prefill load lost
// up to 1.2 points of hit rate (docs/routing.md, saturated prefill queues).
func (t *predictedTTFT) followWaits(el Set, follow followFactors, now time.Duration, match, followed []float64) {
	least, fewest := math.Inf(1), math.Inf(1)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			followed[i] = t.followWait(i, follow, now)
			least = min(least, followed[i])
			fewest = min(fewest, match[i])
		}
	}
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			if i := wi*64 + bitIndex(w); match[i] > fewest {
				followed[i] = min(followed[i], least+follow.fallback)
			}
		}
	}
}

// followCost returns followWait's factors at now for a request of tokens
// prompt tokens.
func (t *predictedTTFT) followCost(m *ttftLaw, now time.Duration, r queueRates, tokens int) followFactors {
	mean, ok := t.meanUncached()
	if !r.started || int64(now) <= t.start.Load() || !ok || r.arrivals <= 0 || m.w[lawOwn] <= 0 {
		return followFactors{}
	}
	q := max(r.q, 1/r.arrivals) // one novel request at least: the first
	queued := max(0, m.w[lawQueued]) * mean / 1000
	followers := (1 - q) / q
	return followFactors{wait: followers * (max(0, m.w[lawAhead]) + queued), delay: followers * queued,
		blocking: min(max(0, m.w[lawQueued])/m.w[lawOwn], 1), fallback: followers * m.w[lawOwn] * float64(max(tokens, 0)) / 1000}
}

// followFactors are followWait's factors common to every target: the
// requests that follow one, (1 − q)/q, times a mean service (wait: what each
// waits per request ahead of it) and times the mean queued work (delay:
// what each adds to the wait of those queued behind it, priced at the
// queued-token weight as in externality); and blocking, the share of a
// pending prefill's time that others queue behind (the queued-token weight
// over the own-token weight, at most 1: about 1 on an engine that prefills
// one request at a time, the routing simulator; about 0.04 on one that
// prefills requests side by side, vllmsim); and fallback, what the
// followers pay to avoid a target instead: this prompt prefilled again
// elsewhere, at the own-work weight (see followWaits). Zero before any
// request.
type followFactors struct{ wait, delay, blocking, fallback float64 }

// noveltyShare returns the mean share of a prompt that no target held, over
// the arrivals since base (nil: all so far), and their number.
func (t *predictedTTFT) noveltyShare(base *rateBase) (q, arrivals float64) {
	for j := range t.n {
		arrivals += float64(t.arrivals[j].Load())
	}
	novelty := loadFloat(&t.novelty)
	if base != nil {
		arrivals -= base.arrivals
		novelty -= base.novelty
	}
	if arrivals <= 0 {
		return 1, 0
	}
	return min(max(novelty/arrivals, 0), 1), arrivals
}

// The rates (arrival rate, utilisation, novelty) are measured over the
// latest rateWindow arrivals, not since the first: a proxy runs for weeks,
// and a replica busy an hour ago, or a fleet idle overnight, says nothing
// of now; since the first arrival, what happened was forgotten only as
// 1/t. A window of arrivals, not of time, holds as many samples at any
// load. 1,024: the judged grid keeps 26 of 33 and the longer runs gain a
// little (the trace +0.09 point of hit rate); 4,096 changes no run (none is
// that long); 256 is noise, 22 of 33 (docs/routing.md). A snapshot every
// rateStep arrivals keeps the window between rateWindow and rateWindow +
// rateStep arrivals long.
const (
	rateWindow = 1024
	rateStep   = 64
)

// rateBase is a snapshot the rates are measured from: its time (ns), the
// arrivals and Σ novelty then, each target's busy time then (ns), and the
// sums and counts behind the means (see windowMean) then.
type rateBase struct {
	at                int64
	arrivals, novelty float64
	busy              []float64
	// Σ and count of: uncached prefill tokens (per Observe), first tokens,
	// those without a slot wait, and completions (ns).
	uncached, observes int64
	first, firstN      int64
	free, freeN        int64
	done, doneN        int64
	// Σ of the in-flight loads and own share at the picks (recordLoads).
	loads, own int64
	// Defer's arrivals with peers and those in a burst (bursty); the
	// settled own arrivals, those near a peer's and the peers' near them
	// (fleetBursts).
	burstArrivals, inBurst   int64
	settled, near, peersNear int64
}

// windowMean is (sum − base) / (n − baseN), the mean over the window, or
// sum / n when the window holds none (or there is no base yet); false when
// there is nothing at all.
func windowMean(sum, n, base, baseN int64) (float64, bool) {
	if n-baseN > 0 {
		return float64(sum-base) / float64(n-baseN), true
	}
	if n > 0 {
		return float64(sum) / float64(n), true
	}
	return 0, false
}

// rateFrom returns the rates' base (nil until the window is full) and the
// time (ns) they are measured from: its time, else the first request's (-1:
// none yet).
func (t *predictedTTFT) rateFrom() (*rateBase, int64) {
	if b := t.base.Load(); b != nil {
		return b, b.at
	}
	return nil, t.start.Load()
}

// means returns the window's base for windowMean: the zero base (every
// sample) until there is one.
func (t *predictedTTFT) means() rateBase {
	if b := t.base.Load(); b != nil {
		return *b
	}
	return rateBase{}
}

// snapshotLocked records a rateBase at now and, once rateWindow arrivals
// have passed, publishes the oldest as the base; t.mu must be held.
func (t *predictedTTFT) snapshotLocked(now time.Duration) {
	b := &rateBase{at: int64(now), novelty: t.noveltySum, busy: make([]float64, t.n),
		uncached: t.uncachedSum.Load(), observes: int64(t.observes.Load()),
		first: t.firstSum.Load(), firstN: t.firstN.Load(), free: t.freeSum.Load(), freeN: t.freeN.Load(),
		done: t.doneSum.Load(), doneN: t.doneN.Load(), loads: t.loadSum.Load(), own: t.ownSum.Load(),
		burstArrivals: t.turns.arrivals.Load(), inBurst: t.turns.inBurst.Load(),
		settled: t.turns.settled.Load(), near: t.turns.near.Load(), peersNear: t.turns.peersNear.Load()}
	t.longFirst.step()
	t.longWhole.step()
	for j := range t.n {
		b.arrivals += float64(t.arrivals[j].Load())
		b.busy[j] = t.busyAt(j, now)
	}
	slot := t.basesN % len(t.bases)
	if t.basesN >= len(t.bases) {
		t.base.Store(t.bases[slot])
	}
	t.bases[slot] = b
	t.basesN++
}

// busyFrom is target i's busy time (ns) from base (nil: the first
// request) to now.
func (t *predictedTTFT) busyFrom(i int, now time.Duration, base *rateBase) float64 {
	busy := t.busyAt(i, now)
	if base != nil {
		busy -= base.busy[i]
	}
	return max(busy, 0)
}

// busyAt is the time (ns) target i's prefill queue has been busy since the
// first request, up to now.
func (t *predictedTTFT) busyAt(i int, now time.Duration) float64 {
	busy := float64(t.busyTotal[i].Load())
	if since := t.busySince[i].Load(); since >= 0 {
		busy += float64(t.busyEnd(i, since, now) - since)
	}
	return busy
}

// meanUncached returns the mean uncached prefill (tokens) of the requests
// this balancer has sent, over the rates' window (see windowMean), false
// before any.
func (t *predictedTTFT) meanUncached() (float64, bool) {
	b := t.means()
	return windowMean(t.uncachedSum.Load(), int64(t.observes.Load()), b.uncached, b.observes)
}

// recordLoads adds one pick's loads to the sums of the rates' window and
// returns the fleet scale, how much more traffic the targets carry than
// this balancer sent them: Σ loads / Σ own in-flight (each target's own
// count capped at its load), summed over the picks of the rates' window
// (see snapshotLocked), 1 when loads are unknown or nothing was in flight.
// With one proxy the loads are its own counts and the scale is 1; behind
// an L4 spread over P sharing proxies it is about P, so the arrival rate
// this proxy measured stands for the fleet's. Read at each pick alone, from
// a few requests in flight and peers' counts up to a load interval old, it
// swung 1.4–10.5 from pick to pick on rolter-sim's trace through 4 proxies;
// over the window, agent with a 1 s ramp through 4 proxies went from 850
// to 772 ms and the trace from 761 to 741 (docs/routing.md).
func (t *predictedTTFT) recordLoads(loads []int) float64 {
	return t.loadScale(loads, true)
}

// loadScale is recordLoads, which passes record; without it the pick's
// loads are counted in the scale but not kept in the sums (Defer, which
// the request's Pick follows).
func (t *predictedTTFT) loadScale(loads []int, record bool) float64 {
	if len(loads) != t.n {
		return 1
	}
	var all, own int64
	for i, l := range loads {
		l := int64(max(l, 0))
		all += l
		own += min(max(t.inflight[i].Load(), 0), l)
	}
	if record {
		all, own = t.loadSum.Add(all), t.ownSum.Add(own)
	} else {
		all, own = t.loadSum.Load()+all, t.ownSum.Load()+own
	}
	b := t.means()
	all, own = all-b.loads, own-b.own
	if own <= 0 || all <= own {
		return 1
	}
	return float64(all) / float64(own)
}

// FirstToken implements [TTFTObserver]: the attempt leaves the pending
// prefill, target's law learns its TTFT, and the prompt's token count
// teaches the bytes-per-token ratios.
func (t *predictedTTFT) FirstToken(target int, ctx *Context, ttft time.Duration, promptTokens int) {
	e, ok := t.take(target, ctx, false)
	if !ok || ttft < 0 {
		return
	}
	t.lastBack[target].Store(int64(t.now()))
	t.longFirst.add(ttft)
	t.firstSum.Add(int64(ttft))
	t.firstN.Add(1)
	if !e.slot {
		t.freeSum.Add(int64(ttft))
		t.freeN.Add(1)
	}
	y := float64(ttft) / float64(time.Millisecond)
	// A request sent before any peer was heard from, by a balancer that has
	// peers (it has heard one since), was predicted without the peers'
	// queues: a fleet's first burst, whose waits behind the peers' picks
	// the law would otherwise learn as fixed cost and per-request delay
	// (docs/routing.md, several proxies). It teaches the law nothing, nor
	// does one that a peer's work not yet reported may have been ahead of
	// (markUnseenLocked). A request expected to wait for a batch slot waited
	// mostly for other requests' decoding, which the prefill law does not
	// price (slotWaits).
	if t.teachesNothing(&e) {
		t.learnRatios(e, promptTokens)
		return
	}
	t.fit(e.x, y)
	if m := t.fleet.Load(); m != nil && e.running >= 0 {
		t.batch.learn(e.running, y-m.predict(e.x))
	}
	t.learnRatios(e, promptTokens)
}

// fit adds the sample (x, y ms) to the law. The law replaces the unit law
// once it is fitted and its own-work weight (the engine's prefill rate,
// which the pick and the served credit rest on) is determined; a later fit
// that is not keeps the last one that was.
func (t *predictedTTFT) fit(x [lawFeatures]float64, y float64) {
	t.fitMu.Lock()
	defer t.fitMu.Unlock()
	pooled := &t.pooled
	pooled.add(x, y)
	if pooled.n >= PredictorMinSamples {
		if w, ok := pooled.solve(); ok && pooled.determined(w, lawOwn) {
			t.fleet.Store(&ttftLaw{w: w, samples: pooled.n})
		}
	}
}

// learnRatios teaches the bytes-per-token ratios from an attempt's prompt
// token count (promptTokens, else its token ids' count).
func (t *predictedTTFT) learnRatios(e pendingPrefill, promptTokens int) {
	toks := promptTokens
	if toks <= 0 {
		toks = e.knownTok
	}
	if toks <= 0 || e.bytes <= 0 {
		return
	}
	t.ratioMu.Lock()
	t.bytesSeen += float64(e.bytes)
	t.indexedSeen += float64(e.indexed)
	t.tokensSeen += float64(toks)
	t.bytesPerToken.Store(math.Float64bits(t.bytesSeen / t.tokensSeen))
	if t.indexedSeen > 0 {
		t.indexedPerToken.Store(math.Float64bits(t.indexedSeen / t.tokensSeen))
	}
	t.ratioMu.Unlock()
}

// Abandon implements [TTFTObserver]: the attempt leaves the pending
// prefill if it was still there, and this balancer's in-flight count
// either way. Counted down only while pending, an attempt cut after its
// first token (a client gone, a broken stream) stayed in flight for good,
// and the fleet scale (Σ loads / Σ own in-flight) drifted towards 1.
func (t *predictedTTFT) Abandon(target int, ctx *Context) {
	if target < 0 || target >= t.n {
		return
	}
	t.take(target, ctx, true)
	t.inflight[target].Add(-1)
	t.flights[target].add(int64(t.now()), -1)
}

// Learn implements [Learner]: the attempt completed, so it leaves this
// balancer's in-flight count, and its latency teaches how long a request
// holds a batch slot (see slotHold; the law learns from first tokens).
//
// Its prompt is also recorded again in the approximate index: a replica
// frees a request's blocks when it completes (tail first), so its LRU ages
// them from the completion, not from the send, and nothing of a running
// request is evicted. Touched only at the send, a long-running request's
// prompt was the index's oldest while the replica held it pinned, and was
// forgotten first (docs/routing.md: without KV events, agent 49.0 -> 58.9 %
// hit rate). Peers hear of it too (touchCompleted).
func (t *predictedTTFT) Learn(target int, ctx *Context, _ int, latency time.Duration) {
	if target >= 0 && target < t.n {
		if ctx != nil && ctx.Prompt != "" {
			t.touchCompleted(target, ctx)
		}
		t.inflight[target].Add(-1)
		t.flights[target].add(int64(t.now()), -1)
		t.lastBack[target].Store(int64(t.now()))
		if latency > 0 {
			t.doneSum.Add(int64(latency))
			t.doneN.Add(1)
		}
	}
}

// slotWaits sets wait[i], for each target i of el, to the time (ms) a
// request sent there now would wait for a batch slot, and slots[i] to its
// slots where it would wait. None until the
// engine has been seen full (requests waiting while others run: vLLM's
// max_num_seqs or its KV blocks reached); then, with s the target's slots
// (slotPlace) and k = running + waiting + 1 − s (the request's place among
// those waiting, counting the loads when they are higher: an engine's
// counts are scraped, the loads are current), the k-th of the s running
// requests to finish: k × hold / (s + 1), their remaining times spread
// evenly over hold, the mean time a request holds its slot (slotHold).
//
// Before any attempt has completed, hold is not known, and as far as the
// proxy knows a full engine could keep a request waiting for as long as
// its running requests decode, longer than any prefill: slotWaits then
// returns el without its full targets (all of el when every one is full).
// Otherwise it returns el.
//
// The prefill law cannot price this wait: it depends on how long the
// running requests decode, not on prompt tokens, and only once the batch
// is full. Without it predicted_ttft piled a group's prompts onto the
// replica holding their prefix past its batch limit (rolter-sim gsp
// --max-batch 16: TTFT mean 896 ms, p99 5,227 ms, against 236 and 4,122
// for the best peers; 205 and 1,092 with it when it was added;
// docs/routing.md).
func (t *predictedTTFT) slotWaits(el Set, loads []int, counts []engineCounts, wait, slots []float64) Set {
	if t.engine == nil {
		return el
	}
	hold := t.slotHold()
	free := el
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			k, s := t.slotPlace(i, loads, counts[i])
			if k > 0 {
				wait[i] = float64(k) * hold / float64(s+1)
				slots[i] = float64(s)
				free.Remove(i)
			}
		}
	}
	if hold > 0 || free.Empty() {
		return el
	}
	return free
}

// slotExternality is the delay that ownMS more of slot time at a full
// target (s slots, all taken) imposes on the requests that wait for its
// slots after this one. The extra time one slot is held passes to the next
// request waiting for a slot, and on along the queue: each request that
// arrives before the queue clears starts ownMS / s later on average (the
// target serves s at once). They are λ × clearMS × saturation: λ the
// fleet's mean arrivals per target and ms (as in externality), clearMS the
// time until this request has its first token (its slot wait and its own
// prefill), saturation the factor by which arrivals that keep finding the
// slots taken extend that (see slotSaturation). It is externality's
// argument for the batch slots, where queued prefill is not the
// bottleneck: in a fleet that stays full (a closed loop with more clients
// than slots) every prefill token a miss adds delays everyone after it,
// and the fastest first token for this request, at whichever replica frees
// a slot first, cost gsp at --max-batch 8 half its cache hits (87.6 % for
// the peers that wait for the holder, 40.5 % without this term, 76 % with
// it; docs/routing.md).
func slotExternality(ownMS, s, clearMS, lambda, saturation float64) float64 {
	if ownMS <= 0 || s <= 0 || saturation <= 0 {
		return 0
	}
	return ownMS / s * lambda * clearMS * saturation
}

// slotSaturation is 1 / (1 − f), f the share of first tokens over the
// rates' window (all of them until there is one) that waited for a batch
// slot, capped as utilisation is (maxUtilisation): the busy period of a
// queue whose arrivals wait that often, relative to the wait in sight, as
// in externality's 1 / (1 − ρ). 0 before any first token.
func (t *predictedTTFT) slotSaturation() float64 {
	b := t.means()
	n, free := t.firstN.Load(), t.freeN.Load()
	if n-b.firstN > 0 {
		n, free = n-b.firstN, free-b.freeN
	}
	if n <= 0 {
		return 0
	}
	f := min(max(1-float64(free)/float64(n), 0), maxUtilisation)
	return 1 / (1 - f)
}

// slotPlace returns a new request's place k among those waiting for a
// batch slot at target i (0: it would run at once) and the target's slots
// s, learned from the engine's counts (c, read for this pick): once requests have been seen
// waiting there while others ran, the most requests seen running there;
// for a target not seen full yet, the most seen running at any target that
// was (a fleet's replicas share their engine arguments), unless more than
// that already run at this one. The most ever seen running, not the
// running count while some waited: a request can wait one scheduler step
// with slots free, and a scrape that catches it must not set a limit below
// the real one (which the avoided replica would then never disprove). So
// a limit that shrinks with the KV cache is not seen: the slot wait then
// counts from the larger one. (A replica caught so before it ever ran more
// still gets too low a limit, raised as soon as it runs more.) While all its slots run, the engine's
// waiting requests beyond those this balancer marked are marked
// (markWaiting).
func (t *predictedTTFT) slotPlace(i int, loads []int, c engineCounts) (k, s int64) {
	if !c.ok {
		return 0, 0
	}
	waiting, running := c.waiting, c.running
	most := raise(&t.maxRunning[i], int64(running))
	if waiting > 0 && running > 0 && !t.seenFull[i].Load() {
		t.seenFull[i].Store(true)
	}
	if t.seenFull[i].Load() {
		s = most
		raise(&t.anySlots, s)
	} else if s = t.anySlots.Load(); s <= 0 || most > s {
		return 0, 0
	}
	if f := t.slotPend[i].Load(); int64(running) >= s && int64(waiting) > f && t.pendCount[i].Load() > f {
		t.markWaiting(i, waiting)
	}
	occupied := int64(running + waiting)
	if len(loads) == t.n {
		// The loads are current, the scrape is not. What the engine
		// counted beyond what the loads held then (the loads less this
		// balancer's own dispatches and completions since: through one
		// proxy, nothing) fades to what it usually does as its slots
		// turn over, one every hold / (s + 1) on average (staleExcess).
		load := int64(loads[i])
		if hold := t.slotHold(); hold > 0 {
			then := load - t.flights[i].since(c.at)
			excess := staleExcess(&t.slotExcess[i], float64(max(occupied-then, 0)), c.age, hold/float64(s+1))
			occupied = load + int64(math.Round(excess))
		}
		occupied = max(occupied, load)
	}
	return max(occupied+1-s, 0), s
}

// raise sets *a to v if v is larger and returns the larger of the two
// (a maximum kept without a lock).
func raise(a *atomic.Int64, v int64) int64 {
	for {
		old := a.Load()
		if v <= old {
			return old
		}
		if a.CompareAndSwap(old, v) {
			return v
		}
	}
}

// slotWaiter reports whether a request sent to target now (engine counts
// c) waits for a batch slot.
func (t *predictedTTFT) slotWaiter(target int, c engineCounts) bool {
	k, _ := t.slotPlace(target, nil, c)
	return k > 0
}

// markWaiting marks as waiting for a batch slot the newest of target i's
// pending requests, up to the engine's waiting count: they were sent before
// the engine was known to be full (the first to overflow it, or while its
// limit shrank with its KV cache), and their wait is not prefill.
func (t *predictedTTFT) markWaiting(i, waiting int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now, marked := t.now(), 0
	for int64(waiting) > t.slotPend[i].Load() {
		var newest *Context
		var e pendingPrefill
		for k, v := range t.pending[i] {
			if !v.slot && (newest == nil || v.seq > e.seq) {
				newest, e = k, v
			}
		}
		if newest == nil {
			break
		}
		e.slot = true
		t.pending[i][newest] = e
		t.slotPend[i].Add(1)
		marked++
	}
	// Those marked waited for a slot since they were sent, not for
	// prefill, but a scrape up to an interval old marks them late, and
	// until then they kept i's busy spell open: a spell that only they
	// kept open ended when the last request that prefilled there left.
	// Counted busy until the mark, a cold burst's overflow (the batch
	// limit not yet seen) made a target look saturated for the whole
	// rates' window, and the follow-up wait kept every new prefix off it:
	// rolter-sim gsp on 32 replicas at --max-batch 4, TTFT mean 267 ->
	// 200 ms (128 with live counts). Not once a peer is heard: the
	// engine's waiting count then holds the peers' requests too, the
	// marks are a guess, and the same run through 4 sharing proxies was
	// 4 % slower over five seeds (docs/routing.md, counts as old as their
	// scrape).
	if marked > 0 && !t.heardPeer() && t.prefilling(i) <= 0 {
		if since := t.busySince[i].Load(); since >= 0 {
			t.endSpellLocked(i, since, min(max(t.lastLeave[i].Load(), since), int64(now)))
		}
	}
	t.busyLocked(i, now)
}

// slotHold is the mean time (ms) a request holds its batch slot: from
// admission, its prefill (the TTFT of those that did not wait for a slot)
// and its decode (mean latency − mean TTFT), over the rates' window (see
// windowMean); 0 before both are known.
func (t *predictedTTFT) slotHold() float64 {
	b := t.means()
	done, okDone := windowMean(t.doneSum.Load(), t.doneN.Load(), b.done, b.doneN)
	first, okFirst := windowMean(t.firstSum.Load(), t.firstN.Load(), b.first, b.firstN)
	free, okFree := windowMean(t.freeSum.Load(), t.freeN.Load(), b.free, b.freeN)
	if !okDone || !okFirst || !okFree {
		return 0
	}
	return (max(done-first, 0) + free) / float64(time.Millisecond)
}

// capacityTokens is target i's KV capacity in tokens, 0 when unknown.
func (t *predictedTTFT) capacityTokens(i int) int {
	if t.engine != nil {
		if c := t.engine.KVCapacityTokens(i); c > 0 {
			return c
		}
	}
	if i < len(t.capCfg) && t.capCfg[i] > 0 {
		return t.capCfg[i]
	}
	return 0
}

// refreshCapacity sizes each target's approximate index to its KV capacity
// in chunks of indexed text.
func (t *predictedTTFT) refreshCapacity() {
	ratio := loadFloat(&t.indexedPerToken)
	for i := range t.n {
		chunks := max(DefaultMaxTrieNodes/chunkindex.ChunkBytes, 1)
		if c := t.capacityTokens(i); c > 0 {
			chunks = max(int(float64(c)*ratio/chunkindex.ChunkBytes), 1)
		}
		if t.index.TargetCapacity(i) != chunks {
			t.index.SetCapacity(i, chunks)
		}
	}
}

// Decisions implements [DecisionCounter].
func (t *predictedTTFT) Decisions() map[string]uint64 {
	return map[string]uint64{DecisionPrecise: t.decisions[0].Load(), DecisionApproximate: t.decisions[1].Load()}
}

// Law implements [LawReporter].
func (t *predictedTTFT) Law() LawState {
	s := LawState{FirstTokens: int(t.firstN.Load()), WholeAnswers: int(t.wholeN.Load()), BytesPerToken: loadFloat(&t.bytesPerToken)}
	if m := t.fleet.Load(); m != nil {
		s.Fitted, s.Samples = true, m.samples
		s.BaseMS, s.AheadMS, s.QueuedMSPer1K, s.OwnMSPer1K = m.w[lawBase], m.w[lawAhead], m.w[lawQueued], m.w[lawOwn]
		s.DecodeMSPer1K = m.w[lawDecode]
		// The slope is reported while it is charged: not once a peer was
		// heard (batchOn), though the law learned alone is kept.
		if b := t.batch.law.Load(); b != nil && t.batchOn() {
			s.PerRunningMS = b.slope
		}
	}
	return s
}

// RecordLocal implements [SharedAffinity]: the hashes the prompt's sends
// and completions at target left to publish since the last call for it (the
// index already holds them), or its whole fingerprint when they were not
// kept (see maxUnsent).
func (t *predictedTTFT) RecordLocal(target int, prompt string, dst []uint64) []uint64 {
	k := unsentKey{target, xxh3.HashString(prompt)}
	t.mu.Lock()
	u := t.unsent[k]
	if u == nil {
		t.mu.Unlock()
		return chunkindex.Hashes(dst, prompt)
	}
	dst = append(dst, u.hashes...)
	u.hashes = u.hashes[:0]
	if u.picks--; u.picks <= 0 {
		delete(t.unsent, k)
	}
	t.mu.Unlock()
	return dst
}

// FoldPeer implements [SharedAffinity]; the prompt ends the peer marked go
// to the forget term's log (withPromptEnd), the rest to the index.
func (t *predictedTTFT) FoldPeer(target int, chunks []uint64) {
	t.index.Fold(target, t.returns.foldPromptEnds(chunks, int64(t.now())))
}

// ExportShared implements [SharedAffinity].
func (t *predictedTTFT) ExportShared(target int, dst []uint64, limit int) []uint64 {
	return t.index.Export(target, dst, limit)
}

// SharedStats implements [SharedAffinity].
func (t *predictedTTFT) SharedStats() []chunkindex.Stats {
	out := make([]chunkindex.Stats, t.n)
	for i := range out {
		out[i] = t.index.Stats(i)
	}
	return out
}
