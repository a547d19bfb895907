package app_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rolter.dev/dataplane/app"
	"rolter.dev/dataplane/internal/routingstate"
	"rolter.dev/pkg/syncbuf"
)

// The proxy writes what its balancers learned to --routing-state while it
// runs and at shutdown, and reads it back at the next start; a damaged
// file is logged and the proxy starts from nothing.
func TestRoutingStateSurvivesARestart(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	dir := t.TempDir()
	path, state := filepath.Join(dir, "rolter.toml"), filepath.Join(dir, "state", "routing.state")
	cfg := fmt.Sprintf("[server]\nrequire_auth = false\n[accounting]\nsink = \"none\"\n"+
		"[[providers]]\nname = \"a\"\nkind = \"openai_compatible\"\napi_base = %q\n"+
		"[[providers]]\nname = \"b\"\nkind = \"openai_compatible\"\napi_base = %q\n"+
		"[[routes]]\nmodel = \"m\"\nstrategy = \"predicted_ttft\"\ntargets = [{ provider = \"a\" }, { provider = \"b\" }]\n", up.URL, up.URL)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(send int) string {
		started := time.Now()
		logs := &syncbuf.Buffer{}
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		a, err := app.Start(ctx, app.Options{ConfigPath: path, Listen: "127.0.0.1:0", DrainTimeout: time.Second, RoutingStateFile: state,
			RoutingStateInterval: 10 * time.Millisecond, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		for i := range send {
			body := fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":%q}]}`, strings.Repeat(fmt.Sprintf("conversation %d ", i), 100))
			resp, err := http.Post(a.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if send > 0 {
			// Written while it runs too: what a crash (no drain) leaves.
			deadline := time.Now().Add(10 * time.Second) // fail-safe
			for {
				if info, err := os.Stat(state); err == nil && info.ModTime().After(started) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the routing state was not written while the proxy ran")
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		stop()
		if err := a.Wait(); err != nil {
			t.Fatal(err)
		}
		return logs.String()
	}

	run(4)
	routes, _, err := routingstate.Load(state)
	if err != nil || len(routes) != 1 || routes[0].Route != "m" || len(routes[0].Targets) != 2 || len(routes[0].State) == 0 {
		t.Fatalf("the state written at shutdown: %+v, %v; want route m's balancer over 2 targets", routes, err)
	}
	if logs := run(0); !strings.Contains(logs, "read back what it had learned before the restart") {
		t.Fatalf("the restarted proxy did not read the state back:\n%s", logs)
	}
	if err := os.WriteFile(state, []byte("damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	if logs := run(1); !strings.Contains(logs, "routing state unreadable") {
		t.Fatalf("a damaged state file was not reported:\n%s", logs)
	}
	if routes, _, err := routingstate.Load(state); err != nil || len(routes) != 1 {
		t.Fatalf("after a start from a damaged file, the state written at shutdown: %v, %v", routes, err)
	}
}
