package respcache_test

import (
	"testing"
	"time"

	"rolter.dev/pkg/respcache"
	"rolter.dev/pkg/respcache/internal/testbody"
)

var benchSizes = []struct {
	name string
	n    int
}{{"body=4KiB", 4 << 10}, {"body=1MiB", 1 << 20}}

func BenchmarkExactKey(b *testing.B) {
	for _, sz := range benchSizes {
		body := testbody.Chat(sz.n)
		b.Run(sz.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := respcache.ExactKey("rolter:cache", chatPath, "", body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLookupHit is the exact hit path on the in-process backend: key,
// read, decode.
func BenchmarkLookupHit(b *testing.B) {
	for _, sz := range benchSizes {
		body := testbody.Chat(sz.n)
		c := respcache.New(respcache.NewMemory(64<<20), respcache.Options{})
		r := respcache.Request{Path: chatPath, Body: body, TTL: time.Hour}
		l, err := c.Lookup(b.Context(), r)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Store(b.Context(), l, jsonEntry(string(make([]byte, 2<<10)))); err != nil {
			b.Fatal(err)
		}
		b.Run(sz.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if l, _ := c.Lookup(b.Context(), r); !l.Hit() {
					b.Fatal("miss")
				}
			}
		})
	}
}
