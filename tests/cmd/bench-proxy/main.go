// Command bench-proxy measures rolter-proxy's overhead. In one run on one
// machine it drives the same fast OpenAI-compatible upstream (a) directly,
// (b) through a net/http/httputil.ReverseProxy tuned like rolter-proxy (the
// same upstream transport: idle pool, timeouts, no transparent gzip; the
// same flushing: streams flushed on every write, other bodies buffered),
// (c) through rolter-proxy with a round_robin route and (d), where it is
// installed, through Portkey's open-source gateway (@portkey-ai/gateway
// under tests/tools/portkey, `npm ci` there; skipped with a note when
// absent), at concurrency 8, 32 and 64, non-streaming and streaming. The
// load comes from wrk when it is on PATH (closed loop, one connection per
// client), else from a closed loop in this process; it prints requests/s,
// p50 and p99 latency of each and the ratios to the tuned reverse proxy.
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
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"rolter.dev/dataplane/app"
)

func main() {
	duration := flag.Duration("duration", 5*time.Second, "measuring time per scenario")
	warmup := flag.Duration("warmup", time.Second, "warm-up time per scenario (not measured)")
	concList := flag.String("concurrency", "8,32,64", "comma-separated concurrent clients, one scenario each")
	moderate := flag.Int("moderate", 4, "--sharing: concurrent clients for the moderate-load latency runs")
	high := flag.Int("high", 32, "--sharing: concurrent clients for the throughput runs")
	events := flag.Int("stream-events", 20, "SSE events per streamed response")
	loadgen := flag.String("loadgen", "auto", "load generator: wrk, go (a closed loop in this process) or auto (wrk when on PATH)")
	portkeyDir := flag.String("portkey", "tools/portkey", "directory with Portkey's gateway installed (npm ci); absent: skipped")
	sharing := flag.Bool("sharing", false, "only measure the cost of sharing routing state across proxies")
	flag.Parse()

	upstream, err := startUpstream(*events)
	if err != nil {
		fail(err)
	}
	if *sharing {
		benchSharing(upstream, *moderate, *high, *warmup, *duration)
		return
	}
	var concs []int
	for f := range strings.SplitSeq(*concList, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			fail(fmt.Errorf("--concurrency: %q is not a positive number", f))
		}
		concs = append(concs, c)
	}
	gen, err := pickLoadgen(*loadgen)
	if err != nil {
		fail(err)
	}
	upURL, _ := url.Parse(upstream)
	tuned, err := serveHTTP(tunedReverseProxy(upURL))
	if err != nil {
		fail(err)
	}
	rolter, stop, err := startRolter(upstream, "round_robin", app.Options{})
	if err != nil {
		fail(err)
	}
	defer stop()

	targets := []target{{name: "direct", url: upstream}, {name: "tuned httputil.ReverseProxy", url: tuned}, {name: "rolter-proxy", url: rolter}}
	pk, stopPK, note := startPortkey(*portkeyDir, upstream)
	if pk != "" {
		defer stopPK()
		targets = append(targets, target{name: "Portkey gateway " + portkeyVersion(*portkeyDir), url: pk,
			// Portkey's OSS gateway proxies to an OpenAI-compatible upstream
			// named by these headers (its docs: provider openai, customHost
			// with the version path).
			headers: map[string]string{"x-portkey-provider": "openai", "x-portkey-custom-host": upstream + "/v1", "Authorization": "Bearer bench"}})
	}

	fmt.Printf("# bench-proxy: %s per scenario after %s warm-up, load from %s, GOMAXPROCS=%d\n\n", *duration, *warmup, gen, cpuCount())
	if note != "" {
		fmt.Printf("Portkey: %s\n\n", note)
	}
	for _, stream := range []bool{false, true} {
		for _, conc := range concs {
			mode := "non-streaming"
			if stream {
				mode = fmt.Sprintf("streaming (%d SSE events)", *events)
			}
			fmt.Printf("## %s, concurrency %d\n\n", mode, conc)
			fmt.Println("| path | requests/s | p50 ms | p99 ms | errors | throughput / tuned proxy |")
			fmt.Println("|---|---:|---:|---:|---:|---:|")
			var res []result
			for _, t := range targets {
				if _, err := measure(gen, t, stream, conc, *warmup); err != nil {
					fail(err)
				}
				r, err := measure(gen, t, stream, conc, *duration)
				if err != nil {
					fail(err)
				}
				r.name = t.name
				res = append(res, r)
			}
			for _, r := range res {
				fmt.Printf("| %s | %.0f | %.3f | %.3f | %d | %.2f× |\n", r.name, r.rps, ms(r.p50), ms(r.p99), r.errors, r.rps/res[1].rps)
			}
			fmt.Println()
		}
	}
}

// tunedReverseProxy is the baseline: httputil.ReverseProxy with
// rolter-proxy's upstream transport (dataplane/internal/proxy/proxy.go,
// newTransport) and rolter's flushing (FlushInterval 0: ReverseProxy
// flushes text/event-stream responses on every write and buffers the rest,
// as forward.go does).
func tunedReverseProxy(up *url.URL) *httputil.ReverseProxy {
	rp := httputil.NewSingleHostReverseProxy(up)
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	rp.Transport = &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         dialer.DialContext,
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
		DisableCompression:  true,
	}
	rp.FlushInterval = 0
	// wrk closes its connections mid-request when a run ends; those are
	// not proxy errors worth a line each.
	rp.ErrorLog = log.New(io.Discard, "", 0)
	return rp
}

// target is one path under test; headers go with every request.
type target struct {
	name, url string
	headers   map[string]string
}

// pickLoadgen resolves --loadgen.
func pickLoadgen(want string) (string, error) {
	_, err := exec.LookPath("wrk")
	switch want {
	case "auto":
		if err == nil {
			return "wrk", nil
		}
		return "go", nil
	case "wrk":
		if err != nil {
			return "", fmt.Errorf("--loadgen wrk: %w", err)
		}
		return "wrk", nil
	case "go":
		return "go", nil
	}
	return "", fmt.Errorf("--loadgen: %q, want wrk, go or auto", want)
}

func measure(gen string, t target, stream bool, conc int, d time.Duration) (result, error) {
	body := chatBody
	if stream {
		body = strings.Replace(chatBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
	}
	if gen == "wrk" {
		return runWrk(t, body, conc, d)
	}
	return runBodies(t, conc, d, func(int) string { return body }), nil
}

// wrkScript sends POST body with the target's headers and counts non-200
// responses (wrk's own count lumps 2xx and 3xx together).
const wrkScript = `wrk.method = "POST"
wrk.body = %q
wrk.headers["Content-Type"] = "application/json"
%s
`

var (
	wrkRPS     = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkPct     = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`)
	wrkNon2xx  = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	wrkSockets = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

// runWrk drives t with wrk: conc connections over two threads (the
// machine's cores), latency percentiles from --latency.
func runWrk(t target, body string, conc int, d time.Duration) (result, error) {
	var hs strings.Builder
	for k, v := range t.headers {
		fmt.Fprintf(&hs, "wrk.headers[%q] = %q\n", k, v)
	}
	f, err := os.CreateTemp("", "bench-proxy-*.lua")
	if err != nil {
		return result{}, err
	}
	defer os.Remove(f.Name())
	if _, err := fmt.Fprintf(f, wrkScript, body, hs.String()); err != nil {
		return result{}, err
	}
	f.Close()
	secs := max(int(d.Round(time.Second)/time.Second), 1)
	threads := min(conc, 2)
	out, err := exec.Command("wrk", "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conc), "-d", fmt.Sprintf("%ds", secs),
		"--latency", "-s", f.Name(), t.url+"/v1/chat/completions").CombinedOutput()
	if err != nil {
		return result{}, fmt.Errorf("wrk: %w: %s", err, out)
	}
	return parseWrk(out)
}

// parseWrk reads wrk's report.
func parseWrk(out []byte) (result, error) {
	var r result
	m := wrkRPS.FindSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("wrk printed no Requests/sec: %s", out)
	}
	r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	for _, p := range wrkPct.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(p[2]), 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[string(p[3])]
		d := time.Duration(v * float64(unit))
		if string(p[1]) == "50" {
			r.p50 = d
		} else {
			r.p99 = d
		}
	}
	if m := wrkNon2xx.FindSubmatch(out); m != nil {
		n, _ := strconv.ParseInt(string(m[1]), 10, 64)
		r.errors += n
	}
	if m := wrkSockets.FindSubmatch(out); m != nil {
		for _, g := range m[1:] {
			n, _ := strconv.ParseInt(string(g), 10, 64)
			r.errors += n
		}
	}
	if r.p50 <= 0 || r.p99 <= 0 { // absent, or out of range
		return r, fmt.Errorf("wrk printed no latency distribution: %s", out)
	}
	return r, nil
}

// startPortkey starts Portkey's gateway from dir on a free port if it is
// installed there and node is on PATH; otherwise it returns a note saying
// why it is skipped.
func startPortkey(dir, upstream string) (string, func(), string) {
	entry := filepath.Join(dir, "node_modules", "@portkey-ai", "gateway", "build", "start-server.js")
	if _, err := os.Stat(entry); err != nil {
		return "", nil, fmt.Sprintf("skipped: not installed (%s; run `npm ci` in tests/tools/portkey)", entry)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return "", nil, "skipped: node is not on PATH"
	}
	port, err := freePort()
	if err != nil {
		return "", nil, "skipped: " + err.Error()
	}
	cmd := exec.Command(node, entry, "--port="+strconv.Itoa(port), "--headless")
	cmd.Env = append(os.Environ(), "NODE_ENV=production")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return "", nil, "skipped: " + err.Error()
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	// Ready when it proxies one request to the upstream.
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-portkey-provider", "openai")
		req.Header.Set("x-portkey-custom-host", upstream+"/v1")
		req.Header.Set("Authorization", "Bearer bench")
		resp, err := client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base, stop, ""
			}
			err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Sprintf("skipped: not serving after 30 s (%v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// portkeyVersion reads the installed gateway's version.
func portkeyVersion(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "@portkey-ai", "gateway", "package.json"))
	if err != nil {
		return "?"
	}
	m := regexp.MustCompile(`"version":\s*"([^"]+)"`).FindSubmatch(b)
	if m == nil {
		return "?"
	}
	return string(m[1])
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

type result struct {
	name     string
	rps      float64
	p50, p99 time.Duration
	errors   int64
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 1024}}

const chatBody = `{"model":"bench","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in five words."}],"max_tokens":16}`

// runBodies drives t from conc goroutines in a closed loop for d, with a
// body per request (n counts the worker's requests).
func runBodies(t target, conc int, d time.Duration, bodyOf func(n int) string) result {
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
				req, _ := http.NewRequest(http.MethodPost, t.url+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				for k, v := range t.headers {
					req.Header.Set(k, v)
				}
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
	return serveHTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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

// serveHTTP serves h on a loopback port with rolter-proxy's server
// timeouts (dataplane/app/app.go), until the process exits.
func serveHTTP(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "bench-proxy: serve:", err)
		}
	}()
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
