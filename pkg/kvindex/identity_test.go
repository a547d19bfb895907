package kvindex_test

import (
	"fmt"
	"slices"
	"testing"

	"rolter.dev/pkg/kvindex"
)

func seq(n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(i*7 + 1)
	}
	return t
}

func TestIdentities(t *testing.T) {
	toks := seq(50)
	seed := kvindex.Seed("m")
	tests := []struct {
		name      string
		tokens    []uint32
		blockSize int
		wantLen   int
	}{
		{"full blocks only", toks, 16, 3},
		{"exact multiple", toks[:48], 16, 3},
		{"shorter than a block", toks[:15], 16, 0},
		{"no tokens", nil, 16, 0},
		{"error: block size 0", toks, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := kvindex.Identities(seed, tc.tokens, tc.blockSize)
			if len(got) != tc.wantLen {
				t.Fatalf("len = %d, want %d", len(got), tc.wantLen)
			}
			parent := seed
			for i, id := range got {
				if want := kvindex.Chain(parent, tc.tokens[i*tc.blockSize:(i+1)*tc.blockSize]); id != want {
					t.Errorf("identity %d = %x, want Chain = %x", i, id, want)
				}
				parent = id
			}
		})
	}
}

func TestIdentitiesArePrefixStable(t *testing.T) {
	toks := seq(64)
	seed := kvindex.Seed("m")
	all := kvindex.Identities(seed, toks, 16)
	if !slices.Equal(kvindex.Identities(seed, toks[:32], 16), all[:2]) {
		t.Error("a prefix's identities differ from the first identities of the whole")
	}
	other := slices.Clone(toks)
	other[20]++
	got := kvindex.Identities(seed, other, 16)
	if got[0] != all[0] || got[1] == all[1] || got[2] == all[2] {
		t.Error("a change in block 1 must change blocks 1.. and keep block 0")
	}
}

func TestSeedsSeparateModels(t *testing.T) {
	toks := seq(16)
	a := kvindex.Identities(kvindex.Seed("model-a"), toks, 16)
	b := kvindex.Identities(kvindex.Seed("model-b"), toks, 16)
	if a[0] == b[0] {
		t.Error("two models share an identity")
	}
}

// TestChainVector pins the identity function: the watcher and every proxy
// must compute the same identities (a change here is a format change).
func TestChainVector(t *testing.T) {
	seed := kvindex.Seed("sim-model")
	ids := kvindex.Identities(seed, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4)
	got := []uint64{seed, ids[0], ids[1]}
	want := []uint64{0x5a6afb8ff4b10fdc, 0x1747fc0ce7cd3451, 0xa398478bade21ac2}
	if !slices.Equal(got, want) {
		t.Errorf("vector = %#x, want %#x", got, want)
	}
}

func BenchmarkIdentities(b *testing.B) {
	for _, n := range []int{1024, 8192} {
		toks := seq(n)
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			buf := make([]uint64, 0, n/16)
			for b.Loop() {
				buf = kvindex.AppendIdentities(buf[:0], 1, toks, 16)
			}
		})
	}
}
