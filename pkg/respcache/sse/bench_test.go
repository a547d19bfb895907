package sse_test

import (
	"fmt"
	"strings"
	"testing"

	"rolter.dev/pkg/respcache/sse"
)

// BenchmarkRecorder is the cost the live path pays per streamed byte: a
// 2,000-event OpenAI stream handed over in upstream-sized reads.
func BenchmarkRecorder(b *testing.B) {
	var sb strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&sb, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i)
	}
	sb.WriteString("data: [DONE]\n\n")
	stream := []byte(sb.String())
	for _, read := range []int{64, 4 << 10} {
		b.Run(fmt.Sprintf("read=%dB", read), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(stream)))
			for b.Loop() {
				r := sse.NewRecorder(1 << 20)
				for p := stream; len(p) > 0; {
					n := min(read, len(p))
					r.Write(p[:n])
					p = p[n:]
				}
				r.End(nil)
				if !r.Complete() {
					b.Fatal("incomplete")
				}
			}
		})
	}
}
