// Package kvindex is the proxy side of precise (KV-event driven) routing:
// rolter's block identities, which the watcher derives from vLLM's
// BlockStored events and a proxy derives from a request's token ids, and
// the [Index] of the identities resident on each provider, kept current from
// rolter-kvwatcher's NATS deltas (rolter.dev/pkg/kvdelta).
//
// # Identity
//
// A block's identity is a chained 64-bit hash: [Chain] of its parent's
// identity and its tokens, the first block's parent being [Seed] of the
// model name. [Identities] gives a request's identities, one per full block
// of block_size tokens ([Index.BlockSize] reports the engine's), and
// [Index.PrefixMatch] counts how many of them, from the first, a provider
// holds. vLLM's own block hashes are never recomputed: they depend on the
// vLLM version, hash algorithm and seed. The watcher maps each engine hash
// to an identity as events arrive (a stored run that continues an earlier
// block chains from that block's identity).
//
// # Overview
//
// A routing strategy calls, per candidate provider, [Index.Fresh] (is the
// view trustworthy; if not, score neutral), [Index.PrefixMatch] for
// precise_cache_aware, or [Index.Occupancy] for lmcache_aware, and after
// routing [Index.Speculate] with the blocks the request will create. The
// index follows the providers given to [New] and [Index.SetProviders]. Each
// provider's resident and speculative identities are a [Residency], which
// also runs on its own (on any clock) where there is no NATS: the routing
// simulator keeps one per simulated replica.
//
// # Tracing
//
// With Options.TracerProvider each snapshot resync is a "kvindex.resync"
// span; deltas are too frequent and cheap to trace one by one (see
// [Options]).
//
// # Concurrency
//
// Identity functions are pure. A [Residency] is not safe for concurrent use.
// An [Index] is (see its documentation); [Index.Close] cancels and waits for its goroutines.
package kvindex
