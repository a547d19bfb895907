// Package engineload scrapes the real load of the replicas whose provider
// has [providers.engine_load]: vLLM's vllm:num_requests_running and
// vllm:num_requests_waiting gauges (every series of each summed, e.g. one
// per data-parallel engine), from the replica's Prometheus text metrics. It
// stores running + waiting and waiting alone, with the time of the scrape,
// in the provider's live state (rolter.dev/pkg/reliability), where the
// proxy's pick reads them with atomic loads.
//
// The same scrape reads the replica's KV cache capacity from vLLM's info
// gauge vllm:cache_config_info (one series per engine, value 1, the
// CacheConfig's fields as labels: vllm/v1/metrics/loggers.py
// log_metrics_info over vllm/config/cache.py CacheConfig.metrics_info):
// the sum over engines of num_gpu_blocks × block_size tokens (each
// data-parallel engine has its own cache). An exposition without the gauge,
// or whose num_gpu_blocks is not a number yet ("None" before profiling),
// leaves the capacity unknown and the scrape still succeeds: the capacity
// bounds predicted_ttft's approximate index, it is not needed for the load.
//
// # Lifecycle
//
// [Scraper.Run] runs one goroutine per enabled provider until its context
// ends. It checks the config for changes every [ReconcileEvery]: a provider
// whose engine_load (URL, interval, staleness) or API key changed gets a new
// goroutine after the old one has stopped; one that lost the table or left
// the config has its goroutine stopped, its gauge removed and its stored
// load forgotten. Run returns only after every goroutine it started has
// returned.
//
// # Failure
//
// Scrapes never block a request. A failed scrape (connection, timeout,
// status, a body over [MaxBody], a malformed sample, a missing metric) is
// counted and leaves the last value in use until it is stale_ms old; past
// that the proxy routes on its own (and its peers') in-flight counts.
package engineload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"rolter.dev/dataplane/internal/metrics"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/promtext"
	"rolter.dev/pkg/reliability"
)

// Names are the vLLM gauges whose sum is the engine load.
var Names = []string{"vllm:num_requests_running", "vllm:num_requests_waiting"}

const (
	// MaxBody bounds a metrics response; a larger one is a failed scrape.
	MaxBody = 4 << 20
	// ReconcileEvery is how often Run looks for a config change.
	ReconcileEvery = 200 * time.Millisecond
	// maxTimeout caps one scrape's timeout (otherwise stale_ms: past it
	// the previous value has expired anyway).
	maxTimeout = 10 * time.Second
)

// Scraper scrapes the engine load of the providers of the current config.
type Scraper struct {
	snapshot func() *config.Snapshot
	reg      *reliability.Registry
	metrics  *metrics.Metrics
	client   *http.Client
	log      *slog.Logger
}

// New returns a scraper over the config returned by snapshot.
func New(snapshot func() *config.Snapshot, reg *reliability.Registry, m *metrics.Metrics, log *slog.Logger) *Scraper {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2
	return &Scraper{
		snapshot: snapshot, reg: reg, metrics: m,
		client: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		log:    log.With("component", "engineload"),
	}
}

// target is what one provider's goroutine scrapes; a change restarts it.
type target struct {
	provider string
	url      string
	apiKey   string
	interval time.Duration
	stale    time.Duration
}

type worker struct {
	target target
	cancel context.CancelFunc
	done   chan struct{}
}

// Run scrapes until ctx ends, following config changes, and returns after
// every scraping goroutine has stopped.
func (s *Scraper) Run(ctx context.Context) {
	workers := map[string]*worker{}
	defer func() {
		for _, w := range workers {
			s.stop(w, nil)
		}
		s.client.CloseIdleConnections()
	}()
	var last *config.Snapshot
	t := time.NewTicker(ReconcileEvery)
	defer t.Stop()
	for {
		if snap := s.snapshot(); snap != nil && snap != last {
			last = snap
			s.reconcile(ctx, snap, workers)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reconcile starts, restarts and stops goroutines to match snap.
func (s *Scraper) reconcile(ctx context.Context, snap *config.Snapshot, workers map[string]*worker) {
	want := map[string]target{}
	for _, p := range snap.Providers {
		if el := p.EngineLoad; el != nil {
			want[p.Name] = target{provider: p.Name, url: el.URL, apiKey: p.APIKey, interval: el.Interval, stale: el.Stale}
		}
	}
	for name, w := range workers {
		if tg, ok := want[name]; !ok || tg != w.target {
			s.stop(w, snap)
			delete(workers, name)
		}
	}
	for name, tg := range want {
		if _, ok := workers[name]; ok {
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		w := &worker{target: tg, cancel: cancel, done: make(chan struct{})}
		workers[name] = w
		go func() { // owned: stop (or Run's exit) cancels it and waits for done
			defer close(w.done)
			s.loop(wctx, tg)
		}()
	}
}

// stop ends w's goroutine and waits for it. When w's provider no longer
// scrapes in snap (nil: shutdown), its gauge is removed and, if the
// provider is still configured, its stored load forgotten.
func (s *Scraper) stop(w *worker, snap *config.Snapshot) {
	w.cancel()
	<-w.done
	name := w.target.provider
	if snap != nil {
		if p := snap.Provider(name); p != nil && p.EngineLoad != nil {
			return // restarted with new settings: keep the value and gauge
		}
		if snap.Provider(name) != nil {
			s.reg.Provider(name).ClearEngineLoad()
		}
	}
	s.metrics.EngineLoad.DeleteLabelValues(name)
}

// loop scrapes tg every interval until ctx ends.
func (s *Scraper) loop(ctx context.Context, tg target) {
	var (
		buf    bytes.Buffer // reused: a scrape allocates little beyond HTTP's own
		sums   = make([]float64, len(Names))
		counts = make([]int, len(Names))
		state  = 0 // 0 before the first scrape, 1 after a success, 2 after a failure
	)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		start := time.Now()
		n, err := s.scrape(ctx, tg, &buf, sums, counts)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.metrics.EngineLoadFails.WithLabelValues(tg.provider).Inc()
			if state != 2 { // log transitions, not every failure
				s.log.Warn("engine load scrape failed; the proxy's own counts take over once the last value is stale",
					"provider", tg.provider, "url", tg.url, "err", err)
			}
			state = 2
		} else {
			pr := s.reg.Provider(tg.provider)
			pr.SetEngineWaiting(int64(math.Round(min(sums[1], math.MaxInt32))))
			pr.SetEngineLoad(n, time.Now())
			if c, ok := capacity(buf.Bytes()); ok {
				pr.SetKVCapacity(c)
			}
			s.metrics.EngineLoad.WithLabelValues(tg.provider).Set(float64(n))
			if state == 2 {
				s.log.Info("engine load scrapes recovered", "provider", tg.provider)
			}
			state = 1
		}
		timer.Reset(max(tg.interval-time.Since(start), 0))
	}
}

// scrape GETs tg's metrics once and returns running + waiting.
func (s *Scraper) scrape(ctx context.Context, tg target, buf *bytes.Buffer, sums []float64, counts []int) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, min(tg.stale, maxTimeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tg.url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	if tg.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+tg.apiKey)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, MaxBody+1)); err != nil {
		return 0, fmt.Errorf("reading body: %w", err)
	}
	if buf.Len() > MaxBody {
		return 0, errBodyTooLarge
	}
	if err := promtext.Sum(buf.Bytes(), Names, sums, counts); err != nil {
		return 0, err
	}
	if err := promtext.Check(Names, counts); err != nil {
		return 0, err
	}
	total := 0.0
	for _, v := range sums {
		total += v
	}
	return int64(math.Round(min(total, math.MaxInt32))), nil
}

var errBodyTooLarge = errors.New("metrics body over 4 MiB")

// CacheConfigInfo is vLLM's info gauge of its KV cache configuration.
const CacheConfigInfo = "vllm:cache_config_info"

// capacity returns the KV cache capacity in tokens that data's
// vllm:cache_config_info series report, summed over engines; false when
// there is none or one of them has no numeric num_gpu_blocks or
// block_size.
func capacity(data []byte) (int64, bool) {
	var total int64
	found := false
	err := promtext.Labels(data, CacheConfigInfo, func(set []byte) error {
		blocks, err1 := labelInt(set, "num_gpu_blocks")
		size, err2 := labelInt(set, "block_size")
		if err1 != nil || err2 != nil {
			return errors.Join(err1, err2)
		}
		if blocks > math.MaxInt64/size || total > math.MaxInt64-blocks*size {
			return errors.New("capacity overflows")
		}
		total += blocks * size
		found = true
		return nil
	})
	return total, err == nil && found
}

// labelInt reads a positive integer label.
func labelInt(set []byte, key string) (int64, error) {
	v, ok := promtext.Label(set, key)
	if !ok {
		return 0, fmt.Errorf("no %s label", key)
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q is not a positive integer", key, v)
	}
	return n, nil
}
