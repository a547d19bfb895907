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
//	               externality and followWait in predictedttft_rates.go,
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
// of two tied targets drawn at random (tiedOfTwo). Before the law is
// fitted, a prompt no target holds any of is picked among the targets sent
// the fewest such prompts (fewestNew; one proxy without peers only); after,
// such a prompt's targets tie within the noise of their follow-up waits,
// and the fewest new prefixes win that tie first (indistinct, fewestNewOf).
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
	// capKept marks, per target, an approximate index taken over from
	// another balancer (Inherit, RestoreState) whose capacity is kept until
	// the target's own is known: a proxy restarted with its routing state
	// reads the replicas' capacity only at their first scrape, and sizing
	// their indexes to the default ceiling meanwhile evicted most of what
	// they held.
	capKept []atomic.Bool
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
		maxRunning: make([]atomic.Int64, n), seenFull: make([]atomic.Bool, n), capKept: make([]atomic.Bool, n),
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

// matched sets match[i] to the prefix tokens target i holds (none for a
// request that reads no cache: Context.ReadsNoCache) and reports whether
// they came from the KV events. A target whose events are not
// fresh while others' are is matched on the approximate index: read as
// holding nothing, it lost the prompts it held to the fresh targets and
// drew no new ones from ties, so its engine, serving nothing new, sent no
// event to become fresh again (rolter-outage: a restarted kvwatcher's
// view of one replica stayed stale for 51 s).
func (t *predictedTTFT) matched(ctx *Context, tokens int, match []float64) bool {
	clear(match)
	if ctx.ReadsNoCache {
		// Every target prefills it whole: what they hold saves it nothing.
		return false
	}
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
	var tied []uint8
	if tw.cold && c.follow.wait > 0 {
		tied = t.fewestNewOf(t.indistinct(pred, el, c, tbuf[:0]))
	} else {
		tied = tiedAt(pred, el, best, tbuf[:0])
	}
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
	follow  followFactors // the follow-up wait's factors (zero when not charged)
	now     time.Duration
}

// indistinct appends to dst the targets of el that, for a prompt no
// target holds any of, are as cheap as the cheapest within the noise of
// their follow-up waits: each target's cost with its busy share one
// standard error lower is no more than the least cost with the busy share
// one standard error higher (followWaitRange). For a new prefix nothing
// else tells idle targets apart, and their follow-up waits differ by how
// busy each was over the rates' window, a sample as noisy as it is small.
// Taken as exact, the least busy share drew every new prefix, and the
// replica serving short prompts, whose prefills keep it least busy, drew
// the short prompts to come: on the Mooncake synthetic trace at 16
// replicas it served 236 of 1,500 requests (the mean 94), and with their
// decode the imbalance was 2.72 (1.15 with the noise tied and fewestNewOf;
// docs/routing.md, new prefixes within the noise). fewestNewOf and then
// the tie rules decide among them.
func (t *predictedTTFT) indistinct(pred []float64, el Set, c pickCosts, dst []uint8) []uint8 {
	var lbuf [MaxTargets]float64
	low := lbuf[:t.n]
	ceiling := math.Inf(1)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			f, lo, hi := t.followWaitRange(i, c.follow, c.now, c.rates.scale)
			low[i] = pred[i] - (f - lo)
			ceiling = min(ceiling, pred[i]+(hi-f))
		}
	}
	limit := ceiling + tieEpsilon*max(1, c.best)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			if i := wi*64 + bitIndex(w); low[i] <= limit {
				dst = append(dst, uint8(i))
			}
		}
	}
	return dst
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
	var buf [MaxTargets]uint8
	members := buf[:0]
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			members = append(members, uint8(wi*64+bitIndex(w)))
		}
	}
	var out Set
	best := math.Inf(1)
	for _, c := range t.fewestNewOf(members) {
		out.Add(int(c))
		best = min(best, pred[c])
	}
	return out, best
}

// fewestNewOf keeps, of the tied targets, those sent the fewest new
// prefixes over the rates' window: among targets the costs do not tell
// apart, a new prefix goes where the fewest sessions began, as before the
// law is fitted (fewestNew). Without it the tie went to the smallest
// index, and a replica sent short prompts keeps a small one: on the
// Mooncake synthetic trace at 16 replicas, imbalance 1.28 with the
// smallest index, 1.15 with the count (docs/routing.md, new prefixes
// within the noise).
func (t *predictedTTFT) fewestNewOf(tied []uint8) []uint8 {
	base, _ := t.rateFrom()
	fewest := int64(math.MaxInt64)
	for _, c := range tied {
		fewest = min(fewest, t.newPrefixesFrom(int(c), base))
	}
	k := 0
	for _, c := range tied {
		if t.newPrefixesFrom(int(c), base) == fewest {
			tied[k] = c
			k++
		}
	}
	return tied[:k]
}

// newPrefixesFrom is the number of new prefixes (prompts no target held
// any of) sent to target i since base (nil: since the first).
func (t *predictedTTFT) newPrefixesFrom(i int, base *rateBase) int64 {
	n := t.newPrefixes[i].Load()
	if base != nil {
		n -= base.newPrefixesAt[i]
	}
	return n
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
	holders := 0             // the eligible targets that hold it
	if fitted {
		for wi, w := range el.w {
			for ; w != 0; w &= w - 1 {
				switch v := placed[wi*64+bitIndex(w)]; {
				case v > held:
					held, holders = v, 1
				case v == held:
					holders++
				}
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
	// Count the queue behind a prompt whose prefix has one holder or none
	// and none of whose own history any target holds (see externality).
	countQueued := held <= shared && (held == 0 || holders == 1)
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
			pred[i] = ttft + t.externality(i, max(0, m.w[lawQueued])*own/1000, ttft, rates, countQueued) + waste(&m, held-max(placed[i], shared)) + followed[i] + forgot[i]
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
	return pickCosts{el: el, best: best, precise: precise, fitted: fitted, rates: rates, follow: follow, now: now}
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
			t.capKept[i].Store(false)
		} else if t.capKept[i].Load() {
			continue
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
