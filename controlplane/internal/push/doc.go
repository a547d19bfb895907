// Package push serves config snapshots to data planes and kvwatchers, in
// the manner of xDS (go-control-plane).
//
// # Overview
//
// The [Hub] holds the snapshot this replica publishes: the consistent state
// the etcd watcher last produced, rendered once per node role (kvwatchers
// never get keys or inline secrets). Each Watch stream sends the full
// snapshot on connect and whenever the hub's revision differs from what it
// last sent; every message carries a fresh nonce, and the node's answer to
// that nonce is an ACK or a NACK with its reason. Answers to older nonces
// are ignored. The [Registry] tracks which node runs which version and
// mirrors that to etcd under a lease, so Status on any replica sees every
// node and a dead replica's nodes disappear with its lease.
//
// # Concurrency
//
// One goroutine per stream sends; a helper goroutine per stream receives
// and feeds a channel, selecting on the stream's context. The hub wakes
// streams by closing a channel; a slow stream never blocks the hub or
// another stream. Registry.mu is a leaf lock, never held across I/O or a
// channel send that can block.
package push
