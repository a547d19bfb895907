// Command slow-clients checks that trickling clients cannot hold
// rolter-proxy. On loopback it starts a fast upstream and a proxy with a
// virtual key, measures ordinary requests alone (baseline), then opens
// --conns connections that send request headers and then a body one byte at
// a time (half without a key, half with a valid one) and measures the same
// ordinary requests while they are held. It reports the latencies, what the
// trickling connections were answered, and how long the proxy kept them.
//
// It is an experiment, not a test (bounded by --body-timeout and
// --duration): `cd tests && go run ./cmd/slow-clients`; numbers go to
// docs/operations.md with the command line.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"rolter.dev/dataplane/app"
)

const key = "sk-rolter-slow-clients-0000"

func main() {
	conns := flag.Int("conns", 1000, "trickling connections")
	bodyTimeout := flag.Int("body-timeout", 5, "server.body_read_timeout_secs of the proxy")
	duration := flag.Duration("duration", 3*time.Second, "measuring time of each phase")
	concurrency := flag.Int("concurrency", 4, "ordinary clients")
	every := flag.Duration("trickle", time.Second, "a trickling client sends one body byte this often")
	flag.Parse()

	upstream, err := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	if err != nil {
		fail(err)
	}
	proxy, stop, err := startRolter(upstream, *bodyTimeout)
	if err != nil {
		fail(err)
	}
	defer stop()
	addr := strings.TrimPrefix(proxy, "http://")

	base := measure(proxy, *concurrency, *duration)
	fmt.Printf("baseline: %s\n", base)

	start := time.Now()
	var wg sync.WaitGroup
	results := make([]trickle, *conns)
	var opened atomic.Int32
	for i := range *conns {
		wg.Go(func() {
			results[i] = trickleOne(addr, i%2 == 1, *every, time.Duration(*bodyTimeout+10)*time.Second, &opened)
		})
	}
	for opened.Load() < int32(*conns) && time.Since(start) < 30*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("%d trickling connections open after %s\n", opened.Load(), time.Since(start).Round(time.Millisecond))
	held := measure(proxy, *concurrency, *duration)
	fmt.Printf("while held: %s\n", held)
	wg.Wait()
	after := measure(proxy, *concurrency, *duration)
	fmt.Printf("after they are gone: %s\n", after)

	summarize(results)
}

type trickle struct {
	err      error
	status   int
	answered time.Duration // since the connection sent its headers
	closed   time.Duration
}

// trickleOne sends the headers of a 1000-byte body, then one byte every
// `every`, reading the answer concurrently; it stops at the close or after
// giveUp.
func trickleOne(addr string, withKey bool, every time.Duration, giveUp time.Duration, opened *atomic.Int32) trickle {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		opened.Add(1)
		return trickle{err: err}
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(giveUp))
	auth := ""
	if withKey {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", auth)
	opened.Add(1)
	if err != nil {
		return trickle{err: err}
	}
	sent := time.Now()
	done := make(chan struct{})
	go func() { // owned: ends when the connection closes (the deferred Close at the latest)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	defer close(done)
	var r trickle
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		r.err = err
		return r
	}
	r.status, r.answered = resp.StatusCode, time.Since(sent)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// A close with trickled bytes still unread arrives as a reset.
	if _, err := br.ReadByte(); err == io.EOF || errors.Is(err, syscall.ECONNRESET) {
		r.closed = time.Since(sent)
	} else {
		r.err = fmt.Errorf("after the answer: %v", err)
	}
	return r
}

func summarize(rs []trickle) {
	byStatus := map[int]int{}
	answered := map[int][]time.Duration{}
	var closed []time.Duration
	errs := map[string]int{}
	for _, r := range rs {
		if r.err != nil {
			msg := r.err.Error()
			if i := strings.LastIndex(msg, ": "); i >= 0 {
				msg = msg[i+2:]
			}
			errs[msg]++
		}
		if r.status != 0 {
			byStatus[r.status]++
			answered[r.status] = append(answered[r.status], r.answered)
		}
		if r.closed != 0 {
			closed = append(closed, r.closed)
		}
	}
	fmt.Printf("trickling connections: answers %v, errors %v\n", byStatus, errs)
	for _, st := range slices.Sorted(maps.Keys(answered)) {
		fmt.Printf("  %d answered after (p50/max): %s / %s\n", st, pct(answered[st], 50), pct(answered[st], 100))
	}
	fmt.Printf("  closed by the proxy after (p50/max): %s / %s (%d of %d)\n", pct(closed, 50), pct(closed, 100), len(closed), len(rs))
}

type latencies struct {
	n        int
	errs     int
	p50, p99 time.Duration
}

func (l latencies) String() string {
	return fmt.Sprintf("%d ok requests, %d failed, p50 %s, p99 %s", l.n, l.errs, l.p50, l.p99)
}

// measure runs ordinary keyed chat requests at fixed concurrency.
func measure(url string, concurrency int, d time.Duration) latencies {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
	var mu sync.Mutex
	var all []time.Duration
	var errs atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					errs.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs.Add(1)
					continue
				}
				mu.Lock()
				all = append(all, time.Since(t0))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return latencies{n: len(all), errs: int(errs.Load()), p50: pct(all, 50), p99: pct(all, 99)}
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s) - 1) * p / 100
	return s[i].Round(10 * time.Microsecond)
}

func serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() { _ = http.Serve(ln, h) }() // lives until the process exits
	return "http://" + ln.Addr().String(), nil
}

func startRolter(upstream string, bodyTimeout int) (string, func(), error) {
	dir, err := os.MkdirTemp("", "slow-clients")
	if err != nil {
		return "", nil, err
	}
	cfg := fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
body_read_timeout_secs = %d
[accounting]
sink = "none"
[[providers]]
name = "up"
kind = "openai_compatible"
api_base = %q
[[routes]]
model = "m"
targets = [{ provider = "up" }]
[[virtual_keys]]
name = "k"
key = %q
`, bodyTimeout, upstream, key)
	path := filepath.Join(dir, "rolter.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.Start(ctx, app.Options{ConfigPath: path, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		cancel()
		return "", nil, err
	}
	return a.URL(), func() { cancel(); _ = a.Wait(); os.RemoveAll(dir) }, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "slow-clients:", err)
	os.Exit(1)
}
