package e2e_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"rolter.dev/tests/vllmsim"
)

// TestRerankThroughProxy: vLLM's rerank and score endpoints through a real
// proxy over simulated replicas: the engine's ranking and usage come back
// as the engine answered them.
func TestRerankThroughProxy(t *testing.T) {
	var rs []*replica
	for range 2 {
		rs = append(rs, startReplica(t, vllmsim.Options{Models: []string{"sim"}}))
	}
	a, _ := startProxy(t, fleetConfig("", "least_load", rs...))
	docs := []string{"the weather is mild", "a red apple and a green apple", "apples grow on trees"}
	body, _ := json.Marshal(map[string]any{"model": "m", "query": "apple trees", "documents": docs, "top_n": 2})
	for _, path := range []string{"/rerank", "/v1/rerank", "/v2/rerank"} {
		resp, err := http.Post(a.URL()+path, "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out struct {
			Results []struct {
				Index          int     `json:"index"`
				RelevanceScore float64 `json:"relevance_score"`
			} `json:"results"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		if len(out.Results) != 2 || out.Results[0].RelevanceScore < out.Results[1].RelevanceScore || out.Usage.PromptTokens == 0 {
			t.Fatalf("%s: %s", path, b)
		}
		want := vllmsim.RelevanceScore("apple trees", docs[out.Results[0].Index])
		if out.Results[0].RelevanceScore != want {
			t.Fatalf("%s: top score %v, the engine's %v", path, out.Results[0].RelevanceScore, want)
		}
	}
	resp, err := http.Post(a.URL()+"/score", "application/json", strings.NewReader(`{"model":"m","queries":"apple trees","documents":["apples grow on trees"]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"object":"score"`) {
		t.Fatalf("/score: %d %s", resp.StatusCode, b)
	}
}
