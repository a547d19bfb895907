package kvstate

import (
	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/kvevents"
)

// Ranks is the state of a provider whose engine runs several data-parallel
// ranks: one [State] per rank (each rank has its own KV cache, block hashes
// and event stream) and their union, the provider's resident set. Its ops
// take a receiver's copy of the union from before to after, so clearing one
// rank (its gap, reconnect or AllBlocksCleared) removes only the identities
// no other rank holds. With one rank it is that rank's State, at no extra
// cost.
//
// Like State, a Ranks is owned by one goroutine.
type Ranks struct {
	states []*State
	// count maps each resident identity to the number of ranks holding it;
	// nil with one rank.
	count map[uint64]int32
	prev  []uint64 // scratch: a rank's identities before a clear
	ops   []kvdelta.Op
	nops  int
}

// NewRanks returns the empty state of a provider of n ranks (at least 1)
// serving model, holding at most maxBlocks blocks in all (each rank gets an
// even share; no cap when maxBlocks < 1).
func NewRanks(model string, maxBlocks, n int) *Ranks {
	n = max(n, 1)
	per := maxBlocks
	if maxBlocks > 0 {
		per = max((maxBlocks+n-1)/n, 1)
	}
	r := &Ranks{}
	for range n {
		r.states = append(r.states, New(model, per))
	}
	if n > 1 {
		r.count = map[uint64]int32{}
	}
	return r
}

// N returns the number of ranks.
func (r *Ranks) N() int { return len(r.states) }

// Rank returns rank i's state (for reading: apply changes through r).
func (r *Ranks) Rank(i int) *State { return r.states[i] }

// Len returns the number of identities resident on any rank.
func (r *Ranks) Len() int {
	if r.count == nil {
		return r.states[0].Len()
	}
	return len(r.count)
}

// BlockSize returns the block size of the last stored event of any rank (0
// before any).
func (r *Ranks) BlockSize() int {
	bs := 0
	for _, s := range r.states {
		bs = max(bs, s.BlockSize())
	}
	return bs
}

// AppendIDs appends the identities resident on any rank to dst.
func (r *Ranks) AppendIDs(dst []uint64) []uint64 {
	if r.count == nil {
		return r.states[0].AppendIDs(dst)
	}
	for id := range r.count {
		dst = append(dst, id)
	}
	return dst
}

// Contains reports whether id is resident on any rank.
func (r *Ranks) Contains(id uint64) bool {
	if r.count == nil {
		return r.states[0].Contains(id)
	}
	_, ok := r.count[id]
	return ok
}

// Clear empties every rank; the receiver's clear is one OpCleared.
func (r *Ranks) Clear() {
	for _, s := range r.states {
		s.Clear()
	}
	clear(r.count)
}

// Apply applies rank's events (see [State.Apply]) and returns the ops that
// change the union. The ops are valid until the next call of a method of r.
func (r *Ranks) Apply(rank int, events []kvevents.Event) ([]kvdelta.Op, Stats) {
	s := r.states[rank]
	if r.count == nil {
		return s.Apply(events)
	}
	r.prev = r.prev[:0]
	for _, ev := range events {
		if ev.Kind() == kvevents.KindAllBlocksCleared {
			r.prev = s.AppendIDs(r.prev)
			break
		}
	}
	ops, st := s.Apply(events)
	r.nops = 0
	for i := range ops {
		op := &ops[i]
		switch op.Kind {
		case kvdelta.OpCleared:
			// Always ops[0]: State.Apply drops what came before a clear,
			// and the rank held r.prev before the batch.
			r.drop(r.prev, op.Reason)
		case kvdelta.OpStored:
			parent, hasParent := op.Parent, op.HasParent
			for _, id := range op.IDs {
				c := r.count[id]
				r.count[id] = c + 1
				if c == 0 {
					r.emitStored(parent, id, hasParent)
				}
				parent, hasParent = id, true
			}
		case kvdelta.OpRemoved:
			for _, id := range op.IDs {
				r.dec(id)
			}
		}
	}
	return r.ops[:r.nops], st
}

// ClearRank empties rank's state and returns the ops that change the union:
// the rank's identities that no other rank holds leave (an OpCleared with
// reason when none is left at all).
func (r *Ranks) ClearRank(rank int, reason kvdelta.Reason) []kvdelta.Op {
	s := r.states[rank]
	r.nops = 0
	if r.count == nil {
		s.Clear()
		r.next(kvdelta.OpCleared).Reason = reason
		return r.ops[:r.nops]
	}
	r.prev = s.AppendIDs(r.prev[:0])
	s.Clear()
	r.drop(r.prev, reason)
	return r.ops[:r.nops]
}

// drop takes one rank's hold of ids away.
func (r *Ranks) drop(ids []uint64, reason kvdelta.Reason) {
	for _, id := range ids {
		r.dec(id)
	}
	if len(r.count) == 0 {
		// Nothing left anywhere: one clear says it shorter, and also drops
		// the receiver's speculative entries as a single rank's clear does.
		r.nops = 0
		r.next(kvdelta.OpCleared).Reason = reason
	}
}

func (r *Ranks) dec(id uint64) {
	switch c := r.count[id]; {
	case c > 1:
		r.count[id] = c - 1
	case c == 1:
		delete(r.count, id)
		if op := r.last(); op != nil && op.Kind == kvdelta.OpRemoved {
			op.IDs = append(op.IDs, id)
			return
		}
		op := r.next(kvdelta.OpRemoved)
		op.IDs = append(op.IDs, id)
	}
}

func (r *Ranks) next(kind kvdelta.OpKind) *kvdelta.Op {
	if r.nops == len(r.ops) {
		r.ops = append(r.ops, kvdelta.Op{})
	}
	op := &r.ops[r.nops]
	r.nops++
	*op = kvdelta.Op{Kind: kind, IDs: op.IDs[:0]}
	return op
}

func (r *Ranks) last() *kvdelta.Op {
	if r.nops == 0 {
		return nil
	}
	return &r.ops[r.nops-1]
}

func (r *Ranks) emitStored(parent, id uint64, hasParent bool) {
	if op := r.last(); op != nil && op.Kind == kvdelta.OpStored && hasParent && op.IDs[len(op.IDs)-1] == parent {
		op.IDs = append(op.IDs, id)
		return
	}
	op := r.next(kvdelta.OpStored)
	op.HasParent = hasParent
	if hasParent {
		op.Parent = parent
	}
	op.IDs = append(op.IDs, id)
}
