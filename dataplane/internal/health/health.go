// Package health runs active health checks against every provider of the
// current config and records the results in the live provider state.
//
// # Lifecycle
//
// [Prober.Run] probes on every interval until its context ends; it reads
// the config anew each round, so a reload changes what it probes, how often
// and against which path without a restart.
package health

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"rolter.dev/dataplane/internal/metrics"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/reliability"
)

// Prober checks providers' health. It is owned by one goroutine running Run.
type Prober struct {
	snapshot func() *config.Snapshot
	reg      *reliability.Registry
	metrics  *metrics.Metrics
	client   *http.Client
	log      *slog.Logger
}

// New returns a prober over the config returned by snapshot.
func New(snapshot func() *config.Snapshot, reg *reliability.Registry, m *metrics.Metrics, log *slog.Logger) *Prober {
	return &Prober{
		snapshot: snapshot, reg: reg, metrics: m,
		client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		log:    log.With("component", "health"),
	}
}

// maxConcurrentProbes bounds how many providers are probed at once.
const maxConcurrentProbes = 8

// Run probes until ctx ends. With health checks disabled it idles, checking
// the config again every second so enabling them takes effect live.
func (p *Prober) Run(ctx context.Context) {
	for {
		wait := time.Second
		if snap := p.snapshot(); snap != nil && snap.Health.Enabled {
			p.Round(ctx, snap)
			wait = time.Duration(snap.Health.IntervalSecs) * time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Round probes every provider of snap once, concurrently, and waits.
func (p *Prober) Round(ctx context.Context, snap *config.Snapshot) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxConcurrentProbes)
	for _, prov := range snap.Providers {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			ok := p.probe(ctx, snap, prov)
			if ctx.Err() != nil {
				return
			}
			state := p.reg.Provider(prov.Name)
			switch state.Observe(ok, snap.Health.ConsecutiveFailureThreshold, snap.Health.RecoverySuccessThreshold) {
			case reliability.WentDown:
				p.metrics.HealthDown.WithLabelValues(prov.Name).Inc()
				p.log.Warn("provider marked unhealthy", "provider", prov.Name)
			case reliability.Recovered:
				p.metrics.HealthRecovered.WithLabelValues(prov.Name).Inc()
				p.log.Info("provider healthy again", "provider", prov.Name)
			}
			v := 0.0
			if state.Healthy() {
				v = 1
			}
			p.metrics.ProviderHealthy.WithLabelValues(prov.Name).Set(v)
		})
	}
	wg.Wait()
}

// Path returns the probe path of a provider: the configured one, or the
// kind's free endpoint (no tokens spent).
func Path(snap *config.Snapshot, prov *config.CompiledProvider) string {
	if snap.Health.Path != "" {
		return snap.Health.Path
	}
	if prov.Kind == config.KindOpenAICompatible {
		return "/health"
	}
	return "/v1/models"
}

func (p *Prober) probe(ctx context.Context, snap *config.Snapshot, prov *config.CompiledProvider) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(snap.Health.TimeoutSecs)*time.Second)
	defer cancel()
	path := Path(snap, prov)
	url := prov.APIBase + path
	if strings.HasSuffix(prov.APIBase, "/v1") && strings.HasPrefix(path, "/v1/") {
		url = prov.APIBase + strings.TrimPrefix(path, "/v1")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	if prov.APIKey != "" {
		if prov.Kind == config.KindAnthropic {
			req.Header.Set("X-Api-Key", prov.APIKey)
			req.Header.Set("Anthropic-Version", prov.AnthropicVersion)
		} else {
			req.Header.Set("Authorization", "Bearer "+prov.APIKey)
		}
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests
}
