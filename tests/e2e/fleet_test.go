package e2e_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"rolter.dev/dataplane/app"
	"rolter.dev/pkg/natstest"
	"rolter.dev/tests/vllmsim"
)

// TestProxiesShareAffinity sends the same traffic (groups of requests, each
// group sharing a long system prompt, interleaved) to three replicas whose
// caches cannot each hold every group, through (a) one proxy, (b) three
// proxies behind a random spreader that share nothing, and (c) three proxies
// that share their routing state over an in-process NATS server, and
// compares the prefix-cache hit rate the replicas themselves report.
func TestProxiesShareAffinity(t *testing.T) {
	ns := natstest.Start(t)

	runs := []struct {
		name    string
		proxies int
		share   bool
	}{{"one proxy", 1, false}, {"three independent", 3, false}, {"three sharing", 3, true}}
	const (
		published = `rolter_fleet_published_total{unit="batches"}`
		received  = `rolter_fleet_received_total{unit="batches"}`
	)
	hit := map[string]float64{}
	for _, run := range runs {
		var rs []*replica
		for range 3 {
			rs = append(rs, startReplica(t, vllmsim.Options{Models: []string{"sim"}, CapacityBlocks: 100, MaxTokensDefault: 1}))
		}
		cfg := fleetConfig("", "cache_aware", rs...)
		var urls []string
		for range run.proxies {
			opts := app.Options{}
			if run.proxies > 1 {
				// A group per run keeps the independent proxies' NATS
				// traffic (none) apart from the sharing ones'.
				opts = app.Options{NATSURL: ns.ClientURL(), NoShare: !run.share, ShareGroup: fmt.Sprintf("run-%d", len(hit)), ShareFlush: 2 * time.Millisecond}
			}
			a, _ := startProxyWith(t, cfg, opts)
			urls = append(urls, a.URL())
		}
		if run.share {
			// Every proxy hears every other before traffic starts.
			for _, u := range urls {
				waitFor(t, "proxy sees its two peers", func() bool { return metric(t, u, "rolter_fleet_peers") == 2 })
			}
		}
		rng := rand.New(rand.NewPCG(11, 11))
		pub := map[string]float64{} // batches each sharing proxy has published
		for i := range 360 {
			g := rng.IntN(12)
			u := urls[rng.IntN(len(urls))] // the L4 spreader
			body, _ := json.Marshal(map[string]any{
				"model": "m",
				"messages": []map[string]string{
					{"role": "system", "content": systemPrompt(g)},
					{"role": "user", "content": fmt.Sprintf("question %d of group %d: what now?", i, g)},
				},
				"max_tokens": 1,
			})
			before := pub[u]
			resp, err := http.Post(u+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s request %d: status %d", run.name, i, resp.StatusCode)
			}
			if run.share {
				// The next request goes out once the peers have folded
				// this one's observations (every question is new text,
				// so its flush publishes a batch): what traffic slower
				// than the 2 ms flush sees. How arrivals faster than
				// the messages fare is the simulator's part
				// (docs/routing.md). Without this wait a loaded machine
				// decides the result.
				poll := func(what string, done func() bool) {
					for deadline := time.Now().Add(20 * time.Second); !done(); time.Sleep(time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("request %d: %s", i, what)
						}
					}
				}
				poll("no batch published", func() bool { pub[u] = metric(t, u, published); return pub[u] > before })
				for _, v := range urls {
					var want float64 // every batch its peers published
					for w, n := range pub {
						if w != v {
							want += n
						}
					}
					poll("a peer did not fold the batch", func() bool { return metric(t, v, received) >= want })
				}
			}
		}
		if run.share {
			// A proxy joining now warms up from a peer's snapshot instead
			// of starting cold.
			opts := app.Options{NATSURL: ns.ClientURL(), ShareGroup: fmt.Sprintf("run-%d", len(hit)), ShareFlush: 2 * time.Millisecond}
			lateApp, _ := startProxyWith(t, cfg, opts)
			late := lateApp.URL()
			waitFor(t, "the late proxy applies a snapshot", func() bool {
				return metric(t, late, `rolter_fleet_snapshots_total{direction="applied"}`) == 1
			})
			held := 0.0
			for i := range rs {
				held += metric(t, late, fmt.Sprintf(`rolter_shared_prefix_chunks{model="m",provider="vllm-%d"}`, i))
			}
			if held <= 0 {
				t.Fatalf("the late proxy's shared index holds %v hashes after warming up", held)
			}
		}
		var prompt, cached uint64
		for _, r := range rs {
			st := r.sim.Stats()
			prompt += st.PromptTokens
			cached += st.CachedPromptTokens
		}
		hit[run.name] = float64(cached) / float64(prompt)
		t.Logf("%s: replica prefix-cache hit rate %.3f", run.name, hit[run.name])
	}
	one, off, on := hit["one proxy"], hit["three independent"], hit["three sharing"]
	if on < 0.95*one {
		t.Errorf("sharing proxies hit %.3f, below 95%% of one proxy's %.3f", on, one)
	}
	if on < off+0.05 {
		t.Errorf("sharing proxies hit %.3f, not clearly above independent proxies' %.3f", on, off)
	}
}
