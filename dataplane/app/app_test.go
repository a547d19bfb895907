package app_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"rolter.dev/pkg/syncbuf"
	"strings"
	"testing"
	"time"

	"rolter.dev/dataplane/app"
	"rolter.dev/pkg/natstest"
)

const doc = `
[server]
require_auth = false
[accounting]
sink = "none"
[[providers]]
name = "a"
kind = "openai_compatible"
api_base = "http://127.0.0.1:9"
[providers.kv_events]
endpoint = "tcp://127.0.0.1:9"
[[routes]]
model = "m"
strategy = "precise_cache_aware"
targets = [{ provider = "a" }]
`

// TestNATSDisconnectIsLogged: the proxy logs when its NATS connection is
// lost; its log lines (the KV index's among them) say "component" once.
func TestNATSDisconnectIsLogged(t *testing.T) {
	s := natstest.Start(t)
	path := filepath.Join(t.TempDir(), "rolter.toml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.Start(ctx, app.Options{ConfigPath: path, Listen: "127.0.0.1:0", NATSURL: s.ClientURL(), DrainTimeout: time.Second,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() { cancel(); _ = a.Wait() }()
	deadline := time.Now().Add(30 * time.Second) // fail-safe
	// No watcher answers the index's snapshot request: it logs that.
	for !strings.Contains(logs.String(), `"component":"kvindex"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no kvindex log line:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Shutdown()
	for !strings.Contains(logs.String(), `"msg":"nats disconnected`) {
		if time.Now().After(deadline) {
			t.Fatalf("no disconnect logged:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Count(line, `"component"`) > 1 {
			t.Errorf("component twice: %s", line)
		}
	}
}
