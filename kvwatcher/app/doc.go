// Package app is rolter-kvwatcher: it subscribes to the vLLM KV events
// (ZMQ) and polls the LMCache occupancy of the providers a [Source] gives,
// and publishes per-provider deltas over NATS in the rolter.dev/pkg/kvdelta
// format, which every proxy's rolter.dev/pkg/kvindex.Index applies.
//
// # Overview
//
// Per provider with KV events, the watcher reads a ZMQ SUB stream: it dials
// the replica's endpoint ([ModeConnect]) or binds one endpoint that many
// replicas connect to and routes each message by its exact topic
// ([ModeBind], e.g. llm-d's kv@<pod>@<model>). A message must be exactly
// three frames with an 8-byte sequence, else it is counted as malformed and
// skipped. Payloads are decoded with rolter.dev/pkg/kvevents (every vLLM
// schema generation; unknown events and fields counted, not fatal) and
// applied to the provider's state (engine hash → identity, capped at
// max_blocks), whose changes are published as one delta per batch.
//
// # Sequence numbers
//
//   - The first sequence of a new stream (a new connection) is a baseline,
//     not a gap. With a replay endpoint the watcher first catches up on what
//     the replica still buffers from sequence 0, so a restarted watcher
//     knows the cache without waiting for new events.
//   - A gap is repaired over the replay socket (a DEALER request from the
//     first missing sequence); without one, or when that fails, the state
//     is cleared, the clear published, and the provider reported not synced
//     (neutral) until the engine's AllBlocksCleared (the reference's rule).
//   - A dropped connection, or a sequence that goes back (a restarted
//     publisher), clears the state.
//
// # Data-parallel ranks
//
// A provider with KVSpec.DataParallelSize N > 1 is N publishers, one per
// engine rank, on the endpoint's port + rank (and the replay endpoint's
// port + rank), as vLLM's ZmqEventPublisher.offset_endpoint_port places
// them, on the rank's node's host when KVSpec.DataParallelHosts lists the
// nodes of a multi-node replica; in bind mode the batch's
// data_parallel_rank names the rank. Every
// rule above applies per rank (each rank numbers its own batches), and the
// provider's state is the union of the ranks' (internal/kvstate.Ranks): a
// rank's clear removes only what no other rank holds. The provider is
// synced while every rank is.
//
// # Two watchers
//
// Any number of watchers may watch the same providers. Each stamps its
// messages with a random epoch and numbers each provider's deltas itself;
// a proxy's index follows one epoch per provider, applies its deltas in
// order, and resyncs from a snapshot of that epoch (request–reply on
// kvdelta.SnapshotSubject) on a gap. It moves to another epoch only when
// the followed one is silent or out of sync for a while, and then starts
// from that epoch's snapshot. Deltas of two watchers are therefore never
// mixed, and nothing is counted twice. This needs no coordination (no etcd
// lease, no leader election), fails over within a few heartbeats, and keeps
// a warm standby; the cost is that each watcher subscribes to every replica
// and publishes its own deltas (2× NATS traffic for two watchers), which
// the proxies filter by epoch.
//
// # Tracing
//
// With Options.TracerProvider, each applied engine batch is a
// "kvwatcher.apply" span and each delta it publishes a "kvwatcher.publish"
// child (see tracing.go); RunService exports them over OTLP when the
// OTEL_* variables ask for it (rolter.dev/pkg/telemetry).
//
// # Concurrency
//
// See [Watcher]. Each provider's state is owned by one goroutine (no
// locks); Watcher.mu guards the running set and is taken before a bound
// endpoint's route lock (binder.mu), never the other way round.
//
// # Lifecycle
//
// [New] then [Watcher.Run]; Run returns when its context ends, after
// stopping every provider (each publishes a clear and a not-synced status
// on the way out) and waiting for every goroutine. [RunService] is the
// whole process: NATS connection, /metrics, file source.
package app
