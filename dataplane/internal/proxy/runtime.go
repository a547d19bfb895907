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
	// cors is nil when [server.cors] allowed_origins is empty.
	cors *corsPolicy
}

type route struct {
	cfg *config.CompiledRoute
	// pools are the route's target pools: one, named "", for a plain
	// route; one per variant, in config order, for a route with variants.
	pools []*pool
	// names and weights of the variants, for routing.RankVariants.
	names   []string
	weights []int
}

// pool is one set of targets with its own balancer: a plain route's, or
// one variant's. Every pick happens inside one pool.
type pool struct {
	// variant is the variant's name, "" for a plain route.
	variant  string
	strategy string
	balancer routing.Balancer
	targets  []target
	// fingerprint decides whether a reload may keep the balancer (and with
	// it learned affinity) for this pool; settings is its part without the
	// targets, which decides whether a new balancer may inherit what the
	// old one learned (routing.Inheritor).
	fingerprint, settings string
	// fleet is the pool's state shared with the other proxies; nil
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
		cors:   newCORSPolicy(snap.Server.CORS),
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
		r := &route{cfg: rc}
		var old *route
		if prev != nil {
			old = prev.routes[rc.Model]
		}
		if len(rc.Variants) == 0 {
			pl, err := p.newPool(reg, rc, "", rc.Strategy, rc.Balancer, rc.SpeculativeTTL, rc.Targets, old)
			if err != nil {
				return nil, fmt.Errorf("routes[%d].strategy: %w", i, err)
			}
			r.pools = []*pool{pl}
		}
		for j := range rc.Variants {
			v := &rc.Variants[j]
			pl, err := p.newPool(reg, rc, v.Name, v.Strategy, v.Balancer, v.SpeculativeTTL, v.Targets, old)
			if err != nil {
				return nil, fmt.Errorf("routes[%d].variants[%d].strategy: %w", i, j, err)
			}
			r.pools = append(r.pools, pl)
			r.names = append(r.names, v.Name)
			r.weights = append(r.weights, v.Weight)
		}
		rt.routes[rc.Model] = r
	}
	return rt, nil
}

// newPool binds one pool's targets to their live state and builds its
// balancer, or keeps the balancer of the previous runtime's pool of the
// same variant when its strategy, parameters and targets are unchanged (a
// weight change keeps every variant's).
func (p *Proxy) newPool(reg *reliability.Registry, rc *config.CompiledRoute, variant, strategy string, bp config.Balancer,
	ttl time.Duration, targets []config.CompiledTarget, old *route) (*pool, error) {
	pl := &pool{variant: variant, strategy: strategy, settings: settingsPrint(strategy, bp, ttl)}
	pl.fingerprint = fingerprint(strategy, pl.settings, targets)
	weights := make([]int, len(targets))
	for j, tc := range targets {
		weights[j] = tc.Weight
		pl.targets = append(pl.targets, target{
			cfg:    tc,
			state:  reg.Target(reliability.TargetKey{Route: rc.Model, Provider: tc.Provider.Name, Model: tc.Model}),
			health: reg.Provider(tc.Provider.Name),
		})
	}
	if p.fleet != nil {
		// Each variant shares its own state: its targets are its own.
		name := rc.Model
		if variant != "" {
			name += "\x1f" + variant
		}
		// Bound by settings and targets alone, as before the fingerprint
		// held what the strategy reads of the providers: proxies of either
		// version share during an upgrade.
		pl.fleet = p.fleet.Bind(name, xxh3.HashString(targetsPrint(pl.settings, targets)), len(targets))
	}
	if old != nil {
		for _, op := range old.pools {
			if op.variant == variant && op.fingerprint == pl.fingerprint {
				pl.balancer = op.balancer
			}
		}
	}
	if pl.balancer == nil {
		spec := routing.Spec{
			Strategy: strategy, Weights: weights,
			Threshold: bp.Threshold, BalanceAbs: bp.BalanceAbs, BalanceRel: bp.BalanceRel,
			MaxTrieNodes: bp.MaxTrieNodes, Scorers: bp.Scorers,
			SignalWeight: bp.SignalWeight, LoadWeight: bp.LoadWeight,
			SpeculativeTTL: ttl,
		}
		if ttl == 0 {
			spec.SpeculativeTTL = routing.NoSpeculation // 0 in the config turns it off
		}
		if p.kv != nil {
			src := newKVSource(p.kv, pl.targets)
			spec.KV, spec.LMCache = src, src
		} else if readsKVEvents(strategy) && publishesKV(targets) {
			// File mode without --nats: the engines' events never reach
			// this proxy. Not an error (the strategy falls back), but the
			// operator configured events for a reason.
			p.log.Warn("route's strategy reads the engines' KV events, but this proxy follows none (start it with --nats): it routes on its approximate index",
				"route", rc.Model, "variant", variant, "strategy", strategy)
		}
		spec.Engine = engineState{targets: pl.targets}
		for _, tc := range targets {
			spec.KVCapacityTokens = append(spec.KVCapacityTokens, tc.Provider.KVCapacityTokens)
		}
		if pl.fleet != nil {
			spec.Share = pl.fleet.Record
		}
		b, err := routing.New(spec)
		if err != nil {
			return nil, err
		}
		if in, ok := b.(routing.Inheritor); ok && old != nil {
			if kept, ok := inherit(in, pl, old.pools, targets); ok {
				p.log.Info("route's balancer rebuilt (its targets, or what it reads of their providers, changed): the new one inherits what the old one learned",
					"route", rc.Model, "variant", variant, "strategy", strategy, "targets", len(targets), "kept", kept)
			}
		} else if sk, ok := b.(routing.StateKeeper); ok && p.saved != nil {
			p.restore(sk, rc.Model, variant, pl.settings, targets)
		}
		pl.balancer = b
	}
	if pl.fleet != nil {
		if sa, ok := pl.balancer.(routing.SharedAffinity); ok {
			pl.fleet.SetAffinity(sa)
		}
		if sq, ok := pl.balancer.(routing.SharedQueue); ok {
			pl.fleet.SetQueue(sq)
		}
		ts := pl.targets
		pl.fleet.SetOwnLoad(func(i int) int { return ts[i].state.InFlight() })
	}
	return pl, nil
}

// readsKVEvents reports whether strategy reads the engines' KV events
// (routesOnKV) or LMCache occupancy (routing.Spec.KV, routing.Spec.LMCache).
func readsKVEvents(strategy string) bool {
	return routesOnKV(strategy) || strategy == routing.LMCacheAware
}

// publishesKV reports whether any target's provider publishes KV state.
func publishesKV(targets []config.CompiledTarget) bool {
	return slices.ContainsFunc(targets, func(t config.CompiledTarget) bool { return t.Provider.PublishesKV() })
}

// settingsPrint is a pool's balancer settings, its fingerprint without the
// targets.
func settingsPrint(strategy string, bp config.Balancer, ttl time.Duration) string {
	return fmt.Sprintf("%s|%+v|%v", strategy, bp, ttl)
}

// targetsPrint is a pool's settings and targets (provider, upstream model,
// weight).
func targetsPrint(settings string, targets []config.CompiledTarget) string {
	s := settings
	for _, t := range targets {
		s += fmt.Sprintf("|%s/%s/%d", t.Provider.Name, t.Model, t.Weight)
	}
	return s
}

// fingerprint is targetsPrint with what the strategy's balancer reads of
// each target's provider when it is built: the model its KV block
// identities are seeded with (strategies that read KV events), and the KV
// capacity and whether and how stale the engine load may be read
// (predicted_ttft's engineState). A reload that changes one builds a new
// balancer, which an Inheritor fills with what the old one learned; kept,
// the old one went on with the old value (precise matches seeded with a
// model the watcher no longer uses: none; an engine_load added later:
// never read).
func fingerprint(strategy, settings string, targets []config.CompiledTarget) string {
	s := targetsPrint(settings, targets)
	for _, t := range targets {
		if readsKVEvents(strategy) {
			s += "|" + identityModel(t)
		}
		if strategy == routing.PredictedTTFT {
			s += fmt.Sprintf("|%d", t.Provider.KVCapacityTokens)
			if el := t.Provider.EngineLoad; el != nil {
				s += fmt.Sprintf("/%v", el.Stale)
			}
		}
	}
	return s
}

// inherit hands a new balancer what the previous runtime's pool of the
// same variant and settings learned, when only its targets (a replica
// added or removed) or what it reads of their providers changed: each
// target is matched by provider and model.
// It returns how many targets were kept and whether the balancer took the
// old one's state.
func inherit(in routing.Inheritor, pl *pool, old []*pool, targets []config.CompiledTarget) (kept int, ok bool) {
	for _, op := range old {
		if op.variant != pl.variant || op.settings != pl.settings {
			continue
		}
		from, kept := sources(op.targetKeys(), targets)
		return kept, in.Inherit(op.balancer, from)
	}
	return 0, false
}

// fleetRoutes lists the routes' shared state, for fleet.Node.Retain.
func (rt *runtime) fleetRoutes() []*fleet.Route {
	var out []*fleet.Route
	for _, r := range rt.routes {
		for _, pl := range r.pools {
			if pl.fleet != nil {
				out = append(out, pl.fleet)
			}
		}
	}
	return out
}

// retain drops live state of targets and providers that left the config.
func (rt *runtime) retain(reg *reliability.Registry) {
	keys := make(map[reliability.TargetKey]bool)
	providers := make(map[string]bool)
	for _, r := range rt.routes {
		for _, pl := range r.pools {
			for _, t := range pl.targets {
				keys[t.state.Key()] = true
			}
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
