package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"rolter.dev/pkg/config"
	"rolter.dev/pkg/reliability"
)

// engineLoadDoc routes m over p0 and p1 with least_load; el is appended to
// each provider (e.g. an engine_load table).
func engineLoadDoc(a, b *upstream, el string) string {
	doc := openAuth + strings.ReplaceAll(providers(a, b), "\n\n", "\n"+el+"\n")
	return doc + "[accounting]\nsink = \"none\"\n[[routes]]\nmodel = \"m\"\nstrategy = \"least_load\"\ntargets = [{ provider = \"p0\" }, { provider = \"p1\" }]\n"
}

func servedBy(t *testing.T, url string) string {
	t.Helper()
	resp, body := post(t, url+"/v1/chat/completions", "", `{"model":"m","messages":[]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var out struct {
		ServedBy string `json:"served_by"`
	}
	_ = json.Unmarshal(body, &out)
	return out.ServedBy
}

// TestPickUsesFreshEngineLoad: a fresh engine load raises a target's load
// (least_load avoids it); a stale one, or one of a provider without
// [providers.engine_load], is ignored.
func TestPickUsesFreshEngineLoad(t *testing.T) {
	const table = "[providers.engine_load]\nstale_ms = 60000\n"
	for _, tc := range []struct {
		name  string
		table string
		age   time.Duration
		avoid bool
	}{
		{"fresh", table, 0, true},
		{"stale", table, 2 * time.Minute, false},
		{"no table", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newUpstream(t, "a"), newUpstream(t, "b")
			p, srv := newTestProxy(t, engineLoadDoc(a, b, tc.table))
			p.Registry().Provider("p0").SetEngineLoad(5, time.Now().Add(-tc.age))
			got := map[string]int{}
			for range 10 {
				got[servedBy(t, srv.URL)]++
			}
			if tc.avoid && got["b"] != 10 || !tc.avoid && (got["a"] == 0 || got["b"] == 0) {
				t.Errorf("served by %v", got)
			}
		})
	}
}

// TestPickTakesTheLargerOfOwnAndEngineLoad: the engine's count includes the
// proxy's own requests, so the two are not added. p0 has 2 requests of this
// proxy in flight and reports 2; p1 has none of ours and reports 3 from
// other clients: p0 (max 2) is less loaded than p1 (max 3), where a sum
// would say 4 against 3.
func TestPickTakesTheLargerOfOwnAndEngineLoad(t *testing.T) {
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	release := make(chan struct{})
	a.mu.Lock()
	a.handler = func(_ http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Hold") != "" {
			<-release // then answer normally
		}
		return false
	}
	a.mu.Unlock()
	p, srv := newTestProxy(t, engineLoadDoc(a, b, "[providers.engine_load]\nstale_ms = 60000\n"))
	now := time.Now()
	p.Registry().Provider("p0").SetEngineLoad(0, now)
	p.Registry().Provider("p1").SetEngineLoad(3, now)
	// Both held requests go to p0 (least loaded: 0, then 1 against 3).
	done := make(chan struct{}, 2)
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
			req.Header.Set("X-Hold", "1")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	waitFor(t, func() bool { return a.hits.Load() == 2 })
	p.Registry().Provider("p0").SetEngineLoad(2, time.Now()) // the engine sees them too
	if got := servedBy(t, srv.URL); got != "a" {
		t.Errorf("served by %s, want a (max(2, 2) < max(0, 3))", got)
	}
	close(release)
	<-done
	<-done
}

// TestEngineStateCounts: predicted_ttft reads a target's running and
// waiting counts from one fresh scrape (running = the load less its
// waiting part) with the scrape's age, and none from a stale scrape, a
// provider without [providers.engine_load] or a target out of range.
func TestEngineStateCounts(t *testing.T) {
	scraped := &reliability.Provider{}
	withTable := config.CompiledTarget{Provider: &config.CompiledProvider{EngineLoad: &config.CompiledEngineLoad{Stale: time.Minute}}}
	st := engineState{targets: []target{
		{cfg: withTable, health: scraped},
		{cfg: config.CompiledTarget{Provider: &config.CompiledProvider{}}, health: &reliability.Provider{}},
	}}
	scraped.SetEngineWaiting(3)
	scraped.SetEngineLoad(10, time.Now().Add(-30*time.Second))
	if w, r, age, ok := st.Counts(0); !ok || w != 3 || r != 7 || age < 30*time.Second || age >= time.Minute {
		t.Errorf("counts = %d waiting, %d running, %v old, %v; want 3, 7, 30 s to 1 min, true", w, r, age, ok)
	}
	for _, i := range []int{1, 2, -1} {
		if _, _, _, ok := st.Counts(i); ok {
			t.Errorf("target %d: counts reported without a scrape", i)
		}
	}
	scraped.SetEngineLoad(10, time.Now().Add(-2*time.Minute))
	if _, _, _, ok := st.Counts(0); ok {
		t.Error("stale scrape: counts reported")
	}
}
