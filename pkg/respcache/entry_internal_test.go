package respcache

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestEntryRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		e    *Entry
		emb  []float32
	}{
		{"json body", &Entry{Status: 200, ContentType: "application/json", Body: []byte(`{"a":1}`)}, nil},
		{"empty body", &Entry{Status: 200, ContentType: "", Body: []byte{}}, nil},
		{"events", &Entry{Status: 200, ContentType: "text/event-stream", Events: [][]byte{[]byte("data: a"), {}, []byte("data: [DONE]")}}, nil},
		{"no events", &Entry{Status: 200, ContentType: "text/event-stream", Events: [][]byte{}}, nil},
		{"semantic", &Entry{Status: 200, ContentType: "application/json", Body: bytes.Repeat([]byte{0xff}, 300)}, []float32{0.5, -1, 3e-8}},
		{"semantic events", &Entry{Status: 200, ContentType: "text/event-stream", Events: [][]byte{[]byte("x")}}, []float32{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := encodeEntry(tc.e, tc.emb)
			got, emb, err := decodeEntry(b)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tc.e.Status || got.ContentType != tc.e.ContentType || !bytes.Equal(got.Body, tc.e.Body) ||
				!reflect.DeepEqual(got.Events, tc.e.Events) || !reflect.DeepEqual(emb, tc.emb) {
				t.Fatalf("round trip: %+v %v, want %+v %v", got, emb, tc.e, tc.emb)
			}
			for cut := range len(b) { // every truncation fails
				if _, _, err := decodeEntry(b[:cut]); !errors.Is(err, errDecode) {
					t.Fatalf("truncated to %d bytes: %v", cut, err)
				}
			}
			if _, _, err := decodeEntry(append(b, 0)); !errors.Is(err, errDecode) {
				t.Fatalf("trailing byte: %v", err)
			}
		})
	}
}

func TestEntryDecodeRejects(t *testing.T) {
	good := encodeEntry(&Entry{Status: 200, ContentType: "a/b", Body: []byte("x")}, nil)
	mod := func(i int, v byte) []byte { b := bytes.Clone(good); b[i] = v; return b }
	tests := []struct {
		name string
		b    []byte
	}{
		{"error: empty", nil},
		{"error: bad magic", mod(0, 'x')},
		{"error: other version", mod(2, 2)},
		{"error: unknown flag", mod(3, 0x80)},
		{"error: status 99", encodeEntry(&Entry{Status: 99}, nil)},
		{"error: status 600", encodeEntry(&Entry{Status: 600}, nil)},
		// Only a 200 is replayed (Storable): an entry of another status,
		// as an older rolter stored, is not an answer to repeat.
		{"error: status 201", encodeEntry(&Entry{Status: 201, ContentType: "a/b", Body: []byte("x")}, nil)},
		{"error: status 202", encodeEntry(&Entry{Status: 202, ContentType: "a/b", Body: []byte("x")}, nil)},
		{"error: status 204", encodeEntry(&Entry{Status: 204, Body: []byte{}}, nil)},
		{"error: status 206", encodeEntry(&Entry{Status: 206, ContentType: "a/b", Body: []byte("x")}, nil)},
		{"error: status 301", encodeEntry(&Entry{Status: 301, ContentType: "a/b", Body: []byte("x")}, nil)},
		{"error: status 304", encodeEntry(&Entry{Status: 304, Body: []byte{}}, nil)},
		{"error: status 201 semantic stream", encodeEntry(&Entry{Status: 201, ContentType: "text/event-stream", Events: [][]byte{[]byte("x")}}, []float32{1})},
		{"error: status 200 plus 2^32", encodeEntry(&Entry{Status: 200 + 1<<32, ContentType: "a/b", Body: []byte("x")}, nil)},
		{"error: JSON of the reference", []byte(`{"status":200,"content_type":"a","body":[1]}`)},
		{"error: zero-length embedding", []byte{'r', 'c', 1, flagEmbedding, 200, 1, 0, 0, 0}},
		{"error: huge event count", []byte{'r', 'c', 1, flagEvents, 200, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"error: varint overflow", []byte{'r', 'c', 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := decodeEntry(tc.b); !errors.Is(err, errDecode) {
				t.Fatalf("decode: %v", err)
			}
		})
	}
}

// FuzzDecodeEntry: decoding never panics, and whatever decodes survives a
// re-encoding unchanged.
func FuzzDecodeEntry(f *testing.F) {
	f.Add(encodeEntry(&Entry{Status: 200, ContentType: "application/json", Body: []byte(`{}`)}, nil))
	f.Add(encodeEntry(&Entry{Status: 200, ContentType: "text/event-stream", Events: [][]byte{[]byte("data: x")}}, []float32{1, 2}))
	f.Add([]byte("rc\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, emb, err := decodeEntry(b)
		if err != nil {
			return
		}
		e2, emb2, err := decodeEntry(encodeEntry(e, emb))
		if err != nil || !reflect.DeepEqual(e, e2) || !reflect.DeepEqual(emb, emb2) && !(hasNaN(emb)) {
			t.Fatalf("re-encoding changed %q: %+v %v -> %+v %v (%v)", b, e, emb, e2, emb2, err)
		}
	})
}

func hasNaN(v []float32) bool {
	for _, f := range v {
		if f != f {
			return true
		}
	}
	return false
}
