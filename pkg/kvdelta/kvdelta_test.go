package kvdelta_test

import (
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"rolter.dev/pkg/kvdelta"
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

// TestGolden pins the encoding: a change of these bytes is a format change
// (bump Version). Regenerate with go test -update.
func TestGolden(t *testing.T) {
	var sb strings.Builder
	for _, tc := range samples() {
		b, err := kvdelta.Encode(&tc.msg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		sb.WriteString(tc.name + " " + hex.EncodeToString(b) + "\n")
	}
	path := filepath.Join("testdata", "v1.golden")
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
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), valid...)) }
	tests := []struct {
		name    string
		in      []byte
		wantErr error
	}{
		{"error: empty", nil, kvdelta.ErrMalformed},
		{"error: other version", mutate(func(b []byte) []byte { b[0] = 2; return b }), kvdelta.ErrVersion},
		{"error: unknown type", mutate(func(b []byte) []byte { b[1] = 0; return b }), kvdelta.ErrMalformed},
		{"error: truncated", valid[:len(valid)-1], kvdelta.ErrMalformed},
		{"error: trailing byte", append(append([]byte(nil), valid...), 0), kvdelta.ErrMalformed},
		{"error: huge id count", []byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 'p', 0, 1, 2, 0xff, 0xff, 0xff, 0xff, 0x0f}, kvdelta.ErrMalformed},
		{"error: unknown status flag", []byte{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 'p', 0x10}, kvdelta.ErrMalformed},
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
			LM: true, Occupancy: 0.5, LMAge: time.Hour, LMStale: time.Hour},
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
