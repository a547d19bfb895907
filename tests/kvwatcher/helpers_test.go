// Package kvwatcher_test runs rolter-kvwatcher end to end: simulated vLLM
// replicas publishing real KV events over ZMQ on loopback, the watcher, an
// in-process NATS server, and the proxies' kvindex.Index.
package kvwatcher_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"rolter.dev/kvwatcher/app"
	"rolter.dev/kvwatcher/zmtptest"
	"rolter.dev/pkg/kvevents"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/natstest"
	"rolter.dev/tests/vllmsim"
)

const (
	model     = "sim-model"
	blockSize = vllmsim.DefaultBlockSize
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func logger() *slog.Logger {
	if os.Getenv("KVWATCHER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// replica is a simulated vLLM replica publishing its prefix cache's KV
// events.
type replica struct {
	srv *vllmsim.Server
	pub *vllmsim.KVPublisher
}

type replicaOpts struct {
	endpoint string // default tcp://127.0.0.1:0
	connect  bool   // the replica connects to endpoint (bind mode)
	topic    string
	replay   bool
	layout   kvevents.Layout
	capacity int
}

func newReplica(t testing.TB, o replicaOpts) *replica {
	t.Helper()
	if o.endpoint == "" {
		o.endpoint = "tcp://127.0.0.1:0"
	}
	opts := vllmsim.KVPublisherOptions{Endpoint: o.endpoint, Connect: o.connect, Topic: o.topic, Layout: o.layout}
	if o.replay {
		opts.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	pub, err := vllmsim.NewKVPublisher(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	srv, err := vllmsim.New(vllmsim.Options{Models: []string{model}, Listener: pub, CapacityBlocks: o.capacity})
	if err != nil {
		t.Fatal(err)
	}
	return &replica{srv: srv, pub: pub}
}

// warm runs a request's prompt through the replica's prefix cache, which
// stores its full blocks and publishes the events.
func (r *replica) warm(tokens []uint32) {
	_, lease := r.srv.Cache().Admit(tokens)
	r.srv.Cache().Release(lease)
}

// resident returns how many of tokens' leading full blocks the replica
// holds.
func (r *replica) resident(tokens []uint32) int {
	n := 0
	for _, h := range vllmsim.BlockHashes(tokens, blockSize) {
		if !r.srv.Cache().Has(h) {
			break
		}
		n++
	}
	return n
}

func (r *replica) waitSubscribers(t testing.TB, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d subscribers", n), 5*time.Second, func() bool { return r.pub.Stats().Subscribers >= n })
}

// prompt returns the token ids of a prompt of about n tokens, different
// for each seed.
func prompt(seed string, n int) []uint32 {
	var b strings.Builder
	for i := 0; b.Len() < n*8; i++ {
		fmt.Fprintf(&b, "%s w%d ", seed, i)
	}
	toks := vllmsim.Tokenize(b.String())
	return toks[:n]
}

func ids(tokens []uint32) []uint64 { return kvindex.Identities(kvindex.Seed(model), tokens, blockSize) }

// watcher is a rolter-kvwatcher running in the test.
type watcher struct {
	w      *app.Watcher
	nc     *nats.Conn
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func startWatcher(t testing.TB, s *server.Server, src app.Source) *watcher {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w, err := app.New(app.Options{Source: src, NATS: nc, Logger: logger(), Registerer: reg, Heartbeat: 100 * time.Millisecond,
		ReplayTimeout: 3 * time.Second, ReplayIdle: time.Second, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wt := &watcher{w: w, nc: nc, reg: reg, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(wt.done)
		if err := w.Run(ctx); err != nil {
			t.Errorf("watcher: %v", err)
		}
	}()
	t.Cleanup(wt.stop)
	return wt
}

// stop stops the watcher gracefully.
func (w *watcher) stop() {
	w.once.Do(func() {
		w.cancel()
		<-w.done
		w.nc.Close()
	})
}

// kill stops the watcher as a crash would: its NATS connection goes first,
// so nothing it says on the way out reaches anyone.
func (w *watcher) kill() {
	w.once.Do(func() {
		w.nc.Close()
		w.cancel()
		<-w.done
	})
}

// metric sums the series of a metric whose labels match.
func (w *watcher) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			lm := map[string]string{}
			for _, lp := range m.GetLabel() {
				lm[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if lm[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum
}

func kvProvider(name, endpoint, replay string, stale time.Duration) app.Provider {
	return app.Provider{Name: name, KV: &app.KVSpec{Endpoint: endpoint, Topic: "", Mode: app.ModeConnect, ReplayEndpoint: replay,
		Model: model, MaxBlocks: 100_000, Stale: stale}}
}

func newIndex(t testing.TB, s *server.Server, providers ...string) *kvindex.Index {
	t.Helper()
	ix, err := kvindex.New(natstest.Connect(t, s), providers, kvindex.Options{FailoverAfter: 500 * time.Millisecond,
		RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, SnapshotTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ix.Close)
	return ix
}

func eventually(t testing.TB, what string, within time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start)
}

// relay forwards a publisher's messages to its own PUB endpoint, dropping
// the ones whose sequence drop says to: a lossy link that makes the watcher
// see a sequence gap.
type relay struct {
	sub  zmq4.Socket
	pub  *zmtptest.Pub
	done chan struct{}
}

func newRelay(t testing.TB, upstream string, drop func(seq uint64) bool) *relay {
	t.Helper()
	pub, err := zmtptest.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sub := zmq4.NewSub(context.Background())
	if err := sub.Dial(upstream); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	r := &relay{sub: sub, pub: pub, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			m, err := kvevents.ParseMessage(msg.Frames)
			if err == nil && drop(m.Seq) {
				continue
			}
			_ = pub.Send(msg.Frames...)
		}
	}()
	t.Cleanup(func() {
		_ = sub.Close()
		<-r.done
		pub.Close()
	})
	return r
}
