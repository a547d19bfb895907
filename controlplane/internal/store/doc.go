// Package store keeps the control plane's config in etcd, one key per
// object (see [Layout]), and writes it in optimistic transactions.
//
// # Overview
//
// Every write reads the config at its revision R, computes the next state,
// validates it (the caller's [Mutation] does), and commits the objects that
// differ plus the marker key in one txn guarded by "the marker is still at
// R" and by any object revision the caller expects. A concurrent write to
// the same object surfaces as a [*ConflictError]; a concurrent write to
// another object just makes the mutation run again on the newer state, so
// validation always sees exactly the state it will replace.
//
// # Concurrency
//
// A [Store] is safe for concurrent use by any number of goroutines and
// control-plane replicas: etcd's transactions order them.
package store
