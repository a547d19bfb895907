package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"rolter.dev/dataplane/app"
)

// benchSharing compares cache_aware through a proxy that shares nothing,
// through a sharing proxy alone in its group, and through one of three
// proxies sharing their routing state over NATS (the two others idle,
// folding what the measured one publishes, on the same CPUs).
func benchSharing(upstream string, moderate, high int, warmup, duration time.Duration) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		fail(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(5 * time.Second) {
		fail(fmt.Errorf("nats not ready"))
	}
	defer ns.Shutdown()

	alone, stopAlone, err := startRolter(upstream, "cache_aware", app.Options{})
	if err != nil {
		fail(err)
	}
	defer stopAlone()
	// A sharing proxy alone in its group: the request path's own cost
	// (shared index, queueing, publishing) without peers folding on the
	// same CPUs.
	lone, stopLone, err := startRolter(upstream, "cache_aware", app.Options{NATSURL: ns.ClientURL(), ShareGroup: "alone"})
	if err != nil {
		fail(err)
	}
	defer stopLone()
	var shared string
	for i := range 3 {
		u, stop, err := startRolter(upstream, "cache_aware", app.Options{NATSURL: ns.ClientURL()})
		if err != nil {
			fail(err)
		}
		defer stop()
		if i == 0 {
			shared = u
		}
	}
	bodies := gspBodies()
	bodyOf := func(n int) string { return bodies[n%len(bodies)] }
	fmt.Printf("# bench-proxy --sharing: %s per scenario after %s warm-up, GOMAXPROCS=%d, %d distinct GSP-like bodies\n\n",
		duration, warmup, cpuCount(), len(bodies))
	for _, conc := range []int{moderate, high} {
		fmt.Printf("## cache_aware, 4 targets, non-streaming, concurrency %d\n\n", conc)
		fmt.Println("| path | requests/s | p50 ms | p99 ms | errors |")
		fmt.Println("|---|---:|---:|---:|---:|")
		var res []result
		for _, t := range []struct{ name, url string }{{"one proxy, no sharing", alone}, {"one sharing proxy, no peers", lone}, {"one of three sharing proxies", shared}} {
			runBodies(target{url: t.url}, conc, warmup, bodyOf)
			r := runBodies(target{url: t.url}, conc, duration, bodyOf)
			r.name = t.name
			res = append(res, r)
			fmt.Printf("| %s | %.0f | %.3f | %.3f | %d |\n", r.name, r.rps, ms(r.p50), ms(r.p99), r.errors)
		}
		fmt.Printf("\nrequest path (no peers): throughput %.2f×, p50 %+.3f ms, p99 %+.3f ms; with two peers folding on the same machine: %.2f×, p50 %+.3f ms, p99 %+.3f ms\n\n",
			res[1].rps/res[0].rps, ms(res[1].p50-res[0].p50), ms(res[1].p99-res[0].p99),
			res[2].rps/res[0].rps, ms(res[2].p50-res[0].p50), ms(res[2].p99-res[0].p99))
	}
}

// gspBodies are chat requests with one of 64 system prompts of about 2 KiB
// and a unique question of about 500 bytes.
func gspBodies() []string {
	rng := rand.New(rand.NewPCG(1, 2))
	words := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			fmt.Fprintf(&b, "w%d ", rng.IntN(5000))
		}
		return b.String()
	}
	systems := make([]string, 64)
	for i := range systems {
		systems[i] = words(2048)
	}
	out := make([]string, 8192)
	for i := range out {
		b, _ := json.Marshal(map[string]any{
			"model": "bench",
			"messages": []map[string]string{
				{"role": "system", "content": systems[rng.IntN(len(systems))]},
				{"role": "user", "content": words(500)},
			},
			"max_tokens": 16,
		})
		out[i] = string(b)
	}
	return out
}
