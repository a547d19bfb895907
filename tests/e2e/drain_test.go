package e2e_test

import (
	"bufio"
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"rolter.dev/dataplane/app"
	"rolter.dev/tests/vllmsim"
)

// TestDrainCompletesInFlightStreams stops a proxy while 200 streams are in
// flight: every stream completes, /readyz has turned 503 before the listener
// closes, and new connections are refused afterwards.
func TestDrainCompletesInFlightStreams(t *testing.T) {
	rs := []*replica{startReplica(t, vllmsim.Options{Models: []string{"sim"}, ITL: 20 * time.Millisecond, MaxTokensDefault: 20})}
	path := filepath.Join(t.TempDir(), "rolter.toml")
	if err := os.WriteFile(path, []byte(fleetConfig("", "round_robin", rs...)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	a, err := app.Start(ctx, app.Options{ConfigPath: path, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler), DrainTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 300}}
	const n = 200
	var started, wg sync.WaitGroup
	started.Add(n)
	errs := make(chan string, n)
	for range n {
		wg.Go(func() {
			resp, err := client.Post(a.URL()+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"drain me"}]}`))
			if err != nil {
				started.Done()
				errs <- err.Error()
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			first, done := true, false
			for sc.Scan() {
				if first {
					first = false
					started.Done()
				}
				if sc.Text() == "data: [DONE]" {
					done = true
				}
			}
			if first {
				started.Done()
			}
			if !done {
				errs <- "stream ended without [DONE]"
			}
		})
	}
	started.Wait() // every stream has its first event: all are in flight
	stop()         // SIGTERM
	waitFor(t, "readyz to report draining", func() bool {
		resp, err := http.Get(a.URL() + "/readyz")
		if err != nil {
			return true // the listener is already closed: readiness flipped before
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if err := a.Wait(); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if _, err := http.Get(a.URL() + "/healthz"); err == nil {
		t.Fatal("a drained proxy still accepts connections")
	}
}
