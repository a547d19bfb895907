package routing

import (
	"time"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/chunkindex"
)

// SharedAffinity is implemented by balancers built with [Spec.Share]
// (cache_aware, and pipeline with its prefix_cache scorer): other proxies'
// observations fold into their prefix matching, so several proxies behind an
// L4 balancer match against what the whole fleet sent to each target.
type SharedAffinity interface {
	// RecordLocal adds a prompt this proxy sent to target (as handed to
	// Spec.Share) to the shared index and appends to dst the hashes the
	// fleet should hear about (see rolter.dev/pkg/chunkindex). The fleet
	// calls it from its flush, off the request path.
	RecordLocal(target int, prompt string, dst []uint64) []uint64
	// FoldPeer records that a peer sent target prompts whose fingerprints
	// include chunks (rolter.dev/pkg/chunkindex hashes).
	FoldPeer(target int, chunks []uint64)
	// ExportShared appends target's shared hashes to dst, oldest first: at
	// most limit (the newest), or all when limit <= 0. It is what a new
	// peer warms up from.
	ExportShared(target int, dst []uint64, limit int) []uint64
	// SharedStats returns one entry per target: the hashes held and evicted.
	SharedStats() []chunkindex.Stats
}

// sharing is the shared prefix index of one balancer; nil when the route
// does not share.
type sharing struct {
	index   *chunkindex.Index
	publish func(target int, prompt string)
}

// newSharing returns nil when publish is nil. The index holds at most
// maxNodes bytes' worth of chunks per target, the tree's own ceiling.
func newSharing(n, maxNodes int, publish func(int, string)) *sharing {
	if publish == nil {
		return nil
	}
	return &sharing{index: chunkindex.New(n, max(maxNodes/chunkindex.ChunkBytes, 1)), publish: publish}
}

// widen raises match[i] to what the shared index holds for the prompt,
// unless an eligible target already holds all of it (then no peer can do
// better, and the lookup is skipped).
func (s *sharing) widen(prompt string, match []int, el Set) {
	if s == nil {
		return
	}
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			if i := wi*64 + bitIndex(w); i < len(match) && match[i] == len(prompt) {
				return
			}
		}
	}
	var buf [MaxTargets]int
	shared := buf[:len(match)]
	s.index.Match(prompt, shared)
	for i, m := range shared {
		match[i] = max(match[i], m)
	}
}

// Candidate lists hold target indexes as bytes: they are < MaxTargets.
const _ = uint8(MaxTargets - 1)

// preferred appends to dst the members of el tied for the greatest match on
// the shared index's grid (whole chunks, or the whole prompt), in the same
// order at every proxy: the highest rendezvous score of the prompt's first
// chunk and the target first, so that different prefixes prefer different
// targets. When no target holds a whole chunk, there is no copy to agree on
// (and less than a KV block in common): it appends the first greatest exact
// match alone, as without sharing.
//
// Why the grid: the tree's byte precision lets this proxy's own placement
// outbid a peer's copy of the same prefix by the bytes past the last whole
// chunk, so after a burst placed a prefix on two targets (requests reaching
// different proxies before they heard of one another) each proxy would keep
// feeding its own copy, for as long as the prefix is used. On the grid the
// copies tie, every proxy prefers the same one, and the other ages out.
// Why an order and not a winner: a hot prefix that several targets hold
// (a shared system prompt the load guard spread) is then spread over them,
// in the same order by every proxy, before the pick spills to a target
// without it (consistent hashing with bounded loads).
func (s *sharing) preferred(prompt string, match []int, el Set, dst []uint8) []uint8 {
	grid := func(m int) int {
		if m < len(prompt) {
			return m - m%chunkindex.ChunkBytes
		}
		return m
	}
	bestGrid, exact := 0, -1
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			if exact < 0 || match[i] > match[exact] {
				exact = i
			}
			bestGrid = max(bestGrid, grid(match[i]))
		}
	}
	if bestGrid == 0 {
		return append(dst, uint8(exact))
	}
	key := xxh3.HashString(prompt[:min(len(prompt), chunkindex.ChunkBytes)])
	start := len(dst)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			if grid(match[i]) != bestGrid {
				continue
			}
			// Insert by descending score (the tied are a few targets;
			// a score costs a few multiplications to recompute).
			sc := rendezvous(key, i)
			j := len(dst)
			dst = append(dst, uint8(i))
			for ; j > start && rendezvous(key, int(dst[j-1])) < sc; j-- {
				dst[j] = dst[j-1]
			}
			dst[j] = uint8(i)
		}
	}
	return dst
}

// rendezvous mixes a key and a target index into a score (splitmix64's
// finaliser).
func rendezvous(key uint64, i int) uint64 {
	z := key + uint64(i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// observe hands a local pick to the fleet; the index work waits for its
// flush (RecordLocal).
func (s *sharing) observe(target int, prompt string) {
	if s != nil {
		s.publish(target, prompt)
	}
}

func (s *sharing) RecordLocal(target int, prompt string, dst []uint64) []uint64 {
	if s == nil {
		return dst
	}
	return s.index.Observe(target, prompt, dst)
}

func (s *sharing) FoldPeer(target int, chunks []uint64) {
	if s != nil {
		s.index.Fold(target, chunks)
	}
}

func (s *sharing) ExportShared(target int, dst []uint64, limit int) []uint64 {
	if s == nil {
		return dst
	}
	return s.index.Export(target, dst, limit)
}

func (s *sharing) SharedStats() []chunkindex.Stats {
	if s == nil {
		return nil
	}
	out := make([]chunkindex.Stats, s.index.Targets())
	for i := range out {
		out[i] = s.index.Stats(i)
	}
	return out
}

// SharedQueue is implemented by balancers that predict the wait at each
// target from the prefill they sent there (predicted_ttft). Behind an L4
// balancer each of several proxies sends only part of a target's queue, so
// each would see a fraction of it; the fleet publishes every proxy's queue
// and folds the peers' in, so that each predicts from the whole.
type SharedQueue interface {
	// LocalQueue returns the prefill this balancer has pending at target.
	LocalQueue(target int) QueueState
	// FoldPeerQueue replaces what peer has pending at target; it holds for
	// ttl unless a newer report replaces it.
	FoldPeerQueue(peer string, target int, q QueueState, ttl time.Duration)
	// PeerQueue returns what the peers' unexpired reports have pending at
	// target, summed (Requests and Tokens; the rest is zero).
	PeerQueue(target int) QueueState
	// SetPlace tells the balancer its place among the proxies serving the
	// route: its rank, in [0, size), in an order every one of them agrees
	// on, and their number (1: alone). Ties between targets are then
	// broken differently at each proxy (see predictedTTFT.homeTie).
	SetPlace(rank, size int)
}

// Deferrer is implemented by balancers that, among several proxies, may
// ask for a request to wait before it is picked (predicted_ttft's turns in
// a burst): a burst that the L4 balancer spreads over the proxies arrives
// at each of them before any has heard of the others' picks, and placed
// blind it collides on the same targets and prefills the same new prefixes
// twice. The proxy calls Defer once per request, before its first Pick,
// waits what it returns (0: nothing), then picks.
type Deferrer interface {
	Defer(ctx *Context, loads []int, eligible Set) time.Duration
}

// SharedArrivals is implemented by balancers that learn from their peers'
// arrivals whether the fleet's requests come in bursts (predicted_ttft's
// turns): with more proxies than a burst has requests, no proxy receives
// two of one, and only the peers' reports show that its lone requests
// arrive together with theirs. The fleet carries each proxy's arrivals
// with its queue reports.
type SharedArrivals interface {
	// TakeArrivals appends to dst the ages of the requests that reached
	// this balancer since the last call (at most MaxReportedArrivals, the
	// latest), and forgets them.
	TakeArrivals(dst []time.Duration) []time.Duration
	// FoldPeerArrivals records a peer's arrivals, given by their ages on
	// receipt (the fleet adds its measured trip to the ages the peer
	// reported).
	FoldPeerArrivals(ages []time.Duration)
}

// MaxReportedArrivals bounds the arrivals one report carries (see
// SharedArrivals): at the fleet's 5 ms queue interval, 200,000 requests a
// second at one proxy.
const MaxReportedArrivals = 1024

// ReportPacer is implemented by balancers that need to know how often the
// peers' queue reports arrive before they have measured it, and how late:
// the fleet tells them its own queue interval, which a fleet's proxies
// share, and the trip of its messages to the slowest peer, which it
// measures (0 until it has).
type ReportPacer interface {
	SetReportInterval(d time.Duration)
	SetReportTrip(d time.Duration)
}

// ReportTrigger is implemented by balancers whose picks in a burst should
// reach the peers sooner than the fleet's next queue tick (predicted_ttft's
// turns): the fleet hands them report, which publishes the node's queue
// reports at once (coalesced with any already asked for, never blocking).
// Their turns then last a couple of the fleet's measured trips instead of
// two queue intervals.
type ReportTrigger interface {
	SetReportTrigger(report func())
}

// FleetClock is implemented by balancers that read a clock the fleet's
// proxies must agree on (predicted_ttft's turns in a burst draw their
// order per time slot of Spec.FleetNow). The fleet measures how far its
// reference proxy's wall clock (the live one with the smallest id) runs
// ahead of this proxy's, from the clocks their load reports carry, and
// hands the difference on: the proxies' slots then agree though their
// machines' clocks do not (0: this proxy is the reference, or the
// difference is not measured yet).
type FleetClock interface {
	SetFleetClockOffset(d time.Duration)
}

// SharedSpeculation is implemented by balancers that pass the KV blocks
// their picks speculated (see KVSharedSource) to the other proxies, with
// their queue reports: a prefix one proxy sent to a target counts there at
// every proxy within a queue interval, not only once the engine has
// prefilled it and its events have arrived (the routing simulator's
// default 50 ms; docs/routing.md).
type SharedSpeculation interface {
	// TakeSpeculated appends to dst the identities this balancer speculated
	// at target since the last call, and forgets them.
	TakeSpeculated(target int, dst []uint64) []uint64
	// FoldPeerSpeculated speculates a peer's identities at target.
	FoldPeerSpeculated(target int, ids []uint64)
}

// QueueState is one proxy's pending prefill at one target: the requests it
// sent there that have not produced a first token.
type QueueState struct {
	// Requests and Tokens count them and their uncached prompt tokens.
	Requests, Tokens int
	// HeadTokens and HeadAge are the oldest one's tokens and the time since
	// it was dispatched (meaningful when Requests > 0).
	HeadTokens int
	HeadAge    time.Duration
	// LeaveAge is the time since one of this proxy's requests last produced
	// its first token at the target (the target then began serving the
	// next), negative when none has.
	LeaveAge time.Duration
	// AnswerAge is the time since the target last sent this proxy an answer,
	// a first token or a completion, negative when it has not: a peer whose
	// own requests there are silent learns the target is serving.
	AnswerAge time.Duration
}
