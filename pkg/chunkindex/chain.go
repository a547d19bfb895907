package chunkindex

import (
	"slices"

	"github.com/zeebo/xxh3"
)

// Chain is the fingerprint of a text (see the package doc) without the
// text: Hashes(nil, text) and the text's length in bytes. A routing context
// carries one for a prompt longer than the text it keeps
// (rolter.dev/pkg/affinity's 32 KiB), so that a prefix shared beyond that
// cut still matches.
type Chain struct {
	// Hashes are the full chunks' hashes, then the tail's when Len is not a
	// multiple of ChunkBytes.
	Hashes []uint64
	// Len is the text's length in bytes.
	Len int
}

// full is the number of full chunks in c.
func (c Chain) full() int { return min(c.Len/ChunkBytes, len(c.Hashes)) }

// valid reports whether c has exactly the hashes its length calls for.
func (c Chain) valid() bool {
	n := c.Len / ChunkBytes
	if c.Len%ChunkBytes != 0 {
		n++
	}
	return c.Len > 0 && len(c.Hashes) == n
}

// Chainer computes a Chain from text written to it in pieces, equal to
// Hashes over their concatenation. The zero value is ready; Reset reuses
// one.
type Chainer struct {
	h      uint64
	buf    [ChunkBytes]byte
	n      int // bytes staged in buf
	size   int // bytes written
	hashes []uint64
	begun  bool
}

// Reset empties c, keeping its hash buffer for the next text (a Chain
// returned earlier must no longer be used).
func (c *Chainer) Reset() {
	*c = Chainer{hashes: c.hashes[:0]}
}

// Grow makes room for n more hashes (a text of about 64 × n more bytes), so
// that a long text's fingerprint is allocated once rather than grown.
func (c *Chainer) Grow(n int) { c.hashes = slices.Grow(c.hashes, n) }

// Trim drops c's hash buffer when it has room for more than limit hashes,
// so that a Chainer kept for reuse does not hold on to the buffer of the
// longest text it ever saw. c must be Reset before its next text.
func (c *Chainer) Trim(limit int) {
	if cap(c.hashes) > limit {
		c.hashes = nil
	}
}

// Write appends p to the text.
func (c *Chainer) Write(p []byte) {
	if !c.begun {
		c.h, c.begun = seed, true
	}
	c.size += len(p)
	if c.n > 0 {
		k := copy(c.buf[c.n:], p)
		c.n += k
		p = p[k:]
		if c.n < ChunkBytes {
			return
		}
		c.h = xxh3.HashSeed(c.buf[:], c.h)
		c.hashes = append(c.hashes, c.h)
		c.n = 0
	}
	for ; len(p) >= ChunkBytes; p = p[ChunkBytes:] {
		c.h = xxh3.HashSeed(p[:ChunkBytes], c.h)
		c.hashes = append(c.hashes, c.h)
	}
	c.n = copy(c.buf[:], p)
}

// Chain returns the fingerprint of everything written since the last Reset,
// tail included. Its Hashes share c's buffer: valid until c is written to or
// Reset again.
func (c *Chainer) Chain() Chain {
	hashes := c.hashes
	if c.n > 0 {
		hashes = append(hashes, xxh3.HashSeed(c.buf[:c.n], c.h^tailMark))
	}
	return Chain{Hashes: hashes, Len: c.size}
}

// MatchChain is Match for a text given by its fingerprint: lens[i] is the
// number of leading bytes of the text target i holds. An invalid chain
// matches nothing.
func (x *Index) MatchChain(c Chain, lens []int) {
	alive := x.startMatch(lens)
	if alive.empty() || !c.valid() {
		return
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	full := c.full()
	for k, h := range c.Hashes[:full] {
		if !x.narrow(&alive, h, lens, k*ChunkBytes) {
			return
		}
	}
	if full < len(c.Hashes) && !x.narrow(&alive, c.Hashes[full], lens, full*ChunkBytes) {
		return
	}
	forEach(&alive, func(i int) { lens[i] = c.Len })
}

// ObserveChain is Observe for a text given by its fingerprint. Forks (for
// SharedLen) are recorded over its first 32 KiB only, the text a routing
// context keeps and SharedLen walks. An invalid chain or a target out of
// range is ignored.
func (x *Index) ObserveChain(tgt int, c Chain, publish []uint64) []uint64 {
	if tgt < 0 || tgt >= len(x.targets) || !c.valid() {
		return publish
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.stamp()
	return x.observeHashes(tgt, &x.targets[tgt], c.Hashes, min(c.full(), maxPromptChunks-1), publish)
}

// observeHashes records a fingerprint for target t (index tgt), in the
// index's order, and the successors of its first forks hashes, which must
// be full chunks'. The write lock must be held.
func (x *Index) observeHashes(tgt int, t *target, chain []uint64, forks int, publish []uint64) []uint64 {
	for i := 1; i < forks; i++ { // full chunks only: a tail is no successor
		x.follow(chain[i-1], chain[i])
	}
	if x.tailFirst {
		for i := len(chain) - 1; i >= 0; i-- {
			publish = x.observeOne(tgt, t, chain[i], publish)
		}
		return publish
	}
	for _, h := range chain {
		publish = x.observeOne(tgt, t, h, publish)
	}
	return publish
}
