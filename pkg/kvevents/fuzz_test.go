package kvevents

import (
	"math/rand/v2"
	"testing"
	"time"
)

// FuzzDecode: decoding never panics, every error wraps ErrMalformed, and
// whatever decodes re-encodes to bytes that decode to the same batch.
func FuzzDecode(f *testing.F) {
	for _, v := range loadVectors(f) {
		f.Add(unhex(f, v.Hex))
	}
	for _, v := range derivedVectors(f) {
		f.Add(unhex(f, v.hex))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		checkRoundTrip(t, p)
	})
}

// benchBatch builds a batch like one engine step's: events BlockStored runs
// of blocksPer blocks of 16 tokens each (token ids of a 150 k vocabulary),
// and one BlockRemoved of removed blocks.
func benchBatch(events, blocksPer, removed int) (*Batch, int) {
	rng := rand.New(rand.NewPCG(7, 7))
	b := &Batch{TS: 1700000000.5, DataParallelRank: Some[int64](0)}
	blocks := 0
	for range events {
		ev := &BlockStored{BlockSize: 16, Medium: Some("GPU"), ParentBlockHash: Some(UintHash(rng.Uint64())),
			GroupIdx: Some[int64](0), KVCacheSpecKind: Some("full_attention"), ExtraKeys: make([]ExtraKey, blocksPer)}
		for range blocksPer {
			ev.BlockHashes = append(ev.BlockHashes, UintHash(rng.Uint64()))
			for range 16 {
				ev.TokenIDs = append(ev.TokenIDs, uint32(rng.IntN(150000)))
			}
		}
		blocks += blocksPer
		b.Events = append(b.Events, ev)
	}
	if removed > 0 {
		ev := &BlockRemoved{Medium: Some("GPU"), GroupIdx: Some[int64](0)}
		for range removed {
			ev.BlockHashes = append(ev.BlockHashes, UintHash(rng.Uint64()))
		}
		blocks += removed
		b.Events = append(b.Events, ev)
	}
	return b, blocks
}

var benchCases = []struct {
	name                       string
	events, blocksPer, removed int
}{
	// A prefill step: one request's 1024-token prompt (64 blocks).
	{"prefill64", 1, 64, 0},
	// A busy decode step: 32 requests each filling a block, 8 evictions.
	{"decode32", 32, 1, 8},
	// A mixed step: 4 prompts of 16 blocks and 16 evictions.
	{"mixed", 4, 16, 16},
}

// BenchmarkDecode measures the decode rate in blocks per second (stored and
// removed blocks), for both event forms.
func BenchmarkDecode(b *testing.B) {
	for _, c := range benchCases {
		batch, blocks := benchBatch(c.events, c.blocksPer, c.removed)
		for _, l := range []Layout{LayoutArray, LayoutMap} {
			payload, err := Encode(batch, l)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(c.name+"/"+l.Form.String(), func(b *testing.B) {
				dec := NewDecoder()
				b.SetBytes(int64(len(payload)))
				b.ReportAllocs()
				cpu0 := cpuTime()
				for b.Loop() {
					if _, err := dec.Decode(payload); err != nil {
						b.Fatal(err)
					}
				}
				reportRate(b, blocks, cpuTime()-cpu0)
			})
		}
	}
}

// reportRate reports blocks per wall-clock second and, where the process's
// CPU time is measured, blocks per CPU second (run with -cpu 1 so that the
// process's CPU time is the benchmark's, plus GC).
func reportRate(b *testing.B, blocks int, cpu time.Duration) {
	total := float64(blocks) * float64(b.N)
	b.ReportMetric(total/b.Elapsed().Seconds(), "blocks/s")
	if cpu > 0 {
		b.ReportMetric(total/cpu.Seconds(), "blocks/cpu-s")
	}
}

// BenchmarkEncode measures the encode rate in blocks per second.
func BenchmarkEncode(b *testing.B) {
	for _, c := range benchCases {
		batch, blocks := benchBatch(c.events, c.blocksPer, c.removed)
		for _, l := range []Layout{LayoutArray, LayoutMap} {
			b.Run(c.name+"/"+l.Form.String(), func(b *testing.B) {
				var buf []byte
				b.ReportAllocs()
				cpu0 := cpuTime()
				for b.Loop() {
					var err error
					if buf, err = AppendBatch(buf[:0], batch, l); err != nil {
						b.Fatal(err)
					}
				}
				reportRate(b, blocks, cpuTime()-cpu0)
			})
		}
	}
}
