// Package reliability holds the live state that decides whether an upstream
// may be tried and how loaded it is: per-target in-flight counts, cooldowns
// and circuit breakers, and per-provider health and scraped engine load.
//
// # Overview
//
// A [Registry] outlives config snapshots: a data plane binds every route
// target of a new snapshot to its [Target] once, when the snapshot is built,
// so a request reads target state through a pointer and never looks anything
// up. Targets are keyed by (route, provider, upstream model), so reordering
// a route's targets in a reload keeps each one's state.
//
// # Concurrency
//
// Every read on the request path is an atomic load: computing a request's
// eligible set takes no lock (the reference gateway's open item #1942).
// Transitions use compare-and-swap so concurrent failures and successes
// resolve to one consistent state.
package reliability
