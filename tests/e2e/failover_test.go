package e2e_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"rolter.dev/tests/vllmsim"
)

func chatOnce(t *testing.T, base string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"ping"}],"max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp, resp.Header.Get("X-Rolter-Provider")
}

// TestFailover: with one of three replicas dead or answering 503, every
// request succeeds; the bad replica is parked / marked unhealthy, and takes
// traffic again once it recovers.
func TestFailover(t *testing.T) {
	for _, mode := range []string{"dead", "503"} {
		t.Run(mode, func(t *testing.T) {
			var rs []*replica
			for range 3 {
				rs = append(rs, startReplica(t, vllmsim.Options{Models: []string{"sim"}}))
			}
			extra := `
[retry]
base_backoff_ms = 1
max_backoff_ms = 5
[cooldown]
base_secs = 1
max_secs = 1
[health]
enabled = true
interval_secs = 1
timeout_secs = 1
consecutive_failure_threshold = 1
recovery_success_threshold = 1
`
			a, _ := startProxy(t, fleetConfig(extra, "round_robin", rs...))
			bad := rs[1]
			if mode == "dead" {
				bad.kill()
			} else {
				bad.sick.Store(true)
			}
			for i := range 30 {
				resp, provider := chatOnce(t, a.URL())
				if resp.StatusCode != 200 {
					t.Fatalf("request %d: status %d", i, resp.StatusCode)
				}
				if provider == "vllm-1" {
					t.Fatalf("request %d answered by the bad replica", i)
				}
			}
			waitFor(t, "the bad replica reported down", func() bool {
				return metric(t, a.URL(), `rolter_provider_healthy{provider="vllm-1"}`) == 0
			})

			if mode == "dead" {
				bad.revive()
			} else {
				bad.sick.Store(false)
			}
			waitFor(t, "the replica healthy again", func() bool {
				return metric(t, a.URL(), `rolter_provider_healthy{provider="vllm-1"}`) == 1
			})
			served := false
			for range 30 {
				if resp, provider := chatOnce(t, a.URL()); resp.StatusCode == 200 && provider == "vllm-1" {
					served = true
					break
				}
			}
			if !served {
				t.Fatal("the recovered replica takes no traffic")
			}
		})
	}
}
