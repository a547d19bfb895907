package app_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
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

// TestDrainDeadlineEndsStreamsWithAnErrorEvent: a stream still running when
// the drain timeout ends (its upstream never finishes) is not simply cut
// when the server closes its connections: the client reads the proxy's
// shutting-down error event first, then the aborted connection, so it can
// tell the answer is incomplete. The upstream request is cancelled, and the
// drain ends cleanly.
func TestDrainDeadlineEndsStreamsWithAnErrorEvent(t *testing.T) {
	const first = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n"
	released := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, first)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // never ends by itself
		close(released)
	}))
	t.Cleanup(up.Close)
	path := filepath.Join(t.TempDir(), "rolter.toml")
	cfg := fmt.Sprintf("[server]\nrequire_auth = false\n[accounting]\nsink = \"none\"\n"+
		"[[providers]]\nname = \"a\"\nkind = \"openai_compatible\"\napi_base = %q\n"+
		"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"a\" }]\n", up.URL)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	a, err := app.Start(ctx, app.Options{ConfigPath: path, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		DrainTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(a.URL()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	got := make([]byte, len(first))
	if _, err := io.ReadFull(rd, got); err != nil || string(got) != first {
		t.Fatalf("first event %q, %v", got, err)
	}
	stop() // SIGTERM, with the stream in flight
	rest, err := io.ReadAll(rd)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read error %v after %q: a stream cut by the drain must end broken", err, rest)
	}
	if !strings.HasPrefix(string(rest), `data: {"error":{"message":"the proxy shut down before the response finished`) ||
		!strings.Contains(string(rest), `"code":"shutting_down"`) {
		t.Fatalf("after the first event: %q, want the shutting-down error event", rest)
	}
	<-released
	if err := a.Wait(); err != nil {
		t.Fatalf("drain: %v", err)
	}
}
