package chunkindex_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"rolter.dev/pkg/chunkindex"
)

// A route's targets change (replica 1 of three removed, one added first):
// the remapped index holds at each kept target what it held before, in
// the same LRU order and with the same ages, and nothing at the new one.
func TestRemapKeepsWhatEachTargetHolds(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	cb := chunkindex.ChunkBytes
	oldNow, newNow := int64(0), int64(0)
	x := chunkindex.New(3, 4)
	x.TrackForks()
	x.EvictTailFirst()
	x.SetClock(func() int64 { return oldNow })
	system := text(rng, 2*cb)
	p0, p1, p2 := system+text(rng, cb), system+text(rng, cb), text(rng, 3*cb)
	oldNow = 100
	x.Observe(0, p0, nil)
	oldNow = 200
	x.Observe(1, p1, nil)
	oldNow = 300
	x.Observe(2, p2, nil)
	x.SetCapacity(2, 3) // p2's three chunks fill it

	newNow = 1000 // the new balancer's clock, 700 ahead of the old one's
	y := x.Remap([]int{-1, 2, 0, 0}, func() int64 { return newNow })
	if y.Targets() != 4 {
		t.Fatalf("remapped index has %d targets, want 4", y.Targets())
	}
	lens := make([]int, 4)
	y.Match(p0, lens)
	if want := []int{0, 0, len(p0), 0}; !slices.Equal(lens, want) {
		t.Errorf("p0 matches %v after the remap, want %v (old target 0 is new target 2, once)", lens, want)
	}
	y.Match(p1, lens)
	if want := []int{0, 0, 2 * cb, 0}; !slices.Equal(lens, want) {
		t.Errorf("p1 matches %v, want %v (only the shared system prompt: its holder left)", lens, want)
	}
	y.Match(p2, lens)
	if want := []int{0, len(p2), 0, 0}; !slices.Equal(lens, want) {
		t.Errorf("p2 matches %v, want %v", lens, want)
	}
	if got, want := y.Export(2, nil, 0), x.Export(0, nil, 0); !slices.Equal(got, want) {
		t.Errorf("new target 2 exports %v, want old target 0's %v in the same order", got, want)
	}
	if y.TargetCapacity(1) != 3 || y.TargetCapacity(0) != 4 {
		t.Errorf("capacities %d and %d, want old target 2's 3 and the default 4", y.TargetCapacity(1), y.TargetCapacity(0))
	}
	if at, full := y.Tail(1); !full || at != 1000 {
		t.Errorf("tail %d (full %v), want p2's observation at 300 on the new clock (1000)", at, full)
	}
	// The forks go with the hashes kept: p0 and p1 part after the system
	// prompt, and p0's holder is still there.
	if got := y.SharedLen(p0 + "more"); got != len(system) {
		t.Errorf("shared %d bytes after the remap, want the system prompt's %d", got, len(system))
	}
	// The remapped index is independent of the old one.
	y.Observe(0, p1, nil)
	x.Match(p1, lens[:3])
	if lens[0] != 2*cb {
		t.Errorf("observing on the remapped index changed the old one: %v", lens[:3])
	}
	// Out-of-range sources give empty targets.
	z := x.Remap([]int{7, -3}, nil)
	if z.Stats(0).Chunks != 0 || z.Stats(1).Chunks != 0 {
		t.Errorf("targets remapped from nothing hold %d and %d chunks", z.Stats(0).Chunks, z.Stats(1).Chunks)
	}
}
