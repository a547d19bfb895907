package proxy

import (
	"rolter.dev/dataplane/internal/routingstate"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/routing"
)

// What the balancers learned, across a restart of the proxy (see package
// routingstate): RoutingState collects it for the file, and the first
// runtime's balancers read back what the previous process wrote
// (Options.Restore).

// RoutingState returns what each balancer of the config in use learned,
// for the balancers that keep state (routing.StateKeeper); safe while the
// proxy serves. False before the first Apply (nothing to write yet: the
// file still holds what the next start should read). A balancer that
// fails to write its state is left out.
func (p *Proxy) RoutingState() ([]routingstate.Route, bool) {
	rt := p.rt.Load()
	if rt == nil {
		return nil, false
	}
	var out []routingstate.Route
	for _, rc := range rt.snap.Routes {
		r := rt.routes[rc.Model]
		if r == nil {
			continue
		}
		for _, pl := range r.pools {
			sk, ok := pl.balancer.(routing.StateKeeper)
			if !ok {
				continue
			}
			state, err := sk.AppendState(nil)
			if err != nil {
				p.log.Warn("route's balancer could not write its state; left out of the routing state", "route", rc.Model, "variant", pl.variant, "err", err)
				continue
			}
			out = append(out, routingstate.Route{Route: rc.Model, Variant: pl.variant, Settings: pl.settings, Targets: pl.targetKeys(), State: state})
		}
	}
	return out, true
}

// restore hands a balancer built with no previous runtime what the
// previous process's balancer of the same route, variant and settings
// wrote, each target matched by provider and upstream model. A state
// written for other settings (the strategy or its parameters changed
// while the proxy was down) is not read.
func (p *Proxy) restore(sk routing.StateKeeper, route, variant, settings string, targets []config.CompiledTarget) {
	saved, ok := p.saved[restoreKey(route, variant)]
	if !ok {
		return
	}
	if saved.Settings != settings {
		p.log.Info("route's saved routing state not read: its strategy or parameters changed since it was written",
			"route", route, "variant", variant)
		return
	}
	from, kept := sources(saved.Targets, targets)
	if err := sk.RestoreState(saved.State, from); err != nil {
		p.log.Warn("route's saved routing state unreadable; the balancer starts from nothing", "route", route, "variant", variant, "err", err)
		return
	}
	p.log.Info("route's balancer read back what it had learned before the restart",
		"route", route, "variant", variant, "targets", len(targets), "kept", kept)
}

func restoreKey(route, variant string) string { return route + "\x1f" + variant }

// sources maps each of targets to the index of the same target (provider
// and upstream model, routingstate.TargetKey) in old, -1 for one old did
// not have: the from of routing.Inheritor and routing.StateKeeper. A
// target twice in a route: the first of each side pairs.
func sources(old []string, targets []config.CompiledTarget) (from []int, kept int) {
	at := make(map[string]int, len(old))
	for i, k := range old {
		if _, dup := at[k]; !dup {
			at[k] = i
		}
	}
	from = make([]int, len(targets))
	for j, t := range targets {
		from[j] = -1
		k := routingstate.TargetKey(t.Provider.Name, t.Model)
		if i, ok := at[k]; ok {
			from[j] = i
			delete(at, k)
			kept++
		}
	}
	return from, kept
}

// targetKeys names the pool's targets by provider and upstream model.
func (pl *pool) targetKeys() []string {
	keys := make([]string, len(pl.targets))
	for i, t := range pl.targets {
		keys[i] = routingstate.TargetKey(t.cfg.Provider.Name, t.cfg.Model)
	}
	return keys
}
