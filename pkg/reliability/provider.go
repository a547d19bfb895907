package reliability

import (
	"sync/atomic"
	"time"
)

// Provider is the live state of one provider: its health as seen by active
// health checks, and its engine load as scraped from the replica. Safe for
// concurrent use; only the prober writes health, only the provider's
// engine-load scraper writes the load. Reads are atomic loads.
type Provider struct {
	name      string
	healthy   atomic.Bool
	failures  atomic.Int32
	successes atomic.Int32
	// engineLoad is the last scraped running + waiting requests;
	// engineLoadAt is when it was scraped (unix nanoseconds, 0 = none).
	engineLoad   atomic.Int64
	engineLoadAt atomic.Int64
}

// SetEngineLoad records the replica's load (requests running plus waiting,
// across all its clients) as scraped at at.
func (p *Provider) SetEngineLoad(n int64, at time.Time) {
	p.engineLoad.Store(max(n, 0))
	p.engineLoadAt.Store(at.UnixNano())
}

// ClearEngineLoad forgets the engine load (its scraper stopped).
func (p *Provider) ClearEngineLoad() { p.engineLoadAt.Store(0) }

// EngineLoad returns the last scraped engine load if it was scraped within
// maxAge before now; ok is false when there is none or it is stale. It
// takes no lock: the load and its time are two atomics, so a read racing a
// scrape may pair the new load with the previous time, both recent.
func (p *Provider) EngineLoad(now time.Time, maxAge time.Duration) (n int, ok bool) {
	at := p.engineLoadAt.Load()
	if at == 0 || now.UnixNano()-at > int64(maxAge) {
		return 0, false
	}
	return int(p.engineLoad.Load()), true
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
