package kvindex

import (
	"fmt"
	"testing"
	"time"

	"rolter.dev/pkg/kvdelta"
)

func benchProvider() *provider {
	return &provider{others: map[uint64]time.Time{}}
}

// BenchmarkDeltaApply measures what the index does per delta on its NATS
// goroutine: decode the message and apply it under the provider's lock. The
// deltas store runs of blocks and remove as many, so the set stays at
// 100k identities.
func BenchmarkDeltaApply(b *testing.B) {
	for _, run := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("blocks=%d", run), func(b *testing.B) {
			p := benchProvider()
			const n = 1024
			msgs := make([][]byte, n)
			var next uint64 = 1
			for i := range msgs {
				stored := make([]uint64, run)
				removed := make([]uint64, run)
				for j := range stored {
					stored[j] = next * 0x9e3779b97f4a7c15
					removed[j] = (next - 100_000) * 0x9e3779b97f4a7c15
					next++
				}
				m := kvdelta.Message{Type: kvdelta.TypeDelta, Epoch: 1, Seq: uint64(i + 1), Provider: "p",
					Status: kvdelta.Status{KV: true, Synced: true, KVStale: time.Second, BlockSize: 16},
					Ops:    []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: stored}, {Kind: kvdelta.OpRemoved, IDs: removed}}}
				buf, err := kvdelta.Encode(&m)
				if err != nil {
					b.Fatal(err)
				}
				msgs[i] = buf
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				m, err := kvdelta.Decode(msgs[i%n])
				if err != nil {
					b.Fatal(err)
				}
				p.mu.Lock()
				p.apply(m)
				p.mu.Unlock()
				i++
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deltas/s")
			b.ReportMetric(float64(2*b.N*run)/b.Elapsed().Seconds(), "ids/s")
		})
	}
}

// BenchmarkScore8k measures scoring one 8k-token request (512 blocks of 16)
// over 16 providers: the request's identities once, then Fresh and
// PrefixMatch per provider. Half the providers hold the whole prefix (the
// worst case: every block looked up), half hold the first 100 blocks.
func BenchmarkScore8k(b *testing.B) {
	const providers, tokens, bs = 16, 8192, 16
	toks := make([]uint32, tokens)
	for i := range toks {
		toks[i] = uint32(i * 31)
	}
	seed := Seed("m")
	ids := Identities(seed, toks, bs)
	ix := &Index{}
	m := map[string]*provider{}
	names := make([]string, providers)
	for i := range providers {
		p := benchProvider()
		p.loaded = true
		p.status = kvdelta.Status{KV: true, Synced: true, KVStale: time.Hour, BlockSize: bs}
		p.statusAt = time.Now()
		held := len(ids)
		if i%2 == 1 {
			held = 100
		}
		filler := make([]uint64, 100_000)
		for j := range filler {
			filler[j] = uint64(j)*0x9e3779b97f4a7c15 + uint64(i)
		}
		p.blocks.Apply([]kvdelta.Op{{Kind: kvdelta.OpStored, IDs: ids[:held]}, {Kind: kvdelta.OpStored, IDs: filler}})
		names[i] = fmt.Sprintf("p%d", i)
		m[names[i]] = p
	}
	ix.providers.Store(&m)
	buf := make([]uint64, 0, tokens/bs)
	scores := make([]float64, providers)
	b.Run("identities+16xPrefixMatch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf = AppendIdentities(buf[:0], seed, toks, bs)
			for i, name := range names {
				if ix.Fresh(name) {
					scores[i] = float64(ix.PrefixMatch(name, buf)) / float64(len(buf))
				}
			}
		}
	})
	b.Run("PrefixMatch/full", func(b *testing.B) {
		for b.Loop() {
			ix.PrefixMatch(names[0], ids)
		}
	})
	b.Run("PrefixMatch/full+speculative", func(b *testing.B) {
		ix.Speculate(names[2], []uint64{1, 2, 3}, time.Hour)
		for b.Loop() {
			ix.PrefixMatch(names[2], ids)
		}
	})
}
