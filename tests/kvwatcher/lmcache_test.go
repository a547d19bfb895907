package kvwatcher_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"rolter.dev/kvwatcher/app"
	"rolter.dev/pkg/natstest"
)

// TestLMCacheOccupancyMovesTraffic: two replicas report LMCache occupancy;
// a proxy with lmcache_aware sends requests to the emptier cache, follows a
// change, and a dead occupancy endpoint stops counting (its replica scores
// as unknown, not as empty).
func TestLMCacheOccupancyMovesTraffic(t *testing.T) {
	s := natstest.Start(t)
	var occA, occB atomic.Value
	occA.Store("0.9")
	occB.Store("0.1")
	lm := func(v *atomic.Value) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"occupancy": %s, "cache_available": true}`, v.Load().(string))
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	lmA, lmB := lm(&occA), lm(&occB)
	startWatcher(t, s, app.StaticSource{
		{Name: "vllm-a", LM: &app.LMSpec{Endpoint: lmA.URL, Refresh: 50 * time.Millisecond, Stale: time.Second}},
		{Name: "vllm-b", LM: &app.LMSpec{Endpoint: lmB.URL, Refresh: 50 * time.Millisecond, Stale: time.Second}},
	})
	a, b := newReplica(t, replicaOpts{}), newReplica(t, replicaOpts{})
	urls := serveHTTP(t, a, b)
	cfg := twoReplicas{urls: urls, table: "lmcache", endpoints: [2]string{lmA.URL, lmB.URL}, strategy: "lmcache_aware"}.config()
	p := startProxies(t, s, cfg, 1)[0]
	provider := func() string {
		resp, err := http.Post(p.URL()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x","max_tokens":1}`))
		if err != nil {
			return ""
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Header.Get("X-Rolter-Provider")
	}
	// Until a signal is fresh the strategy is neutral and ties go to a
	// random target, so one request landing on want proves nothing: wait
	// for a run of 20 (chance: 2^-20), then hold it for 10 more.
	steady := func(want string) {
		t.Helper()
		eventually(t, "traffic moves to "+want, 5*time.Second, func() bool {
			for range 20 {
				if provider() != want {
					return false
				}
			}
			return true
		})
		for range 10 {
			if got := provider(); got != want {
				t.Fatalf("a request went to %s, want %s (the emptier cache)", got, want)
			}
		}
	}
	steady("vllm-b")
	occA.Store("0.05")
	occB.Store("0.95")
	steady("vllm-a")
	// A's occupancy endpoint dies: A ages into staleness (scores 0), so the
	// fresh B (score 0.05) takes the traffic even though its cache is fuller.
	lmA.Close()
	steady("vllm-b")
}
