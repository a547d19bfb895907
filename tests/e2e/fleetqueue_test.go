package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"rolter.dev/dataplane/app"
	"rolter.dev/pkg/natstest"
	"rolter.dev/tests/vllmsim"
)

// TestProxiesShareQueuedPrefill runs two predicted_ttft proxies sharing
// over NATS in front of two replicas that prefill 200 tokens a second.
// Through proxy A a long decode lands on one replica and then a prompt of a
// few thousand tokens, whose prefill outlasts the test, on the other: both
// replicas carry one request in flight, and only one has prefill queued.
// Proxy B, which sent neither, hears A's queue and sends every new request
// to the replica with nothing queued; without the report the two would tie
// (equal loads, nothing cached) and B would pick either.
func TestProxiesShareQueuedPrefill(t *testing.T) {
	ns := natstest.Start(t)
	opts := vllmsim.Options{Models: []string{"sim"}, PrefillTokensPerSecond: 200, ITL: 100 * time.Millisecond}
	rs := []*replica{startReplica(t, opts), startReplica(t, opts)}
	cfg := fleetConfig("[accounting]\nsink = \"none\"\n", "predicted_ttft", rs...)
	// Reports every 500 ms, valid for 1.5 s: at the default 5 ms (valid for
	// 15) a test binary starved of CPU for longer, as under a loaded CI
	// machine, let A's report lapse before B's picks, and B saw a tie.
	share := app.Options{NATSURL: ns.ClientURL(), ShareGroup: "queues", ShareQueueInterval: 500 * time.Millisecond}
	a, _ := startProxyWith(t, cfg, share)
	b, _ := startProxyWith(t, cfg, share)
	for _, u := range []string{a.URL(), b.URL()} {
		waitFor(t, "proxy sees its peer", func() bool { return metric(t, u, "rolter_fleet_peers") == 1 })
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	background := func(body string) {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.URL()+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	requests := func() []uint64 { return []uint64{rs[0].sim.Stats().Requests, rs[1].sim.Stats().Requests} }

	// A long decode (1,000 tokens at 100 ms) after a prefill of a few
	// seconds. Both of A's requests stream: one that does not is out of
	// the queue at once until A's law is fitted (predicted_ttft's whole
	// answers), and this test sends too few for that.
	background(fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1000,"ignore_eos":true,"stream":true}`,
		"decode for a while: "+strings.Repeat("a short prompt. ", 100)))
	waitFor(t, "the decode is admitted", func() bool { r := requests(); return r[0]+r[1] == 1 })
	decoding := 0
	if requests()[1] == 1 {
		decoding = 1
	}
	// A's next pick is the other replica: the first one's prefill is
	// queued ahead there.
	long := strings.Repeat("an unrelated long document sentence. ", 800)
	background(fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1,"stream":true}`, "summarise: "+long))
	waitFor(t, "the long prefill is admitted", func() bool { r := requests(); return r[0] == 1 && r[1] == 1 })
	queued := 1 - decoding
	// Not just any report of A's: the one after the decode's first token
	// may have left before A sent the long prompt.
	waitFor(t, "B hears A's queued long prefill", func() bool {
		return metric(t, b.URL(), fmt.Sprintf(`rolter_fleet_peer_queued_prefill_tokens{model="m",provider="vllm-%d"}`, queued)) > 0
	})

	const n = 8
	before := requests()
	for i := range n {
		postOK(t, b.URL(), "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":"question %d: what now?","max_tokens":1}`, i))
	}
	after := requests()
	if got := after[queued] - before[queued]; got != 0 {
		t.Fatalf("B sent %d of %d requests to replica %d, where A's long prefill is queued (the other got %d)",
			got, n, queued, after[decoding]-before[decoding])
	}
}
