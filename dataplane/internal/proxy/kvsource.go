package proxy

import (
	"time"

	"rolter.dev/pkg/config"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/routing"
)

// kvSource feeds precise_cache_aware and lmcache_aware from the proxy's
// NATS-fed index, for one pool's targets (a route's or a variant's).
// Identities are seeded with each target's upstream model, as the watcher
// seeds the engine's blocks.
type kvSource struct {
	ix      *kvindex.Index
	targets []kvTarget
}

type kvTarget struct {
	provider string
	seed     uint64
}

var (
	_ routing.KVFreshSource  = (*kvSource)(nil)
	_ routing.KVSharedSource = (*kvSource)(nil)
	_ routing.LMCacheSource  = (*kvSource)(nil)
)

func newKVSource(ix *kvindex.Index, targets []target) *kvSource {
	s := &kvSource{ix: ix}
	for _, t := range targets {
		s.targets = append(s.targets, kvTarget{provider: t.cfg.Provider.Name, seed: kvindex.Seed(identityModel(t.cfg))})
	}
	return s
}

// identityModel is the model name a target's block identities are seeded
// with: the provider's kv_events.model when set, as the kvwatcher seeds the
// engine's blocks, else the upstream model the proxy sends (the watcher's
// default too, from the routes' targets).
func identityModel(t config.CompiledTarget) string {
	if kv := t.Provider.KVEvents; kv != nil && kv.Model != "" {
		return kv.Model
	}
	return t.Model
}

// KVScores implements routing.KVSource: the share of the request's full
// leading blocks resident on each target. Targets sharing a provider, model
// and block size share one identity computation.
func (s *kvSource) KVScores(tokenIDs []uint32, scores []float64) bool {
	return s.KVScoresFresh(tokenIDs, scores, nil)
}

// KVScoresFresh implements routing.KVFreshSource (fresh may be nil).
func (s *kvSource) KVScoresFresh(tokenIDs []uint32, scores []float64, freshAt []bool) bool {
	fresh := false
	var ids []uint64
	var idsSeed uint64
	idsBS := -1
	for i, t := range s.targets {
		scores[i] = 0
		f := s.ix.Fresh(t.provider)
		if freshAt != nil {
			freshAt[i] = f
		}
		if !f {
			continue
		}
		fresh = true
		bs := s.ix.BlockSize(t.provider)
		if bs <= 0 || len(tokenIDs) < bs {
			continue
		}
		if bs != idsBS || t.seed != idsSeed {
			ids = kvindex.AppendIdentities(ids[:0], t.seed, tokenIDs, bs)
			idsBS, idsSeed = bs, t.seed
		}
		if len(ids) > 0 {
			scores[i] = float64(s.ix.PrefixMatch(t.provider, ids)) / float64(len(ids))
		}
	}
	return fresh
}

// Speculate implements routing.KVSource: the blocks a routed request will
// create count as resident on its target for ttl (the route's
// balancer.speculative_ttl_ms) before the engine's KV events confirm them.
func (s *kvSource) Speculate(target int, tokenIDs []uint32, ttl time.Duration) {
	if ids, provider := s.identities(target, tokenIDs); len(ids) > 0 {
		s.ix.Speculate(provider, ids, ttl)
	}
}

// SpeculateAppend implements routing.KVSharedSource.
func (s *kvSource) SpeculateAppend(target int, tokenIDs []uint32, ttl time.Duration, dst []uint64) []uint64 {
	if ids, provider := s.identities(target, tokenIDs); len(ids) > 0 {
		return s.ix.SpeculateAppend(provider, ids, ttl, dst)
	}
	return dst
}

// SpeculateIDs implements routing.KVSharedSource: a peer proxy's
// identities for the same route's target, seeded and blocked as this
// proxy's are.
func (s *kvSource) SpeculateIDs(target int, ids []uint64, ttl time.Duration) {
	if target >= 0 && target < len(s.targets) {
		s.ix.Speculate(s.targets[target].provider, ids, ttl)
	}
}

// identities returns the block identities of tokenIDs at target and its
// provider; none for a target out of range or a block size not known yet.
func (s *kvSource) identities(target int, tokenIDs []uint32) ([]uint64, string) {
	if target < 0 || target >= len(s.targets) {
		return nil, ""
	}
	t := s.targets[target]
	bs := s.ix.BlockSize(t.provider)
	if bs <= 0 || len(tokenIDs) < bs {
		return nil, ""
	}
	return kvindex.Identities(t.seed, tokenIDs, bs), t.provider
}

// LMCacheScores implements routing.LMCacheSource.
func (s *kvSource) LMCacheScores(scores []float64) bool {
	fresh := false
	for i, t := range s.targets {
		scores[i] = 0
		occ, available, ok := s.ix.Occupancy(t.provider)
		if !ok {
			continue
		}
		fresh = true
		if available {
			scores[i] = 1 - min(max(occ, 0), 1)
		}
	}
	return fresh
}
