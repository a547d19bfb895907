package routing_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"rolter.dev/pkg/routing"
)

// corpus hands out prompts for benchmarks: one of a few 4 KiB system prompts
// followed by a 4 KiB tail cut at a random offset of a random text, so tails
// are distinct.
type corpus struct {
	rng     *rand.Rand
	text    string
	systems []string
}

func newCorpus(seed uint64) *corpus {
	rng := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, 1<<20)
	for i := range b {
		if rng.IntN(6) == 0 {
			b[i] = ' '
		} else {
			b[i] = byte('a' + rng.IntN(26))
		}
	}
	c := &corpus{rng: rng, text: string(b)}
	for range 32 {
		c.systems = append(c.systems, c.cut(4<<10))
	}
	return c
}

func (c *corpus) cut(n int) string {
	off := c.rng.IntN(len(c.text) - n)
	return c.text[off : off+n]
}

func (c *corpus) prompt() string { return c.systems[c.rng.IntN(len(c.systems))] + c.cut(4<<10) }

// BenchmarkCacheAwareFull: 16 targets whose trees are full at the default
// 1 M byte nodes, 8 KiB prompts whose 4 KiB system prompt every target holds
// and whose first 6 KiB target 5 holds.
func BenchmarkCacheAwareFull(b *testing.B) {
	const n = 16
	bal := newBalancer(b, routing.Spec{Strategy: routing.CacheAware}, n)
	c := newCorpus(1)
	var last string
	for i := range n {
		for bal.(routing.TrieStats).TrieStats()[i].Evictions == 0 {
			last = c.prompt()
			bal.Observe(i, &routing.Context{Prompt: last})
		}
	}
	st := bal.(routing.TrieStats).TrieStats()
	b.Logf("target 0: %+v", st[0])
	prompt := last[:6<<10] + c.cut(2<<10)
	loads := make([]int, n)
	ctx := &routing.Context{Prompt: prompt}
	b.Run("op=pick", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			bal.Pick(ctx, loads, routing.All(n))
		}
	})
	b.Run("op=pick+observe/prompt=resident", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			bal.Observe(bal.Pick(ctx, loads, routing.All(n)), ctx)
		}
	})
	b.Run("op=pick+observe/prompt=new", func(b *testing.B) {
		// One buffer rewritten before each request: the balancer copies what
		// it keeps, so allocs/op are the tree's own.
		buf := []byte(prompt)
		ctx := &routing.Context{}
		b.ReportAllocs()
		i := uint64(0)
		for b.Loop() {
			i++
			binary.LittleEndian.PutUint64(buf[6<<10:], i)
			ctx.Prompt = unsafe.String(&buf[0], len(buf))
			bal.Observe(bal.Pick(ctx, loads, routing.All(n)), ctx)
		}
	})
}

// BenchmarkAffinityPick: picks of the context-reading strategies at n=8 with
// a 2 KiB prompt, a session key, a digest and known loads, after a warm-up
// that taught every balancer.
func BenchmarkAffinityPick(b *testing.B) {
	const n = 8
	c := newCorpus(2)
	for _, s := range affinityStrategies {
		for _, elName := range []string{"all", "half"} {
			b.Run(fmt.Sprintf("%s/n=%d/%s", s, n, elName), func(b *testing.B) {
				bal := newBalancer(b, routing.Spec{Strategy: s}, n)
				for k := range 200 {
					ctx := &routing.Context{Prompt: c.prompt()[:2<<10], SessionKey: fmt.Sprint("s", k%20)}
					t := k % n
					bal.Observe(t, ctx)
					if l, ok := bal.(routing.Learner); ok {
						l.Learn(t, ctx, k%3, time.Duration(100+10*t)*time.Millisecond)
					}
				}
				loads := []int{3, 1, 4, 1, 5, 2, 6, 0}
				el := routing.All(n)
				if elName == "half" {
					el = eligibleOf(0, 2, 4, 6)
				}
				ctx := &routing.Context{Prompt: c.prompt()[:2<<10], SessionKey: "s7", HasDigest: true, PromptDigest: 12345, PromptLen: 2 << 10}
				b.ReportAllocs()
				for b.Loop() {
					bal.Pick(ctx, loads, el)
				}
			})
		}
	}
}
