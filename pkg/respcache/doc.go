// Package respcache is rolter's response cache: exact and semantic reuse of
// whole upstream responses, stored in Redis (shared by every proxy) or in
// process, with strict rules for when a stored answer may be replayed to a
// different request. The proxy wires it in; this package knows nothing of
// HTTP handlers, routes or delivery policy.
//
// # Overview
//
// A cacheable request is described by a [Request] (path, scope, route, the
// route variant it is assigned to, the body as forwarded, the stream flag,
// the TTL, and the route's [Semantic] settings). [Cache.Lookup] then:
//
//  1. reads the exact key, [VariantExactKey]: a sha-256 over the path, the
//     scope, the variant and the canonical JSON of the body (package canon), so key order,
//     whitespace and string-escape spelling do not cost hits;
//  2. on a miss, when the route has semantic settings, classifies the
//     request (package semantic): a request whose meaning its text would
//     not capture bypasses the semantic cache before any embedding call;
//     otherwise its conversation text is embedded and compared, by cosine
//     similarity, with the most recent entries of its partition only
//     ([VariantIndexKey] carries the partition, the variant and
//     [SemanticLayoutVersion]). The
//     best candidate at or above the threshold whose mode (stream or not)
//     matches the request's is a hit.
//
// After a miss the proxy calls [Cache.Store] with the upstream's own
// response, before any delivery policy ran, or for a stream
// [Cache.StoreStream] with the sse.Recorder it teed the live stream through
// ([Cache.NewRecorder]): the client gets every event as it arrives, and the
// stream is stored only if it completed normally. Only 200 answers are
// stored ([Storable]); bodies over MaxEntryBytes never are. A hit's
// [Entry.WriteBody] replays a stored stream as well-formed SSE, one flushed
// event at a time.
//
// # Failing open
//
// The cache never fails a request. A backend error or timeout, a stored blob
// that does not decode, an embedding failure or a candidate of the wrong mode
// is counted ([Cache.Stats]) and is a miss; a failed store is counted and
// dropped. The [Redis] backend bounds every operation by a short timeout
// ([DefaultTimeout]) and reconnects by itself; after a few consecutive
// failures the Cache stops calling the backend for a second, so an outage
// adds no latency, and then tries again on its own.
//
// # Storage layout
//
//	<namespace>:<hex>                                   exact entry (string, TTL)
//	<namespace>:semantic:v2:<hex>                       semantic index (list of ids, newest first, TTL)
//	<namespace>:semantic:v2:<hex>:entry:<id>            semantic entry (string, TTL)
//
// Entries are a small versioned binary encoding (status, content type, an
// optional embedding, then the body or the SSE events); anything else under
// a key is a miss.
//
// # Concurrency
//
// [Cache], [Memory] and [Redis] are safe for concurrent use. A [Lookup]
// belongs to the request that made it.
//
// # Lifecycle
//
// The caller owns the backend: it closes a [Redis] (Close) after the last
// use of the Cache. A Cache holds no goroutines.
package respcache
