package e2e_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"rolter.dev/tests/vllmsim"
)

// TestEngineLoadSteersAwayFromBusyReplica: replica A is kept busy by
// clients the proxy does not see (requests sent to A directly). A proxy with
// least_load over A and B and [providers.engine_load] on both scrapes A's
// queue and sends its own requests to B; the same proxy without
// engine_load sees two idle targets and spreads them.
func TestEngineLoadSteersAwayFromBusyReplica(t *testing.T) {
	// Every token after the first takes 100 ms: a direct request for 1,000
	// tokens keeps A busy for the whole test (it is cancelled at the end),
	// while the proxy's one-token requests finish at once on either replica.
	opts := vllmsim.Options{Models: []string{"sim"}, ITL: 100 * time.Millisecond}
	a, b := startReplica(t, opts), startReplica(t, opts)

	const busy = 6
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range busy {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.url()+"/v1/completions",
				strings.NewReader(`{"model":"sim","prompt":"keep busy","max_tokens":1000,"ignore_eos":true}`))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	waitFor(t, "A runs the direct requests", func() bool { return a.sim.Stats().Running == busy })

	const n = 20
	const quiet = "[accounting]\nsink = \"none\"\n"
	// send makes n sequential requests through the proxy and returns how
	// many reached A and B.
	send := func(proxyURL string) (toA, toB uint64) {
		a0, b0 := a.sim.Stats().Requests, b.sim.Stats().Requests
		for range n {
			postOK(t, proxyURL, "/v1/completions", `{"model":"m","prompt":"hello","max_tokens":1}`)
		}
		return a.sim.Stats().Requests - a0, b.sim.Stats().Requests - b0
	}

	t.Run("without engine_load the proxy spreads", func(t *testing.T) {
		proxy, _ := startProxy(t, fleetConfig(quiet, "least_load", a, b))
		toA, toB := send(proxy.URL())
		t.Logf("A got %d, B got %d of %d", toA, toB, n)
		if toA == 0 || toB == 0 || toA+toB != n { // least_load rotates among ties
			t.Errorf("A got %d, B got %d of %d: want both some", toA, toB, n)
		}
	})

	t.Run("with engine_load the proxy avoids the busy replica", func(t *testing.T) {
		cfg := fleetConfig(quiet, "least_load", a, b)
		// One engine_load table per provider, each after its [[providers]]
		// table's keys.
		var lines []string
		for l := range strings.Lines(cfg) {
			lines = append(lines, l)
			if strings.HasPrefix(l, "api_base = ") {
				lines = append(lines, "[providers.engine_load]\ninterval_ms = 50\nstale_ms = 2000\n")
			}
		}
		cfg = strings.Join(lines, "")
		if strings.Count(cfg, "[providers.engine_load]") != 2 {
			t.Fatalf("config:\n%s", cfg)
		}
		proxy, _ := startProxy(t, cfg)
		waitFor(t, "the proxy scraped A's queue", func() bool {
			return metric(t, proxy.URL(), `rolter_engine_load_requests{provider="vllm-0"}`) == busy
		})
		waitFor(t, "the proxy scraped B", func() bool { // -1: no series yet
			return metric(t, proxy.URL(), `rolter_engine_load_requests{provider="vllm-1"}`) >= 0
		})
		toA, toB := send(proxy.URL())
		t.Logf("A got %d, B got %d of %d", toA, toB, n)
		if toA != 0 || toB != n {
			t.Errorf("A got %d, B got %d of %d: want all on B", toA, toB, n)
		}
		if f := metric(t, proxy.URL(), `rolter_engine_load_scrape_failures_total{provider="vllm-0"}`); f > 0 {
			t.Errorf("%v scrape failures", f)
		}
	})
}
