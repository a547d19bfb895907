package kvdelta_test

import (
	"encoding/hex"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"rolter.dev/pkg/kvdelta"
	kvv1 "rolter.dev/proto/rolter/kv/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// samples are one message of each shape, with values that round-trip
// exactly (durations in whole milliseconds).
func samples() []struct {
	name string
	msg  kvdelta.Message
} {
	kv := kvdelta.Status{KV: true, Synced: true, KVAge: 250 * time.Millisecond, KVStale: 30 * time.Second, BlockSize: 16, Blocks: 3}
	return []struct {
		name string
		msg  kvdelta.Message
	}{
		{"delta_stored_removed_cleared", kvdelta.Message{
			Type: kvdelta.TypeDelta, Epoch: 0x0123456789abcdef, Seq: 42, Provider: "vllm-a", Status: kv,
			Ops: []kvdelta.Op{
				{Kind: kvdelta.OpStored, IDs: []uint64{1, 2}},
				{Kind: kvdelta.OpStored, HasParent: true, Parent: 2, IDs: []uint64{3}},
				{Kind: kvdelta.OpRemoved, IDs: []uint64{1}},
				{Kind: kvdelta.OpCleared, Reason: kvdelta.ReasonGap},
			},
		}},
		{"status_kv_never", kvdelta.Message{
			Type: kvdelta.TypeStatus, Epoch: 7, Seq: 0, Provider: "p",
			Status: kvdelta.Status{KV: true, KVAge: -1, KVStale: time.Second},
		}},
		{"status_lmcache", kvdelta.Message{
			Type: kvdelta.TypeStatus, Epoch: 7, Seq: 9, Provider: "lm.provider",
			Status: kvdelta.Status{LM: true, LMAvailable: true, Occupancy: 0.25, LMAge: 1500 * time.Millisecond, LMStale: 10 * time.Second},
		}},
		{"status_both", kvdelta.Message{
			Type: kvdelta.TypeStatus, Epoch: 1, Seq: 1, Provider: "both",
			Status: kvdelta.Status{KV: true, KVAge: 0, KVStale: 2 * time.Second, LM: true, Occupancy: 1, LMAge: -1, LMStale: time.Second},
		}},
		{"snapshot_part", kvdelta.Message{
			Type: kvdelta.TypeSnapshot, Epoch: 5, Seq: 100, Provider: "vllm-a", Status: kv,
			Part: 1, Parts: 3, IDs: []uint64{0xffffffffffffffff, 0, 12345},
		}},
		{"snapshot_empty", kvdelta.Message{
			Type: kvdelta.TypeSnapshot, Epoch: 5, Seq: 0, Provider: "vllm-a", Status: kv, Part: 0, Parts: 1,
		}},
		{"snapshot_request", kvdelta.Message{Type: kvdelta.TypeSnapshotRequest, Epoch: 5, Provider: "vllm-a"}},
		{"status_heartbeat", kvdelta.Message{
			Type: kvdelta.TypeStatus, Epoch: 7, Seq: 3, Provider: "p",
			Status: kvdelta.Status{KV: true, Synced: true, KVAge: 0, KVStale: 30 * time.Second, Heartbeat: time.Second},
		}},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range samples() {
		t.Run(tc.name, func(t *testing.T) {
			b, err := kvdelta.Encode(&tc.msg)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			got, err := kvdelta.Decode(b)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(*got, tc.msg) {
				t.Errorf("round trip:\n got %+v\nwant %+v", *got, tc.msg)
			}
		})
	}
}

// TestGolden pins the encoding: these bytes must keep decoding to the
// samples (a v1 receiver in the field reads them). A change of the bytes
// that still decodes (a new field, another protobuf version's field order)
// is fine: regenerate with go test -update and check the diff. Only a
// change that old receivers would misread needs a new version.
func TestGolden(t *testing.T) {
	var sb strings.Builder
	for _, tc := range samples() {
		b, err := kvdelta.Encode(&tc.msg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		sb.WriteString(tc.name + " " + hex.EncodeToString(b) + "\n")
	}
	path := filepath.Join("testdata", "v1.pb.golden")
	if *update {
		if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if got := sb.String(); got != string(want) {
		t.Errorf("encoding changed:\n got:\n%s\nwant:\n%s", got, want)
	}
}

func TestEncodeRejects(t *testing.T) {
	tests := []struct {
		name string
		msg  kvdelta.Message
	}{
		{"error: unknown type", kvdelta.Message{Type: 9, Provider: "p"}},
		{"error: empty provider", kvdelta.Message{Type: kvdelta.TypeStatus}},
		{"error: long provider", kvdelta.Message{Type: kvdelta.TypeStatus, Provider: strings.Repeat("p", 256)}},
		{"error: delta without ops", kvdelta.Message{Type: kvdelta.TypeDelta, Provider: "p"}},
		{"error: stored without ids", kvdelta.Message{Type: kvdelta.TypeDelta, Provider: "p", Ops: []kvdelta.Op{{Kind: kvdelta.OpStored}}}},
		{"error: unknown op", kvdelta.Message{Type: kvdelta.TypeDelta, Provider: "p", Ops: []kvdelta.Op{{Kind: 7, IDs: []uint64{1}}}}},
		{"error: bad reason", kvdelta.Message{Type: kvdelta.TypeDelta, Provider: "p", Ops: []kvdelta.Op{{Kind: kvdelta.OpCleared}}}},
		{"error: occupancy above 1", kvdelta.Message{Type: kvdelta.TypeStatus, Provider: "p", Status: kvdelta.Status{LM: true, Occupancy: 1.5}}},
		{"error: snapshot part out of range", kvdelta.Message{Type: kvdelta.TypeSnapshot, Provider: "p", Part: 2, Parts: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := kvdelta.Encode(&tc.msg); err == nil {
				t.Error("Encode succeeded")
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	valid, err := kvdelta.Encode(&samples()[0].msg)
	if err != nil {
		t.Fatal(err)
	}
	// enc marshals a hand-made protobuf message, so the tests can build
	// what Encode refuses to.
	enc := func(m *kvv1.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	msg := func(typ kvv1.Type, edit func(m *kvv1.Message)) []byte {
		m := &kvv1.Message{Version: 1, Type: typ, Epoch: 1, Seq: 1, Provider: "p"}
		if typ == kvv1.Type_TYPE_SNAPSHOT {
			m.Snapshot = &kvv1.SnapshotPart{Parts: 1}
		}
		if typ == kvv1.Type_TYPE_DELTA {
			m.Ops = []*kvv1.Op{{Op: &kvv1.Op_Removed{Removed: &kvv1.Removed{Ids: []uint64{1}}}}}
		}
		edit(m)
		return enc(m)
	}
	age := func(v uint64) *uint64 { return &v }
	tests := []struct {
		name    string
		in      []byte
		wantErr error
	}{
		{"error: empty", nil, kvdelta.ErrMalformed},
		{"error: other version", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) { m.Version = 2 }), kvdelta.ErrVersion},
		{"error: no version", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) { m.Version = 0 }), kvdelta.ErrMalformed},
		{"error: unknown type", msg(0, func(*kvv1.Message) {}), kvdelta.ErrMalformed},
		{"error: type out of range", msg(9, func(*kvv1.Message) {}), kvdelta.ErrMalformed},
		{"error: truncated", valid[:len(valid)-1], kvdelta.ErrMalformed},
		{"error: not protobuf", []byte{0xff, 0xff, 0xff}, kvdelta.ErrMalformed},
		{"error: empty provider", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) { m.Provider = "" }), kvdelta.ErrMalformed},
		{"error: long provider", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) { m.Provider = strings.Repeat("p", 256) }), kvdelta.ErrMalformed},
		{"error: delta without ops", msg(kvv1.Type_TYPE_DELTA, func(m *kvv1.Message) { m.Ops = nil }), kvdelta.ErrMalformed},
		{"error: op without kind", msg(kvv1.Type_TYPE_DELTA, func(m *kvv1.Message) { m.Ops = []*kvv1.Op{{}} }), kvdelta.ErrMalformed},
		{"error: stored without ids", msg(kvv1.Type_TYPE_DELTA, func(m *kvv1.Message) {
			m.Ops = []*kvv1.Op{{Op: &kvv1.Op_Stored{Stored: &kvv1.Stored{}}}}
		}), kvdelta.ErrMalformed},
		{"error: removed without ids", msg(kvv1.Type_TYPE_DELTA, func(m *kvv1.Message) {
			m.Ops = []*kvv1.Op{{Op: &kvv1.Op_Removed{Removed: &kvv1.Removed{}}}}
		}), kvdelta.ErrMalformed},
		{"error: unknown clear reason", msg(kvv1.Type_TYPE_DELTA, func(m *kvv1.Message) {
			m.Ops = []*kvv1.Op{{Op: &kvv1.Op_Cleared{Cleared: &kvv1.Cleared{Reason: 6}}}}
		}), kvdelta.ErrMalformed},
		{"error: clear without reason", msg(kvv1.Type_TYPE_DELTA, func(m *kvv1.Message) {
			m.Ops = []*kvv1.Op{{Op: &kvv1.Op_Cleared{Cleared: &kvv1.Cleared{}}}}
		}), kvdelta.ErrMalformed},
		{"error: status with ops", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) {
			m.Ops = []*kvv1.Op{{Op: &kvv1.Op_Removed{Removed: &kvv1.Removed{Ids: []uint64{1}}}}}
		}), kvdelta.ErrMalformed},
		{"error: snapshot without part", msg(kvv1.Type_TYPE_SNAPSHOT, func(m *kvv1.Message) { m.Snapshot = nil }), kvdelta.ErrMalformed},
		{"error: part on a status", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) { m.Snapshot = &kvv1.SnapshotPart{Parts: 1} }), kvdelta.ErrMalformed},
		{"error: part not below parts", msg(kvv1.Type_TYPE_SNAPSHOT, func(m *kvv1.Message) { m.Snapshot.Part = 1 }), kvdelta.ErrMalformed},
		{"error: zero parts", msg(kvv1.Type_TYPE_SNAPSHOT, func(m *kvv1.Message) { m.Snapshot.Parts = 0 }), kvdelta.ErrMalformed},
		{"error: too many parts", msg(kvv1.Type_TYPE_SNAPSHOT, func(m *kvv1.Message) { m.Snapshot.Parts = maxParts + 1 }), kvdelta.ErrMalformed},
		{"error: occupancy above 1", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) {
			m.Status = &kvv1.Status{Lmcache: &kvv1.LMCacheStatus{Occupancy: 1.5}}
		}), kvdelta.ErrMalformed},
		{"error: occupancy NaN", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) {
			m.Status = &kvv1.Status{Lmcache: &kvv1.LMCacheStatus{Occupancy: math.NaN()}}
		}), kvdelta.ErrMalformed},
		{"error: occupancy -Inf", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) {
			m.Status = &kvv1.Status{Lmcache: &kvv1.LMCacheStatus{Occupancy: math.Inf(-1)}}
		}), kvdelta.ErrMalformed},
		{"error: huge age", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) {
			m.Status = &kvv1.Status{Kv: &kvv1.KVStatus{AgeMs: age(1 << 62)}}
		}), kvdelta.ErrMalformed},
		{"error: huge stale", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) {
			m.Status = &kvv1.Status{Lmcache: &kvv1.LMCacheStatus{StaleMs: 1 << 62}}
		}), kvdelta.ErrMalformed},
		{"error: huge heartbeat", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) {
			m.Status = &kvv1.Status{Kv: &kvv1.KVStatus{}, HeartbeatMs: 1 << 62}
		}), kvdelta.ErrMalformed},
		{"error: huge block count", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) {
			m.Status = &kvv1.Status{Kv: &kvv1.KVStatus{Blocks: 1 << 40}}
		}), kvdelta.ErrMalformed},
		{"error: huge block size", msg(kvv1.Type_TYPE_STATUS, func(m *kvv1.Message) {
			m.Status = &kvv1.Status{Kv: &kvv1.KVStatus{BlockSize: 1 << 31}}
		}), kvdelta.ErrMalformed},
		{"error: packed ids cut short", []byte{0x08, 0x01, 0x10, 0x01, 0x2a, 0x01, 'p', 0x3a, 0x04, 0x12, 0x02, 0x12, 0xff}, kvdelta.ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kvdelta.Decode(tc.in)
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("Decode error = %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// TestDecodeSkipsUnknownFields: a field added by a later revision of the v1
// schema is ignored (that is what keeps additions compatible).
func TestDecodeSkipsUnknownFields(t *testing.T) {
	want := samples()[0].msg
	b, err := kvdelta.Encode(&want)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendTag(b, 99, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte("from the future"))
	got, err := kvdelta.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("got %+v, want %+v", *got, want)
	}
}

// TestSizes pins the sizes doc.go quotes: a stored block id costs 8 bytes,
// the rest of a delta a few dozen.
func TestSizes(t *testing.T) {
	status := kvdelta.Status{KV: true, Synced: true, KVAge: 12 * time.Millisecond, KVStale: 30 * time.Second, BlockSize: 16, Blocks: 40000}
	size := func(n int) int {
		ids := make([]uint64, n)
		for i := range ids {
			ids[i] = uint64(i+1) * 0x9e3779b97f4a7c15
		}
		m := kvdelta.Message{Type: kvdelta.TypeDelta, Epoch: 0x9e3779b97f4a7c15, Seq: 123456, Provider: "vllm-a", Status: status,
			Ops: []kvdelta.Op{{Kind: kvdelta.OpStored, HasParent: true, Parent: 0x9e3779b97f4a7c15, IDs: ids}}}
		b, err := kvdelta.Encode(&m)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	one, hundred := size(1), size(100)
	t.Logf("delta of 1 stored id: %d bytes; of 100: %d bytes (%.2f bytes per further id)", one, hundred, float64(hundred-one)/99)
	if per := float64(hundred-one) / 99; per < 8 || per > 8.1 {
		t.Errorf("%.2f bytes per stored id, want 8", per)
	}
	if one > 70 {
		t.Errorf("a delta of one id is %d bytes", one)
	}
	hb, err := kvdelta.Encode(&kvdelta.Message{Type: kvdelta.TypeStatus, Epoch: 0x9e3779b97f4a7c15, Seq: 123456, Provider: "vllm-a", Status: status})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("heartbeat: %d bytes", len(hb))
}

func TestSubjects(t *testing.T) {
	tests := []struct{ provider, subject, snap string }{
		{"vllm-a", "rolter.kv.v1.delta.vllm-a", "rolter.kv.v1.snap.vllm-a"},
		{"a.b", "rolter.kv.v1.delta.~612e62", "rolter.kv.v1.snap.~612e62"},
		{"x:y", "rolter.kv.v1.delta.~783a79", "rolter.kv.v1.snap.~783a79"},
	}
	for _, tc := range tests {
		t.Run(tc.provider, func(t *testing.T) {
			if got := kvdelta.Subject(tc.provider); got != tc.subject {
				t.Errorf("Subject = %q, want %q", got, tc.subject)
			}
			if got := kvdelta.SnapshotSubject(tc.provider); got != tc.snap {
				t.Errorf("SnapshotSubject = %q, want %q", got, tc.snap)
			}
		})
	}
}

func TestPartIDsFits(t *testing.T) {
	const maxPayload = 4096
	n := kvdelta.PartIDs(maxPayload, "provider")
	m := kvdelta.Message{Type: kvdelta.TypeSnapshot, Epoch: ^uint64(0), Seq: ^uint64(0), Provider: "provider",
		Status: kvdelta.Status{KV: true, KVAge: time.Hour, KVStale: time.Hour, BlockSize: 1 << 20, Blocks: 1 << 30,
			LM: true, Occupancy: 0.5, LMAge: time.Hour, LMStale: time.Hour, Heartbeat: time.Hour},
		Part: maxParts - 1, Parts: maxParts, IDs: make([]uint64, n)}
	b, err := kvdelta.Encode(&m)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > maxPayload {
		t.Errorf("a part of %d ids is %d bytes, over %d", n, len(b), maxPayload)
	}
}

const maxParts = 1 << 24

func FuzzDecode(f *testing.F) {
	for _, tc := range samples() {
		b, err := kvdelta.Encode(&tc.msg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{0x08, 0x01, 0x10, 0x01, 0x2a, 0x01, 'p', 0x3a, 0x04, 0x12, 0x02, 0x12, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := kvdelta.Decode(b)
		if err != nil {
			if !errors.Is(err, kvdelta.ErrMalformed) && !errors.Is(err, kvdelta.ErrVersion) {
				t.Fatalf("error %v wraps neither sentinel", err)
			}
			return
		}
		// What decodes re-encodes to the same bytes, except durations,
		// which are kept in milliseconds either way.
		again, err := kvdelta.Encode(m)
		if err != nil {
			t.Fatalf("decoded message does not encode: %v (%+v)", err, m)
		}
		m2, err := kvdelta.Decode(again)
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-decode differs:\n%+v\n%+v", m, m2)
		}
	})
}

func BenchmarkDecodeDelta(b *testing.B) {
	ids := make([]uint64, 64)
	for i := range ids {
		ids[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	m := kvdelta.Message{Type: kvdelta.TypeDelta, Epoch: 1, Seq: 1, Provider: "vllm-a",
		Status: kvdelta.Status{KV: true, Synced: true, KVStale: time.Second, BlockSize: 16},
		Ops:    []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: ids}}}
	buf, err := kvdelta.Encode(&m)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	var out kvdelta.Message
	for b.Loop() {
		if err := kvdelta.DecodeInto(&out, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(ids))/b.Elapsed().Seconds(), "ids/s")
}
