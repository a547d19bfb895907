package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"rolter.dev/dataplane/app"
	"rolter.dev/pkg/porttest"
	"rolter.dev/tests/vllmsim"
)

// replica is a simulated vLLM replica on a fixed loopback port, which can be
// made sick (every answer 503, health included), killed (port closed), shut
// down gracefully and revived on the same port.
type replica struct {
	t    testing.TB
	sim  *vllmsim.Server
	addr string
	sick atomic.Bool
	srv  *http.Server
	// stop cancels the requests' context, as the vllmsim binary does on
	// SIGTERM: running generations end at once, their bodies cleanly.
	stop context.CancelFunc
	// tokenize, when set, answers POST /tokenize instead of the simulator
	// (a failing or hanging tokenizer, or one the test watches).
	tokenize atomic.Pointer[func(http.ResponseWriter, *http.Request)]
}

func (r *replica) setTokenize(fn func(http.ResponseWriter, *http.Request)) { r.tokenize.Store(&fn) }

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func startReplica(t testing.TB, opts vllmsim.Options) *replica {
	t.Helper()
	sim, err := vllmsim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{t: t, sim: sim}
	// Below the ephemeral range, so that no port-0 bind takes the port while
	// the replica is killed (revive listens on it again).
	ln, err := net.Listen("tcp", porttest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.serve(ln)
	t.Cleanup(func() { r.kill() })
	return r
}

func (r *replica) serve(ln net.Listener) {
	ctx, stop := context.WithCancel(context.Background())
	r.stop = stop
	r.srv = &http.Server{BaseContext: func(net.Listener) context.Context { return ctx }, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.sick.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"error":{"message":"sick","type":"ServiceUnavailable","code":503}}`)
			return
		}
		if fn := r.tokenize.Load(); fn != nil && req.URL.Path == "/tokenize" {
			(*fn)(w, req)
			return
		}
		r.sim.ServeHTTP(w, req)
	})}
	srv := r.srv
	go func() { _ = srv.Serve(ln) }() // ended by kill
}

func (r *replica) kill() {
	if r.srv != nil {
		_ = r.srv.Close()
		r.srv = nil
		r.stop()
	}
}

// shutDown stops the replica as SIGTERM stops the vllmsim binary: running
// generations end at once, their responses ending cleanly, and the server
// closes once they have.
func (r *replica) shutDown() {
	if r.srv != nil {
		r.stop()
		_ = r.srv.Shutdown(context.Background())
		r.srv = nil
	}
}

func (r *replica) revive() {
	r.t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the port was ours a moment ago; retry briefly if the kernel still holds it
		if ln, err = net.Listen("tcp", r.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		r.t.Fatalf("revive %s: %v", r.addr, err)
	}
	r.serve(ln)
}

func (r *replica) url() string { return "http://" + r.addr }

// startProxy writes cfg to a file and starts a real data plane on it.
func startProxy(t *testing.T, cfg string) (*app.App, string) {
	t.Helper()
	return startProxyWith(t, cfg, app.Options{})
}

// startProxyWith is startProxy with further options (NATS, sharing); the
// config path, listener, logger and drain timeout are set here.
func startProxyWith(t testing.TB, cfg string, opts app.Options) (*app.App, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rolter.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	opts.ConfigPath, opts.Listen, opts.Logger, opts.DrainTimeout = path, "127.0.0.1:0", slog.New(slog.DiscardHandler), 5*time.Second
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.Start(ctx, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := a.Wait(); err != nil {
			t.Errorf("proxy stopped with error: %v", err)
		}
	})
	return a, path
}

// openAuth opens a config that has no keys (server.require_auth defaults
// to true). With keys, as in sdkFleet, the keys apply all the same.
const openAuth = "[server]\nrequire_auth = false\n"

// fleetConfig routes model "m" (upstream "sim") over the replicas, open to
// clients without a key; extra must not hold a [server] table.
func fleetConfig(extra, strategy string, rs ...*replica) string {
	var b strings.Builder
	b.WriteString(openAuth)
	b.WriteString(extra)
	var targets []string
	for i, r := range rs {
		fmt.Fprintf(&b, "\n[[providers]]\nname = \"vllm-%d\"\nkind = \"openai_compatible\"\napi_base = %q\n", i, r.url())
		targets = append(targets, fmt.Sprintf("{ provider = \"vllm-%d\", model = \"sim\" }", i))
	}
	fmt.Fprintf(&b, "\n[[routes]]\nmodel = \"m\"\nstrategy = %q\ntargets = [%s]\n", strategy, strings.Join(targets, ", "))
	return b.String()
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// postOK posts a JSON body to base+path, reads the answer to its end and
// fails the test unless it is 200.
func postOK(t testing.TB, base, path, body string) {
	t.Helper()
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: status %d", path, resp.StatusCode)
	}
}
