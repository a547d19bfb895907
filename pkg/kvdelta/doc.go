// Package kvdelta is the wire format of the KV-cache deltas that
// rolter-kvwatcher publishes over NATS and every proxy's index applies: per
// provider, the block identities (see rolter.dev/pkg/kvindex) that became
// resident or left, a clear, the freshness of the provider's telemetry, and
// LMCache occupancy; plus full-state snapshots for request–reply resync.
//
// # Overview
//
// Every [Message] names its provider and is stamped with the publishing
// watcher's epoch (random per watcher start) and a per-provider sequence
// number. A [TypeDelta] carries one or more [Op]s and takes the next
// sequence number; a [TypeStatus] (the heartbeat, also sent when LMCache
// occupancy changes) carries the sequence of the last delta, so a receiver
// that missed the last delta sees the gap without waiting for the next one;
// a [TypeSnapshot] is one part of a provider's full state at a sequence
// number, sent in reply to a [TypeSnapshotRequest]. Every message carries
// the provider's [Status].
//
// A receiver follows one epoch per provider: it applies delta seq+1 after
// seq, drops what it has already applied, and resyncs from a snapshot of
// that epoch on a gap or when it switches to another epoch. Two watchers for
// the same provider therefore never double count: each one's deltas are
// complete on their own, and a receiver never mixes them.
//
// # Subjects
//
// Deltas and statuses of provider P go to [Subject](P)
// ("rolter.kv.v1.delta.<P>"); snapshot requests to [SnapshotSubject](P)
// ("rolter.kv.v1.snap.<P>"), answered on the request's reply subject. A
// provider name that is not a plain NATS token is hex-encoded ([Token]).
//
// # Encoding
//
// Each message is one protobuf rolter.kv.v1.Message (proto/rolter/kv/v1/
// kv.proto, Go package rolter.dev/proto/rolter/kv/v1), marshalled with
// google.golang.org/protobuf:
//
//	Message  version (=1), type, fixed64 epoch, uint64 seq, string provider,
//	         Status status, repeated Op ops (delta), SnapshotPart snapshot
//	Status   KVStatus kv {synced, optional age_ms, stale_ms, block_size, blocks},
//	         LMCacheStatus lmcache {available, double occupancy, optional age_ms, stale_ms}
//	Op       oneof {Stored {optional fixed64 parent, packed fixed64 ids},
//	                Removed {packed fixed64 ids}, Cleared {ClearReason reason}}
//	SnapshotPart  part, parts, packed fixed64 ids
//
// Identities and epochs are random 64-bit hashes, so they are fixed64: 8
// bytes each, where a varint would take 10 for half of them. Measured
// (TestSizes, BenchmarkDecodeDelta): each further stored or removed block
// id costs 8.03 bytes; a delta storing one id on provider "vllm-a", with a
// KV status, is 66 bytes (100 ids: 861); a heartbeat is 43 bytes; decoding
// runs at about 35 M ids/s on one core. The hand-written format before it
// was a little smaller (45 bytes where this is 61, the same 8 bytes per
// id); protobuf buys a schema in proto/, generated decoders in any
// language, and compatible additions.
//
// [Decode] accepts what [Message.Append] can produce and rejects anything
// else with an error wrapping [ErrMalformed] (or [ErrVersion]): a provider
// name outside 1..255 bytes, an unknown type, op or clear reason, a delta
// without ops, an op without ids, ops on another type, a snapshot without
// its part (or a part on another type), part ≥ parts, an occupancy outside
// [0, 1] or not finite, durations beyond about 35 years, block counts beyond
// 2³¹−1. It never panics, and allocates in proportion to the input. Fields
// it does not know are skipped (protobuf's rule).
//
// # Versions
//
// Compatible changes (a new optional field, a new op that old receivers
// may skip) stay in rolter.kv.v1. An incompatible one is a v2: package
// rolter.kv.v2 with version 2, on new subjects (rolter.kv.v2.…). Watchers
// publish both versions while proxies are upgraded (a proxy follows one),
// then v1 is dropped. The version field guards against a v2 payload
// reaching a v1 subject by mistake: [Decode] rejects it with [ErrVersion]
// instead of misreading it.
//
// # Concurrency
//
// Encoding and decoding functions are pure and safe for concurrent use; a
// [Message] is not.
package kvdelta
