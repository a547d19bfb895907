package routing

import (
	"sync"
	"sync/atomic"
	"time"
)

var signalBufs = sync.Pool{New: func() any { return new([MaxTargets]float64) }}

// KVSource tells precise_cache_aware which of a request's leading KV blocks
// each target holds, from the engines' own KV events. The data plane
// implements it over its NATS-fed index for one route's targets.
type KVSource interface {
	// KVScores sets scores[i], for each target i, to the fraction of the
	// request's leading blocks (from its token ids) resident on target i,
	// in [0, 1]. It reports false when no target has fresh state: the
	// scores are then neutral and must not be used.
	KVScores(tokenIDs []uint32, scores []float64) bool
	// Speculate records that target is about to hold the request's blocks
	// for ttl (> 0), closing the blind spot until its engine's events
	// confirm them.
	Speculate(target int, tokenIDs []uint32, ttl time.Duration)
}

// KVFreshSource is a KVSource that also tells which targets' state is
// fresh, for strategies that score a target whose state is not (its
// watcher dead or restarted, its engine silent since) by other means
// rather than as holding nothing.
type KVFreshSource interface {
	KVSource
	// KVScoresFresh is KVScores that also sets fresh[i] to whether target
	// i's state is fresh; scores[i] is 0 where it is not.
	KVScoresFresh(tokenIDs []uint32, scores []float64, fresh []bool) bool
}

// KVSharedSource is a KVSource whose speculation a balancer can pass to
// the other proxies of its fleet by block identity (see
// SharedSpeculation): a pick one proxy made is otherwise invisible to the
// others until the engine has prefilled the request and its events have
// arrived, and they send the prefix's next requests elsewhere.
type KVSharedSource interface {
	KVSource
	// SpeculateAppend is Speculate, appending to dst the block identities
	// it marked (those the target's events have not shown resident).
	SpeculateAppend(target int, tokenIDs []uint32, ttl time.Duration, dst []uint64) []uint64
	// SpeculateIDs marks identities another proxy's SpeculateAppend
	// returned for the same target as held there for ttl, or until an
	// event for them arrives.
	SpeculateIDs(target int, ids []uint64, ttl time.Duration)
}

// LMCacheSource gives lmcache_aware each target's LMCache headroom.
type LMCacheSource interface {
	// LMCacheScores sets scores[i] to 1 - occupancy for an available
	// target and 0 for an unavailable one; a stale target scores 0. It
	// reports false when no target is fresh (neutral).
	LMCacheScores(scores []float64) bool
}

// Default weights of the precise_cache_aware and lmcache_aware stacks: the
// cache signal 1.0; least load 0.25 for lmcache_aware (the reference's) but
// 1.0 for precise_cache_aware. With 0.25 a prefix held by one replica
// outweighs any queue, so a burst sharing a prefix (agents sharing a system
// prompt, and speculation spreading the first pick's blocks to the rest)
// piles onto that replica: the routing simulator's agent workload ran at
// imbalance 3.74 and half of cache_aware's throughput; at 1.0 it runs at
// 1.06 with the oracle's hit rate, costing at most 0.4 points of hit rate
// elsewhere (docs/routing.md).
const (
	DefaultSignalWeight      = 1.0
	DefaultSignalLoadWeight  = 0.25
	DefaultPreciseLoadWeight = 1.0
)

// DefaultSpeculativeTTL is Spec.SpeculativeTTL's default: long enough to
// cover a prefill and the event's trip through the watcher.
const DefaultSpeculativeTTL = 5 * time.Second

// NoSpeculation as Spec.SpeculativeTTL turns the speculative insert off.
const NoSpeculation time.Duration = -1

// signalScored is precise_cache_aware or lmcache_aware: score_i = w_s ·
// signal_i + w_l · (1 - load_i / max load), argmax over the eligible
// targets with uniform tie-break. Without a signal (no token ids, no fresh
// provider, no source configured) only the least-load term remains, so
// least load decides. Observe feeds the KV source's speculative insert.
type signalScored struct {
	name    string
	n       int
	kv      KVSource
	lm      LMCacheSource
	wSignal float64
	wLoad   float64
	specTTL time.Duration   // ≤ 0: no speculation
	intn    func(n int) int // Spec.IntN
	scored  atomic.Uint64   // picks decided with a signal
	neutral atomic.Uint64   // picks without one
}

var (
	_ Balancer        = (*signalScored)(nil)
	_ DecisionCounter = (*signalScored)(nil)
)

// Name implements Balancer.
func (s *signalScored) Name() string { return s.name }

// Pick implements Balancer.
func (s *signalScored) Pick(ctx *Context, loads []int, eligible Set) int {
	if s.n <= 0 {
		return -1
	}
	el := eligible.OrAll(s.n)
	var buf [MaxTargets]float64
	scores := buf[:s.n]
	ok := false
	if (s.kv != nil && ctx != nil && len(ctx.TokenIDs) > 0) || s.lm != nil {
		// The source is an interface, so its buffer would escape: pooled.
		sigp := signalBufs.Get().(*[MaxTargets]float64)
		sig := sigp[:s.n]
		clear(sig)
		if s.kv != nil {
			ok = s.kv.KVScores(ctx.TokenIDs, sig)
		} else {
			ok = s.lm.LMCacheScores(sig)
		}
		for i := range scores {
			scores[i] = s.wSignal * min(max(sig[i], 0), 1)
		}
		signalBufs.Put(sigp)
	}
	if ok {
		s.scored.Add(1)
	} else {
		clear(scores)
		s.neutral.Add(1)
	}
	wl := s.wLoad
	if !ok && wl == 0 {
		wl = 1 // no signal and no load weight: still spread by load
	}
	addLeastLoad(scores, el, loads, s.n, wl)
	return argmax(el, scores, s.intn)
}

// Observe implements Balancer: the chosen target is about to create the
// request's blocks.
func (s *signalScored) Observe(target int, ctx *Context) {
	if s.kv != nil && s.specTTL > 0 && ctx != nil && len(ctx.TokenIDs) > 0 && target >= 0 && target < s.n {
		s.kv.Speculate(target, ctx.TokenIDs, s.specTTL)
	}
}

// Decisions implements DecisionCounter.
func (s *signalScored) Decisions() map[string]uint64 {
	return map[string]uint64{DecisionScored: s.scored.Load(), DecisionNeutral: s.neutral.Load()}
}

// Decision outcomes of precise_cache_aware and lmcache_aware.
const (
	// DecisionScored: the cache signal was fresh and weighed in.
	DecisionScored = "scored"
	// DecisionNeutral: no signal (no token ids, stale or missing state):
	// least load decided.
	DecisionNeutral = "neutral"
)
