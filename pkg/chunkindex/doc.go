// Package chunkindex keeps, for each target of a route, the prompt prefixes
// the whole fleet of proxies sent to it, in the compact form proxies share
// with one another: chained hashes of fixed-size chunks of the prompt text,
// never the text itself. A [Chain] is such a fingerprint on its own, for a
// prompt whose text a routing context does not keep in full; [Chainer]
// computes one from the text in pieces.
//
// # Fingerprints
//
// A prompt's fingerprint is the sequence h1, h2, ... where hk is the xxh3-64
// hash of the k-th [ChunkBytes]-byte chunk seeded with h(k-1) (h0 is a fixed
// seed), plus, when the prompt's length is not a multiple of ChunkBytes, one
// tail hash over the remaining bytes seeded with a value derived from the
// last full chunk's hash. Because each hash covers the whole prefix up to
// its chunk, hk being held by a target means "this target was sent a prompt
// that starts with these k×ChunkBytes bytes", and a set of hashes per target
// is all a receiver needs: no tree, no order. 64-byte chunks keep the match
// fraction that cache_aware compares against its threshold within 64 bytes
// of the byte-exact tree's (the tail hash makes an identical prompt match
// in full), at 8 bytes of fingerprint per 64 bytes of text.
//
// # Index
//
// An [Index] holds a bounded set of hashes per target with least-recently
// used eviction (a hash observed again, locally or from a peer, moves to the
// young end) and answers [Index.Match]: for each target, how many leading
// bytes of a prompt it holds, i.e. the end of the longest run h1..hk that the
// target holds. The walk stops at the first chunk no target holds, so a
// match costs one hash and one map lookup per matched chunk.
//
// With [Index.TrackForks] it also remembers, per held hash, the chunk that
// followed it in the prompts this proxy observed, or that two different
// ones did:
// [Index.SharedLen] is the part of a prompt other requests share (up to
// the last such fork), as opposed to what one line of requests extends.
// Peers' hashes carry no order, so only local observations teach it.
//
// With [Index.SetClock] every hash carries the time it was last observed,
// and [Index.Tail] tells, for a target at its capacity, when its oldest hash
// was: how long the target keeps a prefix nobody touches.
//
// # Sharing with little traffic
//
// [Index.Observe] records a local routing decision and returns the hashes
// worth publishing: those the target did not hold, and those whose last
// publication (by this proxy or, through [Index.Fold], by any peer) is older
// than half the target's capacity in insertions. The second rule refreshes
// hot prefixes (a shared system prompt) at every receiver before its LRU
// could evict them, so every proxy's index evicts roughly what the others
// do, while a prompt sent a thousand times is published about once per half
// window rather than a thousand times.
//
// # Concurrency
//
// An Index is safe for concurrent use: one sync.RWMutex; Match takes the read
// lock and does not allocate, Observe and Fold take the write lock.
package chunkindex
