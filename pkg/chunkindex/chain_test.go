package chunkindex_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"rolter.dev/pkg/chunkindex"
)

// chainOf writes text to a Chainer in pieces cut at the given offsets.
func chainOf(c *chunkindex.Chainer, text string, cuts []int) chunkindex.Chain {
	c.Reset()
	prev := 0
	for _, cut := range cuts {
		cut = min(max(cut, prev), len(text))
		c.Write([]byte(text[prev:cut]))
		prev = cut
	}
	c.Write([]byte(text[prev:]))
	return c.Chain()
}

// A Chainer fed a text in any pieces gives Hashes of the whole text, so a
// context can carry the fingerprint of a prompt longer than the text it
// keeps.
func TestChainerIsHashesOfTheWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	var c chunkindex.Chainer
	for _, n := range []int{1, 63, 64, 65, 128, 1000, 40 << 10} {
		txt := text(rng, n)
		want := chunkindex.Hashes(nil, txt)
		for range 5 {
			cuts := []int{rng.IntN(n + 1), rng.IntN(n + 1), rng.IntN(n + 1)}
			slices.Sort(cuts)
			got := chainOf(&c, txt, cuts)
			if got.Len != n || !slices.Equal(got.Hashes, want) {
				t.Fatalf("%d bytes cut at %v: chain of %d hashes, len %d; want %d hashes", n, cuts, len(got.Hashes), got.Len, len(want))
			}
		}
	}
}

// Trim drops a hash buffer grown past its limit and keeps one within it; a
// trimmed Chainer, once Reset, still fingerprints its next text exactly.
func TestChainerTrim(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	long, short := text(rng, 64<<10), text(rng, 4<<10) // 1,024 and 64 hashes
	var c chunkindex.Chainer
	longBytes := []byte(long)
	rewrite := func(limit int) float64 {
		return testing.AllocsPerRun(3, func() {
			c.Reset()
			c.Write(longBytes)
			c.Chain()
			c.Trim(limit)
		})
	}
	if a := rewrite(2048); a != 0 {
		t.Fatalf("a buffer within the limit was dropped: %.0f allocations to fingerprint the same text again", a)
	}
	if a := rewrite(100); a == 0 {
		t.Fatal("a buffer of 1,024 hashes survived Trim(100): no allocation to grow it again")
	}
	for _, txt := range []string{long, short, long} {
		got := chainOf(&c, txt, []int{len(txt) / 3})
		c.Trim(100)
		if want := chunkindex.Hashes(nil, txt); got.Len != len(txt) || !slices.Equal(got.Hashes, want) {
			t.Fatalf("after Trim: chain of %d hashes, len %d; want %d hashes, len %d", len(got.Hashes), got.Len, len(want), len(txt))
		}
	}
}

// The chain forms of Match and Observe agree with the text forms, in both
// eviction orders, and a chain teaches SharedLen the same forks.
func TestChainFormsAgreeWithText(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	sys := text(rng, 300)
	prompts := []string{sys + text(rng, 500), sys + text(rng, 64), sys, text(rng, 129)}
	for _, tailFirst := range []bool{false, true} {
		x, y := chunkindex.New(2, 12), chunkindex.New(2, 12)
		for _, ix := range []*chunkindex.Index{x, y} {
			ix.TrackForks()
			if tailFirst {
				ix.EvictTailFirst()
			}
		}
		var c chunkindex.Chainer
		for i, p := range prompts {
			xp := x.Observe(i%2, p, nil)
			yp := y.ObserveChain(i%2, chainOf(&c, p, nil), nil)
			if !slices.Equal(xp, yp) {
				t.Fatalf("tail first %v, prompt %d: published %v, chain form %v", tailFirst, i, xp, yp)
			}
		}
		for i, p := range prompts {
			xl, yl := []int{0, 0}, []int{0, 0}
			x.Match(p, xl)
			y.MatchChain(chainOf(&c, p, nil), yl)
			if !slices.Equal(xl, yl) {
				t.Fatalf("tail first %v, prompt %d: Match %v, MatchChain %v", tailFirst, i, xl, yl)
			}
			if a, b := x.SharedLen(p), y.SharedLen(p); a != b {
				t.Fatalf("tail first %v, prompt %d: SharedLen %d after Observe, %d after ObserveChain", tailFirst, i, a, b)
			}
		}
	}
}

// A chain whose hashes do not fit its length matches and records nothing.
func TestInvalidChainIgnored(t *testing.T) {
	x := chunkindex.New(1, 0)
	x.TrackForks()
	p := strings.Repeat("x", 200)
	x.Observe(0, p, nil)
	bad := chunkindex.Chain{Hashes: chunkindex.Hashes(nil, p), Len: 100}
	lens := []int{0}
	if x.MatchChain(bad, lens); lens[0] != 0 {
		t.Fatalf("invalid chain matched %d bytes", lens[0])
	}
	if got := x.ObserveChain(0, bad, nil); got != nil {
		t.Fatalf("invalid chain published %v", got)
	}
	if got := x.ObserveChain(0, chunkindex.Chain{}, nil); got != nil {
		t.Fatalf("empty chain published %v", got)
	}
}

// FuzzChainer: any text in any two pieces chains like Hashes of the whole,
// and the chain matches the text it came from in full.
func FuzzChainer(f *testing.F) {
	f.Add("hello", 2, 4)
	f.Add(strings.Repeat("ab", 100), 64, 130)
	f.Fuzz(func(t *testing.T, s string, i, j int) {
		var c chunkindex.Chainer
		got := chainOf(&c, s, []int{i, j})
		if got.Len != len(s) || !slices.Equal(got.Hashes, chunkindex.Hashes(nil, s)) {
			t.Fatalf("chain of %q cut at %d, %d differs from Hashes", s, i, j)
		}
		x := chunkindex.New(1, 0)
		x.ObserveChain(0, got, nil)
		lens := []int{0}
		x.Match(s, lens)
		if lens[0] != len(s) {
			t.Fatalf("observed chain of %d bytes matches %d", len(s), lens[0])
		}
	})
}
