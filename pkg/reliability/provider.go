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
	// engineWaiting is the waiting part of engineLoad (same scrape time).
	engineWaiting atomic.Int64
	// kvCapacity is the replica's KV cache capacity in tokens as scraped
	// (vllm:cache_config_info num_gpu_blocks × block_size), 0 = unknown.
	kvCapacity atomic.Int64
}

// SetEngineLoad records the replica's load (requests running plus waiting,
// across all its clients) as scraped at at.
func (p *Provider) SetEngineLoad(n int64, at time.Time) {
	p.engineLoad.Store(max(n, 0))
	p.engineLoadAt.Store(at.UnixNano())
}

// SetEngineWaiting records the waiting part of the next [SetEngineLoad]'s
// load (vllm:num_requests_waiting); call it first, so that a load read
// fresh has its waiting count from the same scrape or a newer one.
func (p *Provider) SetEngineWaiting(n int64) { p.engineWaiting.Store(max(n, 0)) }

// EngineWaiting returns the last scraped waiting requests under the same
// freshness rule as [Provider.EngineLoad].
func (p *Provider) EngineWaiting(now time.Time, maxAge time.Duration) (n int, ok bool) {
	at := p.engineLoadAt.Load()
	if at == 0 || now.UnixNano()-at > int64(maxAge) {
		return 0, false
	}
	return int(p.engineWaiting.Load()), true
}

// EngineLoadAge returns how long before now the engine load was last
// scraped; ok is false when it never was (or was cleared).
func (p *Provider) EngineLoadAge(now time.Time) (age time.Duration, ok bool) {
	at := p.engineLoadAt.Load()
	if at == 0 {
		return 0, false
	}
	return max(time.Duration(now.UnixNano()-at), 0), true
}

// SetKVCapacity records the replica's KV cache capacity in tokens, as
// scraped; 0 forgets it.
func (p *Provider) SetKVCapacity(tokens int64) { p.kvCapacity.Store(max(tokens, 0)) }

// KVCapacityTokens returns the scraped KV cache capacity in tokens, 0 when
// none was scraped. It does not expire: an engine's capacity is fixed for
// its lifetime, and a restarted one is scraped again.
func (p *Provider) KVCapacityTokens() int { return int(p.kvCapacity.Load()) }

// ClearEngineLoad forgets the engine load and capacity (its scraper
// stopped).
func (p *Provider) ClearEngineLoad() {
	p.engineLoadAt.Store(0)
	p.kvCapacity.Store(0)
}

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
