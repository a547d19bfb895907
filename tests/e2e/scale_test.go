package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rolter.dev/dataplane/app"
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
	cs := &conversations{replicas: rs}
	cs.firstTurns(t, a.URL())
	firstPrompt, _ := cs.tokens()

	before := metric(t, a.URL(), "rolter_config_reloads_total")
	if err := os.WriteFile(path, []byte(fleetConfig(noUsageLog, "predicted_ttft", rs...)), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the proxy reloads the config with the third replica", func() bool {
		return metric(t, a.URL(), "rolter_config_reloads_total") > before
	})

	cs.secondTurns(t, a.URL())
	prompt, cached := cs.tokens()
	if cached < firstPrompt*9/10 {
		t.Fatalf("second turns after the reload: %d of their %d prompt tokens cached, want nearly the %d tokens of the first turns (each conversation back on its replica)",
			cached, prompt-firstPrompt, firstPrompt)
	}
	t.Logf("second turns: %d cached of %d prompt tokens; first turns %d", cached, prompt-firstPrompt, firstPrompt)
}

// noUsageLog keeps the usage records off the test's output.
const noUsageLog = "[accounting]\nsink = \"none\"\n"

// TestRestartedProxyKeepsConversations: a predicted_ttft route over two
// vllmsim replicas without KV events serves the first turns of eight
// conversations; the proxy is stopped (SIGTERM's drain) and a new one
// started with the same --routing-state file. Its balancer reads back
// where each conversation lives, so the second turns go back to their
// replicas: nearly all of the first turns' tokens are cached. A proxy
// started from nothing spreads them as new prompts, about half landing
// right by chance.
func TestRestartedProxyKeepsConversations(t *testing.T) {
	var rs []*replica
	for range 2 {
		rs = append(rs, startReplica(t, vllmsim.Options{Models: []string{"sim"}, CapacityBlocks: 4000, MaxTokensDefault: 1}))
	}
	dir := t.TempDir()
	path, state := filepath.Join(dir, "rolter.toml"), filepath.Join(dir, "routing.state")
	if err := os.WriteFile(path, []byte(fleetConfig(noUsageLog, "predicted_ttft", rs...)), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func() (*app.App, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		a, err := app.Start(ctx, app.Options{ConfigPath: path, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
			DrainTimeout: 5 * time.Second, RoutingStateFile: state})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		return a, cancel
	}
	cs := &conversations{replicas: rs}
	a, stop := start()
	cs.firstTurns(t, a.URL())
	firstPrompt, _ := cs.tokens()
	stop()
	if err := a.Wait(); err != nil {
		t.Fatal(err)
	}

	a, stop = start()
	defer func() {
		stop()
		if err := a.Wait(); err != nil {
			t.Error(err)
		}
	}()
	cs.secondTurns(t, a.URL())
	prompt, cached := cs.tokens()
	if cached < firstPrompt*9/10 {
		t.Fatalf("second turns after the restart: %d of their %d prompt tokens cached, want nearly the %d tokens of the first turns (each conversation back on its replica)",
			cached, prompt-firstPrompt, firstPrompt)
	}
	t.Logf("second turns: %d cached of %d prompt tokens; first turns %d", cached, prompt-firstPrompt, firstPrompt)
}

// conversations are eight chats with route "m" (max_tokens 1) over the
// replicas: each first turn about 600 tokens of its own, each second a
// short question after it.
type conversations struct {
	replicas []*replica
	history  [8][]map[string]string
}

func (cs *conversations) firstTurns(t *testing.T, url string) {
	t.Helper()
	for c := range cs.history {
		var b strings.Builder
		for i := range 60 {
			fmt.Fprintf(&b, "conversation %d, fact %d: it holds. ", c, i)
		}
		cs.history[c] = []map[string]string{{"role": "user", "content": b.String()}}
		cs.send(t, url, c)
	}
}

func (cs *conversations) secondTurns(t *testing.T, url string) {
	t.Helper()
	for c := range cs.history {
		cs.history[c] = append(cs.history[c], map[string]string{"role": "user", "content": fmt.Sprintf("and then, for conversation %d?", c)})
		cs.send(t, url, c)
	}
}

// tokens sums the replicas' prompt tokens and those served from cache.
func (cs *conversations) tokens() (prompt, cached uint64) {
	for _, r := range cs.replicas {
		st := r.sim.Stats()
		prompt += st.PromptTokens
		cached += st.CachedPromptTokens
	}
	return prompt, cached
}

// send sends conversation c's history and appends the answer to it.
func (cs *conversations) send(t *testing.T, url string, c int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": cs.history[c], "max_tokens": 1})
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out.Choices) != 1 {
		t.Fatalf("conversation %d: status %d, %v", c, resp.StatusCode, err)
	}
	cs.history[c] = append(cs.history[c], map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content})
}
