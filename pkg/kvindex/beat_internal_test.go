package kvindex

import (
	"testing"
	"time"
)

// TestBurstOfDeltasKeepsTheHeartbeatPeriod: a burst of deltas between two
// heartbeats must not shrink the estimated period, or the quiet moment after
// the burst reads as a dead watcher and precise routing goes neutral.
func TestBurstOfDeltasKeepsTheHeartbeatPeriod(t *testing.T) {
	p := &provider{ix: &Index{opts: Options{MissedHeartbeats: DefaultMissedHeartbeats}}}
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		p.heard(t0.Add(time.Duration(i)*time.Second), true)
	}
	for i := range 2 * beatWindow {
		p.heard(t0.Add(2*time.Second+time.Duration(i+1)*time.Millisecond), false)
	}
	if got := p.beat(); got != time.Second {
		t.Fatalf("beat = %v after a burst of deltas, want the 1s between statuses", got)
	}
	if p.silent(500 * time.Millisecond) {
		t.Fatal("silent half a beat after the burst")
	}
	if !p.silent(3*time.Second + time.Millisecond) {
		t.Fatal("not silent after three missed beats")
	}
}
