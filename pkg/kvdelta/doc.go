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
// # Encoding (version 1)
//
// A compact hand-written binary encoding, little-endian, with unsigned
// varints (encoding/binary's Uvarint) for counts and durations. It may move
// to protobuf in proto/ later; the version byte makes that a clean switch.
//
//	u8      version (1)
//	u8      type (1 delta, 2 status, 3 snapshot, 4 snapshot request)
//	u64     epoch (a request: the epoch wanted, 0 for any)
//	uvarint seq
//	uvarint len, bytes: provider name (1..255 bytes)
//	u8      status flags: 1 kv, 2 synced, 4 lmcache, 8 lmcache available
//	if kv:      uvarint kv age ms+1 (0: no event yet), uvarint stale ms,
//	            uvarint block size, uvarint resident blocks
//	if lmcache: f64 occupancy in [0,1], uvarint age ms+1 (0: never),
//	            uvarint stale ms
//	delta:    uvarint op count (≥ 1), then each op:
//	            u8 1 stored: u8 has-parent (0/1), [u64 parent], uvarint n (≥ 1), n × u64
//	            u8 2 removed: uvarint n (≥ 1), n × u64
//	            u8 3 cleared: u8 reason (1..5)
//	snapshot: uvarint part, uvarint parts (part < parts), uvarint n, n × u64
//
// Nothing may follow. [Decode] rejects anything else with an error wrapping
// [ErrMalformed] (or [ErrVersion]); it never panics and never allocates more
// than the input's size justifies.
//
// # Concurrency
//
// Encoding and decoding functions are pure and safe for concurrent use; a
// [Message] is not.
package kvdelta
