package vllmsim

import (
	"encoding/binary"
	"sync"
)

// KVEventKind tells what a [KVEvent] reports.
type KVEventKind uint8

// The kinds of [KVEvent], named after vLLM's KV cache events.
const (
	// BlockStored reports a run of consecutive blocks that became resident.
	BlockStored KVEventKind = iota + 1
	// BlockRemoved reports blocks that were evicted.
	BlockRemoved
	// AllBlocksCleared reports that every block was dropped (a reset).
	AllBlocksCleared
)

// String returns the vLLM name of the event kind.
func (k KVEventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	default:
		return "Unknown"
	}
}

// KVEvent is one change of a [Cache], shaped like vLLM's KV cache events so
// that it can be published in vLLM's wire format.
type KVEvent struct {
	// Kind says which of the other fields are set.
	Kind KVEventKind
	// BlockHashes lists the blocks stored (in chain order) or removed.
	BlockHashes []uint64
	// ParentBlockHash is, for BlockStored, the hash of the block that
	// precedes BlockHashes[0] in its chain; it is meaningful only when
	// HasParent is true.
	ParentBlockHash uint64
	// HasParent is false for a BlockStored run that starts at the first
	// block of a prompt (vLLM sends a null parent_block_hash then).
	HasParent bool
	// TokenIDs holds, for BlockStored, the token ids of all the stored
	// blocks, BlockSize per block, in order.
	TokenIDs []uint32
	// BlockSize is the number of tokens per block (set on BlockStored).
	BlockSize int
	// Salt is, for a BlockStored run that starts at the first block of a
	// salted prompt, the cache_salt that block's extra keys hold.
	Salt string
}

// Listener receives the events of a [Cache]. KVEvents is called
// synchronously, with the cache's lock held, once per cache operation that
// changed something, with the events in the order they happened; so a
// consumer that applies them in call order always mirrors the cache. It must
// not block and must not call back into the cache (hand the batch to a
// goroutine or a buffered channel instead). The batch and its slices belong
// to the listener after the call.
type Listener interface {
	KVEvents(batch []KVEvent)
}

// ListenerFunc adapts a function to the [Listener] interface.
type ListenerFunc func(batch []KVEvent)

// KVEvents calls f(batch).
func (f ListenerFunc) KVEvents(batch []KVEvent) { f(batch) }

var _ Listener = ListenerFunc(nil)

// BlockHashes returns the chained hashes of the full blocks of tokens, as
// the simulated replica's prefix cache computes them: the hash of block i is
// the 64-bit FNV-1a hash of the hash of block i-1 (0 for the first block, as
// 8 little-endian bytes) followed by the block's token ids (4 little-endian
// bytes each). A trailing partial block has no hash, as in vLLM. It returns
// nil when blockSize < 1. It is a pure function and safe for concurrent use.
func BlockHashes(tokens []uint32, blockSize int) []uint64 {
	return chainHashes(tokens, blockSize, 0)
}

// SaltedBlockHashes is [BlockHashes] for a request with a cache_salt:
// vLLM hashes the salt into the prompt's first block (its extra keys), so
// a salted prompt's chain starts from the salt's seed instead of 0 and
// shares no block with another salt's or an unsalted prompt. An empty
// salt is BlockHashes.
func SaltedBlockHashes(tokens []uint32, blockSize int, salt string) []uint64 {
	return chainHashes(tokens, blockSize, saltSeed(salt))
}

// saltSeed is the first block's parent for salt: 0 for none, else the
// FNV-1a hash of "cache_salt", a NUL and the salt (never 0).
func saltSeed(salt string) uint64 {
	if salt == "" {
		return 0
	}
	h := uint64(fnvOffset64)
	for _, c := range []byte("cache_salt\x00" + salt) {
		h = (h ^ uint64(c)) * fnvPrime64
	}
	return max(h, 1)
}

func chainHashes(tokens []uint32, blockSize int, parent uint64) []uint64 {
	if blockSize < 1 {
		return nil
	}
	n := len(tokens) / blockSize
	hashes := make([]uint64, n)
	for i := range n {
		parent = blockHash(parent, tokens[i*blockSize:(i+1)*blockSize])
		hashes[i] = parent
	}
	return hashes
}

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func blockHash(parent uint64, tokens []uint32) uint64 {
	h := uint64(fnvOffset64)
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], parent)
	for _, c := range buf {
		h = (h ^ uint64(c)) * fnvPrime64
	}
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(buf[:4], t)
		for _, c := range buf[:4] {
			h = (h ^ uint64(c)) * fnvPrime64
		}
	}
	return h
}

// block is one resident cache block.
type block struct {
	hash       uint64
	refs       int    // running requests that hold the block
	dead       bool   // evicted or cleared; a stale lease must skip it
	prev, next *block // links in the free list while refs == 0
}

// Cache is a vLLM-style prefix cache of fixed-size token blocks, addressed by
// chained content hashes (see [BlockHashes]). It holds at most a fixed number
// of blocks. Blocks held by a running request (through a [Lease]) are never
// evicted; the others are evicted least recently used first, and because a
// request releases its blocks deepest first, a chain loses its leaves before
// its root, as in vLLM.
//
// All methods are safe for concurrent use.
type Cache struct {
	blockSize int
	capacity  int
	listener  Listener // may be nil

	mu     sync.Mutex
	blocks map[uint64]*block
	// free is the LRU list of resident blocks with refs == 0: head is the
	// next to evict, tail the most recently released.
	freeHead, freeTail *block
	pinned             int // resident blocks with refs > 0
	evictions          uint64
	queries, hits      uint64 // prompt tokens looked up and found, vLLM's counters
}

// NewCache returns an empty cache of capacity blocks of blockSize tokens.
// listener, which may be nil, receives every change (see [Listener]).
// Values below 1 are raised to 1.
func NewCache(blockSize, capacity int, listener Listener) *Cache {
	return &Cache{
		blockSize: max(blockSize, 1),
		capacity:  max(capacity, 1),
		listener:  listener,
		blocks:    make(map[uint64]*block),
	}
}

// BlockSize returns the number of tokens per block.
func (c *Cache) BlockSize() int { return c.blockSize }

// Capacity returns the maximum number of resident blocks.
func (c *Cache) Capacity() int { return c.capacity }

// Lease is the set of blocks a running request holds in a [Cache]. It is
// returned by [Cache.Admit]; the request must hand it back with
// [Cache.Release] when it finishes, whatever the outcome. A Lease is not safe
// for concurrent use; the Cache serialises its own use of it.
type Lease struct {
	blocks []*block
	salt   string // the request's cache_salt (SaltedBlockHashes)
	// released guards against double release.
	released bool
}

// Blocks returns how many blocks the lease holds.
func (l *Lease) Blocks() int { return len(l.blocks) }

// Admit looks up the prompt's longest cached prefix, then makes all the
// prompt's full blocks resident and held by the returned lease, evicting
// unheld blocks when the cache is full (blocks that find no room are simply
// not cached). It returns the number of prompt tokens served from the cache.
//
// As in vLLM, the last prompt token is always computed, so a prompt whose
// every block is cached reports its last block as a miss when the prompt
// length is a multiple of the block size.
func (c *Cache) Admit(tokens []uint32) (cachedTokens int, lease *Lease) {
	return c.AdmitSalted(tokens, "")
}

// AdmitSalted is [Cache.Admit] for a prompt with a cache_salt: its blocks
// are those of [SaltedBlockHashes], shared only with prompts of the same
// salt, and the lease extends them so.
func (c *Cache) AdmitSalted(tokens []uint32, salt string) (cachedTokens int, lease *Lease) {
	return c.admit(tokens, salt, true)
}

// admit is [Cache.AdmitSalted], for a request that reads the cache or not.
// One that does not (vLLM's skip_reading_prefix_cache, set by
// prompt_logprobs) is served no token from it and counts no query
// (KVCacheManager.get_computed_blocks and record_prefix_cache_stats,
// vllm/v1/core/kv_cache_manager.py at 003df2961dd8), but its blocks are
// cached all the same.
func (c *Cache) admit(tokens []uint32, salt string, read bool) (cachedTokens int, lease *Lease) {
	hashes := SaltedBlockHashes(tokens, c.blockSize, salt)
	c.mu.Lock()
	defer c.mu.Unlock()
	if read {
		cachedTokens = c.lookupLocked(len(tokens), hashes)
		c.queries += uint64(len(tokens))
		c.hits += uint64(cachedTokens)
	}

	lease = &Lease{salt: salt}
	c.acquireLocked(lease, tokens, hashes)
	return cachedTokens, lease
}

// Fits reports whether [Cache.Admit] could give every full block of tokens
// a place now without taking one from a running request: the blocks it
// would newly hold (absent, or resident with no holder) are no more than
// the blocks no request holds. vLLM's scheduler admits a waiting request
// only then, and keeps it waiting otherwise; Admit itself never waits.
func (c *Cache) Fits(tokens []uint32) bool {
	hashes := BlockHashes(tokens, c.blockSize)
	c.mu.Lock()
	defer c.mu.Unlock()
	need := 0
	for _, h := range hashes {
		if b, ok := c.blocks[h]; !ok || b.refs == 0 {
			need++
		}
	}
	return need <= c.capacity-c.pinned
}

// Lookup returns the number of prompt tokens [Cache.Admit] would serve from
// the cache for tokens now, without changing the cache or its counters.
func (c *Cache) Lookup(tokens []uint32) int {
	hashes := BlockHashes(tokens, c.blockSize)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lookupLocked(len(tokens), hashes)
}

// lookupLocked counts the cached tokens of a prompt of n tokens whose full
// blocks have the given hashes. c.mu is held.
func (c *Cache) lookupLocked(n int, hashes []uint64) int {
	eligible := 0 // blocks that may hit: the last token is always computed
	if n > 0 {
		eligible = (n - 1) / c.blockSize
	}
	hit := 0
	for hit < eligible {
		if _, ok := c.blocks[hashes[hit]]; !ok {
			break
		}
		hit++
	}
	return hit * c.blockSize
}

// Extend makes the full blocks of seq (the request's prompt followed by its
// output so far) resident and held by lease, as vLLM caches the blocks that
// generated tokens fill. Blocks the lease already holds are skipped. It is a
// no-op on a released lease and on one whose blocks a [Cache.Clear] dropped.
func (c *Cache) Extend(lease *Lease, seq []uint32) {
	hashes := SaltedBlockHashes(seq, c.blockSize, lease.salt)
	c.mu.Lock()
	defer c.mu.Unlock()
	if lease.released {
		return
	}
	for _, b := range lease.blocks {
		if b.dead {
			return
		}
	}
	c.acquireLocked(lease, seq, hashes)
}

// acquireLocked pins hashes[len(lease.blocks):] into lease, storing the
// missing ones, and reports the changes to the listener. c.mu is held.
func (c *Cache) acquireLocked(lease *Lease, tokens []uint32, hashes []uint64) {
	start := len(lease.blocks)
	if start > len(hashes) {
		return
	}
	// Pin what is resident first, so that making room cannot evict it.
	missing := 0
	for _, h := range hashes[start:] {
		if b, ok := c.blocks[h]; ok {
			c.pinLocked(b)
		} else {
			missing++
		}
	}
	// Events are built only for a listener: copying every stored block's
	// token ids is most of the simulator's work when nobody listens.
	emit := c.listener != nil
	var batch []KVEvent
	if over := len(c.blocks) + missing - c.capacity; over > 0 {
		var removed []uint64
		for ; over > 0 && c.freeHead != nil; over-- {
			b := c.freeHead
			c.unlinkLocked(b)
			delete(c.blocks, b.hash)
			b.dead = true
			c.evictions++
			if emit {
				removed = append(removed, b.hash)
			}
		}
		if len(removed) > 0 {
			batch = append(batch, KVEvent{Kind: BlockRemoved, BlockHashes: removed})
		}
	}
	// Walk the chain in order; a block that finds no room ends the lease's
	// chain there (the rest of the prompt is computed but not cached).
	var stored *KVEvent
	for i := start; i < len(hashes); i++ {
		h := hashes[i]
		b, ok := c.blocks[h]
		if !ok {
			if len(c.blocks) >= c.capacity {
				c.unpinLocked(hashes[i:])
				break
			}
			b = &block{hash: h, refs: 1}
			c.blocks[h] = b
			c.pinned++
			if emit {
				if stored == nil { // a new run of stored blocks
					batch = append(batch, KVEvent{Kind: BlockStored, BlockSize: c.blockSize})
					stored = &batch[len(batch)-1]
					if i > 0 {
						stored.ParentBlockHash, stored.HasParent = hashes[i-1], true
					} else {
						stored.Salt = lease.salt
					}
				}
				stored.BlockHashes = append(stored.BlockHashes, h)
				stored.TokenIDs = append(stored.TokenIDs, tokens[i*c.blockSize:(i+1)*c.blockSize]...)
			}
		} else {
			stored = nil // the next new block starts a new run
		}
		lease.blocks = append(lease.blocks, b)
	}
	if len(batch) > 0 {
		c.listener.KVEvents(batch)
	}
}

// unpinLocked undoes the pins acquireLocked took on the resident blocks of
// hashes (the part of the chain that will not join the lease).
func (c *Cache) unpinLocked(hashes []uint64) {
	for j := len(hashes) - 1; j >= 0; j-- {
		if b, ok := c.blocks[hashes[j]]; ok {
			c.releaseBlockLocked(b)
		}
	}
}

// Release hands back the blocks a lease holds: they stay resident and become
// evictable, deepest block first. Releasing twice is a no-op.
func (c *Cache) Release(lease *Lease) {
	if lease == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if lease.released {
		return
	}
	lease.released = true
	for i := len(lease.blocks) - 1; i >= 0; i-- {
		c.releaseBlockLocked(lease.blocks[i])
	}
	lease.blocks = nil
}

func (c *Cache) pinLocked(b *block) {
	if b.refs == 0 {
		c.unlinkLocked(b)
		c.pinned++
	}
	b.refs++
}

func (c *Cache) releaseBlockLocked(b *block) {
	if b.dead || b.refs == 0 {
		return
	}
	b.refs--
	if b.refs == 0 {
		c.pinned--
		// Append at the tail: most recently used, evicted last.
		b.prev, b.next = c.freeTail, nil
		if c.freeTail != nil {
			c.freeTail.next = b
		} else {
			c.freeHead = b
		}
		c.freeTail = b
	}
}

func (c *Cache) unlinkLocked(b *block) {
	if b.prev != nil {
		b.prev.next = b.next
	} else if c.freeHead == b {
		c.freeHead = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else if c.freeTail == b {
		c.freeTail = b.prev
	}
	b.prev, b.next = nil, nil
}

// Clear drops every block, held or not, and reports AllBlocksCleared. Leases
// taken before the clear stay valid and release nothing. The counters of
// [Cache.Stats] are kept; [Cache.ResetStats] zeroes them.
func (c *Cache) Clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.blocks {
		b.dead = true
		b.prev, b.next = nil, nil
	}
	clear(c.blocks)
	c.freeHead, c.freeTail = nil, nil
	c.pinned = 0
	if c.listener != nil {
		c.listener.KVEvents([]KVEvent{{Kind: AllBlocksCleared}})
	}
}

// ResetStats zeroes the counters reported by [Cache.Stats].
func (c *Cache) ResetStats() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.evictions, c.queries, c.hits = 0, 0, 0
}

// Has reports whether the block with the given hash is resident.
func (c *Cache) Has(hash uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.blocks[hash]
	return ok
}

// CacheStats is a snapshot of a [Cache]'s state and counters.
type CacheStats struct {
	// Resident is the number of resident blocks.
	Resident int
	// Pinned is the number of resident blocks held by running requests.
	Pinned int
	// Evictions counts blocks evicted to make room.
	Evictions uint64
	// QueriedTokens counts prompt tokens looked up by [Cache.Admit].
	QueriedTokens uint64
	// HitTokens counts prompt tokens found in the cache.
	HitTokens uint64
}

// Stats returns a snapshot of the cache's state and counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{
		Resident:      len(c.blocks),
		Pinned:        c.pinned,
		Evictions:     c.evictions,
		QueriedTokens: c.queries,
		HitTokens:     c.hits,
	}
}
