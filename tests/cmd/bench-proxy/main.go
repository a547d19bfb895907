// Command bench-proxy measures rolter-proxy's overhead. In one run on one
// machine it drives the same fast upstream (a) directly, (b) through a bare
// net/http/httputil.ReverseProxy and (c) through rolter-proxy with a
// round_robin route, at fixed concurrency, non-streaming and streaming, and
// prints requests/s, p50 and p99 latency of each and the ratios.
//
// With --sharing it also measures what sharing routing state across proxies
// costs the request path: cache_aware through one proxy alone, and through
// one of three proxies sharing over an in-process NATS server, with
// GSP-like prompts (64 system prompts of 2 KiB, unique questions).
//
// It is a benchmark, not a test: `make bench-proxy`, numbers go to
// docs/benchmarks.md with the command line that produced them.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"rolter.dev/dataplane/app"
)

func main() {
	duration := flag.Duration("duration", 5*time.Second, "measuring time per scenario")
	warmup := flag.Duration("warmup", time.Second, "warm-up time per scenario (not measured)")
	high := flag.Int("concurrency", 32, "concurrent clients for the throughput runs")
	moderate := flag.Int("moderate", 4, "concurrent clients for the moderate-load latency runs")
	events := flag.Int("stream-events", 20, "SSE events per streamed response")
	sharing := flag.Bool("sharing", false, "only measure the cost of sharing routing state across proxies")
	flag.Parse()

	upstream, err := startUpstream(*events)
	if err != nil {
		fail(err)
	}
	upURL, _ := url.Parse(upstream)
	rp := httputil.NewSingleHostReverseProxy(upURL)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 1024}
	rp.FlushInterval = -1 // flush every write, as rolter does for streams
	bare, err := serve(rp)
	if err != nil {
		fail(err)
	}
	if *sharing {
		benchSharing(upstream, *moderate, *high, *warmup, *duration)
		return
	}
	rolter, stop, err := startRolter(upstream, "round_robin", app.Options{})
	if err != nil {
		fail(err)
	}
	defer stop()

	targets := []struct{ name, url string }{{"direct", upstream}, {"httputil.ReverseProxy", bare}, {"rolter-proxy", rolter}}
	fmt.Printf("# bench-proxy: %s per scenario after %s warm-up, GOMAXPROCS=%d\n\n", *duration, *warmup, cpuCount())
	for _, stream := range []bool{false, true} {
		for _, conc := range []int{*high, *moderate} {
			mode := "non-streaming"
			if stream {
				mode = fmt.Sprintf("streaming (%d SSE events)", *events)
			}
			fmt.Printf("## %s, concurrency %d\n\n", mode, conc)
			fmt.Println("| path | requests/s | p50 ms | p99 ms | errors |")
			fmt.Println("|---|---:|---:|---:|---:|")
			var res []result
			for _, t := range targets {
				run(t.url, stream, conc, *warmup)
				r := run(t.url, stream, conc, *duration)
				r.name = t.name
				res = append(res, r)
				fmt.Printf("| %s | %.0f | %.3f | %.3f | %d |\n", r.name, r.rps, ms(r.p50), ms(r.p99), r.errors)
			}
			d, b, ro := res[0], res[1], res[2]
			fmt.Printf("\nrolter / ReverseProxy throughput: %.2f×; rolter p99 overhead over direct: %+.3f ms (p50 %+.3f ms); ReverseProxy p99 overhead: %+.3f ms\n\n",
				ro.rps/b.rps, ms(ro.p99-d.p99), ms(ro.p50-d.p50), ms(b.p99-d.p99))
		}
	}
}

type result struct {
	name     string
	rps      float64
	p50, p99 time.Duration
	errors   int64
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 1024}}

const chatBody = `{"model":"bench","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in five words."}],"max_tokens":16}`

func run(base string, stream bool, conc int, d time.Duration) result {
	body := chatBody
	if stream {
		body = strings.Replace(chatBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
	}
	return runBodies(base, conc, d, func(int) string { return body })
}

// runBodies is run with a body per request (n counts the worker's requests).
func runBodies(base string, conc int, d time.Duration, bodyOf func(n int) string) result {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var errs atomic.Int64
	lat := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conc {
		wg.Go(func() {
			for n := w; ctx.Err() == nil; n += conc {
				body := bodyOf(n)
				t0 := time.Now()
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					errs.Add(1)
					continue
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					errs.Add(1)
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := result{errors: errs.Load(), rps: float64(len(all)) / elapsed.Seconds()}
	if len(all) > 0 {
		r.p50 = all[len(all)/2]
		r.p99 = all[len(all)*99/100]
	}
	return r
}

// startUpstream serves a fast OpenAI-compatible upstream: a fixed JSON
// completion, or a stream of SSE chunks flushed one by one.
func startUpstream(events int) (string, error) {
	completion := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, nice to meet."},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":6,"total_tokens":26}}`)
	chunk := []byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]}\n\n")
	return serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(r.Body)
		if bytes.Contains(buf.Bytes(), []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "text/event-stream")
			f := w.(http.Flusher)
			for range events {
				_, _ = w.Write(chunk)
				f.Flush()
			}
			_, _ = w.Write([]byte("data: [DONE]\n\n"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(completion)
	}))
}

func serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() { _ = http.Serve(ln, h) }() // lives until the process exits
	return "http://" + ln.Addr().String(), nil
}

func startRolter(upstream, strategy string, opts app.Options) (string, func(), error) {
	dir, err := os.MkdirTemp("", "bench-proxy")
	if err != nil {
		return "", nil, err
	}
	cfg := fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
require_auth = false
[accounting]
sink = "none"
[[providers]]
name = "up"
kind = "openai_compatible"
api_base = %q
[[routes]]
model = "bench"
strategy = %q
targets = [{ provider = "up" }, { provider = "up", model = "b" }, { provider = "up", model = "c" }, { provider = "up", model = "d" }]
`, upstream, strategy)
	path := filepath.Join(dir, "rolter.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	opts.ConfigPath, opts.Logger = path, slog.New(slog.NewJSONHandler(io.Discard, nil)) // access logs on, as in production
	a, err := app.Start(ctx, opts)
	if err != nil {
		cancel()
		return "", nil, err
	}
	return a.URL(), func() { cancel(); _ = a.Wait(); os.RemoveAll(dir) }, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func cpuCount() int { return runtime.GOMAXPROCS(0) }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench-proxy:", err)
	os.Exit(1)
}
