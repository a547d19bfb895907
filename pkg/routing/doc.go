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
// # Strategies
//
// Each strategy lives in its own file, whose type comment states its exact
// formula and tie rules; README.md summarises them with their inputs and
// [Spec] parameters. consistent_hash, cache_aware, pipeline and
// predicted_latency read the [Context]; cache_aware and pipeline keep their
// prefix state in a [prefixtree.Tree].
//
// # Optional interfaces
//
// A Balancer may also implement [Learner] (learns from successful requests),
// [TrieStats] (per-target prefix-tree size and evictions) and
// [DecisionCounter] (how picks were decided); the proxy discovers them with
// a type assertion.
//
// # Concurrency
//
// Balancers are shared by every request of a snapshot; Pick and Observe are
// safe for concurrent use and take no process-wide lock. Picks do not
// allocate. A prefix tree is guarded by one RWMutex per route: picks share
// its read lock, observes take its write lock for a few microseconds.
package routing
