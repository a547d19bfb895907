package reliability

import (
	"sync/atomic"
	"time"
)

// BreakerConfig is the [breaker] section in runtime form.
type BreakerConfig struct {
	Enabled          bool
	FailureThreshold int
	OpenFor          time.Duration
}

// BreakerState is a circuit breaker's state.
type BreakerState int32

// Breaker states: closed → open (after FailureThreshold consecutive
// failures) → half-open (after OpenFor, one probe at a time) → closed on a
// probe's success, or open again on its failure. A probe abandoned with no
// verdict leaves it half-open, ready for the next probe.
//
// Only the attempt holding the probe (its ticket, from attempt) releases
// it when abandoned: an attempt sent before the breaker opened, or sent
// past it failing open, that ends with no verdict during half-open must not
// let a second probe in. A verdict, though, moves the breaker whoever sent
// it: a success or failure is the target's answer at the attempt's end, as
// fresh as the probe's, so a late success closes the breaker (as it does
// while open) and a late failure reopens it.
const (
	Closed BreakerState = iota
	Open
	HalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "unknown"
}

type breaker struct {
	state    atomic.Int32  // BreakerState
	failures atomic.Int32  // consecutive failures while closed
	openedAt atomic.Int64  // unix nanoseconds of the last open transition
	probe    atomic.Uint64 // ticket of the half-open probe in flight; 0 = none
	tickets  atomic.Uint64 // last probe ticket handed out
}

func (b *breaker) allows(now time.Time, cfg BreakerConfig) bool {
	switch BreakerState(b.state.Load()) {
	case Open:
		return now.UnixNano()-b.openedAt.Load() >= int64(cfg.OpenFor)
	case HalfOpen:
		return b.probe.Load() == 0
	}
	return true
}

// attempt returns the probe ticket of an attempt that takes the half-open
// probe, else 0 (closed, open and sent failing open, or a probe already in
// flight).
func (b *breaker) attempt(now time.Time, cfg BreakerConfig) uint64 {
	switch BreakerState(b.state.Load()) {
	case Open:
		if now.UnixNano()-b.openedAt.Load() < int64(cfg.OpenFor) || !b.state.CompareAndSwap(int32(Open), int32(HalfOpen)) {
			return 0
		}
	case HalfOpen:
	default:
		return 0
	}
	if n := b.tickets.Add(1); b.probe.CompareAndSwap(0, n) {
		return n
	}
	return 0
}

func (b *breaker) success() bool {
	b.failures.Store(0)
	b.probe.Store(0)
	prev := BreakerState(b.state.Swap(int32(Closed)))
	return prev != Closed
}

// abandon ends an attempt that told nothing of the target: no failure is
// counted and the breaker is not closed, but the half-open probe, if this
// attempt holds it (probe is its ticket), is released, so that the next
// request probes (else the breaker would stay half-open with a probe that
// never reports, refusing every request).
func (b *breaker) abandon(probe uint64) {
	if probe != 0 {
		b.probe.CompareAndSwap(probe, 0)
	}
}

func (b *breaker) failure(now time.Time, cfg BreakerConfig) bool {
	switch BreakerState(b.state.Load()) {
	case HalfOpen:
		b.probe.Store(0)
		if b.state.CompareAndSwap(int32(HalfOpen), int32(Open)) {
			b.openedAt.Store(now.UnixNano())
			return true
		}
	case Closed:
		if int(b.failures.Add(1)) >= cfg.FailureThreshold && b.state.CompareAndSwap(int32(Closed), int32(Open)) {
			b.openedAt.Store(now.UnixNano())
			b.failures.Store(0)
			return true
		}
	}
	return false
}
