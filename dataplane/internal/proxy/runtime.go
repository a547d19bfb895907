package proxy

import (
	"fmt"
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/config"
	"rolter.dev/pkg/delivery"
	"rolter.dev/pkg/fleet"
	"rolter.dev/pkg/reliability"
	"rolter.dev/pkg/routing"
	"rolter.dev/pkg/usage"
)

// runtime is everything a request needs from one config snapshot: the
// snapshot itself and, per route, its balancer and targets bound to their
// live state. It is immutable once built; the proxy swaps it whole.
type runtime struct {
	snap       *config.Snapshot
	generation int64
	routes     map[string]*route
	breaker    reliability.BreakerConfig
	// cache is nil when [cache] enabled is false.
	cache *responseCache
	// policy finalises every buffered successful body (pkg/delivery).
	policy *delivery.Policy
	// prices bill usage records; accounting writes them.
	prices     *usage.PriceTable
	accounting *accounting
}

type route struct {
	cfg      *config.CompiledRoute
	balancer routing.Balancer
	targets  []target
	// fingerprint decides whether a reload may keep the balancer (and with
	// it learned affinity) for this route.
	fingerprint string
	// fleet is the route's state shared with the other proxies; nil
	// without sharing.
	fleet *fleet.Route
}

type target struct {
	cfg    config.CompiledTarget
	state  *reliability.Target
	health *reliability.Provider
}

// newRuntime compiles a snapshot into a runtime. Balancers of routes whose
// strategy and targets are unchanged since prev are kept, so a reload that
// touches one route does not reset the learned affinity of the others.
func (p *Proxy) newRuntime(snap *config.Snapshot, prev *runtime) (*runtime, error) {
	reg, log := p.reg, p.log
	rt := &runtime{
		snap:   snap,
		routes: make(map[string]*route, len(snap.Routes)),
		breaker: reliability.BreakerConfig{
			Enabled:          snap.Breaker.Enabled,
			FailureThreshold: snap.Breaker.FailureThreshold,
			OpenFor:          time.Duration(snap.Breaker.OpenSecs) * time.Second,
		},
	}
	if prev != nil {
		rt.generation = prev.generation + 1
	} else {
		rt.generation = 1
	}
	pol, err := delivery.New(snap.Delivery, p.client, log, delivery.WithStats(&p.deliveryStats))
	if err != nil {
		return nil, err
	}
	rt.policy = pol
	rt.prices = usage.NewPriceTable(snap.ModelPrices)
	if prev != nil && prev.accounting != nil && prev.accounting.cfg == snap.Accounting {
		rt.accounting = prev.accounting
	} else {
		sink, err := usage.Open(snap.Accounting, log)
		if err != nil {
			return nil, fmt.Errorf("accounting: %w", err)
		}
		rt.accounting = &accounting{cfg: snap.Accounting, sink: sink}
	}
	if snap.Cache.Enabled {
		if prev != nil && prev.cache != nil && prev.cache.cfg == snap.Cache {
			rt.cache = prev.cache
		} else {
			c, err := newResponseCache(snap.Cache, log)
			if err != nil {
				return nil, err
			}
			rt.cache = c
		}
	}
	for i, rc := range snap.Routes {
		r := &route{cfg: rc, fingerprint: fingerprint(rc)}
		weights := make([]int, len(rc.Targets))
		for j, tc := range rc.Targets {
			weights[j] = tc.Weight
			r.targets = append(r.targets, target{
				cfg:    tc,
				state:  reg.Target(reliability.TargetKey{Route: rc.Model, Provider: tc.Provider.Name, Model: tc.Model}),
				health: reg.Provider(tc.Provider.Name),
			})
		}
		if p.fleet != nil {
			r.fleet = p.fleet.Bind(rc.Model, xxh3.HashString(r.fingerprint), len(rc.Targets))
		}
		if prev != nil {
			if old := prev.routes[rc.Model]; old != nil && old.fingerprint == r.fingerprint {
				r.balancer = old.balancer
			}
		}
		if r.balancer == nil {
			bp := rc.Balancer
			spec := routing.Spec{
				Strategy: rc.Strategy, Weights: weights,
				Threshold: bp.Threshold, BalanceAbs: bp.BalanceAbs, BalanceRel: bp.BalanceRel,
				MaxTrieNodes: bp.MaxTrieNodes, Scorers: bp.Scorers,
				SignalWeight: bp.SignalWeight, LoadWeight: bp.LoadWeight,
				SpeculativeTTL: rc.SpeculativeTTL,
			}
			if rc.SpeculativeTTL == 0 {
				spec.SpeculativeTTL = routing.NoSpeculation // 0 in the config turns it off
			}
			if p.kv != nil {
				src := newKVSource(p.kv, r)
				spec.KV, spec.LMCache = src, src
			}
			spec.Engine = engineState{targets: r.targets}
			for _, tc := range rc.Targets {
				spec.KVCapacityTokens = append(spec.KVCapacityTokens, tc.Provider.KVCapacityTokens)
			}
			if r.fleet != nil {
				spec.Share = r.fleet.Record
			}
			b, err := routing.New(spec)
			if err != nil {
				return nil, fmt.Errorf("routes[%d].strategy: %w", i, err)
			}
			r.balancer = b
		}
		if r.fleet != nil {
			if sa, ok := r.balancer.(routing.SharedAffinity); ok {
				r.fleet.SetAffinity(sa)
			}
			targets := r.targets
			r.fleet.SetOwnLoad(func(i int) int { return targets[i].state.InFlight() })
		}
		rt.routes[rc.Model] = r
	}
	return rt, nil
}

func fingerprint(rc *config.CompiledRoute) string {
	s := fmt.Sprintf("%s|%+v|%v", rc.Strategy, rc.Balancer, rc.SpeculativeTTL)
	for _, t := range rc.Targets {
		s += fmt.Sprintf("|%s/%s/%d", t.Provider.Name, t.Model, t.Weight)
	}
	return s
}

// fleetRoutes lists the routes' shared state, for fleet.Node.Retain.
func (rt *runtime) fleetRoutes() []*fleet.Route {
	var out []*fleet.Route
	for _, r := range rt.routes {
		if r.fleet != nil {
			out = append(out, r.fleet)
		}
	}
	return out
}

// retain drops live state of targets and providers that left the config.
func (rt *runtime) retain(reg *reliability.Registry) {
	keys := make(map[reliability.TargetKey]bool)
	providers := make(map[string]bool)
	for _, r := range rt.routes {
		for _, t := range r.targets {
			keys[t.state.Key()] = true
		}
	}
	for _, p := range rt.snap.Providers {
		providers[p.Name] = true
	}
	reg.Retain(func(k reliability.TargetKey) bool { return keys[k] }, func(n string) bool { return providers[n] })
}

// modelNames lists the routes in config order, for /v1/models.
func (rt *runtime) modelNames() []string {
	names := make([]string, 0, len(rt.snap.Routes))
	for _, r := range rt.snap.Routes {
		names = append(names, r.Model)
	}
	return slices.Clip(names)
}
