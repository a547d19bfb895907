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
	state    atomic.Int32 // BreakerState
	failures atomic.Int32 // consecutive failures while closed
	openedAt atomic.Int64 // unix nanoseconds of the last open transition
	probing  atomic.Bool  // a half-open probe is in flight
}

func (b *breaker) allows(now time.Time, cfg BreakerConfig) bool {
	switch BreakerState(b.state.Load()) {
	case Open:
		return now.UnixNano()-b.openedAt.Load() >= int64(cfg.OpenFor)
	case HalfOpen:
		return !b.probing.Load()
	}
	return true
}

func (b *breaker) attempt(now time.Time, cfg BreakerConfig) {
	switch BreakerState(b.state.Load()) {
	case Open:
		if now.UnixNano()-b.openedAt.Load() >= int64(cfg.OpenFor) && b.state.CompareAndSwap(int32(Open), int32(HalfOpen)) {
			b.probing.Store(true)
		}
	case HalfOpen:
		b.probing.Store(true)
	}
}

func (b *breaker) success() bool {
	b.failures.Store(0)
	b.probing.Store(false)
	prev := BreakerState(b.state.Swap(int32(Closed)))
	return prev != Closed
}

// abandon ends an attempt that told nothing of the target: no failure is
// counted and the breaker is not closed, but a half-open probe is
// released, so that the next request probes (else the breaker would stay
// half-open with a probe that never reports, refusing every request).
func (b *breaker) abandon() {
	if BreakerState(b.state.Load()) == HalfOpen {
		b.probing.Store(false)
	}
}

func (b *breaker) failure(now time.Time, cfg BreakerConfig) bool {
	switch BreakerState(b.state.Load()) {
	case HalfOpen:
		b.probing.Store(false)
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
