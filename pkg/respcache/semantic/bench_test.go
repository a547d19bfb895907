package semantic_test

import (
	"testing"

	"rolter.dev/pkg/respcache/internal/testbody"
	"rolter.dev/pkg/respcache/semantic"
)

func BenchmarkClassify(b *testing.B) {
	for _, sz := range []struct {
		name string
		n    int
	}{{"body=4KiB", 4 << 10}, {"body=1MiB", 1 << 20}} {
		body := testbody.Chat(sz.n)
		if _, _, ok := semantic.Classify(chat, body); !ok {
			b.Fatal("benchmark body bypassed")
		}
		b.Run(sz.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				semantic.Classify(chat, body)
			}
		})
	}
}

func BenchmarkCosine(b *testing.B) {
	x, y := make([]float32, 1536), make([]float32, 1536)
	for i := range x {
		x[i], y[i] = float32(i%7)-3, float32(i%5)-2
	}
	b.ReportAllocs()
	for b.Loop() {
		semantic.Cosine(x, y)
	}
}
