package routing_test

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"

	"rolter.dev/pkg/routing"
	"rolter.dev/pkg/wire"
)

// A balancer built after a restart reads back what the old one wrote: the
// law, the text/token ratio and what each target holds (mapped to the new
// targets), with the counters its metrics export starting at zero.
func TestPredictedTTFTRestoreKeepsTheLawAndWhatTargetsHold(t *testing.T) {
	conv := words(7, 6000)
	next := &routing.Context{Prompt: conv + words(8, 600)}
	elsewhere := 0
	for seed := range uint64(12) {
		clock := &ttftClock{now: time.Second}
		old := newTTFT(t, 3, seed, clock, nil)
		teachLaw(old, 3, clock)
		served(old, 2, &routing.Context{Prompt: conv}, clock)
		state, err := old.(routing.StateKeeper).AppendState(nil)
		if err != nil {
			t.Fatal(err)
		}

		// The restarted proxy's clock starts again; its config lists the
		// replicas in another order: new target 0 is old target 2.
		later := &ttftClock{now: time.Millisecond}
		fresh := newTTFT(t, 3, seed+100, later, nil)
		if got := fresh.Pick(next, []int{0, 0, 0}, routing.All(3)); got != 0 {
			elsewhere++
		}
		b := newTTFT(t, 3, seed+100, later, nil)
		if err := b.(routing.StateKeeper).RestoreState(state, []int{2, 0, 1}); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		l, want := b.(routing.LawReporter).Law(), old.(routing.LawReporter).Law()
		if !l.Fitted || l.OwnMSPer1K != want.OwnMSPer1K || l.BaseMS != want.BaseMS || math.Abs(l.BytesPerToken-3) > 0.01 {
			t.Fatalf("seed %d: restored law %+v, want the old one's %+v (3 bytes a token)", seed, l, want)
		}
		if l.FirstTokens != 0 || b.(routing.DecisionCounter).Decisions()[routing.DecisionApproximate] != 0 {
			t.Fatalf("seed %d: restored counters %d first tokens, %v decisions; a restarted process's start at 0", seed, l.FirstTokens, b.(routing.DecisionCounter).Decisions())
		}
		if got := b.Pick(next, []int{0, 0, 0}, routing.All(3)); got != 0 {
			t.Fatalf("seed %d: the next turn went to %d, want 0 (old target 2, which holds the conversation)", seed, got)
		}
	}
	if elsewhere == 0 {
		t.Fatal("a balancer built from nothing sent the turn to target 0 on every seed: the test cannot tell restoring from chance")
	}
}

// What is written, read back over the same targets and written again is
// the same bytes, however long the proxy was down: nothing is lost or
// aged by the trip.
func TestPredictedTTFTStateIsAFixedPoint(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	old := newTTFT(t, 4, 1, clock, nil)
	teachLaw(old, 4, clock)
	for i := range 30 { // conversations that come back: the forget term's log
		conv := &routing.Context{Prompt: words(uint64(500+i%6), 2000+100*i)}
		tgt := old.Pick(conv, []int{0, 0, 0, 0}, routing.All(4))
		served(old, tgt, conv, clock)
	}
	state, err := old.(routing.StateKeeper).AppendState(nil)
	if err != nil {
		t.Fatal(err)
	}
	later := &ttftClock{now: time.Hour}
	b := newTTFT(t, 4, 2, later, nil)
	if err := b.(routing.StateKeeper).RestoreState(state, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	again, err := b.(routing.StateKeeper).AppendState(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(state, again) {
		t.Fatalf("state written (%d bytes), read and written again (%d bytes) differs", len(state), len(again))
	}
}

// Damaged state is refused whole: the balancer stays as built.
func TestPredictedTTFTRestoreRefusesDamage(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	old := newTTFT(t, 2, 1, clock, nil)
	teachLaw(old, 2, clock)
	state, _ := old.(routing.StateKeeper).AppendState(nil)
	for _, n := range []int{0, 3, 4, 100, len(state) / 2, len(state) - 1} {
		b := newTTFT(t, 2, 1, clock, nil)
		if err := b.(routing.StateKeeper).RestoreState(state[:n], []int{0, 1}); !errors.Is(err, wire.ErrCorrupt) {
			t.Fatalf("cut to %d of %d bytes: err %v, want ErrCorrupt", n, len(state), err)
		}
		if b.(routing.LawReporter).Law().Fitted {
			t.Fatalf("cut to %d bytes: a refused state left the law fitted", n)
		}
	}
	nan := bytes.Clone(state)
	copy(nan[5:], []byte{0, 0, 0, 0, 0, 0, 0xf8, 0x7f}) // the law fit's first float: NaN
	if err := newTTFT(t, 2, 1, clock, nil).(routing.StateKeeper).RestoreState(nan, []int{0, 1}); !errors.Is(err, wire.ErrCorrupt) {
		t.Fatalf("a NaN in the law: err %v, want ErrCorrupt", err)
	}
}

// FuzzPredictedTTFTRestoreState: any input is refused or restores a
// balancer whose own state, written, read and written again, is a fixed
// point, and which picks.
func FuzzPredictedTTFTRestoreState(f *testing.F) {
	clock := &ttftClock{now: time.Second}
	old := newTTFT(f, 3, 1, clock, nil)
	teachLaw(old, 3, clock)
	served(old, 1, &routing.Context{Prompt: words(9, 3000)}, clock)
	state, _ := old.(routing.StateKeeper).AppendState(nil)
	f.Add(state)
	empty, _ := newTTFT(f, 1, 1, clock, nil).(routing.StateKeeper).AppendState(nil)
	f.Add(empty)
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &ttftClock{now: time.Minute}
		b := newTTFT(t, 3, 1, c, nil)
		if err := b.(routing.StateKeeper).RestoreState(data, []int{0, 1, 2}); err != nil {
			if !errors.Is(err, wire.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		b.Pick(&routing.Context{Prompt: words(9, 3500)}, []int{0, 1, 0}, routing.All(3))
		once, err := b.(routing.StateKeeper).AppendState(nil)
		if err != nil {
			t.Fatal(err)
		}
		b2 := newTTFT(t, 3, 1, c, nil)
		if err := b2.(routing.StateKeeper).RestoreState(once, []int{0, 1, 2}); err != nil {
			t.Fatalf("a balancer's own state is refused: %v", err)
		}
		twice, _ := b2.(routing.StateKeeper).AppendState(nil)
		if !bytes.Equal(once, twice) {
			t.Fatalf("written, read and written again differs (%d and %d bytes)", len(once), len(twice))
		}
	})
}

// A restarted proxy reads its replicas' KV capacity at their first scrape:
// until then the restored index keeps the capacity it was written with
// (sized to the default ceiling meanwhile, it evicted most of what a large
// replica held), and once the capacity is known the index takes it.
func TestPredictedTTFTRestoreKeepsCapacityUntilKnown(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	big := &fixedEngine{waiting: []int{0, 0}, running: []int{0, 0}, capacity: 10_000_000}
	old := newTTFT(t, 2, 1, clock, func(s *routing.Spec) { s.Engine = big })
	for i := range 30 { // 1.2 MB of distinct prompts at target 0: beyond the default ceiling's 16,384 chunks
		served(old, 0, &routing.Context{Prompt: words(uint64(700+i), 40_000)}, clock)
	}
	held := old.(routing.SharedAffinity).SharedStats()[0].Chunks
	if held <= routing.DefaultMaxTrieNodes/64 {
		t.Fatalf("the old balancer holds %d chunks at target 0, not beyond the default ceiling: the test shows nothing", held)
	}
	state, _ := old.(routing.StateKeeper).AppendState(nil)

	unscraped := &fixedEngine{waiting: []int{0, 0}, running: []int{0, 0}}
	b := newTTFT(t, 2, 1, &ttftClock{now: time.Second}, func(s *routing.Spec) { s.Engine = unscraped })
	if err := b.(routing.StateKeeper).RestoreState(state, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 64 { // the balancer re-reads capacities every 64 observes
		served(b, 1, &routing.Context{Prompt: words(uint64(900+i), 200)}, clock)
	}
	if got := b.(routing.SharedAffinity).SharedStats()[0].Chunks; got != held {
		t.Fatalf("before the first scrape target 0's restored index holds %d chunks, want the %d written", got, held)
	}
	unscraped.capacity = 100_000 // scraped: about 4,700 chunks of text at 3 bytes a token
	for i := range 64 {
		served(b, 1, &routing.Context{Prompt: words(uint64(1000+i), 200)}, clock)
	}
	if got := b.(routing.SharedAffinity).SharedStats()[0].Chunks; got >= held/2 {
		t.Fatalf("once the capacity is known target 0 holds %d chunks, want it sized down from %d", got, held)
	}
}
