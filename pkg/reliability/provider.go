package reliability

import "sync/atomic"

// Provider is the health of one provider as seen by active health checks.
// Safe for concurrent use; only the prober writes it.
type Provider struct {
	name      string
	healthy   atomic.Bool
	failures  atomic.Int32
	successes atomic.Int32
}

// Healthy reports whether the provider passes its health checks. A
// provider is healthy until checks say otherwise.
func (p *Provider) Healthy() bool { return p.healthy.Load() }

// HealthTransition is what a probe result changed.
type HealthTransition int

// Health transitions reported by [Provider.Observe].
const (
	NoChange HealthTransition = iota
	WentDown
	Recovered
)

// Observe records one probe result: failThreshold consecutive failures mark
// the provider down, recoverThreshold consecutive successes bring it back.
func (p *Provider) Observe(ok bool, failThreshold, recoverThreshold int) HealthTransition {
	if ok {
		p.failures.Store(0)
		if int(p.successes.Add(1)) >= recoverThreshold && p.healthy.CompareAndSwap(false, true) {
			return Recovered
		}
		return NoChange
	}
	p.successes.Store(0)
	if int(p.failures.Add(1)) >= failThreshold && p.healthy.CompareAndSwap(true, false) {
		return WentDown
	}
	return NoChange
}
