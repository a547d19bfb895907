package sim

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/routing"
)

// ---------------------------------------------------------------- rolter

// kvSource is routing.KVSource over one proxy's per-replica
// kvindex.Residency: what dataplane/internal/proxy/kvsource.go computes over
// pkg/kvindex.Index.
// KVScores is the share of the request's full leading blocks resident (or
// speculated) on each replica; it always reports fresh (the watchers'
// heartbeats are not modelled as late or lost, only the events). Speculate
// marks the request's identities on the chosen replica for the balancer's
// Spec.SpeculativeTTL (routing.DefaultSpeculativeTTL, 5 s, unless
// speculate_ms says otherwise).
type kvSource struct {
	reps []kvindex.Residency
	now  func() time.Duration // the virtual clock (Env.Now)
	memo identities
}

var _ routing.KVSharedSource = (*kvSource)(nil)

// KVScores implements routing.KVSource.
func (s *kvSource) KVScores(tokenIDs []uint32, scores []float64) bool {
	ids := s.memo.get(tokenIDs)
	for i := range scores {
		scores[i] = 0
		if len(ids) > 0 {
			scores[i] = float64(s.reps[i].PrefixMatch(ids, int64(s.now()))) / float64(len(ids))
		}
	}
	return true
}

// Speculate implements routing.KVSource.
func (s *kvSource) Speculate(target int, tokenIDs []uint32, ttl time.Duration) {
	if target >= 0 && target < len(s.reps) {
		s.reps[target].Speculate(s.memo.get(tokenIDs), int64(s.now()), ttl)
	}
}

// SpeculateAppend implements routing.KVSharedSource.
func (s *kvSource) SpeculateAppend(target int, tokenIDs []uint32, ttl time.Duration, dst []uint64) []uint64 {
	if target < 0 || target >= len(s.reps) {
		return dst
	}
	return s.reps[target].SpeculateAppend(s.memo.get(tokenIDs), int64(s.now()), ttl, dst)
}

// SpeculateIDs implements routing.KVSharedSource.
func (s *kvSource) SpeculateIDs(target int, ids []uint64, ttl time.Duration) {
	if target >= 0 && target < len(s.reps) {
		s.reps[target].Speculate(ids, int64(s.now()), ttl)
	}
}

// precise runs pkg/routing's precise_cache_aware balancer, fed through its
// KVSource by the proxy's own index of the replicas' KV events.
type precise struct {
	*balancer
	src *kvSource
}

func (p *precise) Pick(f *Flight, v *View) int {
	p.src.memo.forget()
	return p.balancer.Pick(f, v)
}

func (p *precise) applyKV(replica int, ops []kvdelta.Op) { p.src.reps[replica].Apply(ops) }

// newPrecise builds precise_cache_aware for one proxy: spec with its KV
// source set.
func newPrecise(spec routing.Spec, env Env) (Policy, error) {
	src := &kvSource{reps: make([]kvindex.Residency, env.Replicas), now: env.Now, memo: identities{bs: env.BlockSize}}
	spec.KV = src
	b, err := routing.New(spec)
	if err != nil {
		return nil, err
	}
	return &precise{balancer: &balancer{b: b, all: routing.All(env.Replicas)}, src: src}, nil
}

// ---------------------------------------------------------------- llm-d

// llm-d's precise prefix-cache routing as its guide deploys it (llm-d/llm-d
// guides/precise-prefix-cache-aware/scheduler/
// precise-prefix-cache-aware.values.yaml, commit 955190d9, EPP image
// llm-d-inference-scheduler v0.8.0-rc.1): precise-prefix-cache-scorer 2,
// kv-cache-utilization-scorer 1, queue-scorer 1, max-score picker,
// speculativeIndexing true with the scorer's defaultSpeculativeTTL of 2 s
// (llm-d-inference-scheduler v0.8.0 pkg/epp/framework/plugins/scheduling/
// scorer/preciseprefixcache/precise_prefix_cache.go). The guide's block
// size must match vLLM's --block-size, so it is the replicas' here.
// Re-read in llm-d-router v0.10.0 (the renamed repository's newest
// release), nothing this model uses changed: pkg/epp/framework/plugins/
// requestcontrol/dataproducer/preciseprefixcache/prerequest.go
// (defaultSpeculativeTTL 2 s), producer.go (full blocks only), the prefix
// scorer's match ratio (scheduling/scorer/prefix/plugin.go) and the sample
// profile deploy/config/epp-precise-prefix-cache-config.yaml (2 / 1 / 1).
const llmdSpeculativeTTL = 2 * time.Second

func defaultLLMDWeights() llmdWeights {
	return llmdWeights{prefix: 2, kvCache: 1, queue: 1, specTTL: llmdSpeculativeTTL}
}

// llmdPrecise is llm-d's scheduler with the precise prefix-cache scorer and
// the profile's load scorers (llmdLoad, over scraped metrics):
//
//	score = 2 * matched/blocks + llmdLoad   (kv-cache-utilization 1, queue 1)
//
// matched is kv-cache-manager's LongestPrefixScorer: the longest run of the
// request's block keys, from the first, that the index holds for the pod,
// from the engines' KV events (plus unexpired speculative entries); blocks =
// floor(tokens / block size) (absoluteScoredPods: matched/blocks, clipped to
// [0, 1]). After the pick the request's keys are added speculatively for the
// chosen pod for 2 s.
//
// Simulation notes: llm-d computes its block keys with its own hash (SHA-256
// over CBOR of parent, tokens, extra keys) from the same token ids; any
// chained hash gives the same matches, so the simulator's identities
// (kvindex.Chain) stand in. The index is the in-memory one, never full at
// these sizes.
type llmdPrecise struct {
	llmdLoad
	n      int
	rng    *rand.Rand
	ix     *eventIndex
	memo   identities
	scores []float64
}

func newLLMDPrecise(env Env, w llmdWeights, rng *rand.Rand) *llmdPrecise {
	return &llmdPrecise{llmdLoad: newLLMDLoad(env.Replicas, w), n: env.Replicas, rng: rng, ix: newEventIndex(env.Replicas),
		memo: identities{bs: env.BlockSize}, scores: make([]float64, env.Replicas)}
}

func (l *llmdPrecise) Pick(f *Flight, v *View) int {
	l.memo.forget()
	ids := l.memo.get(f.Req.Tokens())
	for i := range l.n {
		prefix := 0.0
		if len(ids) > 0 {
			prefix = float64(l.ix.prefixMatch(i, ids, v.Now)) / float64(len(ids))
		}
		l.scores[i] = -l.w.prefix * prefix
	}
	l.score(v, l.scores)
	return argminRandom(l.scores, l.rng)
}

func (l *llmdPrecise) Observe(target int, f *Flight, v *View) {
	l.dispatched(target, f, v.Now)
	l.ix.speculate(target, l.memo.get(f.Req.Tokens()), v.Now, l.w.specTTL)
}

func (l *llmdPrecise) applyKV(replica int, ops []kvdelta.Op) { l.ix.apply(replica, ops) }

// parseLLMD reads the llm-d strategies' parameters: the scorer weights
// prefix, kv_cache, queue, active over the strategy's defaults; for
// llmd_precise speculate_ms (0 turns speculative indexing off); for the
// approximate ones lru_blocks, the LRU capacity per server instead of
// autoTune's engine block count (31250 is the plugin's fallback).
func parseLLMD(st Strategy, params string) (Strategy, error) {
	var w llmdWeights
	switch st.Base {
	case LLMDPrecise:
		w = defaultLLMDWeights()
	case LLMDApprox:
		w = shippedLLMDApproxWeights()
	default:
		w = benchLLMDApproxWeights()
	}
	if params != "" {
		for kv := range strings.SplitSeq(params, ":") {
			k, v, _ := strings.Cut(kv, "=")
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 {
				return st, fmt.Errorf("strategy %q: %s: want a number >= 0", st.Name, kv)
			}
			switch {
			case k == "prefix":
				w.prefix = f
			case k == "kv_cache":
				w.kvCache = f
			case k == "queue":
				w.queue = f
			case k == "active":
				w.active = f
			case k == "speculate_ms" && st.Base == LLMDPrecise:
				w.specTTL = time.Duration(f * float64(time.Millisecond))
			case k == "lru_blocks" && st.Base != LLMDPrecise && f >= 1:
				w.lruBlocks = int(f)
			default:
				want := "prefix, kv_cache, queue, active, lru_blocks >= 1"
				if st.Base == LLMDPrecise {
					want = "prefix, kv_cache, queue, active, speculate_ms"
				}
				return st, fmt.Errorf("strategy %q: unknown parameter %q (want %s)", st.Name, k, want)
			}
		}
	}
	base := st.Base
	st.New = func(env Env) (Policy, error) {
		rng := rand.New(rand.NewPCG(env.Seed, Key(uint64(len(base)), uint64(base[0]))))
		if base == LLMDPrecise {
			return newLLMDPrecise(env, w, rng), nil
		}
		return newLLMD(env, w, rng), nil
	}
	return st, nil
}
