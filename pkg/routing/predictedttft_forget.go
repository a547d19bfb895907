package routing

import (
	"slices"
	"sort"
	"sync"

	"rolter.dev/pkg/chunkindex"
	"rolter.dev/pkg/lrulist"
)

// The forget term: what a pick loses when its target will have evicted the
// prompt before the requests that extend it come back.
//
// A request leaves its prompt in the target's prefix cache, and the
// requests that extend it (a conversation's next turn, an agent's next
// step) save its prefill only if they find it there. A target keeps a
// prefix no request touches for as long as its cache takes to turn over:
// the age of the oldest prefix in its approximate index, when that index is
// full (chunkindex.Index.Tail; an index with room evicts nothing). The
// balancer learns when requests come back: for every request that extends
// an earlier one, the time since that one was last sent or answered (its
// return time), and how many requests do. So a pick of target i costs
//
//	forget(i) = extended × prompt_tokens × w_own / 1000 × P(return time ≥ keep(i))
//
// where extended is the share of the latest requests that extended an
// earlier one, w_own the law's own-prefill weight (the prompt prefilled
// again, ms per 1,000 tokens) and keep(i) = now − Tail(i): the expected
// prefill the followers pay again because i forgot the prompt first.
//
// The return times are read from prompts the balancer remembers beyond any
// target's eviction (returnMemory of them), not from what a target still
// held: a target that forgets fast shows only the returns quicker than its
// turnover, and judged by those it kept everything. A return extends an
// earlier prompt whole (its last full chunk is in the new prompt's chain):
// a request that reuses only part of one, as most of the Mooncake trace's
// do, counts as new.
//
// Without the term a replica that held a prefix every session shares
// (agents' tool definitions) drew every new session while its cache turned
// over in less than a session's step: rolter-sim agent --prefill-us 60
// --parallel-prefill --ramp 10s sent 315 of 512 requests to one replica and
// served 37.1 % of the prompt tokens from cache; with it 200 and 45.0 %
// (docs/routing.md, the forget term).
type returnLog struct {
	mu sync.RWMutex
	// The prompts remembered, by the hash of their last full chunk, with
	// when each was last sent or answered; the oldest forgotten beyond
	// returnMemory.
	slots map[uint64]int32
	order lrulist.List[promptTouch]
	// The latest return times (ns): a ring of rateWindow, and the same
	// sorted for P(return time ≥ keep).
	ring   [rateWindow]int64
	ringN  int
	sorted []int64
	// Whether each of the latest rateWindow requests extended an earlier
	// one (a ring), and how many did.
	extends   [rateWindow]bool
	requestsN int
	extended  int
}

type promptTouch struct {
	hash uint64
	at   int64
}

// returnMemory bounds the prompts a balancer remembers for their return
// times (about 40 bytes each): a request extending a prompt sent more than
// this many prompts ago counts as new. 65,536 covers every return of the
// simulator's workloads and traces many times over.
const returnMemory = 1 << 16

func newReturnLog() *returnLog {
	return &returnLog{slots: make(map[uint64]int32)}
}

// sent records a request at now (ns) whose prompt's full chunks hash to
// hashes (the chained fingerprint, chunkindex): the latest prompt it
// extends, if any, gives a return time, and the prompt is remembered.
func (r *returnLog) sent(hashes []uint64, now int64) {
	if len(hashes) == 0 {
		return
	}
	// The walk, a lookup per chunk, under the read lock: picks read the
	// window meanwhile.
	var at int64
	extended := false
	r.mu.RLock()
	for k := len(hashes) - 1; k >= 0; k-- { // the longest earlier prompt first
		if e, ok := r.slots[hashes[k]]; ok {
			at, extended = r.order.At(e).at, true
			break
		}
	}
	r.mu.RUnlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if extended {
		r.addReturn(max(0, now-at))
	}
	i := r.requestsN % rateWindow
	if r.requestsN >= rateWindow && r.extends[i] {
		r.extended--
	}
	r.extends[i] = extended
	if extended {
		r.extended++
	}
	r.requestsN++
	r.touchLocked(hashes[len(hashes)-1], now)
}

// answered records that the prompt whose last full chunk hashes to last was
// answered at now (ns): its followers come after the answer, and a replica
// keeps its blocks from then.
func (r *returnLog) answered(last uint64, now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.touchLocked(last, now)
}

// touchLocked remembers the prompt last as touched at now; r.mu must be
// held.
func (r *returnLog) touchLocked(last uint64, now int64) {
	if e, ok := r.slots[last]; ok {
		r.order.At(e).at = now
		r.order.Touch(e)
		return
	}
	r.slots[last] = r.order.PushNewest(promptTouch{hash: last, at: now})
	for r.order.Len() > returnMemory {
		old, _ := r.order.Oldest()
		delete(r.slots, r.order.At(old).hash)
		r.order.Remove(old)
	}
}

// addReturn adds a return time to the window; r.mu must be held.
func (r *returnLog) addReturn(d int64) {
	i := r.ringN % rateWindow
	if r.ringN >= rateWindow {
		old := r.ring[i]
		j := sort.Search(len(r.sorted), func(k int) bool { return r.sorted[k] >= old })
		r.sorted = slices.Delete(r.sorted, j, j+1)
	}
	r.ring[i] = d
	r.ringN++
	j := sort.Search(len(r.sorted), func(k int) bool { return r.sorted[k] > d })
	r.sorted = slices.Insert(r.sorted, j, d)
}

// extendedShare returns the share of the latest requests that extended an
// earlier one; false before any return was seen.
func (r *returnLog) extendedShare() (share float64, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if len(r.sorted) == 0 {
		return 0, false
	}
	return float64(r.extended) / float64(min(r.requestsN, rateWindow)), true
}

// laterThan returns the share of the window's return times of at least
// keep (ns): the followers a target that keeps a prefix that long misses.
func (r *returnLog) laterThan(keep int64) float64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := len(r.sorted)
	if n == 0 {
		return 0
	}
	j := sort.Search(n, func(k int) bool { return r.sorted[k] >= keep })
	return float64(n-j) / float64(n)
}

// forget returns forget(i) for every target of el (see returnLog) into
// out, for a request of tokens prompt tokens at now on the law m; all 0
// before any return was seen.
func (t *predictedTTFT) forget(el Set, m *ttftLaw, tokens int, now int64, out []float64) {
	share, ok := t.returns.extendedShare()
	if !ok || tokens <= 0 || m.w[lawOwn] <= 0 {
		return
	}
	perTarget := share * float64(tokens) * m.w[lawOwn] / 1000
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			if at, full := t.index.Tail(i); full {
				out[i] = perTarget * t.returns.laterThan(now-at)
			}
		}
	}
}

// promptEnd marks, in the hashes a proxy publishes to its peers, that the
// next one ends a prompt the proxy sent or saw answered (withPromptEnd):
// a peer's log then knows the prompts of a conversation whose turns went
// through other proxies, which a proxy behind an L4 spread over P sees
// one in P of. No chunk hash takes this value but with probability 2⁻⁶⁴;
// a proxy that does not know the mark folds it and the end as two chunk
// hashes, which cost it two slots of its index.
const promptEnd uint64 = 0x7f4a7c159e3779b9

// withPromptEnd appends the mark and the last of hashes (a prompt's full
// chunks) to publish.
func withPromptEnd(publish, hashes []uint64) []uint64 {
	if len(hashes) == 0 {
		return publish
	}
	return append(publish, promptEnd, hashes[len(hashes)-1])
}

// foldPromptEnds records, at now (ns), the prompt ends a peer marked in
// chunks (withPromptEnd) and returns the chunks without the marks and
// ends: chunks itself when there are none, else a copy. A mark with
// nothing after it is dropped.
func (r *returnLog) foldPromptEnds(chunks []uint64, now int64) []uint64 {
	k := slices.Index(chunks, promptEnd)
	if k < 0 {
		return chunks
	}
	out := slices.Clone(chunks[:k])
	for ; k < len(chunks); k++ {
		if chunks[k] != promptEnd {
			out = append(out, chunks[k])
			continue
		}
		if k+1 < len(chunks) {
			r.answered(chunks[k+1], now)
			k++
		}
	}
	return out
}

// promptHashBuf holds the chained hashes of a prompt of
// rolter.dev/pkg/affinity's 32 KiB bound on the stack.
const promptHashBuf = 32<<10/chunkindex.ChunkBytes + 1

// fullHashes returns the hashes of c's full chunks (without its tail's).
func fullHashes(c chunkindex.Chain) []uint64 {
	return c.Hashes[:min(c.Len/chunkindex.ChunkBytes, len(c.Hashes))]
}
