package reliability

import (
	"sync/atomic"
	"time"
)

// Target is the live state of one route target. Safe for concurrent use.
type Target struct {
	key           TargetKey
	inflight      atomic.Int64
	cooldownUntil atomic.Int64 // unix nanoseconds; 0 = not parked
	breaker       breaker
}

// Key returns the target's identity.
func (t *Target) Key() TargetKey { return t.key }

// InFlight is the number of requests currently holding the target, from
// the start of the attempt until its response (or stream) ends.
func (t *Target) InFlight() int { return int(t.inflight.Load()) }

// Acquire counts a request in flight; call the returned func exactly once
// when its response has ended.
func (t *Target) Acquire() (release func()) {
	t.inflight.Add(1)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			t.inflight.Add(-1)
		}
	}
}

// CoolingDown reports whether the target is parked at now.
func (t *Target) CoolingDown(now time.Time) bool {
	until := t.cooldownUntil.Load()
	return until != 0 && now.UnixNano() < until
}

// CoolDown parks the target for d from now, extending (never shortening) a
// running cooldown. It reports whether the target was not parked before,
// i.e. whether a cooldown was tripped.
func (t *Target) CoolDown(now time.Time, d time.Duration) (tripped bool) {
	if d <= 0 {
		return false
	}
	until := now.Add(d).UnixNano()
	for {
		old := t.cooldownUntil.Load()
		if old >= until {
			return false
		}
		if t.cooldownUntil.CompareAndSwap(old, until) {
			return old == 0 || now.UnixNano() >= old
		}
	}
}

// BreakerAllows reports whether the circuit breaker lets a request through
// at now: closed, or open long enough to admit a half-open probe, or
// half-open with no probe in flight.
func (t *Target) BreakerAllows(now time.Time, cfg BreakerConfig) bool {
	return !cfg.Enabled || t.breaker.allows(now, cfg)
}

// BreakerAttempt tells the breaker a request is about to be sent; from
// open past its open time, or half-open with no probe in flight, this
// request becomes the probe. probe is then nonzero, the ticket to pass to
// BreakerAbandon; else 0.
func (t *Target) BreakerAttempt(now time.Time, cfg BreakerConfig) (probe uint64) {
	if !cfg.Enabled {
		return 0
	}
	return t.breaker.attempt(now, cfg)
}

// BreakerSuccess records a non-failure answer. It reports whether this
// closed an open or half-open breaker.
func (t *Target) BreakerSuccess(cfg BreakerConfig) (closed bool) {
	if !cfg.Enabled {
		return false
	}
	return t.breaker.success()
}

// BreakerAbandon records an attempt that ended with no verdict on the
// target, because its client went away before the answer reached it
// whole: it is neither a failure (it does not count towards opening the
// breaker) nor a success (it does not close it, nor reset the failure
// count). probe is the attempt's BreakerAttempt result: if it holds the
// half-open probe, the probe is released, so the next request probes; any
// other attempt (one sent before the breaker opened, say) leaves the probe
// in flight alone.
func (t *Target) BreakerAbandon(cfg BreakerConfig, probe uint64) {
	if cfg.Enabled {
		t.breaker.abandon(probe)
	}
}

// BreakerFailure records a failure. It reports whether this opened the
// breaker.
func (t *Target) BreakerFailure(now time.Time, cfg BreakerConfig) (opened bool) {
	if !cfg.Enabled {
		return false
	}
	return t.breaker.failure(now, cfg)
}

// BreakerState returns the breaker's state for metrics and tests.
func (t *Target) BreakerState() BreakerState { return BreakerState(t.breaker.state.Load()) }
