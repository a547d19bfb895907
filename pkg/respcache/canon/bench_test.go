package canon_test

import (
	"crypto/sha256"
	"encoding/json"
	"testing"

	"rolter.dev/pkg/respcache/canon"
)

var sizes = []struct {
	name string
	n    int
}{{"body=4KiB", 4 << 10}, {"body=1MiB", 1 << 20}}

func BenchmarkAppend(b *testing.B) {
	for _, sz := range sizes {
		body := chatBody(sz.n)
		b.Run(sz.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			dst := make([]byte, 0, len(body))
			for b.Loop() {
				var err error
				if dst, err = canon.Append(dst[:0], body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWriteSHA256 is the exact-key path: canonical form streamed into
// the hash.
func BenchmarkWriteSHA256(b *testing.B) {
	for _, sz := range sizes {
		body := chatBody(sz.n)
		b.Run(sz.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			h := sha256.New()
			for b.Loop() {
				h.Reset()
				if err := canon.Write(h, body); err != nil {
					b.Fatal(err)
				}
				h.Sum(nil)
			}
		})
	}
}

// BenchmarkStdlibRoundTrip is the naive alternative (decode into any,
// re-marshal with sorted keys), for comparison only.
func BenchmarkStdlibRoundTrip(b *testing.B) {
	for _, sz := range sizes {
		body := chatBody(sz.n)
		b.Run(sz.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				var v any
				if err := json.Unmarshal(body, &v); err != nil {
					b.Fatal(err)
				}
				if _, err := json.Marshal(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
