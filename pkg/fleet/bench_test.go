package fleet_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// gspPrompts is GSP-like traffic: 64 groups, each a 2 KiB system prompt
// followed by a 512-byte question.
func gspPrompts(n int) []string {
	rng := rand.New(rand.NewPCG(1, 2))
	word := func(k int) string {
		var b strings.Builder
		for range k {
			b.WriteByte(byte('a' + rng.IntN(26)))
		}
		return b.String()
	}
	systems := make([]string, 64)
	for i := range systems {
		systems[i] = word(2048)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = systems[rng.IntN(len(systems))] + word(512)
	}
	return out
}

// BenchmarkShareRequest is one request's routing on the proxy that routes
// it, with sharing off (the balancer alone: pick and observe on the prefix
// tree) and on (plus the pick against the shared index, the observe there,
// the queueing of new hashes, and the proxy's flush every 64 requests,
// amortized); the difference is what sharing costs the request path. It
// reports the bytes published per request.
func BenchmarkShareRequest(b *testing.B) {
	prompts := gspPrompts(4096)
	for _, share := range []bool{false, true} {
		b.Run(fmt.Sprintf("share=%v", share), func(b *testing.B) {
			a := newMember(b, "a", 1)
			if !share {
				a = newSoloMember(b)
			}
			var bytes int
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				a.send(prompts[i%len(prompts)])
				if i%64 == 63 {
					bytes += len(a.node.FlushObservations())
				}
			}
			b.ReportMetric(float64(bytes)/float64(b.N), "bytes/req")
		})
	}
}

// BenchmarkFoldBatch is a receiver's cost of folding one peer batch of 64
// requests' observations (about a 25 ms flush at 2,500 requests/s).
func BenchmarkFoldBatch(b *testing.B) {
	prompts := gspPrompts(64 * 64)
	a, r := newMember(b, "a", 1), newMember(b, "r", 1)
	var batches [][]byte
	for i, p := range prompts {
		a.send(p)
		if i%64 == 63 {
			if batch := a.node.FlushObservations(); batch != nil {
				batches = append(batches, batch)
			}
		}
	}
	b.ReportAllocs()
	now := time.Now()
	for i := 0; b.Loop(); i++ {
		r.node.HandleObservations(batches[i%len(batches)], now)
	}
}

// BenchmarkLoadReport is one load report of a proxy with 10 routes of 8
// targets, and a peer taking it.
func BenchmarkLoadReport(b *testing.B) {
	a, r := newMember(b, "a", 1), newMember(b, "r", 1)
	for i := range 10 {
		a.node.Bind(fmt.Sprintf("route-%d", i), 1, 8)
		r.node.Bind(fmt.Sprintf("route-%d", i), 1, 8)
	}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		r.node.HandleLoads(a.node.LoadReport(), now)
	}
}
