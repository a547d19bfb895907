package kvstate_test

import (
	"encoding/hex"
	"reflect"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"rolter.dev/kvwatcher/internal/kvstate"
	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/kvevents"
	"rolter.dev/pkg/kvindex"
)

const (
	model = "sim-model"
	bs    = 4
)

func tokens(n int, base uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = base + uint32(i)
	}
	return t
}

func hashes(ids ...uint64) []kvevents.Hash {
	out := make([]kvevents.Hash, len(ids))
	for i, id := range ids {
		out[i] = kvevents.UintHash(id)
	}
	return out
}

func stored(engine []uint64, parent *uint64, toks []uint32) *kvevents.BlockStored {
	ev := &kvevents.BlockStored{BlockHashes: hashes(engine...), TokenIDs: toks, BlockSize: bs, Medium: kvevents.Some("GPU")}
	if parent != nil {
		ev.ParentBlockHash = kvevents.Some(kvevents.UintHash(*parent))
	}
	return ev
}

func removed(engine ...uint64) *kvevents.BlockRemoved {
	return &kvevents.BlockRemoved{BlockHashes: hashes(engine...)}
}

func ptr[T any](v T) *T { return &v }

// cloneOps copies ops out of the state's reused buffers.
func cloneOps(ops []kvdelta.Op) []kvdelta.Op {
	out := make([]kvdelta.Op, len(ops))
	for i, op := range ops {
		if len(op.IDs) == 0 {
			op.IDs = nil
		} else {
			op.IDs = slices.Clone(op.IDs)
		}
		out[i] = op
	}
	return out
}

func TestIdentitiesMatchTheDataPlane(t *testing.T) {
	s := kvstate.New(model, 0)
	toks := tokens(4*bs, 100)
	want := kvindex.Identities(kvindex.Seed(model), toks, bs)

	// The first two blocks, then the next two as a continuation run.
	ops, st := s.Apply([]kvevents.Event{stored([]uint64{11, 12}, nil, toks[:2*bs])})
	if got := cloneOps(ops); !reflect.DeepEqual(got, []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: want[:2]}}) {
		t.Fatalf("first run: ops %+v, want stored %v", got, want[:2])
	}
	if st.Stored != 1 || st.StoredBlocks != 2 {
		t.Errorf("stats %+v", st)
	}
	ops, _ = s.Apply([]kvevents.Event{stored([]uint64{13, 14}, ptr[uint64](12), toks[2*bs:])})
	wantOps := []kvdelta.Op{{Kind: kvdelta.OpStored, HasParent: true, Parent: want[1], IDs: want[2:]}}
	if got := cloneOps(ops); !reflect.DeepEqual(got, wantOps) {
		t.Fatalf("continuation: ops %+v, want %+v", got, wantOps)
	}
	for i, id := range want {
		if !s.Contains(id) {
			t.Errorf("identity %d not resident", i)
		}
	}
	if s.Len() != 4 || s.BlockSize() != bs {
		t.Errorf("Len %d BlockSize %d", s.Len(), s.BlockSize())
	}
}

// llmdSimArrayStored is one batch as llm-d's inference simulator sends it in
// its default array format (llm-d/llm-d-inference-sim
// pkg/kv-cache/kv_cache_sender.go, v0.10.2-41: msgpackEventBatch and
// msgpackBlockStoredEvent, as_array, encoded by vmihailenco/msgpack v5.4.1):
// ts 1700000000.5, BlockStored{hashes 0x0123456789ABCDEF and
// 0xFEDCBA9876543210, parent_block_hash uint64 0 (the first block of a
// sequence), tokens 1..8 as uint32, block_size 4, lora_id nil, medium "GPU",
// lora_name nil, extra_keys nil}, rank 0. Produced by a program declaring
// those two structs with these values.
const llmdSimArrayStored = "93cb41d954fc402000009199ab426c6f636b53746f72656492cf0123456789abcdefcffedcba9876543210" +
	"cf000000000000000098ce00000001ce00000002ce00000003ce00000004ce00000005ce00000006ce00000007ce0000000804c0a3475055c0c000"

// TestLLMDSimulatorRootBlocks: the simulator's first blocks (parent 0) are
// indexed as the start of a chain, with the identities the data plane
// computes for the same tokens.
func TestLLMDSimulatorRootBlocks(t *testing.T) {
	payload, err := hex.DecodeString(llmdSimArrayStored)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kvevents.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := b.Events[0].(*kvevents.BlockStored)
	if len(b.Events) != 1 || !ok || !ev.ParentBlockHash.Valid || ev.ParentBlockHash.V.Uint64() != 0 {
		t.Fatalf("decoded %+v", b.Events)
	}
	s := kvstate.New(model, 100)
	ops, st := s.Apply(b.Events)
	want := kvindex.Identities(kvindex.Seed(model), tokens(2*bs, 1), bs)
	if got := cloneOps(ops); !reflect.DeepEqual(got, []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: want}}) {
		t.Fatalf("ops %+v, want one root run %x (stats %+v)", got, want, st)
	}
	if st.SkippedParent != 0 || s.Len() != 2 {
		t.Fatalf("stats %+v, len %d", st, s.Len())
	}
}

func TestApply(t *testing.T) {
	toks := tokens(2*bs, 1)
	root := kvindex.Identities(kvindex.Seed(model), toks, bs)
	lora := kvindex.Identities(kvindex.Seed("my-adapter"), toks, bs)
	loraKey, _ := msgpack.Marshal([]any{"my-adapter"})
	saltKey, _ := msgpack.Marshal([]any{"salt-123"})

	tests := []struct {
		name      string
		maxBlocks int
		batches   [][]kvevents.Event
		wantOps   []kvdelta.Op // of the last batch
		wantLen   int
		check     func(t *testing.T, st kvstate.Stats)
	}{
		{
			name:    "removal removes, unknown removal is counted",
			batches: [][]kvevents.Event{{stored([]uint64{1, 2}, nil, toks)}, {removed(2, 99)}},
			wantOps: []kvdelta.Op{{Kind: kvdelta.OpRemoved, IDs: root[1:]}},
			wantLen: 1,
			check: func(t *testing.T, st kvstate.Stats) {
				if st.UnknownRemovals != 1 || st.Removed != 1 {
					t.Errorf("stats %+v", st)
				}
			},
		},
		{
			name:    "unknown parent skips the run",
			batches: [][]kvevents.Event{{stored([]uint64{5}, ptr[uint64](4), toks[:bs])}},
			wantLen: 0,
			check: func(t *testing.T, st kvstate.Stats) {
				if st.SkippedParent != 1 {
					t.Errorf("stats %+v", st)
				}
			},
		},
		{
			name:    "parent 0 naming no block starts a chain",
			batches: [][]kvevents.Event{{stored([]uint64{1, 2}, ptr[uint64](0), toks)}},
			wantOps: []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: root}},
			wantLen: 2,
			check: func(t *testing.T, st kvstate.Stats) {
				if st.SkippedParent != 0 {
					t.Errorf("stats %+v", st)
				}
			},
		},
		{
			name: "parent 0 naming a known block chains from it",
			batches: [][]kvevents.Event{
				{stored([]uint64{0}, nil, toks[:bs])},
				{stored([]uint64{2}, ptr[uint64](0), toks[bs:])},
			},
			wantOps: []kvdelta.Op{{Kind: kvdelta.OpStored, HasParent: true, Parent: root[0], IDs: root[1:]}},
			wantLen: 2,
		},
		{
			name: "a hash held twice leaves after its second removal",
			batches: [][]kvevents.Event{
				{stored([]uint64{1}, nil, toks[:bs]), stored([]uint64{1}, nil, toks[:bs])},
				{removed(1)},
			},
			wantLen: 1,
		},
		{
			name: "AllBlocksCleared drops the state and earlier ops of the batch",
			batches: [][]kvevents.Event{
				{stored([]uint64{1}, nil, toks[:bs])},
				{stored([]uint64{2}, ptr[uint64](1), toks[bs:]), &kvevents.AllBlocksCleared{}},
			},
			wantOps: []kvdelta.Op{{Kind: kvdelta.OpCleared, Reason: kvdelta.ReasonEngine}},
			wantLen: 0,
		},
		{
			name:      "max_blocks evicts the oldest",
			maxBlocks: 1,
			batches:   [][]kvevents.Event{{stored([]uint64{1, 2}, nil, toks)}},
			wantOps:   []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: root}, {Kind: kvdelta.OpRemoved, IDs: root[:1]}},
			wantLen:   1,
			check: func(t *testing.T, st kvstate.Stats) {
				if st.Evictions != 1 {
					t.Errorf("stats %+v", st)
				}
			},
		},
		{
			name: "other tiers and kinds are not indexed",
			batches: [][]kvevents.Event{{
				&kvevents.BlockStored{BlockHashes: hashes(1), TokenIDs: toks[:bs], BlockSize: bs, Medium: kvevents.Some("CPU")},
				&kvevents.BlockStored{BlockHashes: hashes(2), TokenIDs: toks[:bs], BlockSize: bs, KVCacheSpecKind: kvevents.Some("sliding_window")},
			}},
			wantLen: 0,
			check: func(t *testing.T, st kvstate.Stats) {
				if st.SkippedMedium != 1 || st.SkippedKind != 1 {
					t.Errorf("stats %+v", st)
				}
			},
		},
		{
			name: "a LoRA adapter's blocks chain from the adapter's seed",
			batches: [][]kvevents.Event{{
				&kvevents.BlockStored{BlockHashes: hashes(1, 2), TokenIDs: toks, BlockSize: bs, LoRAName: kvevents.Some("my-adapter"),
					ExtraKeys: []kvevents.ExtraKey{loraKey, loraKey}},
			}},
			wantOps: []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: lora}},
			wantLen: 2,
		},
		{
			name: "a salted block cuts the run",
			batches: [][]kvevents.Event{{
				&kvevents.BlockStored{BlockHashes: hashes(1, 2), TokenIDs: toks, BlockSize: bs, ExtraKeys: []kvevents.ExtraKey{nil, saltKey}},
			}},
			wantOps: []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: root[:1]}},
			wantLen: 1,
			check: func(t *testing.T, st kvstate.Stats) {
				if st.SkippedExtraKeys != 1 {
					t.Errorf("stats %+v", st)
				}
			},
		},
		{
			name:    "stored then removed in one batch keeps the order",
			batches: [][]kvevents.Event{{stored([]uint64{1}, nil, toks[:bs]), removed(1)}},
			wantOps: []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: root[:1]}, {Kind: kvdelta.OpRemoved, IDs: root[:1]}},
			wantLen: 0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := kvstate.New(model, tc.maxBlocks)
			var ops []kvdelta.Op
			var st kvstate.Stats
			for _, b := range tc.batches {
				var bst kvstate.Stats
				ops, bst = s.Apply(b)
				st.Add(bst)
			}
			if got := cloneOps(ops); len(got) != len(tc.wantOps) || (len(got) > 0 && !reflect.DeepEqual(got, tc.wantOps)) {
				t.Errorf("ops %+v, want %+v", got, tc.wantOps)
			}
			if s.Len() != tc.wantLen {
				t.Errorf("Len = %d, want %d", s.Len(), tc.wantLen)
			}
			if tc.check != nil {
				tc.check(t, st)
			}
		})
	}
}

func BenchmarkApply(b *testing.B) {
	// Runs of 8 blocks of 16 tokens each, continuing one long chain, with
	// removals keeping the state at 100k blocks.
	const block, run = 16, 8
	s := kvstate.New(model, 100_000)
	toks := tokens(block*run, 7)
	var engine uint64
	var parent *uint64
	b.ReportAllocs()
	for b.Loop() {
		hs := make([]uint64, run)
		for i := range hs {
			engine++
			hs[i] = engine
		}
		ev := &kvevents.BlockStored{BlockHashes: hashes(hs...), TokenIDs: toks, BlockSize: block, Medium: kvevents.Some("GPU")}
		if parent != nil {
			ev.ParentBlockHash = kvevents.Some(kvevents.UintHash(*parent))
		}
		s.Apply([]kvevents.Event{ev})
		parent = &hs[run-1]
	}
	b.ReportMetric(float64(b.N*run)/b.Elapsed().Seconds(), "blocks/s")
}

// FuzzApply feeds decoded payloads to a small state: whatever the engine
// sends, Apply never panics, stays within max_blocks, and a snapshot of the
// state equals the result of applying the ops it emitted.
func FuzzApply(f *testing.F) {
	toks := tokens(3*bs, 9)
	for _, events := range [][]kvevents.Event{
		{stored([]uint64{1, 2}, nil, toks[:2*bs]), stored([]uint64{3}, ptr[uint64](2), toks[2*bs:])},
		{removed(2, 3), &kvevents.AllBlocksCleared{}},
		{stored([]uint64{1}, nil, toks[:bs]), stored([]uint64{1}, nil, toks[bs:2*bs])},
	} {
		for _, l := range []kvevents.Layout{kvevents.LayoutArray, kvevents.LayoutMap, kvevents.LayoutV09} {
			b, err := kvevents.Encode(&kvevents.Batch{TS: 1, Events: events, DataParallelRank: kvevents.Some[int64](0)}, l)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b, b)
		}
	}
	f.Fuzz(func(t *testing.T, p1, p2 []byte) {
		s := kvstate.New(model, 4)
		mirror := map[uint64]bool{}
		for _, p := range [][]byte{p1, p2, p1} {
			b, err := kvevents.Decode(p)
			if err != nil {
				continue
			}
			ops, _ := s.Apply(b.Events)
			for _, op := range ops {
				switch op.Kind {
				case kvdelta.OpStored:
					for _, id := range op.IDs {
						mirror[id] = true
					}
				case kvdelta.OpRemoved:
					for _, id := range op.IDs {
						delete(mirror, id)
					}
				case kvdelta.OpCleared:
					clear(mirror)
				}
			}
			if s.Len() > 4 {
				t.Fatalf("Len %d over max_blocks 4", s.Len())
			}
			got := s.AppendIDs(nil)
			if len(got) != len(mirror) {
				t.Fatalf("state has %d ids, its ops %d", len(got), len(mirror))
			}
			for _, id := range got {
				if !mirror[id] {
					t.Fatalf("id %x resident but never published", id)
				}
			}
		}
	})
}
