package e2e_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"rolter.dev/tests/vllmsim"
)

// TestCacheAwareRaisesReplicaHitRate sends the same traffic (12 groups of
// requests, each group sharing a long system prompt, interleaved) through a
// proxy to three replicas whose caches cannot each hold every group, once
// with round_robin and once with cache_aware, and compares the prefix-cache
// hit rate the replicas themselves report.
func TestCacheAwareRaisesReplicaHitRate(t *testing.T) {
	hit := map[string]float64{}
	for _, strategy := range []string{"round_robin", "cache_aware"} {
		var rs []*replica
		for range 3 {
			// 16-token blocks; 100 blocks hold about 5 of the 12 groups.
			rs = append(rs, startReplica(t, vllmsim.Options{Models: []string{"sim"}, CapacityBlocks: 100, MaxTokensDefault: 1}))
		}
		a, _ := startProxy(t, fleetConfig("", strategy, rs...))
		rng := rand.New(rand.NewPCG(7, 7))
		for i := range 240 {
			g := rng.IntN(12)
			body, _ := json.Marshal(map[string]any{
				"model": "m",
				"messages": []map[string]string{
					{"role": "system", "content": systemPrompt(g)},
					{"role": "user", "content": fmt.Sprintf("question %d of group %d: what now?", i, g)},
				},
				"max_tokens": 1,
			})
			resp, err := http.Post(a.URL()+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s request %d: status %d", strategy, i, resp.StatusCode)
			}
		}
		var prompt, cached uint64
		for _, r := range rs {
			st := r.sim.Stats()
			prompt += st.PromptTokens
			cached += st.CachedPromptTokens
		}
		hit[strategy] = float64(cached) / float64(prompt)
		t.Logf("%s: replica prefix-cache hit rate %.3f", strategy, hit[strategy])
	}
	if hit["cache_aware"] < 1.5*hit["round_robin"] || hit["cache_aware"] < 0.6 {
		t.Fatalf("cache_aware hit rate %.3f vs round_robin %.3f: affinity routing is not keeping groups on their replica",
			hit["cache_aware"], hit["round_robin"])
	}
}

// systemPrompt is group g's shared system prompt, about 250 tokens.
func systemPrompt(g int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "You are assistant number %d. ", g)
	for i := range 50 {
		fmt.Fprintf(&b, "rule%d_%d applies. ", g, i)
	}
	return b.String()
}
