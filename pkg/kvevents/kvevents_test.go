package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The values the vectors encode (kv-events.md §6).
const (
	vecTS = 1700000000.5
	vecH1 = 0x0123456789ABCDEF
	vecH2 = 0xFEDCBA9876543210
)

var vecTokens = []uint32{1, 2, 3, 4, 5, 6, 7, 8}

// TestVectors decodes every msgspec-encoded vector, checks it against the
// generic value msgspec decoded, and re-encodes it: the bytes must be the
// vector's bytes exactly.
func TestVectors(t *testing.T) {
	vecs := loadVectors(t)
	for _, name := range sortedKeys(vecs) {
		v := vecs[name]
		t.Run(name, func(t *testing.T) {
			raw := unhex(t, v.Hex)
			if v.Len != 0 && len(raw) != v.Len {
				t.Fatalf("hex has %d bytes, vector says %d", len(raw), v.Len)
			}
			b, err := Decode(raw)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if b.UnknownEvents+b.InvalidEvents+b.UnknownFields != 0 {
				t.Errorf("skipped: unknown events %d, invalid %d, unknown fields %d", b.UnknownEvents, b.InvalidEvents, b.UnknownFields)
			}
			want := parseGeneric(t, v.Generic)
			if got := toGeneric(t, b, b.Layout); !reflect.DeepEqual(got, want) {
				t.Errorf("decoded value\n got %v\nwant %v", got, want)
			}
			enc, err := Encode(b, b.Layout)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if !bytes.Equal(enc, raw) {
				t.Errorf("re-encoded bytes differ\n got %x\nwant %x", enc, raw)
			}
		})
	}
}

// TestVectorValues checks the typed values of the vectors of vectors.json,
// generation by generation.
func TestVectorValues(t *testing.T) {
	vecs := loadVectors(t)
	dec := func(name string) *Batch {
		t.Helper()
		v, ok := vecs[name]
		if !ok {
			t.Fatalf("no vector %s", name)
		}
		b, err := Decode(unhex(t, v.Hex))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b.TS != vecTS || len(b.Events) != 1 {
			t.Fatalf("%s: ts %v, %d events", name, b.TS, len(b.Events))
		}
		return b
	}
	hashes := []Hash{UintHash(vecH1), UintHash(vecH2)}

	// G0: vLLM 0.9.0, 2-element batch, 6-element BlockStored.
	b := dec("A0_v0.8_array_no_dp/BlockStored")
	if b.DataParallelRank.Valid || b.Layout != (Layout{Form: FormArray, NoRank: true, StoredLen: 6}) {
		t.Errorf("A0 batch: rank %v, layout %+v", b.DataParallelRank, b.Layout)
	}
	want := &BlockStored{BlockHashes: hashes, TokenIDs: vecTokens, BlockSize: 4}
	if got := b.Events[0]; !reflect.DeepEqual(got, want) {
		t.Errorf("A0 BlockStored = %+v, want %+v", got, want)
	}
	b = dec("A0_v0.8_array_no_dp/BlockRemoved")
	if got, want := b.Events[0], (&BlockRemoved{BlockHashes: hashes}); !reflect.DeepEqual(got, want) || b.Layout.RemovedLen != 2 {
		t.Errorf("A0 BlockRemoved = %+v (layout %+v), want %+v", got, b.Layout, want)
	}
	b = dec("A0_v0.8_array_no_dp/AllBlocksCleared")
	if _, ok := b.Events[0].(*AllBlocksCleared); !ok {
		t.Errorf("A0 AllBlocksCleared = %T", b.Events[0])
	}

	// G6: 12-element BlockStored with realistic values.
	b = dec("A4_full_array_realistic/BlockStored")
	if b.DataParallelRank != Some[int64](0) || b.Layout != (Layout{Form: FormArray, StoredLen: 12}) {
		t.Errorf("A4 batch: rank %v, layout %+v", b.DataParallelRank, b.Layout)
	}
	full := &BlockStored{
		BlockHashes: hashes, TokenIDs: vecTokens, BlockSize: 4,
		Medium: Some("GPU"), ExtraKeys: []ExtraKey{nil, nil}, GroupIdx: Some[int64](0),
		KVCacheSpecKind: Some("full_attention"),
	}
	if got := b.Events[0]; !reflect.DeepEqual(got, full) {
		t.Errorf("A4 BlockStored = %+v, want %+v", got, full)
	}
	b = dec("A4_full_array_realistic/BlockRemoved")
	removed := &BlockRemoved{BlockHashes: hashes, Medium: Some("GPU"), GroupIdx: Some[int64](0)}
	if got := b.Events[0]; !reflect.DeepEqual(got, removed) || b.Layout.RemovedLen != 4 {
		t.Errorf("A4 BlockRemoved = %+v (layout %+v), want %+v", got, b.Layout, removed)
	}

	// G7: map events, as vLLM ≥ 0.24 sends them.
	b = dec("M2_map_events_array_batch_realistic/BlockStored")
	if b.Layout != LayoutMap || b.DataParallelRank != Some[int64](0) {
		t.Errorf("M2 batch: rank %v, layout %+v", b.DataParallelRank, b.Layout)
	}
	if got := b.Events[0]; !reflect.DeepEqual(got, full) {
		t.Errorf("M2 BlockStored = %+v, want %+v", got, full)
	}
	b = dec("M2_map_events_array_batch_realistic/BlockRemoved")
	if got := b.Events[0]; !reflect.DeepEqual(got, removed) {
		t.Errorf("M2 BlockRemoved = %+v, want %+v", got, removed)
	}
	b = dec("M2_map_events_array_batch_realistic/AllBlocksCleared")
	if _, ok := b.Events[0].(*AllBlocksCleared); !ok || b.Layout.Form != FormMap {
		t.Errorf("M2 AllBlocksCleared = %T, layout %+v", b.Events[0], b.Layout)
	}
}

// fs is the msgpack fixstr of s, in hex.
func fs(s string) string {
	if len(s) >= 32 {
		panic(s)
	}
	return fmt.Sprintf("%02x", 0xa0|len(s)) + hex.EncodeToString([]byte(s))
}

// Pieces of the vectors' bytes, for the derived vectors below.
var (
	hTS      = "cb41d954fc40200000"
	hHashes  = "92cf0123456789abcdefcffedcba9876543210"
	hTokens  = "980102030405060708"
	hStored  = fs("BlockStored")
	hRemoved = fs("BlockRemoved")
	hCleared = fs("AllBlocksCleared")
	hGPU     = fs("GPU")
	hType    = fs("type")
	// sha256("block1") and sha256("block2") as 32-byte bins.
	hSHA1 = "9a59c5f8229aab55e9f855173ef94485aab8497eea0588f365c871d6d0561722"
	hSHA2 = "6d0b07ee773591f2a1b492d3ca65afdefc90e1cadfcc542a74048bb0ae7daa27"
)

func cat(parts ...string) string { return strings.Join(parts, "") }

// derivedVectors are the generations for which the shared vectors.json has
// no payload, assembled by hand from the same pieces following msgspec's
// rules (kv-events.md §1.2, §6): array_like events write every declared
// field; map events write "type" first, then the fields in declaration
// order, leaving out only defaulted fields that hold None.
func derivedVectors(t testing.TB) []struct {
	name   string
	hex    string
	layout Layout
	want   *Batch
} {
	hashes := []Hash{UintHash(vecH1), UintHash(vecH2)}
	sha1, sha2 := unhex(t, hSHA1), unhex(t, hSHA2)
	rank0, rank1 := Some[int64](0), Some[int64](1)
	stored := func(ev BlockStored) []Event {
		ev.BlockHashes, ev.TokenIDs, ev.BlockSize = hashes, vecTokens, 4
		return []Event{&ev}
	}
	removedGPU := []Event{&BlockRemoved{BlockHashes: hashes, Medium: Some("GPU")}}
	mapStoredMinimal := cat("88", hType, hStored, fs("block_hashes"), hHashes, fs("parent_block_hash"), "c0",
		fs("token_ids"), hTokens, fs("block_size"), "04", fs("lora_id"), "c0", fs("medium"), hGPU, fs("lora_name"), "c0")
	return []struct {
		name   string
		hex    string
		layout Layout
		want   *Batch
	}{
		{"G1 dp rank, no medium", cat("93", hTS, "91", "96", hStored, hHashes, "c0", hTokens, "04", "c0", "00"),
			LayoutDPRank, &Batch{Events: stored(BlockStored{}), DataParallelRank: rank0}},
		{"G1 dp rank BlockRemoved", cat("93", hTS, "91", "92", hRemoved, hHashes, "00"),
			LayoutDPRank, &Batch{Events: []Event{&BlockRemoved{BlockHashes: hashes}}, DataParallelRank: rank0}},
		{"A1 medium", cat("93", hTS, "91", "97", hStored, hHashes, "c0", hTokens, "04", "c0", hGPU, "00"),
			LayoutMedium, &Batch{Events: stored(BlockStored{Medium: Some("GPU")}), DataParallelRank: rank0}},
		{"A1 medium BlockRemoved", cat("93", hTS, "91", "93", hRemoved, hHashes, hGPU, "00"),
			LayoutMedium, &Batch{Events: removedGPU, DataParallelRank: rank0}},
		{"A1 medium AllBlocksCleared", cat("93", hTS, "91", "91", hCleared, "00"),
			Layout{Form: FormArray}, &Batch{Events: []Event{&AllBlocksCleared{}}, DataParallelRank: rank0}},
		{"A2 lora_name", cat("93", hTS, "91", "98", hStored, hHashes, "c0", hTokens, "04", "c0", hGPU, fs("sql-lora"), "00"),
			LayoutLoRAName, &Batch{Events: stored(BlockStored{Medium: Some("GPU"), LoRAName: Some("sql-lora")}), DataParallelRank: rank0}},
		{"G4 extra_keys", cat("93", hTS, "91", "99", hStored, hHashes, "2a", hTokens, "04", "07", hGPU, fs("sql-lora"),
			"92", "91"+fs("sql-lora"), "c0", "00"),
			LayoutExtraKeys, &Batch{Events: stored(BlockStored{
				ParentBlockHash: Some(UintHash(42)), LoRAID: Some[int64](7), Medium: Some("GPU"), LoRAName: Some("sql-lora"),
				ExtraKeys: []ExtraKey{unhex(t, "91"+fs("sql-lora")), nil},
			}), DataParallelRank: rank0}},
		{"G5 group_idx", cat("93", hTS, "91", "9a", hStored, hHashes, "c0", hTokens, "04", "c0", hGPU, "c0", "c0", "01", "00"),
			LayoutGroupIdx, &Batch{Events: stored(BlockStored{Medium: Some("GPU"), GroupIdx: Some[int64](1)}), DataParallelRank: rank0}},
		{"A3 full array minimal", cat("93", hTS, "91", "9c", hStored, hHashes, "c0", hTokens, "04", "c0", hGPU, "c0c0c0c0c0", "00"),
			LayoutArray, &Batch{Events: stored(BlockStored{Medium: Some("GPU")}), DataParallelRank: rank0}},
		{"A3 full array minimal BlockRemoved", cat("93", hTS, "91", "94", hRemoved, hHashes, hGPU, "c0", "00"),
			LayoutArray, &Batch{Events: removedGPU, DataParallelRank: rank0}},
		{"A3 sliding window", cat("93", hTS, "91", "9c", hStored, hHashes, "c0", hTokens, "04", "c0", hGPU, "c0", "c0", "01",
			fs("sliding_window"), "cd1000", "00"),
			LayoutArray, &Batch{Events: stored(BlockStored{Medium: Some("GPU"), GroupIdx: Some[int64](1),
				KVCacheSpecKind: Some("sliding_window"), KVCacheSpecSlidingWindow: Some[int64](4096)}), DataParallelRank: rank0}},
		{"M1 map minimal", cat("93", hTS, "91", mapStoredMinimal, "00"),
			LayoutMap, &Batch{Events: stored(BlockStored{Medium: Some("GPU")}), DataParallelRank: rank0}},
		{"M1 map minimal BlockRemoved", cat("93", hTS, "91", "83", hType, hRemoved, fs("block_hashes"), hHashes, fs("medium"), hGPU, "00"),
			LayoutMap, &Batch{Events: removedGPU, DataParallelRank: rank0}},
		{"M3 map batch (hypothetical)", cat("83", fs("ts"), hTS, fs("events"), "91", mapStoredMinimal, fs("data_parallel_rank"), "00"),
			Layout{Form: FormMap, MapBatch: true}, &Batch{Events: stored(BlockStored{Medium: Some("GPU")}), DataParallelRank: rank0}},
		{"B1 bytes hashes", cat("93", hTS, "91", "88", hType, hStored, fs("block_hashes"), "92c420", hSHA1, "c420", hSHA2,
			fs("parent_block_hash"), "c0", fs("token_ids"), hTokens, fs("block_size"), "04", fs("lora_id"), "c0",
			fs("medium"), hGPU, fs("lora_name"), "c0", "00"),
			LayoutMap, &Batch{Events: []Event{&BlockStored{BlockHashes: []Hash{BytesHash(sha1), BytesHash(sha2)},
				TokenIDs: vecTokens, BlockSize: 4, Medium: Some("GPU")}}, DataParallelRank: rank0}},
		{"B1 bytes hashes BlockRemoved", cat("93", hTS, "91", "83", hType, hRemoved, fs("block_hashes"), "92c420", hSHA1, "c420", hSHA2,
			fs("medium"), hGPU, "00"),
			LayoutMap, &Batch{Events: []Event{&BlockRemoved{BlockHashes: []Hash{BytesHash(sha1), BytesHash(sha2)}, Medium: Some("GPU")}},
				DataParallelRank: rank0}},
		{"N1 newest fields", cat("93", hTS, "91", "8e", hType, hStored, fs("block_hashes"), hHashes, fs("parent_block_hash"), "2a",
			fs("token_ids"), hTokens, fs("block_size"), "04", fs("lora_id"), "c0", fs("medium"), fs("CPU"),
			fs("lora_name"), fs("sql-lora"), fs("extra_keys"), "92", "91"+fs("sql-lora"), "91"+fs("sql-lora"),
			fs("group_idx"), "00", fs("kv_cache_spec_kind"), fs("full_attention"), fs("locality"), fs("LOCAL"),
			fs("ownership"), fs("tier-1"), fs("session_id"), fs("sess-42"), "01"),
			LayoutMap, &Batch{Events: stored(BlockStored{
				ParentBlockHash: Some(UintHash(42)), Medium: Some("CPU"), LoRAName: Some("sql-lora"),
				ExtraKeys: []ExtraKey{unhex(t, "91"+fs("sql-lora")), unhex(t, "91"+fs("sql-lora"))},
				GroupIdx:  Some[int64](0), KVCacheSpecKind: Some("full_attention"),
				Locality: Some("LOCAL"), Ownership: Some("tier-1"), SessionID: Some("sess-42"),
			}), DataParallelRank: rank1}},
		{"N2 STORAGE removal", cat("93", hTS, "91", "84", hType, hRemoved, fs("block_hashes"), hHashes, fs("medium"), fs("STORAGE"),
			fs("locality"), fs("REMOTE"), "01"),
			LayoutMap, &Batch{Events: []Event{&BlockRemoved{BlockHashes: hashes, Medium: Some("STORAGE"), Locality: Some("REMOTE")}},
				DataParallelRank: rank1}},
		{"negative int hashes (Python hash())", cat("92", hTS, "91", "96", hStored, "92d3fffffee08e04fb35fb", "d1fed4", hTokens, "04", "c0"),
			LayoutV09, &Batch{Events: []Event{&BlockStored{
				BlockHashes: []Hash{IntHash(-1234567890123), IntHash(-5)}, ParentBlockHash: Some(IntHash(-300)),
				TokenIDs: vecTokens, BlockSize: 4,
			}}}},
		{"several events, rank 3", cat("93", hTS, "93", "92", hRemoved, "91cd1234", "91", hCleared, "97", hStored, "91cd5678", "cd1234",
			"94cd1000ce00010000cc807f", "04", "c0", hGPU, "03"),
			Layout{Form: FormArray, StoredLen: 7, RemovedLen: 2}, &Batch{Events: []Event{
				&BlockRemoved{BlockHashes: []Hash{UintHash(0x1234)}},
				&AllBlocksCleared{},
				&BlockStored{BlockHashes: []Hash{UintHash(0x5678)}, ParentBlockHash: Some(UintHash(0x1234)),
					TokenIDs: []uint32{0x1000, 0x10000, 0x80, 0x7f}, BlockSize: 4, Medium: Some("GPU")},
			}, DataParallelRank: Some[int64](3)}},
	}
}

// TestDerivedVectors decodes the hand-assembled vectors of the generations
// that vectors.json lacks, and re-encodes them byte for byte.
func TestDerivedVectors(t *testing.T) {
	for _, v := range derivedVectors(t) {
		t.Run(v.name, func(t *testing.T) {
			raw := unhex(t, v.hex)
			b, err := Decode(raw)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			v.want.TS = vecTS
			if !sameBatch(b, v.want) {
				t.Errorf("decoded\n got %s\nwant %s", dump(b), dump(v.want))
			}
			if b.UnknownEvents+b.InvalidEvents+b.UnknownFields != 0 {
				t.Errorf("skipped: unknown events %d, invalid %d, unknown fields %d", b.UnknownEvents, b.InvalidEvents, b.UnknownFields)
			}
			wantLayout := v.layout
			if wantLayout.Form == FormArray { // the layout records only what it saw
				if !hasKind(b, KindBlockStored) {
					wantLayout.StoredLen = 0
				}
				if !hasKind(b, KindBlockRemoved) {
					wantLayout.RemovedLen = 0
				}
			}
			if b.Layout != wantLayout {
				t.Errorf("layout %+v, want %+v", b.Layout, wantLayout)
			}
			for _, l := range []Layout{b.Layout, v.layout} {
				enc, err := Encode(v.want, l)
				if err != nil {
					t.Fatalf("Encode: %v", err)
				}
				if !bytes.Equal(enc, raw) {
					t.Errorf("Encode(layout %+v)\n got %x\nwant %x", l, enc, raw)
				}
			}
		})
	}
}

func hasKind(b *Batch, k Kind) bool {
	return slices.ContainsFunc(b.Events, func(e Event) bool { return e.Kind() == k })
}

func dump(b *Batch) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "ts=%v rank=%v layout=%+v [", b.TS, b.DataParallelRank, b.Layout)
	for _, e := range b.Events {
		fmt.Fprintf(&sb, " %T%+v", e, e)
	}
	sb.WriteString(" ]")
	return sb.String()
}

// TestB1BytesHashKey checks the documented folding of a bytes hash: the
// last 8 bytes big-endian equal the int vLLM sends for the same block.
func TestB1BytesHashKey(t *testing.T) {
	h := BytesHash(unhex(t, hSHA1))
	if h.Uint64() != 0x65c871d6d0561722 || h.Form() != HashBytes || len(h.Bytes()) != 32 {
		t.Errorf("sha256(block1): key %#x, form %v, %d bytes", h.Uint64(), h.Form(), len(h.Bytes()))
	}
	if h == UintHash(0x65c871d6d0561722) {
		t.Error("a bytes hash == the int hash with the same key; == must tell forms apart")
	}
	if got := BytesHash([]byte{1, 2}).Uint64(); got != 0x0102 {
		t.Errorf("short bytes hash key = %#x, want 0x102", got)
	}
	if got := IntHash(-1); got.Uint64() != math.MaxUint64 || got.Form() != HashInt || got.String() != "-1" {
		t.Errorf("IntHash(-1) = %v (%#x, form %v)", got, got.Uint64(), got.Form())
	}
	if IntHash(5) != UintHash(5) {
		t.Error("IntHash(5) != UintHash(5)")
	}
	if got := UintHash(vecH2).String(); got != "18364758544493064720" {
		t.Errorf("String = %s", got)
	}
	if got := BytesHash([]byte{0xab}).String(); got != "0xab" {
		t.Errorf("String = %s", got)
	}
	if UintHash(1).Bytes() != nil {
		t.Error("Bytes of an int hash")
	}
}

// TestIntWidths decodes hashes, tokens, block sizes, ranks and ts written in
// every msgpack width, as other encoders than msgspec may write them.
func TestIntWidths(t *testing.T) {
	cases := []struct {
		hex  string
		want Hash
	}{
		{"05", UintHash(5)},
		{"cc05", UintHash(5)},
		{"cd0005", UintHash(5)},
		{"ce00000005", UintHash(5)},
		{"cf0000000000000005", UintHash(5)},
		{"d005", UintHash(5)},
		{"d10005", UintHash(5)},
		{"d200000005", UintHash(5)},
		{"d30000000000000005", UintHash(5)},
		{"fb", IntHash(-5)},
		{"d0fb", IntHash(-5)},
		{"d1fffb", IntHash(-5)},
		{"d2fffffffb", IntHash(-5)},
		{"d3fffffffffffffffb", IntHash(-5)},
		{"cfffffffffffffffff", UintHash(math.MaxUint64)},
		{"d38000000000000000", IntHash(math.MinInt64)},
		{"c40105", BytesHash([]byte{5})},
		{"c5000105", BytesHash([]byte{5})},
		{"c60000000105", BytesHash([]byte{5})},
	}
	for _, c := range cases {
		// [ts(float32), [[BlockStored, [h], h, [tok...], bs, nil]], rank(int16)]
		raw := unhex(t, cat("93", "ca3f800000", "91", "96", hStored, "91", c.hex, c.hex,
			"94", "01", "cc80", "cd8000", "ce80000000", "d004", "c0", "d10002"))
		b, err := Decode(raw)
		if err != nil {
			t.Fatalf("%s: %v", c.hex, err)
		}
		if len(b.Events) != 1 {
			t.Fatalf("%s: %d events (invalid %d)", c.hex, len(b.Events), b.InvalidEvents)
		}
		ev := b.Events[0].(*BlockStored)
		if ev.BlockHashes[0] != c.want || ev.ParentBlockHash != Some(c.want) {
			t.Errorf("%s: hash %v parent %v, want %v", c.hex, ev.BlockHashes[0], ev.ParentBlockHash, c.want)
		}
		if !slices.Equal(ev.TokenIDs, []uint32{1, 0x80, 0x8000, 0x80000000}) || ev.BlockSize != 4 || b.TS != 1 || b.DataParallelRank != Some[int64](2) {
			t.Errorf("%s: tokens %v, block size %d, ts %v, rank %v", c.hex, ev.TokenIDs, ev.BlockSize, b.TS, b.DataParallelRank)
		}
	}
	// ts as an int.
	b, err := Decode(unhex(t, "92cd0100"+"90"))
	if err != nil || b.TS != 256 || !b.Layout.NoRank {
		t.Errorf("int ts: %v, %+v", err, b)
	}
}

// TestSkipped checks that unknown event types, unknown fields and invalid
// events are skipped and counted without losing the rest of the batch.
func TestSkipped(t *testing.T) {
	good := cat("92", hRemoved, "9101")
	cases := []struct {
		name                     string
		events                   []string // events, hex
		extraBatch               string   // elements after the rank
		unknownEv, invalid, flds int
	}{
		{name: "unknown array tag", events: []string{"93" + fs("BlockInactive") + "9101c0"}, unknownEv: 1},
		{name: "unknown map type", events: []string{"82" + hType + fs("BlockInactive") + fs("block_hashes") + "9101"}, unknownEv: 1},
		{name: "map without type", events: []string{"81" + fs("block_hashes") + "9101"}, unknownEv: 1},
		{name: "tag not a string", events: []string{"9205c0"}, unknownEv: 1},
		{name: "type not a string", events: []string{"81" + hType + "05"}, unknownEv: 1},
		{name: "empty array event", events: []string{"90"}, unknownEv: 1},
		{name: "event is a string", events: []string{fs("BlockStored")}, unknownEv: 1},
		{name: "event is nil", events: []string{"c0"}, unknownEv: 1},
		{name: "unknown map key", events: []string{"83" + hType + hRemoved + fs("block_hashes") + "9101" + fs("future") + "92c0" + fs("x")}, flds: 1},
		{name: "non-string map key", events: []string{"83" + hType + hRemoved + fs("block_hashes") + "9101" + "05c0"}, flds: 1},
		{name: "stored fields on a removal", events: []string{"83" + hType + hRemoved + fs("block_hashes") + "9101" + fs("token_ids") + "9101"}, flds: 1},
		{name: "fields on a clear", events: []string{"82" + hType + hCleared + fs("medium") + hGPU}, flds: 1},
		{name: "array clear with extra", events: []string{"92" + hCleared + "c0"}, flds: 1},
		{name: "array stored past newest", events: []string{cat("dc0011", hStored, "9101", "c0", "9101", "01", "c0", hGPU, "c0", "c0", "00",
			fs("full_attention"), "c0", fs("LOCAL"), "c0", fs("s"), "05", "06")}, flds: 2},
		{name: "removed past newest", events: []string{cat("98", hRemoved, "9101", hGPU, "00", fs("LOCAL"), fs("t"), "c0", "05")}, flds: 2},
		{name: "stored too short", events: []string{cat("94", hStored, "9101", "c0", "9101")}, invalid: 1},
		{name: "removed too short", events: []string{cat("91", hRemoved)}, invalid: 1},
		{name: "string token", events: []string{cat("95", hStored, "9101", "c0", "92"+fs("a")+"01", "01")}, invalid: 1},
		{name: "negative token", events: []string{cat("95", hStored, "9101", "c0", "91ff", "01")}, invalid: 1},
		{name: "token over 32 bits", events: []string{cat("95", hStored, "9101", "c0", "91cf0000000100000000", "01")}, invalid: 1},
		{name: "nil block size", events: []string{cat("95", hStored, "9101", "c0", "9101", "c0")}, invalid: 1},
		{name: "string hash", events: []string{cat("92", hRemoved, "91"+fs("h"))}, invalid: 1},
		{name: "float hash", events: []string{cat("92", hRemoved, "91cb3ff0000000000000")}, invalid: 1},
		{name: "hashes not a list", events: []string{cat("92", hRemoved, "05")}, invalid: 1},
		{name: "nil hashes", events: []string{cat("92", hRemoved, "c0")}, invalid: 1},
		{name: "huge bytes hash", events: []string{cat("92", hRemoved, "91c441", strings.Repeat("00", 65))}, invalid: 1},
		{name: "map removal without hashes", events: []string{"82" + hType + hRemoved + fs("medium") + hGPU}, invalid: 1},
		{name: "medium not a string", events: []string{cat("93", hRemoved, "9101", "05")}, invalid: 1},
		{name: "lora id over int64", events: []string{cat("96", hStored, "9101", "c0", "9101", "01", "cfffffffffffffffff")}, invalid: 1},
		{name: "extra keys not a list", events: []string{cat("99", hStored, "9101", "c0", "9101", "01", "c0", hGPU, "c0", "05")}, invalid: 1},
		{name: "extra batch elements", extraBatch: "c0" + fs("future"), flds: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			events := append([]string{good}, c.events...)
			events = append(events, good)
			n := 3
			if c.extraBatch != "" {
				n = 5 // two extra elements
			}
			raw := unhex(t, cat(fmt.Sprintf("%02x", 0x90|n), hTS, fmt.Sprintf("%02x", 0x90|len(events)), cat(events...), "00", c.extraBatch))
			b, err := Decode(raw)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if b.UnknownEvents != c.unknownEv || b.InvalidEvents != c.invalid || b.UnknownFields != c.flds {
				t.Errorf("unknown events %d, invalid %d, unknown fields %d; want %d, %d, %d",
					b.UnknownEvents, b.InvalidEvents, b.UnknownFields, c.unknownEv, c.invalid, c.flds)
			}
			first, last := b.Events[0], b.Events[len(b.Events)-1]
			want := &BlockRemoved{BlockHashes: []Hash{UintHash(1)}}
			if !reflect.DeepEqual(first, want) || !reflect.DeepEqual(last, want) {
				t.Errorf("events around the skipped one: %s", dump(b))
			}
		})
	}
}

// TestMalformed checks that payloads that are not a batch return an error
// wrapping ErrMalformed.
func TestMalformed(t *testing.T) {
	cases := map[string]string{
		"empty":               "",
		"nil":                 "c0",
		"int":                 "05",
		"one-element batch":   "91" + hTS,
		"ts not a number":     "92" + fs("x") + "90",
		"events not a list":   "93" + hTS + "c0" + "00",
		"rank not an int":     "93" + hTS + "90" + fs("x"),
		"trailing bytes":      "93" + hTS + "90" + "00" + "00",
		"invalid code":        "93" + hTS + "91" + "c1" + "00",
		"array32 too long":    "dd7fffffff" + hTS,
		"map32 too long":      "93" + hTS + "91df7fffffff" + "00",
		"string too long":     "93" + hTS + "91" + "92" + "db7fffffff41" + "00",
		"map batch no events": "81" + fs("ts") + hTS,
		"deep nesting":        "93" + hTS + "91" + "92" + hCleared + strings.Repeat("91", 100) + "c0" + "00",
		"deep nesting in key": "93" + hTS + "91" + "98" + hStored + "9101c09101" + "01c0c0" + "91" + strings.Repeat("91", 100) + "c0" + "00",
		"truncated ext":       "93" + hTS + "91" + "92" + hCleared + "c7ff01" + "00",
	}
	for name, h := range cases {
		_, err := Decode(unhex(t, h))
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
	// Oversized payloads.
	dec := NewDecoder()
	dec.MaxPayload = 16
	if _, err := dec.Decode(make([]byte, 17)); !errors.Is(err, ErrTooLarge) || !errors.Is(err, ErrMalformed) {
		t.Errorf("oversized: %v", err)
	}
	if _, err := Decode(make([]byte, DefaultMaxPayload+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized: %v", err)
	}
	// Every ext form is skippable in an unknown field.
	for _, ext := range []string{"d40100", "d5010000", "d601" + strings.Repeat("00", 4), "d701" + strings.Repeat("00", 8),
		"d801" + strings.Repeat("00", 16), "c70201aaaa", "c8000201aaaa", "c90000000201aaaa"} {
		raw := unhex(t, "93"+hTS+"91"+"92"+hCleared+ext+"00")
		b, err := Decode(raw)
		if err != nil || len(b.Events) != 1 || b.UnknownFields != 1 {
			t.Errorf("ext %s: %v, %+v", ext, err, b)
		}
	}
}

// TestTruncated cuts every vector at every length: each prefix must fail
// (not panic).
func TestTruncated(t *testing.T) {
	payloads := [][]byte{}
	for _, v := range loadVectors(t) {
		payloads = append(payloads, unhex(t, v.Hex))
	}
	for _, v := range derivedVectors(t) {
		payloads = append(payloads, unhex(t, v.hex))
	}
	for _, p := range payloads {
		for n := range len(p) {
			if b, err := Decode(p[:n]); err == nil {
				t.Errorf("prefix %x of %x decoded: %s", p[:n], p, dump(b))
			}
		}
	}
}

// TestRandom feeds random bytes and random mutations of the vectors: no
// panic, and whatever decodes re-encodes to something that decodes the same.
func TestRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seeds := [][]byte{}
	for _, v := range loadVectors(t) {
		seeds = append(seeds, unhex(t, v.Hex))
	}
	for _, v := range derivedVectors(t) {
		seeds = append(seeds, unhex(t, v.hex))
	}
	for i := range 20000 {
		var p []byte
		if i%2 == 0 {
			p = make([]byte, rng.IntN(64))
			for j := range p {
				p[j] = byte(rng.Uint32())
			}
		} else {
			p = bytes.Clone(seeds[rng.IntN(len(seeds))])
			for range 1 + rng.IntN(3) {
				p[rng.IntN(len(p))] = byte(rng.Uint32())
			}
		}
		checkRoundTrip(t, p)
	}
}

// checkRoundTrip decodes p and, if it decodes, checks that re-encoding in a
// lossless layout decodes to the same batch, and that re-encoding in the
// layout found is a fixed point.
func checkRoundTrip(t *testing.T, p []byte) {
	t.Helper()
	b, err := Decode(p)
	if err != nil {
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("Decode(%x): error %v does not wrap ErrMalformed", p, err)
		}
		return
	}
	lossless := []Layout{
		{Form: FormMap, NoRank: b.Layout.NoRank, MapBatch: b.Layout.MapBatch},
		{Form: FormArray, NoRank: b.Layout.NoRank, MapBatch: b.Layout.MapBatch, StoredLen: maxStoredLen, RemovedLen: maxRemovedLen},
	}
	for _, l := range lossless {
		enc, err := Encode(b, l)
		if err != nil {
			t.Fatalf("Encode(%x, %+v): %v", p, l, err)
		}
		b2, err := Decode(enc)
		if err != nil {
			t.Fatalf("Decode(Encode(%x)) = %v (encoded %x)", p, err, enc)
		}
		if !sameBatch(b, b2) {
			t.Fatalf("round trip of %x in %+v:\n got %s\nwant %s", p, l, dump(b2), dump(b))
		}
	}
	enc, err := Encode(b, b.Layout)
	if err != nil {
		if b.Layout.StoredLen > maxArrayLen || b.Layout.RemovedLen > maxArrayLen {
			return // an array32 event longer than Encode writes
		}
		t.Fatalf("Encode(%x, own layout %+v): %v", p, b.Layout, err)
	}
	b2, err := Decode(enc)
	if err != nil {
		t.Fatalf("Decode(Encode(%x, own layout)) = %v", p, err)
	}
	enc2, err := Encode(b2, b.Layout)
	if err != nil || !bytes.Equal(enc, enc2) {
		t.Fatalf("Encode in the decoded layout is not a fixed point for %x: %x then %x (%v)", p, enc, enc2, err)
	}
}

// TestLongArrayEvent re-encodes a BlockStored far longer than any known
// generation: the unknown positions come back as nil.
func TestLongArrayEvent(t *testing.T) {
	raw := unhex(t, cat("93", hTS, "91", "dc0046", hStored, "9101", "c0", "9101", "01", strings.Repeat("c0", 65), "00"))
	b, err := Decode(raw)
	if err != nil || len(b.Events) != 1 || b.Layout.StoredLen != 70 || b.UnknownFields != 70-maxStoredLen {
		t.Fatalf("Decode: %v, %+v", err, b)
	}
	enc, err := Encode(b, b.Layout)
	if err != nil || !bytes.Equal(enc, raw) {
		t.Errorf("Encode: %x, %v", enc, err)
	}
	checkRoundTrip(t, raw)
}

func TestEncodeErrors(t *testing.T) {
	b := &Batch{Events: []Event{&AllBlocksCleared{}}}
	for _, l := range []Layout{{}, {Form: 9}, {Form: FormArray, StoredLen: 4}, {Form: FormArray, RemovedLen: 1}, {Form: FormArray, StoredLen: 1 << 16}} {
		if _, err := Encode(b, l); !errors.Is(err, ErrInvalidBatch) {
			t.Errorf("layout %+v: %v", l, err)
		}
	}
	for _, ev := range []Event{(*BlockStored)(nil), (*BlockRemoved)(nil), nil} {
		if _, err := Encode(&Batch{Events: []Event{ev}}, LayoutMap); !errors.Is(err, ErrInvalidBatch) {
			t.Errorf("event %#v: %v", ev, err)
		}
	}
	// An empty batch needs no form; AppendBatch appends.
	out, err := AppendBatch([]byte{0xff}, &Batch{TS: 1}, Layout{NoRank: true})
	if err != nil || !bytes.Equal(out, unhex(t, "ff92cb3ff000000000000090")) {
		t.Errorf("empty batch: %x, %v", out, err)
	}
}

// TestEncodeWidths checks msgspec's choice of int, string and header forms
// at every boundary.
func TestEncodeWidths(t *testing.T) {
	ints := map[int64]string{
		0: "00", 127: "7f", 128: "cc80", 255: "ccff", 256: "cd0100", 65535: "cdffff", 65536: "ce00010000",
		math.MaxUint32: "ceffffffff", math.MaxUint32 + 1: "cf0000000100000000", math.MaxInt64: "cf7fffffffffffffff",
		-1: "ff", -32: "e0", -33: "d0df", -128: "d080", -129: "d1ff7f", -32768: "d18000", -32769: "d2ffff7fff",
		math.MinInt32: "d280000000", math.MinInt32 - 1: "d3ffffffff7fffffff", math.MinInt64: "d38000000000000000",
	}
	for i, want := range ints {
		if got := hex.EncodeToString(appendInt(nil, i)); got != want {
			t.Errorf("appendInt(%d) = %s, want %s", i, got, want)
		}
	}
	strs := map[int]string{0: "a0", 31: "bf", 32: "d920", 255: "d9ff", 256: "da0100", 65536: "db00010000"}
	for n, want := range strs {
		if got := hex.EncodeToString(appendStr(nil, strings.Repeat("x", n))[:len(want)/2]); got != want {
			t.Errorf("appendStr(len %d) header = %s, want %s", n, got, want)
		}
	}
	bins := map[int]string{0: "c400", 255: "c4ff", 256: "c50100", 65536: "c600010000"}
	for n, want := range bins {
		if got := hex.EncodeToString(appendBin(nil, strings.Repeat("x", n))[:len(want)/2]); got != want {
			t.Errorf("appendBin(len %d) header = %s, want %s", n, got, want)
		}
	}
	hdrs := map[int]string{0: "90", 15: "9f", 16: "dc0010", 65535: "dcffff", 65536: "dd00010000"}
	for n, want := range hdrs {
		if got := hex.EncodeToString(appendArrayHeader(nil, n)); got != want {
			t.Errorf("appendArrayHeader(%d) = %s, want %s", n, got, want)
		}
		wantMap := want
		switch want[:2] {
		case "dc":
			wantMap = "de" + want[2:]
		case "dd":
			wantMap = "df" + want[2:]
		default:
			wantMap = fmt.Sprintf("%02x", 0x80|n)
		}
		if got := hex.EncodeToString(appendMapHeader(nil, n)); got != wantMap {
			t.Errorf("appendMapHeader(%d) = %s, want %s", n, got, wantMap)
		}
	}
}

// TestDecodeDoesNotAlias checks that a decoded batch keeps no reference to
// the payload.
func TestDecodeDoesNotAlias(t *testing.T) {
	v := derivedVectors(t)
	for _, d := range v {
		raw := unhex(t, d.hex)
		b, err := Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		before := dump(b)
		for i := range raw {
			raw[i] = 0
		}
		if after := dump(b); after != before {
			t.Errorf("%s: batch changed with the payload:\n%s\n%s", d.name, before, after)
		}
	}
}

func TestExtraKeyValue(t *testing.T) {
	v, err := ExtraKey(unhex(t, "92"+fs("lora")+"05")).Value()
	if err != nil || !reflect.DeepEqual(normGo(v), []any{"lora", gInt(5)}) {
		t.Errorf("Value = %#v, %v", v, err)
	}
	if v, err := ExtraKey(nil).Value(); v != nil || err != nil {
		t.Errorf("nil Value = %#v, %v", v, err)
	}
}

func TestKindAndFormStrings(t *testing.T) {
	if KindBlockStored.String() != "BlockStored" || KindBlockRemoved.String() != "BlockRemoved" ||
		KindAllBlocksCleared.String() != "AllBlocksCleared" || Kind(0).String() != "Unknown" {
		t.Error("Kind.String")
	}
	if FormArray.String() != "array" || FormMap.String() != "map" || Form(0).String() != "unknown" {
		t.Error("Form.String")
	}
}

// TestDecodedSizeBounded: a payload decodes to at most maxDecodedPerByte
// times its size. Batches shaped as vLLM sends them (64-bit hashes, token
// ids, nil extra keys; many one-block removals) stay well within it; a
// publisher's one-byte hashes, 32 bytes each decoded, are malformed
// instead of costing gigabytes.
func TestDecodedSizeBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const blocks = 1 << 14
	stored := &BlockStored{BlockSize: 16, ExtraKeys: make([]ExtraKey, blocks)}
	for range blocks {
		stored.BlockHashes = append(stored.BlockHashes, UintHash(rng.Uint64()))
		for range 16 {
			stored.TokenIDs = append(stored.TokenIDs, uint32(rng.IntN(150000)))
		}
	}
	var removals []Event
	for range blocks {
		removals = append(removals, &BlockRemoved{BlockHashes: []Hash{UintHash(rng.Uint64())}})
	}
	for _, tc := range []struct {
		name   string
		events []Event
		ok     bool
	}{
		{"a long prompt's blocks", []Event{stored}, true},
		{"one-block removals", removals, true},
		{"one-byte hashes", []Event{&BlockRemoved{BlockHashes: make([]Hash, 1<<20)}}, false},
	} {
		for _, l := range []Layout{LayoutArray, LayoutMap} {
			frame, err := Encode(&Batch{TS: 1, Events: tc.events}, l)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Decode(frame)
			if tc.ok && (err != nil || len(b.Events) != len(tc.events)) {
				t.Errorf("%s (form %v): %v", tc.name, l.Form, err)
			}
			if !tc.ok && !errors.Is(err, ErrMalformed) {
				t.Errorf("%s (form %v): err = %v, want ErrMalformed", tc.name, l.Form, err)
			}
		}
	}
}
