package chunkindex

import (
	"math/bits"
	"sync"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/lrulist"
)

// ChunkBytes is the size of one fingerprinted chunk of prompt text.
const ChunkBytes = 64

// MaxTargets is the largest number of targets an Index tracks (a route's
// limit in rolter.dev/pkg/routing).
const MaxTargets = 256

// seed starts every chain; tailMark tells a tail hash from a full chunk's;
// forked marks a chunk seen followed by two different chunks (a hash of
// that value is merely never recorded as a successor).
const (
	seed     uint64 = 0x726f6c7465722e63 // "rolter.c"
	tailMark uint64 = 0x9e3779b97f4a7c15
	forked   uint64 = ^uint64(0)
)

// Hashes appends prompt's fingerprint (see the package doc) to dst.
func Hashes(dst []uint64, prompt string) []uint64 {
	h, off := seed, 0
	for ; off+ChunkBytes <= len(prompt); off += ChunkBytes {
		h = xxh3.HashStringSeed(prompt[off:off+ChunkBytes], h)
		dst = append(dst, h)
	}
	if off < len(prompt) {
		dst = append(dst, xxh3.HashStringSeed(prompt[off:], h^tailMark))
	}
	return dst
}

// Stats describes what one target holds.
type Stats struct {
	// Chunks is the number of hashes the target holds.
	Chunks int
	// Evictions counts the hashes evicted over the index's life.
	Evictions uint64
}

// Index holds, per target, a bounded LRU set of prefix hashes. See the
// package doc.
type Index struct {
	mu      sync.RWMutex
	holders map[uint64]set // which targets hold a hash
	// next has, for a full chunk's hash this index observed a full chunk
	// after, that successor's hash, or forked once two different ones
	// were seen: where prompts part (see SharedLen). Kept as long as
	// some target holds the hash; nil unless TrackForks was called.
	next     map[uint64]uint64
	targets  []target
	capacity int
	// tailFirst makes Observe touch a prompt's chunks last to first, so
	// that its head is the most recent and evicted last (EvictTailFirst).
	tailFirst bool
	// now stamps each hash observed (SetClock; nil: no stamps), and at is
	// the stamp of the write under way, read once per Observe or Fold.
	now func() int64
	at  int64
}

// set is a bitset of target indexes.
type set [MaxTargets / 64]uint64

func (s *set) add(i int)          { s[i>>6] |= 1 << (uint(i) & 63) }
func (s *set) remove(i int)       { s[i>>6] &^= 1 << (uint(i) & 63) }
func (s *set) empty() bool        { return *s == set{} }
func (s *set) and(o *set) (r set) { return set{s[0] & o[0], s[1] & o[1], s[2] & o[2], s[3] & o[3]} }

// target is one target's LRU of hashes, with each hash's list handle.
type target struct {
	slots     map[uint64]int32 // hash → handle in lru
	lru       lrulist.List[entry]
	inserts   uint64 // hashes added over the index's life: the age clock
	evictions uint64
	capacity  int // this target's ceiling in hashes (0 = unbounded)
}

type entry struct {
	hash      uint64
	published uint64 // the inserts clock when the hash was last published
	at        int64  // when it was last observed, on the SetClock clock
}

// New returns an empty index for targets targets (clamped to [0,
// MaxTargets]) holding at most capacity hashes each; capacity <= 0 means
// unbounded (and nothing is ever republished).
func New(targets, capacity int) *Index {
	targets = min(max(targets, 0), MaxTargets)
	x := &Index{holders: make(map[uint64]set), targets: make([]target, targets), capacity: max(capacity, 0)}
	for i := range x.targets {
		x.targets[i] = target{slots: make(map[uint64]int32), capacity: x.capacity}
	}
	return x
}

// SetCapacity sets target tgt's ceiling in hashes (<= 0: unbounded),
// evicting its oldest hashes at once when it holds more. A caller that
// learns a target's real cache size (a replica's KV capacity) makes the
// index forget what that replica has evicted. A target out of range is
// ignored.
func (x *Index) SetCapacity(tgt, capacity int) {
	if tgt < 0 || tgt >= len(x.targets) {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	t := &x.targets[tgt]
	t.capacity = max(capacity, 0)
	x.evict(tgt, t)
}

// TargetCapacity returns target tgt's ceiling in hashes (0 = unbounded or
// out of range).
func (x *Index) TargetCapacity(tgt int) int {
	if tgt < 0 || tgt >= len(x.targets) {
		return 0
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.targets[tgt].capacity
}

// SetClock makes the index stamp every hash it observes (Observe,
// ObserveChain, Fold) with now(), in now's units, for Tail; without it the
// stamps are 0. Set it before the index is used.
func (x *Index) SetClock(now func() int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.now = now
}

// stamp reads the clock for the write under way. The write lock must be
// held.
func (x *Index) stamp() {
	if x.now != nil {
		x.at = x.now()
	}
}

// Tail returns when target tgt's oldest hash was last observed (on the
// SetClock clock) and whether the target is full, so that the next hash it
// is sent evicts that one: now − at is how long the target keeps a prefix
// no request touches. False for a target that is not full, unbounded or
// out of range.
func (x *Index) Tail(tgt int) (at int64, full bool) {
	if tgt < 0 || tgt >= len(x.targets) {
		return 0, false
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	t := &x.targets[tgt]
	old, ok := t.lru.Oldest()
	if !ok || t.capacity <= 0 || len(t.slots) < t.capacity {
		return 0, false
	}
	return t.lru.At(old).at, true
}

// Targets returns the number of targets.
func (x *Index) Targets() int { return len(x.targets) }

// Capacity returns the per-target ceiling New was given, in hashes (0 =
// unbounded); SetCapacity changes one target's.
func (x *Index) Capacity() int { return x.capacity }

// Match sets lens[i], for every target i < len(lens), to the number of
// leading bytes of prompt that target i holds: a multiple of ChunkBytes, or
// len(prompt) when it holds the whole fingerprint. It takes the read lock
// and does not allocate.
func (x *Index) Match(prompt string, lens []int) {
	alive := x.startMatch(lens)
	if alive.empty() || prompt == "" {
		return
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	h, off := seed, 0
	for ; off+ChunkBytes <= len(prompt); off += ChunkBytes {
		h = xxh3.HashStringSeed(prompt[off:off+ChunkBytes], h)
		if !x.narrow(&alive, h, lens, off) {
			return
		}
	}
	end := off
	if off < len(prompt) {
		if x.narrow(&alive, xxh3.HashStringSeed(prompt[off:], h^tailMark), lens, off) {
			end = len(prompt)
		} else {
			return
		}
	}
	forEach(&alive, func(i int) { lens[i] = end })
}

// startMatch clears lens and returns the targets a match starts with: every
// one lens has room for.
func (x *Index) startMatch(lens []int) (alive set) {
	clear(lens)
	for i := range min(len(lens), len(x.targets)) {
		alive.add(i)
	}
	return alive
}

// narrow intersects alive with the holders of h; targets that drop out get
// depth as their match. It reports whether any target is still alive.
func (x *Index) narrow(alive *set, h uint64, lens []int, depth int) bool {
	hs := x.holders[h]
	next := alive.and(&hs)
	if next != *alive {
		dropped := set{alive[0] &^ next[0], alive[1] &^ next[1], alive[2] &^ next[2], alive[3] &^ next[3]}
		forEach(&dropped, func(i int) { lens[i] = depth })
		*alive = next
	}
	return !alive.empty()
}

func forEach(s *set, f func(int)) {
	for wi, w := range s {
		for ; w != 0; w &= w - 1 {
			f(wi*64 + bits.TrailingZeros64(w))
		}
	}
}

// Observe records that target was sent prompt and appends to publish the
// hashes other proxies should hear about (see the package doc). A target
// out of range or an empty prompt is ignored.
func (x *Index) Observe(tgt int, prompt string, publish []uint64) []uint64 {
	if tgt < 0 || tgt >= len(x.targets) || prompt == "" {
		return publish
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.stamp()
	t := &x.targets[tgt]
	if x.tailFirst {
		return x.observeTailFirst(tgt, t, prompt, publish)
	}
	h, off := seed, 0
	for ; off+ChunkBytes <= len(prompt); off += ChunkBytes {
		prev := h
		h = xxh3.HashStringSeed(prompt[off:off+ChunkBytes], h)
		if off > 0 {
			x.follow(prev, h)
		}
		publish = x.observeOne(tgt, t, h, publish)
	}
	if off < len(prompt) {
		publish = x.observeOne(tgt, t, xxh3.HashStringSeed(prompt[off:], h^tailMark), publish)
	}
	return publish
}

// observeTailFirst is Observe for an index that evicts tail first: the
// same hashes and forks, touched last to first. The write lock must be
// held.
func (x *Index) observeTailFirst(tgt int, t *target, prompt string, publish []uint64) []uint64 {
	var buf [maxPromptChunks]uint64
	return x.observeHashes(tgt, t, Hashes(buf[:0], prompt), len(prompt)/ChunkBytes, publish)
}

// maxPromptChunks covers a prompt of rolter.dev/pkg/affinity's 32 KiB
// bound, its tail included, without allocating; longer prompts spill to
// the heap.
const maxPromptChunks = 32<<10/ChunkBytes + 1

// EvictTailFirst makes the index forget a prompt's chunks in the order a
// vLLM replica evicts its blocks: a finished request's blocks are freed
// last block first, so under pressure a cached prompt loses its tail
// before its head, and what is left still matches from the start. Without
// it the head, touched first, is the oldest of the prompt's chunks and goes
// first, and the whole prompt stops matching while the replica still holds
// most of it. Peers hear the hashes in the same order (Fold keeps it).
// rolter-sim, predicted_ttft without KV events (docs/routing.md): hit rate
// +0.5 to +0.8 point on agent, multiturn and the trace.
func (x *Index) EvictTailFirst() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.tailFirst = true
}

// TrackForks makes the index remember where observed prompts part, for
// SharedLen; an index that never calls it pays nothing for that (a map
// entry per held chunk and a lookup per observed chunk).
func (x *Index) TrackForks() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.next == nil {
		x.next = make(map[uint64]uint64)
	}
}

// follow records that full chunk h came after full chunk prev (the tail
// is not a successor: a conversation's next turn extends its last turn's
// tail into a full chunk, which is no fork). The write lock must be held.
func (x *Index) follow(prev, h uint64) {
	if x.next == nil {
		return
	}
	switch v, ok := x.next[prev]; {
	case !ok:
		x.next[prev] = h
	case v != h && v != forked:
		x.next[prev] = forked
	}
}

// observeOne records hash h for target t (index tgt) and appends it to
// publish when peers should hear of it. The write lock must be held.
func (x *Index) observeOne(tgt int, t *target, h uint64, publish []uint64) []uint64 {
	if e, ok := t.slots[h]; ok {
		t.lru.Touch(e)
		en := t.lru.At(e)
		en.at = x.at
		if t.capacity > 0 && t.inserts-en.published > uint64(t.capacity/2) {
			en.published = t.inserts
			publish = append(publish, h)
		}
		return publish
	}
	x.insert(tgt, h)
	return append(publish, h)
}

// Fold records that a peer sent target prompts with these hashes. Hashes
// are applied in order, so a snapshot folded oldest first keeps the peer's
// LRU order. A target out of range is ignored.
func (x *Index) Fold(tgt int, hashes []uint64) {
	if tgt < 0 || tgt >= len(x.targets) || len(hashes) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.stamp()
	t := &x.targets[tgt]
	for _, h := range hashes {
		if e, ok := t.slots[h]; ok {
			t.lru.Touch(e)
			en := t.lru.At(e)
			en.published, en.at = t.inserts, x.at
			continue
		}
		x.insert(tgt, h)
	}
}

// SharedLen returns the number of leading bytes of prompt up to the end of
// its last full chunk that the observed prompts continued in two different
// ways: the part of prompt that other requests share, such as a system
// prompt many sessions start with, as opposed to what only one line of
// requests extends (a conversation's history); 0 unless TrackForks was
// called before the prompts were observed. It walks prompt's chunks
// while this index knows them, takes the read lock and does not allocate.
// Peers' folded hashes carry no order and teach it nothing.
func (x *Index) SharedLen(prompt string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	shared := 0
	h := seed
	for off := 0; off+ChunkBytes <= len(prompt); off += ChunkBytes {
		h = xxh3.HashStringSeed(prompt[off:off+ChunkBytes], h)
		v, ok := x.next[h]
		if !ok {
			break
		}
		if v == forked {
			shared = off + ChunkBytes
		}
	}
	return shared
}

// Export appends target's hashes to dst, oldest first, newest last; at most
// limit of them (the newest), or all when limit <= 0.
func (x *Index) Export(tgt int, dst []uint64, limit int) []uint64 {
	if tgt < 0 || tgt >= len(x.targets) {
		return dst
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	t := &x.targets[tgt]
	skip := 0
	if limit > 0 && len(t.slots) > limit {
		skip = len(t.slots) - limit
	}
	for _, en := range t.lru.All() {
		if skip > 0 {
			skip--
			continue
		}
		dst = append(dst, en.hash)
	}
	return dst
}

// Stats returns what target holds (the zero Stats out of range).
func (x *Index) Stats(tgt int) Stats {
	if tgt < 0 || tgt >= len(x.targets) {
		return Stats{}
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	t := &x.targets[tgt]
	return Stats{Chunks: len(t.slots), Evictions: t.evictions}
}

// insert adds h to target tgt as its newest hash and evicts the oldest
// while the target is above capacity. The write lock must be held.
func (x *Index) insert(tgt int, h uint64) {
	t := &x.targets[tgt]
	t.inserts++
	x.hold(tgt, t, entry{hash: h, published: t.inserts, at: x.at})
	x.evict(tgt, t)
}

// hold makes e the newest hash of target tgt (t), which must not hold it
// yet, and records tgt among its holders.
func (x *Index) hold(tgt int, t *target, e entry) {
	t.slots[e.hash] = t.lru.PushNewest(e)
	hs := x.holders[e.hash]
	hs.add(tgt)
	x.holders[e.hash] = hs
}

// evict drops target t's (index tgt) oldest hashes while it is above its
// capacity. The write lock must be held.
func (x *Index) evict(tgt int, t *target) {
	for t.capacity > 0 && len(t.slots) > t.capacity {
		old, _ := t.lru.Oldest()
		oh := t.lru.At(old).hash
		t.lru.Remove(old)
		delete(t.slots, oh)
		t.evictions++
		hs := x.holders[oh]
		hs.remove(tgt)
		if hs.empty() {
			delete(x.holders, oh)
			delete(x.next, oh)
		} else {
			x.holders[oh] = hs
		}
	}
}
