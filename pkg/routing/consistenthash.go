package routing

import (
	"cmp"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// VirtualNodes is the number of points each target has on consistent_hash's
// ring.
const VirtualNodes = 160

// consistentHash maps a request key onto a hash ring.
//
// Ring: every target i has VirtualNodes points at xxh3-64("i#v"), v in
// [0, VirtualNodes), sorted by hash (ties by target). The ring depends only on
// the target count, so every proxy and every restart builds the same one.
//
// Key, first that applies:
//  1. SessionKey, hashed with xxh3-64: a session stays on one target;
//  2. PromptDigest when HasDigest: the xxh3-64 of the whole prompt, used as
//     is (so it equals the hash of the prompt text when Prompt is the whole
//     prompt). Because the digest covers everything after the 32 KiB cut,
//     tool results and media, requests that share a long system prompt and
//     differ after it, or only in an attachment, spread over the ring;
//  3. the Prompt text, hashed with xxh3-64;
//  4. none: round robin over the eligible targets, as round_robin does.
//
// Lookup: the first point at or after the key's hash, wrapping to the start;
// from there the walk continues along the ring to the first point whose
// target is eligible. An ineligible target's keys thus move to the next
// eligible target along the ring, spread over its successors, and every other
// key stays where it was.
//
// Cost: a binary search over n*VirtualNodes points plus the walk past
// ineligible points (about n/m steps for m eligible targets out of n, at
// most the whole ring); no allocation, no lock.
type consistentHash struct {
	n    int
	ring []vnode
	next atomic.Uint64
}

type vnode struct {
	hash   uint64
	target int
}

var _ Balancer = (*consistentHash)(nil)

func newConsistentHash(n int) *consistentHash {
	c := &consistentHash{n: n, ring: make([]vnode, 0, n*VirtualNodes)}
	buf := make([]byte, 0, 16)
	for i := range n {
		for v := range VirtualNodes {
			buf = strconv.AppendInt(buf[:0], int64(i), 10)
			buf = append(buf, '#')
			buf = strconv.AppendInt(buf, int64(v), 10)
			c.ring = append(c.ring, vnode{hash: xxh3.Hash(buf), target: i})
		}
	}
	slices.SortFunc(c.ring, func(a, b vnode) int {
		return cmp.Or(cmp.Compare(a.hash, b.hash), cmp.Compare(a.target, b.target))
	})
	return c
}

// Name implements Balancer.
func (*consistentHash) Name() string { return ConsistentHash }

// Pick implements Balancer; loads are ignored.
func (c *consistentHash) Pick(ctx *Context, _ []int, eligible Set) int {
	if c.n <= 0 {
		return -1
	}
	el := eligible.OrAll(c.n)
	h, ok := hashKey(ctx)
	if !ok {
		return rotate(el, c.n, c.next.Add(1)-1)
	}
	// The first point with hash >= h.
	lo, hi := 0, len(c.ring)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if c.ring[mid].hash < h {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	for k := range len(c.ring) {
		j := lo + k
		if j >= len(c.ring) {
			j -= len(c.ring)
		}
		if t := c.ring[j].target; el.Has(t) {
			return t
		}
	}
	return -1 // unreachable: el holds a target below n, which has points
}

// hashKey returns the ring key of ctx, or false when ctx carries none.
func hashKey(ctx *Context) (uint64, bool) {
	switch {
	case ctx == nil:
		return 0, false
	case ctx.SessionKey != "":
		return xxh3.HashString(ctx.SessionKey), true
	case ctx.HasDigest:
		return ctx.PromptDigest, true
	case ctx.Prompt != "":
		return xxh3.HashString(ctx.Prompt), true
	}
	return 0, false
}

// Observe implements Balancer; it does nothing.
func (*consistentHash) Observe(int, *Context) {}
