package routing_test

import (
	"math"
	"testing"
	"time"

	"rolter.dev/pkg/routing"
)

// teachLaw sends b 40 requests over its n targets, each alone, whose first
// tokens take 5 ms plus 50 ms per 1,000 prompt tokens (3 bytes a token).
func teachLaw(b routing.Balancer, n int, clock *ttftClock) {
	for i := range 40 {
		tokens := 200 + 100*(i%17)
		ctx := &routing.Context{Prompt: words(uint64(100+i), 3*tokens)}
		b.Observe(i%n, ctx)
		clock.tick()
		ttft := 5*time.Millisecond + time.Duration(tokens)*50*time.Microsecond
		b.(routing.TTFTObserver).FirstToken(i%n, ctx, ttft, tokens)
		b.(routing.Learner).Learn(i%n, ctx, 0, ttft)
		clock.tick()
	}
}

// A reload that changes a route's targets (replica 1 of three drained, a
// new one added) builds a new balancer; inheriting from the old one, it
// routes on the law already learned, and a conversation's next turn goes
// to the replica that holds it at its new index. Built from nothing, the
// same turn is a cold prompt spread over the targets.
func TestPredictedTTFTInheritKeepsTheLawAndWhatTargetsHold(t *testing.T) {
	conv := words(7, 6000)
	next := &routing.Context{Prompt: conv + words(8, 600)}
	elsewhere := 0
	for seed := range uint64(12) {
		clock := &ttftClock{now: time.Second}
		old := newTTFT(t, 3, seed, clock, nil)
		teachLaw(old, 3, clock)
		served(old, 2, &routing.Context{Prompt: conv}, clock)

		// New targets: the new replica, old target 0, old target 2.
		from := []int{-1, 0, 2}
		fresh := newTTFT(t, 3, seed+100, clock, nil)
		if got := fresh.Pick(next, []int{0, 0, 0}, routing.All(3)); got != 2 {
			elsewhere++
		}
		old.Pick(next, []int{0, 0, 0}, routing.All(3)) // a decision to count on
		b := newTTFT(t, 3, seed+100, clock, nil)
		if !b.(routing.Inheritor).Inherit(old, from) {
			t.Fatal("a predicted_ttft balancer did not inherit from another")
		}
		if got, want := b.(routing.DecisionCounter).Decisions(), old.(routing.DecisionCounter).Decisions(); got[routing.DecisionApproximate] != want[routing.DecisionApproximate] {
			t.Fatalf("seed %d: decisions %v after inheriting, want the old one's %v counted on", seed, got, want)
		}
		if got := b.Pick(next, []int{0, 0, 0}, routing.All(3)); got != 2 {
			t.Fatalf("seed %d: the next turn went to %d, want 2 (old target 2, which holds the conversation)", seed, got)
		}
		l, want := b.(routing.LawReporter).Law(), old.(routing.LawReporter).Law()
		if !l.Fitted || l.OwnMSPer1K != want.OwnMSPer1K || l.BaseMS != want.BaseMS || math.Abs(l.BytesPerToken-3) > 0.01 || l.FirstTokens != want.FirstTokens {
			t.Fatalf("seed %d: inherited law %+v, want the old one's %+v (3 bytes a token; its first tokens counted on)", seed, l, want)
		}
		// The old balancer is unchanged: it still sends the turn to 2.
		if got := old.Pick(next, []int{0, 0, 0}, routing.All(3)); got != 2 {
			t.Fatalf("seed %d: inheriting changed the old balancer's pick to %d", seed, got)
		}
	}
	if elsewhere == 0 {
		t.Fatal("a balancer built from nothing sent the turn to target 2 on every seed: the test cannot tell inheriting from chance")
	}
}

func TestPredictedTTFTInheritsOnlyFromItsKind(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	b := newTTFT(t, 2, 1, clock, nil)
	other := newBalancer(t, routing.Spec{Strategy: routing.LeastLoad}, 2)
	if b.(routing.Inheritor).Inherit(other, []int{0, 1}) {
		t.Fatal("predicted_ttft inherited from a least_load balancer")
	}
	if b.(routing.Inheritor).Inherit(b, []int{0, 1}) {
		t.Fatal("predicted_ttft inherited from itself")
	}
}

// Inheriting reads the old balancer while it still serves the attempts it
// observed, and so does writing its state (run with -race).
func TestPredictedTTFTInheritWhileTheOldOneServes(t *testing.T) {
	clock := &ttftClock{now: time.Second}
	old := newTTFT(t, 4, 1, clock, func(s *routing.Spec) { s.Now = nil })
	teachLaw(old, 4, &ttftClock{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			ctx := &routing.Context{Prompt: words(uint64(1000+i%50), 900)}
			target := old.Pick(ctx, nil, routing.All(4))
			old.Observe(target, ctx)
			old.(routing.TTFTObserver).FirstToken(target, ctx, 30*time.Millisecond, 300)
			old.(routing.Learner).Learn(target, ctx, 0, 40*time.Millisecond)
		}
	}()
	for i := range 50 {
		b := newTTFT(t, 5, uint64(i), clock, func(s *routing.Spec) { s.Now = nil })
		if !b.(routing.Inheritor).Inherit(old, []int{3, -1, 0, 1, 2}) {
			t.Fatal("did not inherit")
		}
		b.Pick(&routing.Context{Prompt: words(1001, 900)}, nil, routing.All(5))
		// The proxy writes its routing state while the balancer serves too.
		if _, err := old.(routing.StateKeeper).AppendState(nil); err != nil {
			t.Fatal(err)
		}
	}
	<-done
}
