package reliability_test

import (
	"sync"
	"testing"
	"time"

	"rolter.dev/pkg/reliability"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestCooldown(t *testing.T) {
	tg := reliability.NewRegistry().Target(reliability.TargetKey{Route: "m", Provider: "a"})
	if tg.CoolingDown(t0) {
		t.Fatal("fresh target parked")
	}
	if !tg.CoolDown(t0, 5*time.Second) {
		t.Fatal("first cooldown not reported as tripped")
	}
	if tg.CoolDown(t0.Add(time.Second), 2*time.Second) {
		t.Fatal("a shorter cooldown inside a running one counted as a trip")
	}
	if !tg.CoolingDown(t0.Add(4 * time.Second)) {
		t.Fatal("shorter cooldown shortened the running one")
	}
	if tg.CoolingDown(t0.Add(5 * time.Second)) {
		t.Fatal("still parked after the cooldown ended")
	}
	if !tg.CoolDown(t0.Add(6*time.Second), time.Second) {
		t.Fatal("a cooldown after expiry is a new trip")
	}
	if tg.CoolDown(t0, 0) {
		t.Fatal("zero cooldown tripped")
	}
}

func TestBreakerTransitions(t *testing.T) {
	cfg := reliability.BreakerConfig{Enabled: true, FailureThreshold: 3, OpenFor: 10 * time.Second}
	tg := reliability.NewRegistry().Target(reliability.TargetKey{Route: "m", Provider: "a"})
	var probe, old, stale, other uint64 // BreakerAttempt's probe tickets
	steps := []struct {
		name      string
		do        func() bool
		wantRet   bool
		wantState reliability.BreakerState
		allowsAt  time.Duration
		allows    bool
	}{
		{"failure 1 stays closed", func() bool { return tg.BreakerFailure(t0, cfg) }, false, reliability.Closed, 0, true},
		{"success resets the count", func() bool { return tg.BreakerSuccess(cfg) }, false, reliability.Closed, 0, true},
		{"failure 1", func() bool { return tg.BreakerFailure(t0, cfg) }, false, reliability.Closed, 0, true},
		{"failure 2", func() bool { return tg.BreakerFailure(t0, cfg) }, false, reliability.Closed, 0, true},
		{"failure 3 opens", func() bool { return tg.BreakerFailure(t0, cfg) }, true, reliability.Open, 5 * time.Second, false},
		{"open admits a probe after open_secs", func() bool { return tg.BreakerAttempt(t0.Add(10*time.Second), cfg) != 0 }, true, reliability.HalfOpen, 10 * time.Second, false},
		{"probe failure reopens", func() bool { return tg.BreakerFailure(t0.Add(11*time.Second), cfg) }, true, reliability.Open, 15 * time.Second, false},
		{"second probe", func() bool { return tg.BreakerAttempt(t0.Add(21*time.Second), cfg) != 0 }, true, reliability.HalfOpen, 21 * time.Second, false},
		{"probe success closes", func() bool { return tg.BreakerSuccess(cfg) }, true, reliability.Closed, 21 * time.Second, true},
		// An abandoned attempt (its client went away) is no verdict: it
		// neither counts towards opening nor resets the count.
		{"failure 1 again", func() bool { return tg.BreakerFailure(t0.Add(22*time.Second), cfg) }, false, reliability.Closed, 22 * time.Second, true},
		{"a request sent while closed is no probe", func() bool { stale = tg.BreakerAttempt(t0.Add(22*time.Second), cfg); return stale != 0 }, false, reliability.Closed, 22 * time.Second, true},
		{"failure 2 again", func() bool { return tg.BreakerFailure(t0.Add(22*time.Second), cfg) }, false, reliability.Closed, 22 * time.Second, true},
		{"abandon while closed changes nothing", func() bool { tg.BreakerAbandon(cfg, 0); return false }, false, reliability.Closed, 22 * time.Second, true},
		{"failure 3 still opens", func() bool { return tg.BreakerFailure(t0.Add(23*time.Second), cfg) }, true, reliability.Open, 23 * time.Second, false},
		{"abandon while open changes nothing", func() bool { tg.BreakerAbandon(cfg, 0); return false }, false, reliability.Open, 24 * time.Second, false},
		{"a probe after open_secs", func() bool { probe = tg.BreakerAttempt(t0.Add(33*time.Second), cfg); return probe != 0 }, true, reliability.HalfOpen, 33 * time.Second, false},
		{"a request failing open beside it is no probe", func() bool { other = tg.BreakerAttempt(t0.Add(33*time.Second), cfg); return other != 0 }, false, reliability.HalfOpen, 33 * time.Second, false},
		// Only the probe's own abandon lets the next request probe.
		{"the request sent while closed abandoned: the probe stays in flight", func() bool { tg.BreakerAbandon(cfg, stale); return false }, false, reliability.HalfOpen, 33 * time.Second, false},
		{"the request failing open abandoned: the probe stays in flight", func() bool { tg.BreakerAbandon(cfg, other); return false }, false, reliability.HalfOpen, 33 * time.Second, false},
		{"the probe abandoned: still half-open, the next request probes", func() bool { tg.BreakerAbandon(cfg, probe); return false }, false, reliability.HalfOpen, 33 * time.Second, true},
		{"the next probe", func() bool { old = probe; probe = tg.BreakerAttempt(t0.Add(34*time.Second), cfg); return probe != 0 }, true, reliability.HalfOpen, 34 * time.Second, false},
		{"the first probe abandoned again: the next stays in flight", func() bool { tg.BreakerAbandon(cfg, old); return false }, false, reliability.HalfOpen, 34 * time.Second, false},
		// A verdict moves the breaker whoever sent the attempt.
		{"another attempt's failure reopens", func() bool { return tg.BreakerFailure(t0.Add(35*time.Second), cfg) }, true, reliability.Open, 35 * time.Second, false},
		{"a probe after open_secs again", func() bool { old = probe; probe = tg.BreakerAttempt(t0.Add(45*time.Second), cfg); return probe != 0 }, true, reliability.HalfOpen, 45 * time.Second, false},
		{"the probe of the earlier half-open abandoned: the new one stays in flight", func() bool { tg.BreakerAbandon(cfg, old); return false }, false, reliability.HalfOpen, 45 * time.Second, false},
		{"its success closes", func() bool { return tg.BreakerSuccess(cfg) }, true, reliability.Closed, 45 * time.Second, true},
	}
	for _, s := range steps {
		if got := s.do(); got != s.wantRet {
			t.Fatalf("%s: returned %v, want %v", s.name, got, s.wantRet)
		}
		if got := tg.BreakerState(); got != s.wantState {
			t.Fatalf("%s: state %v, want %v", s.name, got, s.wantState)
		}
		if got := tg.BreakerAllows(t0.Add(s.allowsAt), cfg); got != s.allows {
			t.Fatalf("%s: allows=%v, want %v", s.name, got, s.allows)
		}
	}
	off := reliability.BreakerConfig{}
	for range 10 {
		tg.BreakerFailure(t0, off)
	}
	if !tg.BreakerAllows(t0, off) || tg.BreakerState() != reliability.Closed {
		t.Fatal("a disabled breaker opened")
	}
}

func TestProviderHealth(t *testing.T) {
	p := reliability.NewRegistry().Provider("a")
	if !p.Healthy() {
		t.Fatal("new provider unhealthy")
	}
	seq := []struct {
		ok   bool
		want reliability.HealthTransition
	}{
		{false, reliability.NoChange}, {false, reliability.NoChange}, {true, reliability.NoChange},
		{false, reliability.NoChange}, {false, reliability.NoChange}, {false, reliability.WentDown},
		{false, reliability.NoChange}, {true, reliability.NoChange}, {true, reliability.Recovered}, {true, reliability.NoChange},
	}
	for i, s := range seq {
		if got := p.Observe(s.ok, 3, 2); got != s.want {
			t.Fatalf("step %d: %v, want %v", i, got, s.want)
		}
	}
	if !p.Healthy() {
		t.Fatal("not healthy after recovery")
	}
}

func TestInFlightAndRetain(t *testing.T) {
	r := reliability.NewRegistry()
	k := reliability.TargetKey{Route: "m", Provider: "a", Model: "x"}
	tg := r.Target(k)
	if r.Target(k) != tg {
		t.Fatal("same key gave a different target")
	}
	var wg sync.WaitGroup
	releases := make(chan func(), 100)
	for range 100 {
		wg.Go(func() { releases <- tg.Acquire() })
	}
	wg.Wait()
	close(releases)
	if tg.InFlight() != 100 {
		t.Fatalf("in flight %d", tg.InFlight())
	}
	for rel := range releases {
		rel()
		rel() // a second release is a no-op
	}
	if tg.InFlight() != 0 {
		t.Fatalf("in flight after release %d", tg.InFlight())
	}
	r.Retain(func(reliability.TargetKey) bool { return false }, func(string) bool { return false })
	if r.Target(k) == tg {
		t.Fatal("Retain kept a dropped target")
	}
}

func TestEngineLoad(t *testing.T) {
	p := reliability.NewRegistry().Provider("a")
	if _, ok := p.EngineLoad(t0, time.Second); ok {
		t.Fatal("engine load before any scrape")
	}
	if _, ok := p.EngineLoadAge(t0); ok {
		t.Fatal("engine load age before any scrape")
	}
	p.SetEngineLoad(7, t0)
	for at, want := range map[time.Duration]time.Duration{0: 0, 2 * time.Second: 2 * time.Second, -time.Second: 0} {
		if age, ok := p.EngineLoadAge(t0.Add(at)); !ok || age != want {
			t.Errorf("age at +%v: %v, %v; want %v, true", at, age, ok, want)
		}
	}
	for _, tc := range []struct {
		at     time.Duration
		want   int
		wantOK bool
	}{{0, 7, true}, {time.Second, 7, true}, {time.Second + 1, 0, false}, {-time.Second, 7, true}} {
		if n, ok := p.EngineLoad(t0.Add(tc.at), time.Second); n != tc.want || ok != tc.wantOK {
			t.Errorf("at +%v: %d, %v; want %d, %v", tc.at, n, ok, tc.want, tc.wantOK)
		}
	}
	p.SetEngineLoad(-3, t0)
	if n, _ := p.EngineLoad(t0, time.Second); n != 0 {
		t.Errorf("negative load stored as %d", n)
	}
	p.ClearEngineLoad()
	if _, ok := p.EngineLoad(t0, time.Hour); ok {
		t.Error("engine load after clear")
	}
	if _, ok := p.EngineLoadAge(t0); ok {
		t.Error("engine load age after clear")
	}
}

func TestEngineLoadConcurrent(t *testing.T) {
	p := reliability.NewRegistry().Provider("a")
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 1000 {
			p.SetEngineLoad(int64(i), time.Now())
		}
	})
	for range 1000 {
		if n, ok := p.EngineLoad(time.Now(), time.Hour); ok && (n < 0 || n >= 1000) {
			t.Fatalf("load %d", n)
		}
	}
	wg.Wait()
}
