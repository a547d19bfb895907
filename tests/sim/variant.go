package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/routing"
)

// VariantSpec is one variant of a simulated route (routes[].variants): its
// name, weight and strategy, and the replicas it owns (its targets).
type VariantSpec struct {
	Name     string
	Weight   int
	Strategy Strategy
	Replicas []int
}

// VariantStats are one variant's totals over a run.
type VariantStats struct {
	Name     string `json:"name"`
	Weight   int    `json:"weight"`
	Replicas []int  `json:"replicas"`
	Requests int    `json:"requests"`
	// PromptTokens and CachedTokens as in Result, for the variant's
	// requests; HitRate is their ratio.
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRate      float64 `json:"token_hit_rate"`
	// TTFT statistics of the variant's requests.
	TTFTMean time.Duration `json:"ttft_mean_ns"`
	TTFTP50  time.Duration `json:"ttft_p50_ns"`
	TTFTP99  time.Duration `json:"ttft_p99_ns"`

	ttfts []time.Duration
}

// VariantReport collects the per-variant results of the runs of a
// [Variants] strategy; Finish computes the statistics of the runs so far.
type VariantReport struct {
	Variants []VariantStats
}

// Finish computes the hit rates and TTFT statistics.
func (r *VariantReport) Finish() {
	for i := range r.Variants {
		v := &r.Variants[i]
		if v.PromptTokens > 0 {
			v.HitRate = float64(v.CachedTokens) / float64(v.PromptTokens)
		}
		if len(v.ttfts) > 0 {
			slices.Sort(v.ttfts)
			var sum time.Duration
			for _, t := range v.ttfts {
				sum += t
			}
			v.TTFTMean = sum / time.Duration(len(v.ttfts))
			v.TTFTP50, v.TTFTP99 = percentile(v.ttfts, 0.50), percentile(v.ttfts, 0.99)
		}
	}
}

// Variants returns a strategy that splits the requests over variants as
// rolter-proxy does: routing.RankVariants on routing.AssignmentKey (the
// session's x-session-id with Config.SessionKeys, else each request on its
// own), then the assigned variant's own balancer over its replicas. Every
// simulated replica is healthy, so no request falls over. The variants'
// balancers do not share state across proxies (Config.Share). The returned
// report accumulates every run of the strategy.
func Variants(specs []VariantSpec, replicas int) (Strategy, *VariantReport, error) {
	if len(specs) == 0 {
		return Strategy{}, nil, fmt.Errorf("variants: none given")
	}
	rep := &VariantReport{}
	names, weights := make([]string, len(specs)), make([]int, len(specs))
	sum := 0
	var label []string
	tokenIDs := false
	for i, s := range specs {
		if s.Weight < 0 || len(s.Replicas) == 0 || s.Strategy.New == nil {
			return Strategy{}, nil, fmt.Errorf("variant %q: needs a weight >= 0, replicas and a strategy", s.Name)
		}
		for _, r := range s.Replicas {
			if r < 0 || r >= replicas {
				return Strategy{}, nil, fmt.Errorf("variant %q: replica %d outside 0..%d", s.Name, r, replicas-1)
			}
		}
		names[i], weights[i] = s.Name, s.Weight
		sum += s.Weight
		tokenIDs = tokenIDs || s.Strategy.TokenIDs
		rep.Variants = append(rep.Variants, VariantStats{Name: s.Name, Weight: s.Weight, Replicas: slices.Clone(s.Replicas)})
		label = append(label, fmt.Sprintf("%s=%d:%s", s.Name, s.Weight, s.Strategy.Name))
	}
	if sum == 0 {
		return Strategy{}, nil, fmt.Errorf("variants: the weights must sum to more than 0")
	}
	st := Strategy{Name: "variants(" + strings.Join(label, ",") + ")", Base: "variants", TokenIDs: tokenIDs}
	st.New = func(env Env) (Policy, error) {
		vp := &variantPolicy{names: names, weights: weights, rep: rep}
		kv := false
		for _, s := range specs {
			sub := env
			sub.Replicas, sub.Share = len(s.Replicas), nil
			pol, err := s.Strategy.New(sub)
			if err != nil {
				return nil, fmt.Errorf("variant %q: %w", s.Name, err)
			}
			local := make(map[int]int, len(s.Replicas))
			for j, r := range s.Replicas {
				local[r] = j
			}
			c, isKV := pol.(kvConsumer)
			kv = kv || isKV
			vp.pools = append(vp.pools, variantPool{policy: pol, kv: c, replicas: s.Replicas, local: local})
		}
		if kv {
			return variantKVPolicy{vp}, nil
		}
		return vp, nil
	}
	return st, rep, nil
}

type variantPolicy struct {
	names   []string
	weights []int
	pools   []variantPool
	rep     *VariantReport
	order   []int
}

type variantPool struct {
	policy   Policy
	kv       kvConsumer
	replicas []int       // local index → replica
	local    map[int]int // replica → local index
}

// assign is the variant of f, as rolter-proxy assigns it.
func (p *variantPolicy) assign(f *Flight) int {
	id := ""
	if f.Ctx.SessionKey == "" && f.Req.Session != nil {
		id = strconv.Itoa(f.Req.Session.ID) + "/" + strconv.Itoa(f.Req.Turn) // each request on its own
	}
	p.order = routing.RankVariants(p.order, routing.AssignmentKey(f.Ctx.SessionKey, "", id), p.names, p.weights)
	return p.order[0]
}

// view restricts v to a pool's replicas.
func (vp *variantPool) view(v *View) *View {
	sub := &View{Now: v.Now, BlockSize: v.BlockSize}
	for _, r := range vp.replicas {
		sub.Loads = append(sub.Loads, v.Loads[r])
		sub.Waiting = append(sub.Waiting, v.Waiting[r])
		if v.Running != nil {
			sub.Running = append(sub.Running, v.Running[r])
		}
		sub.KVUsage = append(sub.KVUsage, v.KVUsage[r])
		sub.Caches = append(sub.Caches, v.Caches[r])
	}
	return sub
}

// withLocal runs fn with f.Target as the pool's index, as its policy knows it.
func (vp *variantPool) withLocal(f *Flight, fn func()) {
	global := f.Target
	f.Target = vp.local[global]
	fn()
	f.Target = global
}

func (p *variantPolicy) Pick(f *Flight, v *View) int {
	vp := &p.pools[p.assign(f)]
	return vp.replicas[vp.policy.Pick(f, vp.view(v))]
}

func (p *variantPolicy) Observe(target int, f *Flight, v *View) {
	vp := &p.pools[p.assign(f)]
	vp.policy.Observe(vp.local[target], f, vp.view(v))
}

func (p *variantPolicy) FirstToken(f *Flight, now time.Duration) {
	vp := &p.pools[p.assign(f)]
	if l, ok := vp.policy.(lifecycle); ok {
		vp.withLocal(f, func() { l.FirstToken(f, now) })
	}
}

func (p *variantPolicy) Done(f *Flight, now time.Duration) {
	i := p.assign(f)
	vp := &p.pools[i]
	if l, ok := vp.policy.(lifecycle); ok {
		vp.withLocal(f, func() { l.Done(f, now) })
	}
	s := &p.rep.Variants[i]
	s.Requests++
	s.PromptTokens += int64(len(f.Req.Tokens()))
	s.CachedTokens += int64(f.Cached)
	s.ttfts = append(s.ttfts, f.FirstToken-f.Issued)
}

// Decisions sums the variants' balancers' decision counts.
func (p *variantPolicy) Decisions() map[string]uint64 {
	var out map[string]uint64
	for i, vp := range p.pools {
		d, ok := vp.policy.(interface{ Decisions() map[string]uint64 })
		if !ok {
			continue
		}
		for k, n := range d.Decisions() {
			if out == nil {
				out = map[string]uint64{}
			}
			out[p.names[i]+"/"+k] += n
		}
	}
	return out
}

// variantKVPolicy is a variantPolicy whose variants read KV events: each
// replica's events go to the variant that owns it.
type variantKVPolicy struct{ *variantPolicy }

func (p variantKVPolicy) applyKV(replica int, ops []kvdelta.Op) {
	for _, vp := range p.pools {
		if j, ok := vp.local[replica]; ok && vp.kv != nil {
			vp.kv.applyKV(j, ops)
		}
	}
}

// ParseVariants reads a variant split: comma-separated
// NAME=WEIGHT:STRATEGY@REPLICAS, where STRATEGY is any [ParseStrategy]
// strategy (parameters included) and REPLICAS a list of replica indexes and
// ranges joined by "+", e.g. "stable=90:cache_aware@0-5,canary=10:least_load@6+7".
func ParseVariants(s string) ([]VariantSpec, error) {
	var out []VariantSpec
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		name, rest, ok := strings.Cut(part, "=")
		at := strings.LastIndex(rest, "@")
		if !ok || name == "" || at < 0 {
			return nil, fmt.Errorf("variant %q: want NAME=WEIGHT:STRATEGY@REPLICAS", part)
		}
		ws, strat, ok := strings.Cut(rest[:at], ":")
		w, err := strconv.Atoi(ws)
		if !ok || err != nil {
			return nil, fmt.Errorf("variant %q: want NAME=WEIGHT:STRATEGY@REPLICAS", part)
		}
		st, err := ParseStrategy(strat)
		if err != nil {
			return nil, fmt.Errorf("variant %q: %w", name, err)
		}
		var replicas []int
		for _, rg := range strings.Split(rest[at+1:], "+") {
			lo, hi, isRange := strings.Cut(rg, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 != nil || err2 != nil || b < a || a < 0 || b-a >= routing.MaxTargets {
				return nil, fmt.Errorf("variant %q: bad replicas %q", name, rg)
			}
			for r := a; r <= b; r++ {
				replicas = append(replicas, r)
			}
		}
		out = append(out, VariantSpec{Name: name, Weight: w, Strategy: st, Replicas: replicas})
	}
	return out, nil
}
