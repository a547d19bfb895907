package routing

import (
	"sync"
	"time"
)

// maxSharedSpeculation bounds the identities a balancer holds for its next
// queue report, over every target: 8,192 blocks (64 KiB on the wire, 128 K
// tokens at 16 per block), so that a burst of long prompts cannot outgrow
// a NATS message. Beyond it a pick still speculates for itself, unshared.
const maxSharedSpeculation = 8192

// sharedSpec holds, per target, the KV block identities this balancer's
// picks speculated and the fleet has not yet taken for a queue report (see
// SharedSpeculation). Only a balancer that shares (Spec.Share) and whose
// KV source can hand identities back (KVSharedSource) keeps any.
type sharedSpec struct {
	mu    sync.Mutex
	ids   [][]uint64
	since []time.Duration // when the oldest of ids[i] was added (-1: none)
	n     int             // len(ids[i]) summed
}

func (s *sharedSpec) init(n int) {
	s.ids, s.since = make([][]uint64, n), make([]time.Duration, n)
	for i := range s.since {
		s.since[i] = -1
	}
}

// speculate marks the blocks of tokenIDs held at target for the
// speculative TTL and, on a sharing balancer, keeps what it marked for the
// peers.
func (t *predictedTTFT) speculate(target int, tokenIDs []uint32, now time.Duration) {
	ks, ok := t.kv.(KVSharedSource)
	if !ok || t.publish == nil {
		t.kv.Speculate(target, tokenIDs, t.specTTL)
		return
	}
	s := &t.shared
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n >= maxSharedSpeculation {
		t.kv.Speculate(target, tokenIDs, t.specTTL)
		return
	}
	before := len(s.ids[target])
	s.ids[target] = ks.SpeculateAppend(target, tokenIDs, t.specTTL, s.ids[target])
	// A prompt's leading blocks come first: past the bound its tail is not
	// shared.
	s.ids[target] = s.ids[target][:min(len(s.ids[target]), before+maxSharedSpeculation-s.n)]
	s.n += len(s.ids[target]) - before
	if before == 0 && len(s.ids[target]) > 0 {
		s.since[target] = now
	}
}

// TakeSpeculated implements [SharedSpeculation]. Identities held longer
// than the speculative TTL (no fleet took them: NATS was down) are dropped
// rather than passed on as new.
func (t *predictedTTFT) TakeSpeculated(target int, dst []uint64) []uint64 {
	if target < 0 || target >= t.n {
		return dst
	}
	now := t.now()
	s := &t.shared
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := s.ids[target]
	if len(ids) > 0 && now-s.since[target] <= t.specTTL {
		dst = append(dst, ids...)
	}
	s.n -= len(ids)
	s.ids[target] = ids[:0]
	s.since[target] = -1
	return dst
}

// FoldPeerSpeculated implements [SharedSpeculation]: a peer's identities
// count at target as this balancer's own speculation does, for its TTL or
// until the target's events speak for them.
func (t *predictedTTFT) FoldPeerSpeculated(target int, ids []uint64) {
	ks, ok := t.kv.(KVSharedSource)
	if !ok || target < 0 || target >= t.n || len(ids) == 0 || t.specTTL <= 0 {
		return
	}
	ks.SpeculateIDs(target, ids, t.specTTL)
}
