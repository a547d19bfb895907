// Package kvevents is a codec for vLLM's KV-cache events: the msgpack
// KVEventBatch payloads that vLLM's ZmqEventPublisher sends, and the ZMQ
// frames that carry them (live PUB messages and replay ROUTER replies).
//
// # Schema generations
//
// A batch is a positional msgpack array [ts, events, data_parallel_rank]
// (two elements, without the rank, in vLLM 0.9.0). Each event is either a
// positional array whose element 0 is the class name (vLLM ≤ 0.23, whose
// length identifies the generation: 6, 7, 8, 9, 10 or 12 elements for
// BlockStored) or a map whose "type" key is the class name (vLLM ≥ 0.24),
// where fields that hold their default (None) are left out. [Decode] accepts
// every generation, both event forms, a map-shaped batch, any integer width
// and int or bin block hashes; unknown fields and unknown event types are
// skipped and counted in the [Batch], not fatal. [Encode] writes a batch in
// the [Layout] of a chosen generation, byte for byte as vLLM's encoder
// (msgspec) writes it.
//
// # Block hashes
//
// A [Hash] keeps a block hash as it was sent (an unsigned int, a negative
// int, or bytes) so that it encodes back to the same bytes, and
// [Hash.Uint64] maps every form to one 64-bit key: an unsigned int is
// itself, a negative int is its two's-complement bits, and bytes are the last
// 8 bytes read big-endian (left-padded with zeros when shorter). That is
// exactly the int vLLM sends for the same block by default
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 sends the low 64 bits of the
// digest), so a consumer keys its maps by Uint64 and does not care which form
// the engine was configured for.
//
// # Frames
//
// A live message is three frames: topic, an 8-byte big-endian sequence
// number (starting at 0 per publisher), and the payload ([ParseMessage]).
// Replay goes over a ROUTER socket: a DEALER sends ["", seq8]
// ([ReplayRequest]) and receives the buffered messages from that sequence on,
// then an end marker whose sequence is all 0xFF and whose payload is empty
// ([ParseReplayReply] accepts the layout with the topic frame, vLLM ≥ 0.26,
// and the older one without).
package kvevents
