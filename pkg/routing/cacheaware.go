package routing

import (
	"math"
	"sync/atomic"

	"rolter.dev/pkg/prefixtree"
)

// cacheAware is approximate KV-cache affinity with a load guard (the seed's
// cache_aware, #1851).
//
// State: one [prefixtree.Tree] with a tenant per target, holding the bounded
// prompt text (Context.Prompt) of every request observed for that target, at
// most Spec.MaxTrieNodes byte nodes per target with least-recently-inserted
// eviction; warm[i], the number of prompts observed for target i (counting
// re-observations); and a round-robin counter.
//
// Pick, where E is the eligible set (every target when none is eligible) and
// every comparison, minimum and fallback runs over E only:
//
//  1. Affinity. With a non-empty prompt p: match[i] = the longest prefix of p
//     that target i holds, in bytes; best = the first i in E (index order)
//     with the strictly greatest match (the first member of E even when all
//     match 0). If match[best]/len(p) >= Threshold, return best, unless
//     loads are known (len(loads) == n) and best is overloaded:
//
//     load[best] > min + BalanceAbs  &&  load[best] > BalanceRel * min
//
//     where min is the least load over E and min + BalanceAbs saturates
//     instead of overflowing. Both margins must be exceeded, strictly: with
//     the defaults (2, 1.5) a warm target may run 2 ahead of an idle one
//     (2 vs 0 pins, 3 vs 0 spills) and 50% ahead of a busy one (10 vs 7
//     pins). With loads unknown nothing can be overloaded and affinity stands.
//
//  2. Loads known: an i in E with the least load (load_spill when step 1
//     found an overloaded match, least_load otherwise); among tied loads the
//     least warmed (fewest observed prompts), then round robin. (The
//     reference takes the first minimum by index, which sends every new
//     prefix to target 0 while queues are empty.)
//
//  3. Loads unknown: the first i in E with the fewest observed prompts
//     (least_warmed); if that is 0, i.e. some eligible target is still cold,
//     round robin over E (cold), which spreads the first requests instead of
//     sending a burst to the first cold index. The rotation is even over E,
//     like round_robin's (the reference's "first usable at rr % n" gives an
//     ineligible target's turns to its successor).
//
// Observe(target, ctx) inserts ctx.Prompt into target's tree and counts it in
// warm[target]; an empty prompt or a target out of range is ignored.
//
// Sharing (Spec.Share): match[i] in step 1 is the larger of the tree's match
// and the shared chunk index's (what peers sent to target i, at 64-byte
// granularity), and Observe also records the prompt there and publishes the
// new hashes. Step 1 then compares matches on the chunk grid (rounded down
// to whole chunks unless they cover the whole prompt): the targets tied for
// the greatest are tried in the order of a rendezvous hash of the prompt's
// first chunk and the target, and the first that clears the threshold (on
// its exact match) and is not overloaded wins; only when all are overloaded
// does the pick spill. So every proxy prefers the same of two copies of a
// prefix, and a hot prefix held by several targets spreads over them before
// it spills to a cold one (see sharing.preferred; when no target holds a
// whole chunk, the rule above). The
// proxy calls Observe on every attempt, before the upstream call, so
// concurrent requests see the pick's cache effect at once.
//
// Concurrency: Pick takes the tree's read lock for one walk and otherwise
// only reads atomics; Observe takes the tree's write lock. Pick does not
// allocate.
type cacheAware struct {
	n         int
	threshold float64
	abs       int
	rel       float64
	tree      *prefixtree.Tree
	warm      []atomic.Uint64
	rr        atomic.Uint64
	decisions [numCacheDecisions]atomic.Uint64
	*sharing  // nil unless Spec.Share is set
}

// Indexes of cacheAware.decisions.
const (
	decAffinityHit = iota
	decLoadSpill
	decLeastLoad
	decLeastWarmed
	decCold
	numCacheDecisions
)

var cacheDecisionNames = [numCacheDecisions]string{
	DecisionAffinityHit, DecisionLoadSpill, DecisionLeastLoad, DecisionLeastWarmed, DecisionCold,
}

var (
	_ Balancer        = (*cacheAware)(nil)
	_ TrieStats       = (*cacheAware)(nil)
	_ DecisionCounter = (*cacheAware)(nil)
	_ SharedAffinity  = (*cacheAware)(nil)
)

func newCacheAware(n int, p params, s *sharing) *cacheAware {
	return &cacheAware{
		sharing:   s,
		n:         n,
		threshold: p.threshold,
		abs:       p.balanceAbs,
		rel:       p.balanceRel,
		tree:      prefixtree.New(n, p.maxNodes),
		warm:      make([]atomic.Uint64, n),
	}
}

// Name implements Balancer.
func (*cacheAware) Name() string { return CacheAware }

// Pick implements Balancer.
func (c *cacheAware) Pick(ctx *Context, loads []int, eligible Set) int {
	if c.n <= 0 {
		return -1
	}
	el := eligible.OrAll(c.n)
	known := len(loads) == c.n
	spill := false
	if ctx != nil && ctx.Prompt != "" {
		var buf [MaxTargets]int
		match := buf[:c.n]
		c.tree.Match(ctx.Prompt, match)
		if c.sharing != nil {
			var cbuf [MaxTargets]uint8
			c.sharing.widen(ctx.Prompt, match, el)
			candidates := c.sharing.preferred(ctx.Prompt, match, el, cbuf[:0])
			var target int
			if target, spill = c.affinity(len(ctx.Prompt), match, candidates, loads, el); target >= 0 {
				c.decisions[decAffinityHit].Add(1)
				return target
			}
		} else {
			best := -1
			for wi, w := range el.w {
				for ; w != 0; w &= w - 1 {
					if i := wi*64 + bitIndex(w); best < 0 || match[i] > match[best] {
						best = i
					}
				}
			}
			if float64(match[best])/float64(len(ctx.Prompt)) >= c.threshold {
				if !known || !c.overloaded(loads[best], loads[leastLoaded(el, loads)]) {
					c.decisions[decAffinityHit].Add(1)
					return best
				}
				spill = true
			}
		}
	}
	if known {
		if spill {
			c.decisions[decLoadSpill].Add(1)
		} else {
			c.decisions[decLeastLoad].Add(1)
		}
		return c.leastLoadedSpread(el, loads)
	}
	coldest, fewest := -1, uint64(0)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			if k := c.warm[i].Load(); coldest < 0 || k < fewest {
				coldest, fewest = i, k
			}
		}
	}
	if fewest > 0 {
		c.decisions[decLeastWarmed].Add(1)
		return coldest
	}
	c.decisions[decCold].Add(1)
	return rotate(el, c.n, c.rr.Add(1)-1)
}

// affinity returns the first of candidates (target indexes in order of
// preference, with sharing) whose match clears the threshold and that is not
// overloaded, or -1 and whether one cleared the threshold but all such were
// overloaded (a spill). Without sharing step 1 has one candidate, inline.
func (c *cacheAware) affinity(promptLen int, match []int, candidates []uint8, loads []int, el Set) (target int, spill bool) {
	known := len(loads) == c.n
	minLoad := -1
	for _, u := range candidates {
		i := int(u)
		if float64(match[i])/float64(promptLen) < c.threshold {
			continue
		}
		if !known {
			return i, false
		}
		if minLoad < 0 {
			minLoad = loads[leastLoaded(el, loads)]
		}
		if !c.overloaded(loads[i], minLoad) {
			return i, false
		}
		spill = true
	}
	return -1, spill
}

// overloaded reports whether a load is past both balance margins of min.
func (c *cacheAware) overloaded(load, min int) bool {
	limit := math.MaxInt
	if min <= math.MaxInt-c.abs {
		limit = min + c.abs
	}
	return load > limit && float64(load) > c.rel*float64(min)
}

// leastLoadedSpread returns a least-loaded member of el. Ties, common when
// traffic is light and every queue is empty, go to the least-warmed of the
// tied targets (fewest observed prompts), then rotate: the reference's
// "first minimum by index" sent every new prefix to target 0 whenever loads
// were equal, so all groups shared one replica's cache while the others sat
// cold.
func (c *cacheAware) leastLoadedSpread(el Set, loads []int) int {
	minLoad := loads[leastLoaded(el, loads)]
	var tied Set
	var fewest uint64
	first := true
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			if loads[i] != minLoad {
				continue
			}
			k := c.warm[i].Load()
			switch {
			case first || k < fewest:
				tied, fewest, first = Set{}, k, false
				tied.Add(i)
			case k == fewest:
				tied.Add(i)
			}
		}
	}
	if tied.Len() == 1 {
		return tied.Nth(0, c.n)
	}
	return rotate(tied, c.n, c.rr.Add(1)-1)
}

// leastLoaded returns the first member of el (in index order) with the least
// load. el must not be empty and loads must cover it.
func leastLoaded(el Set, loads []int) int {
	best := -1
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			if i := wi*64 + bitIndex(w); best < 0 || loads[i] < loads[best] {
				best = i
			}
		}
	}
	return best
}

// Observe implements Balancer.
func (c *cacheAware) Observe(target int, ctx *Context) {
	if target < 0 || target >= c.n || ctx == nil || ctx.Prompt == "" {
		return
	}
	c.tree.Insert(target, ctx.Prompt)
	c.warm[target].Add(1)
	c.sharing.observe(target, ctx.Prompt)
}

// TrieStats implements [TrieStats].
func (c *cacheAware) TrieStats() []TreeStats {
	return c.tree.AppendStats(make([]TreeStats, 0, c.n))
}

// Decisions implements [DecisionCounter].
func (c *cacheAware) Decisions() map[string]uint64 {
	m := make(map[string]uint64, numCacheDecisions)
	for i, name := range cacheDecisionNames {
		m[name] = c.decisions[i].Load()
	}
	return m
}
