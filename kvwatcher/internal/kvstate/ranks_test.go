package kvstate_test

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"rolter.dev/kvwatcher/internal/kvstate"
	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/kvevents"
	"rolter.dev/pkg/kvindex"
)

// receiver applies ops as a proxy's index does.
type receiver map[uint64]bool

func (r receiver) apply(t *testing.T, ops []kvdelta.Op) {
	t.Helper()
	for _, op := range ops {
		switch op.Kind {
		case kvdelta.OpStored:
			for _, id := range op.IDs {
				if r[id] {
					t.Fatalf("stored %x twice", id)
				}
				r[id] = true
			}
		case kvdelta.OpRemoved:
			for _, id := range op.IDs {
				if !r[id] {
					t.Fatalf("removed %x, not resident", id)
				}
				delete(r, id)
			}
		case kvdelta.OpCleared:
			clear(r)
		}
	}
}

// union is what the receiver should hold: the identities of every rank.
func union(rs *kvstate.Ranks) receiver {
	u := receiver{}
	for i := range rs.N() {
		for _, id := range rs.Rank(i).AppendIDs(nil) {
			u[id] = true
		}
	}
	return u
}

func TestRanksClearOnlyTheRank(t *testing.T) {
	rs := kvstate.NewRanks(model, 0, 2)
	rcv := receiver{}
	shared, own := tokens(2*bs, 100), tokens(2*bs, 500)
	ids := kvindex.Identities(kvindex.Seed(model), shared, bs)
	ownIDs := kvindex.Identities(kvindex.Seed(model), own, bs)
	// Both ranks hold the shared prefix (their own engine hashes); rank 1
	// also holds another.
	ops, _ := rs.Apply(0, []kvevents.Event{stored([]uint64{1, 2}, nil, shared)})
	rcv.apply(t, ops)
	ops, _ = rs.Apply(1, []kvevents.Event{stored([]uint64{71, 72}, nil, shared), stored([]uint64{81, 82}, nil, own)})
	if want := []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: ownIDs}}; !reflect.DeepEqual(cloneOps(ops), want) {
		t.Fatalf("rank 1's store: ops %+v, want only its own blocks %+v", cloneOps(ops), want)
	}
	rcv.apply(t, ops)

	// Rank 1 loses its stream: only its own blocks leave.
	// (A rank's identities come out of a map: their order is not defined.)
	ops = rs.ClearRank(1, kvdelta.ReasonReconnect)
	got := cloneOps(ops)
	for _, op := range got {
		slices.Sort(op.IDs)
	}
	if want := []kvdelta.Op{{Kind: kvdelta.OpRemoved, IDs: slices.Sorted(slices.Values(ownIDs))}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("clear of rank 1: ops %+v, want %+v", got, want)
	}
	rcv.apply(t, ops)
	if !rcv[ids[0]] || !rcv[ids[1]] || rs.Len() != 2 {
		t.Fatalf("rank 0's blocks left with rank 1's: %v (len %d)", rcv, rs.Len())
	}
	// Rank 0's engine clears: nothing is left anywhere, one clear says so.
	ops, st := rs.Apply(0, []kvevents.Event{&kvevents.AllBlocksCleared{}})
	if want := []kvdelta.Op{{Kind: kvdelta.OpCleared, Reason: kvdelta.ReasonEngine}}; !reflect.DeepEqual(cloneOps(ops), want) || st.Cleared != 1 {
		t.Fatalf("last clear: ops %+v, want %+v", cloneOps(ops), want)
	}
	rcv.apply(t, ops)
	if len(rcv) != 0 || rs.Len() != 0 {
		t.Fatalf("left: %v", rcv)
	}
}

func TestOneRankIsTheState(t *testing.T) {
	rs := kvstate.NewRanks(model, 0, 1)
	ops := rs.ClearRank(0, kvdelta.ReasonGap)
	if want := []kvdelta.Op{{Kind: kvdelta.OpCleared, Reason: kvdelta.ReasonGap}}; !reflect.DeepEqual(cloneOps(ops), want) {
		t.Fatalf("ops %+v, want %+v", cloneOps(ops), want)
	}
}

// TestRanksRandom: whatever the ranks do, a receiver applying the ops holds
// exactly the union of the ranks' identities.
func TestRanksRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 3
	rs := kvstate.NewRanks(model, 40, n)
	rcv := receiver{}
	// A few prompts, so that ranks share identities; engine hashes differ
	// per rank.
	prompts := [][]uint32{tokens(6*bs, 100), tokens(6*bs, 200), tokens(6*bs, 300)}
	for step := range 3000 {
		rank := rng.IntN(n)
		p := rng.IntN(len(prompts))
		engine := func(b int) uint64 { return uint64(rank)<<32 | uint64(p)<<16 | uint64(b) }
		var evs []kvevents.Event
		switch k := rng.IntN(10); {
		case k < 5: // store a run continuing from block from
			from := rng.IntN(5)
			to := from + 1 + rng.IntN(6-from)
			var eng []uint64
			for b := from; b < to; b++ {
				eng = append(eng, engine(b))
			}
			var parent *uint64
			if from > 0 {
				parent = ptr(engine(from - 1))
			}
			evs = append(evs, stored(eng, parent, prompts[p][from*bs:to*bs]))
		case k < 8:
			evs = append(evs, removed(engine(rng.IntN(6))))
		case k < 9:
			evs = append(evs, removed(engine(0)), &kvevents.AllBlocksCleared{}, stored([]uint64{engine(0)}, nil, prompts[p][:bs]))
		default:
			rcv.apply(t, rs.ClearRank(rank, kvdelta.ReasonGap))
			continue
		}
		ops, _ := rs.Apply(rank, evs)
		rcv.apply(t, ops)
		if u := union(rs); !reflect.DeepEqual(rcv, u) || rs.Len() != len(u) {
			t.Fatalf("step %d: receiver %d ids, union %d (Len %d)", step, len(rcv), len(u), rs.Len())
		}
	}
}
