package app

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/natstest"
	"rolter.dev/pkg/porttest"
)

const serviceDoc = `
[[providers]]
name = "vllm-a"
kind = "openai_compatible"
api_base = "http://127.0.0.1:1"
[providers.kv_events]
endpoint = "tcp://127.0.0.1:1"

[[routes]]
model = "m"
targets = [{ provider = "vllm-a" }]
`

// readyz returns /readyz's status code and body ("" when unreachable).
func readyz(base string) (int, string) {
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServiceStartsBeforeNATS: started while NATS is unreachable, the
// process keeps running and answers not-ready; once a NATS server listens
// on the address it connects, turns ready and publishes the provider's
// status.
func TestServiceStartsBeforeNATS(t *testing.T) {
	natsPort := porttest.Free(t, 1)
	metrics := porttest.Addr(t)
	cfg := filepath.Join(t.TempDir(), "rolter.toml")
	if err := os.WriteFile(cfg, []byte(serviceDoc), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunService(ctx, ServiceOptions{ConfigPath: cfg, NATSURL: "nats://127.0.0.1:" + strconv.Itoa(natsPort),
			MetricsListen: metrics, Heartbeat: 50 * time.Millisecond, Logger: testLogger()})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunService: %v", err)
		}
	}()
	base := "http://" + metrics
	deadline := time.Now().Add(30 * time.Second) // fail-safe, not a timing assertion
	for {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("RunService returned with NATS down: %v", err)
		default:
		}
		if code, body := readyz(base); code != 0 {
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "nats") {
				t.Fatalf("/readyz with NATS down: %d %q", code, body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the metrics listener never answered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	s := natstest.Start(t, func(o *server.Options) { o.Port = natsPort })
	nc := natstest.Connect(t, s)
	msgs := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(kvdelta.Subject("vllm-a"), msgs)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	select {
	case m := <-msgs:
		d, err := kvdelta.Decode(m.Data)
		if err != nil || d.Provider != "vllm-a" {
			t.Fatalf("message %+v, %v", d, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nothing published after NATS came up")
	}
	for code, body := readyz(base); code != http.StatusOK; code, body = readyz(base) {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz after NATS came up: %d %q", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
