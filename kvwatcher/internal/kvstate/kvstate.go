// Package kvstate mirrors one provider's KV cache from its vLLM KV events:
// it maps each engine block hash to rolter's own block identity
// (rolter.dev/pkg/kvindex), keeps the set of resident identities capped at
// a maximum with eviction, and turns every batch into the kvdelta ops that
// change that set.
//
// # Identity
//
// A BlockStored run's identities are chained from the identity of its
// parent block, found through the engine-hash map (vLLM sends the parent's
// engine hash); a run without a parent starts at the seed of its model (the
// provider's model, or the LoRA adapter named in the event). A run whose
// parent is unknown (stored before the watcher joined, or evicted from the
// state) cannot be placed and is skipped, except a parent hash of 0 naming
// no block, which starts a chain like vLLM's None: llm-d's inference
// simulator sends 0 for a sequence's first block in its array format
// (llm-d/llm-d-inference-sim pkg/kv-cache/kv_cache_sender.go, v0.10.2-41,
// ParentHash = kvblock.EmptyBlockHash), and llm-d's consumer treats 0 as no
// parent (llm-d/llm-d-kv-cache pkg/kvevents/pool.go, commit 7be76e1:
// "if ev.ParentHash != 0"). The rest of a run is skipped from a block whose extra_keys carry anything but the LoRA name (a cache salt,
// multimodal inputs: a plain request can never hit such blocks). Only GPU
// blocks of full-attention-like KV-cache groups are indexed.
//
// # Concurrency
//
// A State is not safe for concurrent use: one goroutine (the provider's
// watcher) owns it.
package kvstate

import (
	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/kvevents"
	"rolter.dev/pkg/kvindex"
)

// Stats counts what Apply did, by kind; Add accumulates.
type Stats struct {
	// Stored, Removed and Cleared count the events applied.
	Stored, Removed, Cleared int
	// StoredBlocks counts blocks that got an identity.
	StoredBlocks int
	// SkippedMedium counts BlockStored events of another tier than GPU.
	SkippedMedium int
	// SkippedKind counts BlockStored events of a KV-cache group that is
	// not full attention (sliding window, mamba, ...).
	SkippedKind int
	// SkippedParent counts runs whose parent block is unknown.
	SkippedParent int
	// SkippedExtraKeys counts runs cut at a block with extra keys.
	SkippedExtraKeys int
	// SkippedLoRA counts runs of a LoRA adapter known only by its int id.
	SkippedLoRA int
	// SkippedInvalid counts BlockStored events with a block size below 1.
	SkippedInvalid int
	// UnknownRemovals counts removed hashes that were not in the state.
	UnknownRemovals int
	// Evictions counts blocks dropped to keep the state within MaxBlocks.
	Evictions int
}

// Add adds o to s.
func (s *Stats) Add(o Stats) {
	s.Stored += o.Stored
	s.Removed += o.Removed
	s.Cleared += o.Cleared
	s.StoredBlocks += o.StoredBlocks
	s.SkippedMedium += o.SkippedMedium
	s.SkippedKind += o.SkippedKind
	s.SkippedParent += o.SkippedParent
	s.SkippedExtraKeys += o.SkippedExtraKeys
	s.SkippedLoRA += o.SkippedLoRA
	s.SkippedInvalid += o.SkippedInvalid
	s.UnknownRemovals += o.UnknownRemovals
	s.Evictions += o.Evictions
}

const none = -1

// node is one engine block: its hash, its identity, how many times the
// engine holds it (vLLM can hold two blocks with the same hash, and removes
// them one by one), and its place in insertion order.
type node struct {
	engine, id uint64
	refs       int32
	prev, next int32
}

// State is one provider's mirrored KV cache. The zero value is not usable:
// call [New].
type State struct {
	model     string
	seed      uint64
	maxBlocks int
	blockSize int

	engine     map[uint64]int32 // engine hash → node
	ids        map[uint64]int32 // identity → nodes mapping to it
	nodes      []node
	free       []int32
	head, tail int32 // insertion order, oldest first

	loraSeeds map[string]uint64
	ops       []kvdelta.Op
	nops      int
}

// New returns an empty state for a provider serving model (the name its
// blocks' identities are seeded with, see kvindex.Seed), holding at most
// maxBlocks blocks (no cap when maxBlocks < 1).
func New(model string, maxBlocks int) *State {
	return &State{
		model: model, seed: kvindex.Seed(model), maxBlocks: maxBlocks,
		engine: map[uint64]int32{}, ids: map[uint64]int32{},
		head: none, tail: none, loraSeeds: map[string]uint64{},
	}
}

// Len returns the number of resident identities.
func (s *State) Len() int { return len(s.ids) }

// BlockSize returns the block size of the last stored event (0 before
// any).
func (s *State) BlockSize() int { return s.blockSize }

// AppendIDs appends the resident identities to dst, in no particular order.
func (s *State) AppendIDs(dst []uint64) []uint64 {
	for id := range s.ids {
		dst = append(dst, id)
	}
	return dst
}

// Contains reports whether id is resident.
func (s *State) Contains(id uint64) bool { _, ok := s.ids[id]; return ok }

// Clear empties the state (the block size is kept).
func (s *State) Clear() {
	clear(s.engine)
	clear(s.ids)
	s.nodes = s.nodes[:0]
	s.free = s.free[:0]
	s.head, s.tail = none, none
}

// Apply applies events in order and returns the ops that take a receiver's
// resident set from before to after, and what was done. The ops (and their
// ID slices) are valid until the next call of Apply; an empty result means
// the resident set did not change.
func (s *State) Apply(events []kvevents.Event) ([]kvdelta.Op, Stats) {
	s.resetOps()
	var st Stats
	for _, ev := range events {
		switch ev := ev.(type) {
		case *kvevents.BlockStored:
			s.stored(ev, &st)
		case *kvevents.BlockRemoved:
			st.Removed++
			for _, h := range ev.BlockHashes {
				if id, gone, ok := s.remove(h.Uint64()); !ok {
					st.UnknownRemovals++
				} else if gone {
					s.emitRemoved(id)
				}
			}
		case *kvevents.AllBlocksCleared:
			st.Cleared++
			s.Clear()
			s.nops = 0 // what came before is moot
			s.emitCleared(kvdelta.ReasonEngine)
		}
	}
	if s.maxBlocks > 0 {
		for len(s.engine) > s.maxBlocks && s.head != none {
			st.Evictions++
			if id, gone := s.drop(s.head); gone {
				s.emitRemoved(id)
			}
		}
	}
	return s.ops[:s.nops], st
}

// indexedKinds are the KV-cache group kinds whose blocks a prefix lookup can
// hit (llm-d indexes the same ones).
func indexedKind(k string) bool {
	return k == "full_attention" || k == "mla_attention" || k == "sink_full_attention"
}

func (s *State) stored(ev *kvevents.BlockStored, st *Stats) {
	st.Stored++
	if ev.Medium.Valid && ev.Medium.V != "GPU" {
		st.SkippedMedium++
		return
	}
	if ev.KVCacheSpecKind.Valid && !indexedKind(ev.KVCacheSpecKind.V) {
		st.SkippedKind++
		return
	}
	if ev.BlockSize < 1 {
		st.SkippedInvalid++
		return
	}
	var parent uint64
	lora := ""
	switch {
	case ev.LoRAName.Valid && ev.LoRAName.V != "":
		lora = ev.LoRAName.V
	case ev.LoRAID.Valid:
		st.SkippedLoRA++
		return
	}
	hasParent := ev.ParentBlockHash.Valid
	if hasParent {
		idx, ok := s.engine[ev.ParentBlockHash.V.Uint64()]
		switch {
		case ok:
			parent = s.nodes[idx].id
		case ev.ParentBlockHash.V.Uint64() == 0:
			// 0 naming no block is "no parent": llm-d's simulator writes
			// it for a sequence's first block in its array format, and
			// llm-d's consumer reads it so (see the package comment).
			hasParent = false
		default:
			st.SkippedParent++
			return
		}
	}
	switch {
	case hasParent:
	case lora != "":
		parent = s.loraSeed(lora)
	default:
		parent = s.seed
	}
	s.blockSize = ev.BlockSize
	n := min(len(ev.BlockHashes), len(ev.TokenIDs)/ev.BlockSize)
	for i := range n {
		if i < len(ev.ExtraKeys) && ev.ExtraKeys[i] != nil && !loraOnly(ev.ExtraKeys[i], lora) {
			st.SkippedExtraKeys++
			return
		}
		id := kvindex.Chain(parent, ev.TokenIDs[i*ev.BlockSize:(i+1)*ev.BlockSize])
		if s.insert(ev.BlockHashes[i].Uint64(), id) {
			s.emitStored(parent, id, i > 0 || hasParent)
		}
		st.StoredBlocks++
		parent = id
	}
}

func (s *State) loraSeed(name string) uint64 {
	if v, ok := s.loraSeeds[name]; ok {
		return v
	}
	v := kvindex.Seed(name)
	if len(s.loraSeeds) < 1024 {
		s.loraSeeds[name] = v
	}
	return v
}

// loraOnly reports whether an extra key holds nothing but the LoRA name
// (vLLM puts the adapter's name first in every block's extra keys).
func loraOnly(k kvevents.ExtraKey, lora string) bool {
	if lora == "" {
		return false
	}
	v, err := k.Value()
	if err != nil {
		return false
	}
	list, ok := v.([]any)
	if !ok || len(list) != 1 {
		return false
	}
	name, ok := list[0].(string)
	return ok && name == lora
}

// insert records engine block h with identity id; it reports whether id
// became resident.
func (s *State) insert(h, id uint64) bool {
	if idx, ok := s.engine[h]; ok {
		n := &s.nodes[idx]
		if n.id == id {
			n.refs++
			return false
		}
		// The engine reused a hash for other content: forget the old.
		old, gone := s.drop(idx)
		if gone {
			s.emitRemoved(old)
		}
	}
	var idx int32
	if k := len(s.free); k > 0 {
		idx = s.free[k-1]
		s.free = s.free[:k-1]
	} else {
		idx = int32(len(s.nodes))
		s.nodes = append(s.nodes, node{})
	}
	s.nodes[idx] = node{engine: h, id: id, refs: 1, prev: s.tail, next: none}
	if s.tail != none {
		s.nodes[s.tail].next = idx
	} else {
		s.head = idx
	}
	s.tail = idx
	s.engine[h] = idx
	s.ids[id]++
	return s.ids[id] == 1
}

// remove drops one reference to engine block h; it reports the block's
// identity, whether that identity left the resident set, and whether h was
// known.
func (s *State) remove(h uint64) (id uint64, gone, ok bool) {
	idx, ok := s.engine[h]
	if !ok {
		return 0, false, false
	}
	n := &s.nodes[idx]
	if n.refs > 1 {
		n.refs--
		return n.id, false, true
	}
	id, gone = s.drop(idx)
	return id, gone, true
}

// drop removes node idx whatever its references.
func (s *State) drop(idx int32) (id uint64, gone bool) {
	n := s.nodes[idx]
	if n.prev != none {
		s.nodes[n.prev].next = n.next
	} else {
		s.head = n.next
	}
	if n.next != none {
		s.nodes[n.next].prev = n.prev
	} else {
		s.tail = n.prev
	}
	delete(s.engine, n.engine)
	s.free = append(s.free, idx)
	if c := s.ids[n.id]; c > 1 {
		s.ids[n.id] = c - 1
		return n.id, false
	}
	delete(s.ids, n.id)
	return n.id, true
}

func (s *State) resetOps() { s.nops = 0 }

// next returns the next op slot, reusing its ID slice.
func (s *State) next(kind kvdelta.OpKind) *kvdelta.Op {
	if s.nops == len(s.ops) {
		s.ops = append(s.ops, kvdelta.Op{})
	}
	op := &s.ops[s.nops]
	s.nops++
	*op = kvdelta.Op{Kind: kind, IDs: op.IDs[:0]}
	return op
}

func (s *State) last() *kvdelta.Op {
	if s.nops == 0 {
		return nil
	}
	return &s.ops[s.nops-1]
}

func (s *State) emitStored(parent, id uint64, hasParent bool) {
	if op := s.last(); op != nil && op.Kind == kvdelta.OpStored && hasParent && op.IDs[len(op.IDs)-1] == parent {
		op.IDs = append(op.IDs, id)
		return
	}
	op := s.next(kvdelta.OpStored)
	op.Parent, op.HasParent = parent, hasParent
	if !hasParent {
		op.Parent = 0
	}
	op.IDs = append(op.IDs, id)
}

func (s *State) emitRemoved(id uint64) {
	if op := s.last(); op != nil && op.Kind == kvdelta.OpRemoved {
		op.IDs = append(op.IDs, id)
		return
	}
	op := s.next(kvdelta.OpRemoved)
	op.IDs = append(op.IDs, id)
}

func (s *State) emitCleared(r kvdelta.Reason) {
	op := s.next(kvdelta.OpCleared)
	op.Reason = r
}
