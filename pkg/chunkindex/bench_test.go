package chunkindex_test

import (
	"math/rand/v2"
	"testing"

	"rolter.dev/pkg/chunkindex"
)

// benchIndex holds 8 targets, each sent 200 prompts of 4 KiB that share a
// 1 KiB system prompt per target; forks: with TrackForks.
func benchIndex(b *testing.B, forks bool) (*chunkindex.Index, []string) {
	rng := rand.New(rand.NewPCG(1, 1))
	x := chunkindex.New(8, 1_000_000/chunkindex.ChunkBytes)
	if forks {
		x.TrackForks()
	}
	var prompts []string
	for t := range 8 {
		sys := text(rng, 1024)
		for range 200 {
			p := sys + text(rng, 3072)
			prompts = append(prompts, p)
			x.Observe(t, p, nil)
		}
	}
	b.ResetTimer()
	return x, prompts
}

// BenchmarkMatch is the cost a shared index adds to a cache_aware pick: a
// 4 KiB prompt fully held by one target.
func BenchmarkMatch(b *testing.B) {
	x, prompts := benchIndex(b, false)
	lens := make([]int, 8)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		x.Match(prompts[i%len(prompts)], lens)
	}
}

// BenchmarkSharedLen is what predicted_ttft's waste term adds to a pick
// with a held prefix: the walk of a 4 KiB prompt whose 1 KiB system prompt
// its target's other prompts continue differently.
func BenchmarkSharedLen(b *testing.B) {
	x, prompts := benchIndex(b, true)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		x.SharedLen(prompts[i%len(prompts)])
	}
}

// BenchmarkObserveKnown is the observe of a prompt the target already holds
// (the common case in multi-turn traffic): hashing and LRU touches.
func BenchmarkObserveKnown(b *testing.B) {
	x, prompts := benchIndex(b, false)
	buf := make([]uint64, 0, 128)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		x.Observe(i%8, prompts[(i%8)*200+i%200], buf[:0])
	}
}

// BenchmarkObserveNew observes a 4 KiB prompt sharing only a 1 KiB system
// prompt: 48 new hashes, with eviction at capacity.
func BenchmarkObserveNew(b *testing.B) {
	rng := rand.New(rand.NewPCG(2, 2))
	x := chunkindex.New(8, 20_000)
	sys := text(rng, 1024)
	tails := make([]string, 1024)
	for i := range tails {
		tails[i] = text(rng, 3072)
	}
	buf := make([]uint64, 0, 128)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		x.Observe(i%8, sys+tails[i%len(tails)]+string(rune('a'+i%26)), buf[:0])
	}
}

// BenchmarkRemap is what a reload that changes a route's targets costs
// predicted_ttft (chunkindex.Index.Remap, under the old index's read lock):
// 16 targets of 62,500 chunks each (a million tokens of KV cache at 4 bytes
// a token), one target dropped and one added.
func BenchmarkRemap(b *testing.B) {
	const targets, chunks = 16, 62_500
	x := chunkindex.New(targets, chunks)
	x.TrackForks()
	hashes := make([]uint64, chunks)
	for t := range targets {
		for i := range hashes {
			hashes[i] = uint64(t)<<32 | uint64(i)
		}
		x.Fold(t, hashes)
	}
	from := make([]int, targets)
	for j := range from {
		from[j] = j + 1
	}
	from[targets-1] = -1
	b.ReportAllocs()
	for b.Loop() {
		x.Remap(from, nil)
	}
}

// fullIndex is BenchmarkRemap's index, stamped: 16 targets of 62,500
// chunks.
func fullIndex() *chunkindex.Index {
	const targets, chunks = 16, 62_500
	x := chunkindex.New(targets, chunks)
	x.TrackForks()
	now := int64(0)
	x.SetClock(func() int64 { now += 1000; return now })
	hashes := make([]uint64, 64)
	for t := range targets {
		for i := 0; i < chunks; i += len(hashes) {
			for k := range hashes {
				hashes[k] = uint64(t)<<32 | uint64(i+k)
			}
			x.Fold(t, hashes)
		}
	}
	return x
}

// BenchmarkAppendBinary is what writing the proxy's routing state costs
// per write for BenchmarkRemap's index (rolter-proxy --routing-state,
// every 30 s by default), reported with the form's size.
func BenchmarkAppendBinary(b *testing.B) {
	x := fullIndex()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = x.AppendBinary(buf[:0])
	}
	b.ReportMetric(float64(len(buf)), "bytes/index")
}

// BenchmarkDecode is what reading that index back costs a proxy at start.
func BenchmarkDecode(b *testing.B) {
	data, _ := fullIndex().AppendBinary(nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := chunkindex.Decode(data, func() int64 { return 1 }); err != nil {
			b.Fatal(err)
		}
	}
}
