package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
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
	now  time.Duration
	memo identities
}

var _ routing.KVSource = (*kvSource)(nil)

// KVScores implements routing.KVSource.
func (s *kvSource) KVScores(tokenIDs []uint32, scores []float64) bool {
	ids := s.memo.get(tokenIDs)
	for i := range scores {
		scores[i] = 0
		if len(ids) > 0 {
			scores[i] = float64(s.reps[i].PrefixMatch(ids, int64(s.now))) / float64(len(ids))
		}
	}
	return true
}

// Speculate implements routing.KVSource.
func (s *kvSource) Speculate(target int, tokenIDs []uint32, ttl time.Duration) {
	if target >= 0 && target < len(s.reps) {
		s.reps[target].Speculate(s.memo.get(tokenIDs), int64(s.now), ttl)
	}
}

// precise runs pkg/routing's precise_cache_aware balancer, fed through its
// KVSource by the proxy's own index of the replicas' KV events.
type precise struct {
	*balancer
	src *kvSource
}

func (p *precise) Pick(f *Flight, v *View) int {
	p.src.now = v.Now
	p.src.memo.forget()
	return p.balancer.Pick(f, v)
}

func (p *precise) Observe(target int, f *Flight, v *View) {
	p.src.now = v.Now
	p.balancer.Observe(target, f, v)
}

func (p *precise) applyKV(replica int, ops []kvdelta.Op) { p.src.reps[replica].Apply(ops) }

// newPrecise builds precise_cache_aware for one proxy: spec with its KV
// source set.
func newPrecise(spec routing.Spec, env Env) (Policy, error) {
	src := &kvSource{reps: make([]kvindex.Residency, env.Replicas), memo: identities{bs: env.BlockSize}}
	spec.KV = src
	b, err := routing.New(spec)
	if err != nil {
		return nil, err
	}
	return &precise{balancer: &balancer{b: b, all: routing.All(env.Replicas)}, src: src}, nil
}

// ---------------------------------------------------------------- llm-d

// llm-d's precise prefix-cache routing. Scorer weights: docs peers.md §2.2,
// llm-d-kv-cache-manager benchmarking/37-capacity/README.md, the published
// precise run: "prefix 2, kv-cache 1, active-request 1" (the approximate
// profile's queue scorer is not in it). llm-d's guide
// (guides/precise-prefix-cache-aware/gaie-kv-events/values.yaml) uses
// precise 3, kv-cache-utilization 2, queue 2: run it as
// llmd_precise:prefix=3:kv_cache=2:queue=2:active=0. Speculative indexing is
// on by default since llm-d PR #1290 (peers.md §1.2), with the scorer's
// defaultSpeculativeTTL of 2 s (llm-d-router
// pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache).
const (
	llmdPreciseWeightPrefix  = 2
	llmdPreciseWeightKVCache = 1
	llmdPreciseWeightQueue   = 0
	llmdPreciseWeightActive  = 1
	llmdSpeculativeTTL       = 2 * time.Second
)

// llmdWeights are llmd_precise's scorer weights and speculation TTL.
type llmdWeights struct {
	prefix, kvCache, queue, active float64
	specTTL                        time.Duration
}

func defaultLLMDWeights() llmdWeights {
	return llmdWeights{prefix: llmdPreciseWeightPrefix, kvCache: llmdPreciseWeightKVCache,
		queue: llmdPreciseWeightQueue, active: llmdPreciseWeightActive, specTTL: llmdSpeculativeTTL}
}

// llmdPrecise is llm-d's scheduler with the precise prefix-cache scorer and
// its load scorers, max-score picker (ties at random):
//
//	score = 2 * matched/blocks                (precise-prefix-cache-scorer)
//	      + 1 * (1 - kv_cache_usage)          (kv-cache-utilization-scorer)
//	      + 0 * (maxQ - q)/(maxQ - minQ)      (queue-scorer, 1 when equal)
//	      + 1 * (maxA - a)/maxA               (active-request, 1 when a = 0)
//
// matched is kv-cache-manager's LongestPrefixScorer: the longest run of the
// request's block keys, from the first, that the index holds for the pod,
// from the engines' KV events (plus unexpired speculative entries); blocks =
// floor(tokens / block size) (absoluteScoredPods: matched/blocks, clipped to
// [0, 1]). kv_cache_usage is vLLM's kv_cache_usage_perc: blocks held by
// running requests over capacity. After the pick the request's keys are
// added speculatively for the chosen pod for 2 s.
//
// Simulation notes: llm-d computes its block keys with its own hash (SHA-256
// over CBOR of parent, tokens, extra keys) from the same token ids; any
// chained hash gives the same matches, so the simulator's identities
// (kvindex.Chain) stand in. The index is the in-memory one, never full at
// these sizes. Metrics are read without scrape lag, as for llmd_approx.
type llmdPrecise struct {
	n      int
	rng    *rand.Rand
	w      llmdWeights
	ix     *llmdIndex
	active []map[*Flight]time.Duration
	counts []int
	memo   identities
	scores []float64
}

func newLLMDPrecise(env Env, w llmdWeights, rng *rand.Rand) *llmdPrecise {
	l := &llmdPrecise{n: env.Replicas, rng: rng, w: w, ix: newLLMDIndex(env.Replicas),
		counts: make([]int, env.Replicas), memo: identities{bs: env.BlockSize}, scores: make([]float64, env.Replicas)}
	for range env.Replicas {
		l.active = append(l.active, map[*Flight]time.Duration{})
	}
	return l
}

func (l *llmdPrecise) Pick(f *Flight, v *View) int {
	l.memo.forget()
	ids := l.memo.get(f.Req.Tokens())
	minQ, maxQ := slices.Min(v.Waiting), slices.Max(v.Waiting)
	maxA := activeCounts(l.active, v.Now, l.counts)
	for i := range l.n {
		prefix := 0.0
		if len(ids) > 0 {
			prefix = float64(l.ix.prefixMatch(i, ids, v.Now)) / float64(len(ids))
		}
		kv := 1.0
		if v.KVUsage != nil {
			kv = 1 - min(max(v.KVUsage[i], 0), 1)
		}
		queue := 1.0
		if maxQ != minQ {
			queue = float64(maxQ-v.Waiting[i]) / float64(maxQ-minQ)
		}
		act := 1.0
		if l.counts[i] > 0 && maxA > 0 {
			act = float64(maxA-l.counts[i]) / float64(maxA)
		}
		l.scores[i] = -(l.w.prefix*prefix + l.w.kvCache*kv + l.w.queue*queue + l.w.active*act)
	}
	return argminRandom(l.scores, l.rng)
}

func (l *llmdPrecise) Observe(target int, f *Flight, v *View) {
	l.active[target][f] = v.Now
	l.ix.speculate(target, l.memo.get(f.Req.Tokens()), v.Now, l.w.specTTL)
}

func (l *llmdPrecise) FirstToken(*Flight, time.Duration) {}

func (l *llmdPrecise) Done(f *Flight, _ time.Duration) { delete(l.active[f.Target], f) }

func (l *llmdPrecise) applyKV(replica int, ops []kvdelta.Op) { l.ix.apply(replica, ops) }

// parseLLMDPrecise reads llmd_precise's parameters: the scorer weights
// prefix, kv_cache, queue, active, and speculate_ms (0 turns speculative
// indexing off).
func parseLLMDPrecise(st Strategy, params string) (Strategy, error) {
	w := defaultLLMDWeights()
	if params != "" {
		for kv := range strings.SplitSeq(params, ":") {
			k, v, _ := strings.Cut(kv, "=")
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 {
				return st, fmt.Errorf("strategy %q: %s: want a number >= 0", st.Name, kv)
			}
			switch k {
			case "prefix":
				w.prefix = f
			case "kv_cache":
				w.kvCache = f
			case "queue":
				w.queue = f
			case "active":
				w.active = f
			case "speculate_ms":
				w.specTTL = time.Duration(f * float64(time.Millisecond))
			default:
				return st, fmt.Errorf("strategy %q: unknown parameter %q (want prefix, kv_cache, queue, active, speculate_ms)", st.Name, k)
			}
		}
	}
	st.New = func(env Env) (Policy, error) {
		rng := rand.New(rand.NewPCG(env.Seed, Key(uint64(len(LLMDPrecise)), uint64(LLMDPrecise[0]))))
		return newLLMDPrecise(env, w, rng), nil
	}
	return st, nil
}
