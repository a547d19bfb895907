package kvwatcher_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dpapp "rolter.dev/dataplane/app"
	"rolter.dev/kvwatcher/app"
	"rolter.dev/pkg/natstest"
)

// TestSpeculativeTTLFromConfig: a proxy routing a prefix no replica holds
// yet keeps sending it to the first replica it chose while
// [routes.balancer] speculative_ttl_ms lasts (the speculative insert), and
// spreads it by load when the key is 0. The replicas never store these
// token ids (the simulator tokenizes the prompt "x" instead), so only
// speculation can make the proxy stick.
func TestSpeculativeTTLFromConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ttlMS int
		stick bool
	}{{"on", 60_000, true}, {"off", 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.Start(t)
			a, b := newReplica(t, replicaOpts{}), newReplica(t, replicaOpts{})
			startWatcher(t, s, app.StaticSource{
				kvProvider("vllm-a", a.pub.Endpoint(), "", time.Minute),
				kvProvider("vllm-b", b.pub.Endpoint(), "", time.Minute),
			})
			a.waitSubscribers(t, 1)
			b.waitSubscribers(t, 1)
			urls := serveHTTP(t, a, b)
			cfg := twoReplicas{urls: urls, table: "kv_events", endpoints: [2]string{a.pub.Endpoint(), b.pub.Endpoint()},
				strategy: "precise_cache_aware", tail: fmt.Sprintf("[routes.balancer]\nspeculative_ttl_ms = %d\n", tc.ttlMS)}.config()
			p := startProxies(t, s, cfg, 1)[0]

			// Both replicas fresh (an applied batch each), neither holding
			// the prefix.
			a.warm(prompt("warm-a", 64))
			b.warm(prompt("warm-b", 64))
			tokens := prompt("fresh", 128)
			eventually(t, "a scored pick", 5*time.Second, func() bool {
				send(t, p, prompt("probe", 64))
				return decisions(t, p, "scored") > 0
			})
			seen := map[string]int{}
			for range 20 {
				seen[send(t, p, tokens)]++
			}
			if stuck := len(seen) == 1; stuck != tc.stick {
				t.Errorf("speculative_ttl_ms = %d: picks %v, want them all on one replica: %t", tc.ttlMS, seen, tc.stick)
			}
		})
	}
}

// send posts a completion carrying tokens as vLLM token ids and returns
// the provider that served it.
func send(t *testing.T, p *dpapp.App, tokens []uint32) string {
	t.Helper()
	ids := make([]string, len(tokens))
	for i, id := range tokens {
		ids[i] = strconv.FormatUint(uint64(id), 10)
	}
	req, _ := http.NewRequest(http.MethodPost, p.URL()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x","max_tokens":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Rolter-Vllm-Token-Ids", strings.Join(ids, ","))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	return resp.Header.Get("X-Rolter-Provider")
}

// decisions reads the proxy's rolter_routing_decisions_total of outcome.
func decisions(t *testing.T, p *dpapp.App, outcome string) float64 {
	t.Helper()
	resp, err := http.Get(p.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "rolter_routing_decisions_total{") && strings.Contains(line, `outcome="`+outcome+`"`) {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			sum += v
		}
	}
	return sum
}
