package kvindex

import (
	"testing"
	"time"

	"rolter.dev/pkg/kvdelta"
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

// TestOutageIsNotAHeartbeatPeriod: the gap a NATS outage leaves between two
// statuses must not become the period, or a watcher that dies after the
// outage is noticed only after three outages' time.
func TestOutageIsNotAHeartbeatPeriod(t *testing.T) {
	p := &provider{ix: &Index{opts: Options{MissedHeartbeats: DefaultMissedHeartbeats}}}
	t0 := time.Unix(1000, 0)
	at := t0
	for range 4 {
		p.heard(at, true)
		at = at.Add(time.Second)
	}
	at = at.Add(8 * time.Second)              // nothing heard for 9 s: an outage
	p.heard(at.Add(-time.Millisecond), false) // a delta first, then the status
	for range 3 {
		p.heard(at, true)
		at = at.Add(time.Second)
	}
	if got := p.beat(); got != time.Second {
		t.Fatalf("beat = %v after an outage, want the 1s between statuses", got)
	}
	if !p.silent(3*time.Second + time.Millisecond) {
		t.Fatal("not silent three missed beats after the outage")
	}
}

// TestSlowerBeatsAreLearned: intervals longer than the estimate but short
// of silence still count, so a watcher whose beats slow down (a loaded
// host) is not declared dead by the old, shorter period.
func TestSlowerBeatsAreLearned(t *testing.T) {
	p := &provider{ix: &Index{opts: Options{MissedHeartbeats: DefaultMissedHeartbeats}}}
	at := time.Unix(1000, 0)
	for range 3 {
		p.heard(at, true)
		at = at.Add(time.Second)
	}
	at = at.Add(time.Second) // a 2 s interval: late, not silent
	p.heard(at, true)
	if got := p.beat(); got != 2*time.Second {
		t.Fatalf("beat = %v, want the 2s interval learned", got)
	}
}

// TestAnnouncedHeartbeat: a watcher that says its period is silent after
// three missed beats from its first status on, before any interval was
// seen, and late beats still stretch the period beyond the announced one.
func TestAnnouncedHeartbeat(t *testing.T) {
	p := &provider{ix: &Index{opts: Options{MissedHeartbeats: DefaultMissedHeartbeats}}}
	at := time.Unix(1000, 0)
	p.status = kvdelta.Status{KV: true, Heartbeat: time.Second}
	p.heard(at, true)
	if !p.silent(3*time.Second + time.Millisecond) {
		t.Fatal("not silent three announced beats after the first status")
	}
	for range 3 {
		at = at.Add(2 * time.Second)
		p.heard(at, true)
	}
	if got := p.beat(); got != 2*time.Second {
		t.Fatalf("beat = %v, want the 2s the statuses came at", got)
	}
}
