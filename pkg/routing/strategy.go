package routing

import (
	"errors"
	"fmt"
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
)

// ErrUnknownStrategy is returned by [New] for a name it does not know.
var ErrUnknownStrategy = errors.New("routing: unknown strategy")

// Spec describes the balancer of one route.
type Spec struct {
	// Strategy is one of the strategy names above.
	Strategy string
	// Weights has one entry per target (config `weight`, default 1); its
	// length is the number of targets.
	Weights []int
}

// New builds the balancer a route's Spec asks for.
func New(spec Spec) (Balancer, error) {
	n := len(spec.Weights)
	if n > MaxTargets {
		return nil, fmt.Errorf("routing: %d targets, at most %d supported", n, MaxTargets)
	}
	switch spec.Strategy {
	case RoundRobin:
		return newRoundRobin(n), nil
	case Random:
		return newRandom(n), nil
	case Weighted:
		return newWeighted(spec.Weights), nil
	case PowerOfTwo:
		return newPowerOfTwo(n), nil
	case LeastLoad:
		return newLeastLoad(n), nil
	default:
		return nil, fmt.Errorf("%w %q", ErrUnknownStrategy, spec.Strategy)
	}
}
