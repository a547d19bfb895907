// Package routing chooses which target of a route serves a request.
//
// # Overview
//
// A [Balancer] picks one target index from a route's target list, given the
// request's [Context] (prompt text, digest, session, token ids), the current
// per-target loads and the [Set] of targets that are eligible for this
// attempt. Every strategy honours eligibility: while at least one target below
// n is eligible, an ineligible one is never returned. When none is, the
// strategy weighs every target ([Set.OrAll]), so the gateway can fail open.
//
// # Concurrency
//
// Balancers are shared by every request of a snapshot; Pick and Observe are
// safe for concurrent use and take no process-wide lock.
package routing
