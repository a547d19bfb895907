package routing

import "rolter.dev/pkg/prefixtree"

// Pipeline scorer names, the keys of Spec.Scorers.
const (
	ScorerPrefixCache     = "prefix_cache"
	ScorerLeastLoad       = "least_load"
	ScorerSessionAffinity = "session_affinity"
	ScorerStaticWeight    = "static_weight"
)

// Indexes of the pipeline's scorers.
const (
	scorerPrefixCache = iota
	scorerLeastLoad
	scorerSessionAffinity
	scorerStaticWeight
	numScorers
)

var scorerNames = [numScorers]string{ScorerPrefixCache, ScorerLeastLoad, ScorerSessionAffinity, ScorerStaticWeight}

// pipeline scores every eligible target with weighted scorers and picks the
// best.
//
//	score(i) = W_prefix  * match(i) / len(prompt)               (prefix_cache)
//	         + W_load    * (1 - load(i) / max(max load over E, 1)) (least_load)
//	         + W_session * [i last served SessionKey < 300 s ago]  (session_affinity)
//	         + W_static  * max(w(i), 1) / max(max w, 1)            (static_weight)
//
// E is the eligible set (every target when none is eligible); a single
// member is returned without scoring. match(i) is the longest prefix of the
// bounded prompt held by target i's prefix tree (0 without a prompt);
// least_load scores every member 1 when loads are unknown and counts a
// negative load as 0; session_affinity is 0 without a SessionKey, and only an
// eligible target can score it; w(i) are the route's target weights. Every W
// defaults to 1 (Spec.Scorers) and a scorer with W = 0 is skipped, along
// with its state. The pick is the argmax over E; scores within 1e-6 of the
// best tie, and ties are broken uniformly at random.
//
// Observe(target, ctx) inserts the prompt into target's prefix tree (at most
// Spec.MaxTrieNodes byte nodes per target, least-recently-inserted eviction)
// and records target for ctx.SessionKey (at most SessionCap sessions; a new
// one past the cap forgets an arbitrary one).
//
// Unlike the reference pipeline (#1942) it honours eligibility.
//
// Concurrency: Pick takes the prefix tree's read lock and one session shard's
// read lock; Observe their write locks. Pick does not allocate.
type pipeline struct {
	n        int
	w        [numScorers]float64
	static   []float64
	intn     func(n int) int  // Spec.IntN
	tree     *prefixtree.Tree // nil when prefix_cache is off
	sessions *sessionTable    // nil when session_affinity is off
	*sharing                  // nil unless Spec.Share is set and prefix_cache is on
}

var (
	_ Balancer  = (*pipeline)(nil)
	_ TrieStats = (*pipeline)(nil)
)

func newPipeline(weights []int, p params, s *sharing) *pipeline {
	n := len(weights)
	pl := &pipeline{n: n, w: p.scorers, static: make([]float64, n), intn: p.intn}
	top := 1
	for _, w := range weights {
		top = max(top, min(w, maxWeight))
	}
	for i, w := range weights {
		pl.static[i] = float64(max(min(w, maxWeight), 1)) / float64(top)
	}
	if pl.w[scorerPrefixCache] > 0 {
		pl.tree = prefixtree.New(n, p.maxNodes)
		pl.sharing = s
	}
	if pl.w[scorerSessionAffinity] > 0 {
		pl.sessions = newSessionTable(p.now)
	}
	return pl
}

// Name implements Balancer.
func (*pipeline) Name() string { return Pipeline }

// Pick implements Balancer.
func (p *pipeline) Pick(ctx *Context, loads []int, eligible Set) int {
	if p.n <= 0 {
		return -1
	}
	el := eligible.OrAll(p.n)
	if el.Len() == 1 {
		return el.Nth(0, p.n)
	}
	var buf [MaxTargets]float64
	scores := buf[:p.n]
	if p.tree != nil && ctx != nil && ctx.Prompt != "" {
		var mbuf [MaxTargets]int
		match := mbuf[:p.n]
		p.tree.Match(ctx.Prompt, match)
		p.sharing.widen(ctx.Prompt, match, el)
		w := p.w[scorerPrefixCache] / float64(len(ctx.Prompt))
		for i, m := range match {
			scores[i] += w * float64(m)
		}
	}
	addLeastLoad(scores, el, loads, p.n, p.w[scorerLeastLoad])
	if p.sessions != nil && ctx != nil && ctx.SessionKey != "" {
		if t, ok := p.sessions.lookup(ctx.SessionKey); ok && t < p.n {
			scores[t] += p.w[scorerSessionAffinity]
		}
	}
	if w := p.w[scorerStaticWeight]; w > 0 {
		for i, s := range p.static {
			scores[i] += w * s
		}
	}
	return argmax(el, scores, p.intn)
}

// Observe implements Balancer.
func (p *pipeline) Observe(target int, ctx *Context) {
	if target < 0 || target >= p.n || ctx == nil {
		return
	}
	if p.tree != nil && ctx.Prompt != "" {
		p.tree.Insert(target, ctx.Prompt)
		p.sharing.observe(target, ctx.Prompt)
	}
	if p.sessions != nil && ctx.SessionKey != "" {
		p.sessions.record(ctx.SessionKey, target)
	}
}

// TrieStats implements [TrieStats]; it returns nil when prefix_cache is off.
func (p *pipeline) TrieStats() []TreeStats {
	if p.tree == nil {
		return nil
	}
	return p.tree.AppendStats(make([]TreeStats, 0, p.n))
}
