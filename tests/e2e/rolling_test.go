package e2e_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rolter.dev/dataplane/app"
	"rolter.dev/tests/vllmsim"
)

// l4 is a TCP load balancer as the deployments put in front of the proxies
// (HAProxy in compose, a Service in Kubernetes): it polls each backend's
// /readyz every interval and sends each new connection to the next ready
// backend, trying the next one when a dial fails (HAProxy's redispatch). It
// never looks inside a connection. A connection that finds no ready backend
// is closed (counted in dropped), as HAProxy does.
type l4 struct {
	ln       net.Listener
	interval time.Duration
	mu       sync.Mutex
	backends []*l4Backend
	next     int
	conns    sync.WaitGroup
	dropped  atomic.Int64
}

type l4Backend struct {
	addr   string
	ready  atomic.Bool
	served atomic.Int64 // connections sent to it
	stop   chan struct{}
}

func startL4(t *testing.T, interval time.Duration) *l4 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &l4{ln: ln, interval: interval}
	go b.serve()
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, be := range b.backends {
			close(be.stop)
		}
		b.backends = nil
		b.mu.Unlock()
		b.conns.Wait()
	})
	return b
}

func (b *l4) url() string { return "http://" + b.ln.Addr().String() }

// add puts a backend in rotation once its /readyz answers 200.
func (b *l4) add(addr string) *l4Backend {
	be := &l4Backend{addr: addr, stop: make(chan struct{})}
	go func() {
		// A probe fails on an answer other than 200 or on no answer within
		// a second (a Kubernetes readinessProbe's default timeoutSeconds).
		// Not within the poll interval: on a loaded machine a 20 ms
		// timeout took healthy proxies out, all of them at once at times,
		// and the balancer dropped connections no proxy had refused.
		client := &http.Client{Timeout: time.Second}
		tick := time.NewTicker(b.interval)
		defer tick.Stop()
		for {
			resp, err := client.Get("http://" + addr + "/readyz")
			ok := err == nil && resp.StatusCode == http.StatusOK
			if err == nil {
				resp.Body.Close()
			}
			be.ready.Store(ok)
			select {
			case <-be.stop:
				return
			case <-tick.C:
			}
		}
	}()
	b.mu.Lock()
	b.backends = append(b.backends, be)
	b.mu.Unlock()
	return be
}

// remove takes a backend out of the configuration (after it has stopped).
func (b *l4) remove(be *l4Backend) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, x := range b.backends {
		if x == be {
			b.backends = append(b.backends[:i], b.backends[i+1:]...)
			close(be.stop)
			return
		}
	}
}

// pick returns the ready backends, starting with the next in rotation.
func (b *l4) pick() []*l4Backend {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*l4Backend
	for i := range b.backends {
		be := b.backends[(b.next+i)%len(b.backends)]
		if be.ready.Load() {
			out = append(out, be)
		}
	}
	b.next++
	return out
}

func (b *l4) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.conns.Add(1)
		go func() {
			defer b.conns.Done()
			defer c.Close()
			var up net.Conn
			for _, be := range b.pick() {
				if up, err = net.DialTimeout("tcp", be.addr, time.Second); err == nil {
					be.served.Add(1)
					break
				}
			}
			if up == nil {
				b.dropped.Add(1)
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go pipe(up, c)
			go pipe(c, up)
			<-done
			<-done
		}()
	}
}

// TestRollingRestartFailsNoRequest replaces each of three proxies in turn,
// as a rolling update does, while clients keep sending streamed and
// non-streamed requests through a readiness-checking L4 balancer over
// keep-alive connections. With --drain-delay longer than the balancer takes
// to see /readyz fail, no request fails: the draining proxy keeps serving
// what still reaches it (closing each keep-alive connection after its
// response), then finishes its streams.
//
// The delay must also outlast the responses already started when draining
// begins: their headers went out without "Connection: close", and one that
// ends after the listener closes is followed by the server's close, which
// the client's next POST on that connection can cross (the HTTP/1.1 race
// docs/operations.md describes). Under -race on a loaded machine an
// eight-token answer took up to 0.7 s, hence a second.
func TestRollingRestartFailsNoRequest(t *testing.T) {
	const pollEvery, drainDelay = 20 * time.Millisecond, time.Second
	rs := []*replica{
		startReplica(t, vllmsim.Options{Models: []string{"sim"}, ITL: 2 * time.Millisecond, MaxTokensDefault: 8}),
		startReplica(t, vllmsim.Options{Models: []string{"sim"}, ITL: 2 * time.Millisecond, MaxTokensDefault: 8}),
	}
	path := filepath.Join(t.TempDir(), "rolter.toml")
	if err := os.WriteFile(path, []byte(fleetConfig("", "cache_aware", rs...)), 0o600); err != nil {
		t.Fatal(err)
	}
	lb := startL4(t, pollEvery)
	type proxy struct {
		a    *app.App
		stop context.CancelFunc
		be   *l4Backend
	}
	start := func() *proxy {
		ctx, stop := context.WithCancel(context.Background())
		a, err := app.Start(ctx, app.Options{ConfigPath: path, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
			DrainDelay: drainDelay, DrainTimeout: 10 * time.Second})
		if err != nil {
			stop()
			t.Fatal(err)
		}
		return &proxy{a: a, stop: stop, be: lb.add(a.Addr().String())}
	}
	var proxies []*proxy
	for range 3 {
		proxies = append(proxies, start())
	}
	t.Cleanup(func() {
		for _, p := range proxies {
			p.stop()
			_ = p.a.Wait()
		}
	})
	waitFor(t, "three ready proxies", func() bool { return len(lb.pick()) == 3 })

	// Clients close a connection idle for longer than a tenth of the drain
	// delay, as a client should whose idle timeout is below the proxies'
	// drain delay: otherwise the draining proxy's close of an idle
	// connection can cross a request sent on it, which HTTP/1.1 cannot
	// retry for a POST.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: drainDelay / 10}}
	var sent, failed atomic.Int64
	var failures sync.Map
	ctx, stopLoad := context.WithCancel(context.Background())
	var load sync.WaitGroup
	for w := range 8 {
		load.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				stream := (w+i)%2 == 0
				body := fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"user","content":"client %d request %d"}]}`, stream, w, i)
				sent.Add(1)
				if err := roundTrip(client, lb.url(), body, stream); err != nil {
					failed.Add(1)
					failures.Store(err.Error(), true)
				}
			}
		})
	}
	waitFor(t, "traffic", func() bool { return sent.Load() > 50 })

	for i := range proxies {
		old := proxies[i]
		proxies[i] = start()
		waitFor(t, "the new proxy ready", func() bool { return proxies[i].be.ready.Load() })
		before := sent.Load()
		old.stop() // SIGTERM
		if err := old.a.Wait(); err != nil {
			t.Fatalf("proxy %d drained with error: %v", i, err)
		}
		lb.remove(old.be)
		waitFor(t, "traffic after the restart", func() bool { return sent.Load() > before+50 })
	}
	stopLoad()
	load.Wait()
	failures.Range(func(k, _ any) bool { t.Errorf("failed request: %s", k); return true })
	t.Logf("%d requests through three rolling restarts, %d failed, %d connections found no ready proxy", sent.Load(), failed.Load(), lb.dropped.Load())
	for i, p := range proxies {
		if p.be.served.Load() == 0 {
			t.Errorf("replacement proxy %d served nothing", i)
		}
	}
}

// roundTrip sends one chat request and reads the whole answer: a 200 with a
// complete body, or a stream ending in [DONE].
func roundTrip(client *http.Client, base, body string, stream bool) error {
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if !stream {
		_, err := io.Copy(io.Discard, resp.Body)
		return err
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			return nil
		}
	}
	return errors.Join(errors.New("stream ended without [DONE]"), sc.Err())
}
