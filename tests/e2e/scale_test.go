package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"rolter.dev/tests/vllmsim"
)

// TestScaledFleetKeepsConversations: a predicted_ttft route over two
// vllmsim replicas (no KV events: the proxy's approximate index is all it
// knows of where a conversation lives) serves the first turns of eight
// conversations; the config file then gains a third replica, and the proxy
// reloads it. The route's new balancer inherits what the old one learned,
// so every second turn goes back to the replica holding its conversation:
// the replicas report nearly all of the first turns' tokens cached. A
// balancer rebuilt from nothing spread the second turns as new prompts.
func TestScaledFleetKeepsConversations(t *testing.T) {
	var rs []*replica
	for range 3 {
		rs = append(rs, startReplica(t, vllmsim.Options{Models: []string{"sim"}, CapacityBlocks: 4000, MaxTokensDefault: 1}))
	}
	a, path := startProxy(t, fleetConfig(noUsageLog, "predicted_ttft", rs[0], rs[1]))
	const conversations = 8
	history := make([][]map[string]string, conversations)
	send := func(c int) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": history[c], "max_tokens": 1})
		resp, err := http.Post(a.URL()+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || len(out.Choices) != 1 {
			t.Fatalf("conversation %d: status %d, %v", c, resp.StatusCode, err)
		}
		history[c] = append(history[c], map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content})
	}
	stats := func() (prompt, cached uint64) {
		for _, r := range rs {
			st := r.sim.Stats()
			prompt += st.PromptTokens
			cached += st.CachedPromptTokens
		}
		return prompt, cached
	}
	for c := range conversations {
		var b strings.Builder
		for i := range 60 {
			fmt.Fprintf(&b, "conversation %d, fact %d: it holds. ", c, i)
		}
		history[c] = []map[string]string{{"role": "user", "content": b.String()}}
		send(c)
	}
	firstPrompt, _ := stats()

	before := metric(t, a.URL(), "rolter_config_reloads_total")
	if err := os.WriteFile(path, []byte(fleetConfig(noUsageLog, "predicted_ttft", rs...)), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the proxy reloads the config with the third replica", func() bool {
		return metric(t, a.URL(), "rolter_config_reloads_total") > before
	})

	for c := range conversations {
		history[c] = append(history[c], map[string]string{"role": "user", "content": fmt.Sprintf("and then, for conversation %d?", c)})
		send(c)
	}
	prompt, cached := stats()
	if cached < firstPrompt*9/10 {
		t.Fatalf("second turns after the reload: %d of their %d prompt tokens cached, want nearly the %d tokens of the first turns (each conversation back on its replica)",
			cached, prompt-firstPrompt, firstPrompt)
	}
	t.Logf("second turns: %d cached of %d prompt tokens; first turns %d", cached, prompt-firstPrompt, firstPrompt)
}

// noUsageLog keeps the usage records off the test's output.
const noUsageLog = "[accounting]\nsink = \"none\"\n"
