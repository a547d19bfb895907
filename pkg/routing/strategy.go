package routing

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"rolter.dev/pkg/prefixtree"
)

// Strategy names as written in config (`strategy = "..."`).
const (
	RoundRobin        = "round_robin"
	Random            = "random"
	Weighted          = "weighted"
	PowerOfTwo        = "power_of_two"
	LeastLoad         = "least_load"
	ConsistentHash    = "consistent_hash"
	CacheAware        = "cache_aware"
	Pipeline          = "pipeline"
	PreciseCacheAware = "precise_cache_aware"
	LMCacheAware      = "lmcache_aware"
	PredictedLatency  = "predicted_latency"
	PredictedTTFT     = "predicted_ttft"
)

// ErrUnknownStrategy is returned by [New] for a name it does not know.
var ErrUnknownStrategy = errors.New("routing: unknown strategy")

// Defaults of the per-route parameters in [Spec]; a zero field means the
// default.
const (
	// DefaultThreshold is cache_aware's minimum prefix-match fraction.
	DefaultThreshold = 0.5
	// DefaultBalanceAbs is cache_aware's absolute balance margin: how many
	// requests the warm target may be ahead of the least-loaded one.
	DefaultBalanceAbs = 2
	// DefaultBalanceRel is cache_aware's relative balance margin.
	DefaultBalanceRel = 1.5
	// DefaultMaxTrieNodes is the per-target prefix-tree ceiling, in byte
	// nodes (see package prefixtree).
	DefaultMaxTrieNodes = prefixtree.DefaultMaxNodes
)

// Spec describes the balancer of one route.
type Spec struct {
	// Strategy is one of the strategy names above.
	Strategy string
	// Weights has one entry per target (config `weight`, default 1); its
	// length is the number of targets.
	Weights []int

	// Threshold is cache_aware's minimum best prefix-match fraction (matched
	// bytes / prompt bytes) for affinity; 0 means [DefaultThreshold]. Above 1
	// affinity never applies.
	Threshold float64
	// BalanceAbs is cache_aware's absolute balance margin; 0 means
	// [DefaultBalanceAbs].
	BalanceAbs int
	// BalanceRel is cache_aware's relative balance margin; 0 means
	// [DefaultBalanceRel].
	BalanceRel float64
	// MaxTrieNodes is the per-target node ceiling of the prefix tree of
	// cache_aware and of the pipeline's prefix_cache scorer, in byte nodes;
	// 0 means [DefaultMaxTrieNodes].
	MaxTrieNodes int
	// Scorers sets the pipeline's scorer weights by scorer name
	// ([ScorerPrefixCache], [ScorerLeastLoad], [ScorerSessionAffinity],
	// [ScorerStaticWeight]). A scorer that is not named has weight 1; weight
	// 0 turns it off.
	Scorers map[string]float64

	// Share, when set, makes cache_aware and the pipeline's prefix_cache
	// scorer keep a shared prefix index (rolter.dev/pkg/chunkindex, capped
	// at MaxTrieNodes/ChunkBytes hashes per target) next to their tree and
	// consult it at pick time: every Observe hands the prompt to Share,
	// which must only queue it (it runs on the request path); the fleet
	// later records it with [SharedAffinity.RecordLocal] and folds peers'
	// observations with FoldPeer. Share is called outside the balancer's
	// locks.
	Share func(target int, prompt string)

	// KV feeds precise_cache_aware (nil leaves it neutral: least load) and
	// predicted_ttft's matched prefixes (nil: the approximate index only).
	KV KVSource
	// Engine is what the replicas report (num_requests_waiting, KV
	// capacity), for predicted_ttft; nil: nothing scraped.
	Engine EngineState
	// KVCapacityTokens has, per target, its KV cache capacity in tokens
	// as configured (a provider's kv_capacity_tokens), 0 or missing when
	// not set; predicted_ttft bounds its approximate index with it when
	// Engine has no scraped capacity.
	KVCapacityTokens []int
	// LMCache feeds lmcache_aware; nil leaves it neutral (least load).
	LMCache LMCacheSource
	// SignalWeight and LoadWeight weigh the cache signal and least load in
	// precise_cache_aware and lmcache_aware; 0 means the defaults
	// (DefaultSignalWeight; DefaultPreciseLoadWeight or
	// DefaultSignalLoadWeight).
	SignalWeight, LoadWeight float64
	// SpeculativeTTL is how long precise_cache_aware (and predicted_ttft) has the KV source
	// count a routed request's blocks as resident on its target; 0 means
	// [DefaultSpeculativeTTL], [NoSpeculation] (or any negative) turns it
	// off.
	SpeculativeTTL time.Duration

	// IntN, when set, is the source of every random draw of the balancer
	// (random, power_of_two, and the tie breaks of the scoring strategies):
	// it returns a uniform int in [0, n). Nil means math/rand/v2's
	// goroutine-safe generator. Pick calls it, so it must be as safe for
	// concurrent use as the balancer's callers need; the routing simulator
	// passes a seeded single-goroutine source so that runs reproduce.
	IntN func(n int) int
	// Now, when set, is the clock the pipeline's session_affinity scorer
	// measures SessionTTL on: any monotonic reading (only differences
	// count). Nil means the process's monotonic clock. The routing
	// simulator passes its virtual clock.
	Now func() time.Duration
	// FleetNow, when set, is a clock every proxy of a fleet reads alike
	// (to well under a queue interval): predicted_ttft's turns in a burst
	// draw the proxies' order for each time slot from it. Nil means Now
	// when that is set (a simulated clock, the same for every simulated
	// proxy), else the wall clock (time since the Unix epoch, which NTP
	// keeps within a millisecond or so on a LAN).
	FleetNow func() time.Duration
}

// params are a Spec's per-route parameters with defaults applied.
type params struct {
	threshold  float64
	balanceAbs int
	balanceRel float64
	maxNodes   int
	scorers    [numScorers]float64
	intn       func(n int) int
	now        func() time.Duration // Spec.Now; nil: the monotonic clock
	fleetNow   func() time.Duration // Spec.FleetNow, else Spec.Now, else the wall clock
}

// params applies defaults and rejects values no route can mean: negative or
// non-finite numbers and unknown scorer names.
func (s *Spec) params() (params, error) {
	p := params{
		threshold:  cmp.Or(s.Threshold, DefaultThreshold),
		balanceAbs: cmp.Or(s.BalanceAbs, DefaultBalanceAbs),
		balanceRel: cmp.Or(s.BalanceRel, DefaultBalanceRel),
		maxNodes:   cmp.Or(s.MaxTrieNodes, DefaultMaxTrieNodes),
		intn:       s.IntN,
		now:        s.Now,
		fleetNow:   s.FleetNow,
	}
	if p.intn == nil {
		p.intn = rand.IntN
	}
	switch {
	case p.fleetNow != nil:
	case s.Now != nil:
		p.fleetNow = s.Now
	default:
		p.fleetNow = func() time.Duration { return time.Duration(time.Now().UnixNano()) }
	}
	var errs []error
	if !finiteNonNegative(s.Threshold) {
		errs = append(errs, fmt.Errorf("routing: threshold: must be a finite number >= 0, got %v", s.Threshold))
	}
	if s.BalanceAbs < 0 {
		errs = append(errs, fmt.Errorf("routing: balance_abs: must be >= 0, got %d", s.BalanceAbs))
	}
	if !finiteNonNegative(s.BalanceRel) {
		errs = append(errs, fmt.Errorf("routing: balance_rel: must be a finite number >= 0, got %v", s.BalanceRel))
	}
	if s.MaxTrieNodes < 0 {
		errs = append(errs, fmt.Errorf("routing: max_trie_nodes: must be >= 0, got %d", s.MaxTrieNodes))
	}
	for i := range p.scorers {
		p.scorers[i] = 1
	}
	for name, w := range s.Scorers {
		i := slices.Index(scorerNames[:], name)
		switch {
		case i < 0:
			errs = append(errs, fmt.Errorf("routing: scorers.%s: unknown scorer (want one of %v)", name, scorerNames))
		case !finiteNonNegative(w):
			errs = append(errs, fmt.Errorf("routing: scorers.%s: must be a finite number >= 0, got %v", name, w))
		default:
			p.scorers[i] = w
		}
	}
	return p, errors.Join(errs...)
}

func finiteNonNegative(f float64) bool { return f >= 0 && !math.IsInf(f, 1) }

// New builds the balancer a route's Spec asks for.
func New(spec Spec) (Balancer, error) {
	n := len(spec.Weights)
	if n > MaxTargets {
		return nil, fmt.Errorf("routing: %d targets, at most %d supported", n, MaxTargets)
	}
	p, err := spec.params()
	if err != nil {
		return nil, err
	}
	switch spec.Strategy {
	case RoundRobin:
		return newRoundRobin(n), nil
	case Random:
		return newRandom(n, p.intn), nil
	case Weighted:
		return newWeighted(spec.Weights), nil
	case PowerOfTwo:
		return newPowerOfTwo(n, p.intn), nil
	case LeastLoad:
		return newLeastLoad(n), nil
	case ConsistentHash:
		return newConsistentHash(n), nil
	case CacheAware:
		return newCacheAware(n, p, newSharing(n, p.maxNodes, spec.Share)), nil
	case Pipeline:
		return newPipeline(spec.Weights, p, newSharing(n, p.maxNodes, spec.Share)), nil
	case PredictedLatency:
		return newPredictedLatency(n, p.intn), nil
	case PredictedTTFT:
		for i, c := range spec.KVCapacityTokens {
			if c < 0 {
				return nil, fmt.Errorf("routing: kv_capacity_tokens[%d]: must be >= 0, got %d", i, c)
			}
		}
		return newPredictedTTFT(&spec, p), nil
	case PreciseCacheAware, LMCacheAware:
		if spec.SignalWeight < 0 || spec.LoadWeight < 0 {
			return nil, fmt.Errorf("routing: negative signal or load weight")
		}
		s := &signalScored{name: spec.Strategy, n: n, intn: p.intn, wSignal: spec.SignalWeight, wLoad: spec.LoadWeight,
			specTTL: cmp.Or(spec.SpeculativeTTL, DefaultSpeculativeTTL)}
		if s.wSignal == 0 {
			s.wSignal = DefaultSignalWeight
		}
		if s.wLoad == 0 {
			s.wLoad = DefaultSignalLoadWeight
			if spec.Strategy == PreciseCacheAware {
				s.wLoad = DefaultPreciseLoadWeight
			}
		}
		if spec.Strategy == PreciseCacheAware {
			s.kv = spec.KV
		} else {
			s.lm = spec.LMCache
		}
		return s, nil
	default:
		return nil, fmt.Errorf("%w %q", ErrUnknownStrategy, spec.Strategy)
	}
}
