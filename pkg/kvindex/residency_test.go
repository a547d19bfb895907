package kvindex_test

import (
	"testing"
	"time"

	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/kvindex"
)

// A Residency on a clock the test moves: resident prefixes, speculation
// until its expiry or the engine's word, snapshots keeping speculation.
func TestResidency(t *testing.T) {
	var r kvindex.Residency
	chain := []uint64{1, 2, 3, 4}
	if got := r.PrefixMatch(chain, 0); got != 0 {
		t.Fatalf("empty: match %d", got)
	}
	r.Apply([]kvdelta.Op{stored(1, 2), stored(9)})
	if got := r.PrefixMatch(chain, 0); got != 2 {
		t.Fatalf("1, 2 stored: match %d, want 2", got)
	}
	// A gap ends the prefix even when later blocks are resident.
	r.Apply([]kvdelta.Op{stored(4)})
	if got := r.PrefixMatch(chain, 0); got != 2 {
		t.Fatalf("1, 2, 4 stored: match %d, want 2", got)
	}

	const sec = int64(time.Second)
	now := 10 * sec
	r.Speculate(chain, now, 5*time.Second)
	if res, spec := r.Len(); res != 4 || spec != 1 || !r.Speculating() {
		t.Fatalf("after speculating: %d resident, %d speculative (only 3 is not resident)", res, spec)
	}
	if got := r.PrefixMatch(chain, now+4*sec); got != 4 {
		t.Fatalf("within the TTL: match %d, want 4", got)
	}
	if got := r.PrefixMatch(chain, now+5*sec); got != 2 {
		t.Fatalf("at expiry: match %d, want 2", got)
	}

	// The engine's removal of a speculated block ends its speculation.
	r.Apply([]kvdelta.Op{removed(3)})
	if got := r.PrefixMatch(chain, now); got != 2 {
		t.Fatalf("3 removed: match %d, want 2", got)
	}
	// A snapshot replaces what is resident and keeps speculation.
	r.Speculate([]uint64{3}, now, 5*time.Second)
	r.Replace([]uint64{1, 2, 4})
	if got := r.PrefixMatch(chain, now); got != 4 {
		t.Fatalf("after a snapshot: match %d, want 4 (3 speculated)", got)
	}
	r.Replace([]uint64{2, 3, 4})
	if got := r.PrefixMatch(chain, now); got != 0 {
		t.Fatalf("snapshot without 1: match %d, want 0", got)
	}
	// A clear drops both.
	r.Apply([]kvdelta.Op{{Kind: kvdelta.OpCleared}})
	if res, spec := r.Len(); res != 0 || spec != 0 {
		t.Fatalf("after a clear: %d resident, %d speculative", res, spec)
	}

	// Expired entries are swept by a later Speculate, at most once a second.
	r.Speculate([]uint64{7}, now, time.Second)
	r.Speculate([]uint64{8}, now+3*sec, time.Second)
	if _, spec := r.Len(); spec != 1 {
		t.Fatalf("after the sweep: %d speculative entries, want 1 (7 expired)", spec)
	}
	// Zero TTL or no ids: nothing.
	r.Speculate([]uint64{9}, now, 0)
	r.Speculate(nil, now, time.Second)
	if _, spec := r.Len(); spec != 1 {
		t.Fatalf("a zero TTL speculated: %d entries", spec)
	}
}

// Speculative entries stop at MaxSpeculative until the next sweep drops the
// expired ones: a flood of long token-id headers cannot grow them further.
// SpeculateAppend hands back what it marked: the identities not resident,
// which a peer does not know of until the engine's events, in order.
func TestSpeculateAppendReturnsWhatItMarked(t *testing.T) {
	var r kvindex.Residency
	r.Apply([]kvdelta.Op{stored(1, 2)})
	dst := r.SpeculateAppend([]uint64{1, 2, 3, 4}, 0, time.Second, []uint64{7})
	if len(dst) != 3 || dst[0] != 7 || dst[1] != 3 || dst[2] != 4 {
		t.Fatalf("SpeculateAppend = %v, want [7 3 4] (1 and 2 are resident)", dst)
	}
	if got := r.PrefixMatch([]uint64{1, 2, 3, 4}, int64(time.Millisecond)); got != 4 {
		t.Fatalf("after SpeculateAppend: match %d, want 4", got)
	}
	if dst := r.SpeculateAppend(nil, 0, time.Second, nil); dst != nil {
		t.Fatalf("nothing to speculate: %v", dst)
	}
}

func TestSpeculationIsBounded(t *testing.T) {
	var r kvindex.Residency
	const sec = int64(time.Second)
	ids := make([]uint64, kvindex.MaxSpeculative/4+1)
	next := uint64(1)
	fill := func(now int64) {
		for i := range ids {
			ids[i] = next
			next++
		}
		r.Speculate(ids, now, 5*time.Second)
	}
	for range 8 {
		fill(10 * sec)
	}
	if _, spec := r.Len(); spec != kvindex.MaxSpeculative {
		t.Fatalf("%d speculative entries after 8 floods of %d, want the bound %d", spec, len(ids), kvindex.MaxSpeculative)
	}
	fill(20 * sec) // all expired: the sweep makes room
	if _, spec := r.Len(); spec != len(ids) {
		t.Fatalf("%d speculative entries after the sweep, want the %d new ones", spec, len(ids))
	}
}
