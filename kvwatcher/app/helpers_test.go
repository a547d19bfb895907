package app

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"rolter.dev/pkg/kvevents"
	"rolter.dev/pkg/kvindex"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogger() *slog.Logger {
	if os.Getenv("KVWATCHER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// running is a watcher running in the background of a test.
type running struct {
	w      *Watcher
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

func startWatcher(t testing.TB, nc *nats.Conn, src Source) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	w, err := New(Options{Source: src, NATS: nc, Logger: testLogger(), Registerer: reg, Heartbeat: 50 * time.Millisecond,
		ReplayTimeout: 2 * time.Second, ReplayIdle: 500 * time.Millisecond, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{w: w, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *running) stop() {
	r.cancel()
	<-r.done
	r.done <- nil // later stops return at once
}

// counter reads a counter of the watcher's registry.
func (r *running) counter(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
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
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func newIndex(t testing.TB, nc *nats.Conn, providers ...string) *kvindex.Index {
	t.Helper()
	ix, err := kvindex.New(nc, providers, kvindex.Options{FailoverAfter: 500 * time.Millisecond, RetryMin: 20 * time.Millisecond,
		RetryMax: 100 * time.Millisecond, SnapshotTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ix.Close)
	return ix
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// chain builds BlockStored events for a chain of token blocks, engine
// hashes base+i.
type chain struct {
	model     string
	blockSize int
	tokens    []uint32
	base      uint64
}

func newChain(model string, blocks, blockSize int, base uint64) chain {
	toks := make([]uint32, blocks*blockSize)
	for i := range toks {
		toks[i] = uint32(base)*1000 + uint32(i)
	}
	return chain{model: model, blockSize: blockSize, tokens: toks, base: base}
}

func (c chain) ids() []uint64 {
	return kvindex.Identities(kvindex.Seed(c.model), c.tokens, c.blockSize)
}

// stored returns the BlockStored of blocks [from, to).
func (c chain) stored(from, to int) *kvevents.BlockStored {
	ev := &kvevents.BlockStored{BlockSize: c.blockSize, Medium: kvevents.Some("GPU"),
		TokenIDs: c.tokens[from*c.blockSize : to*c.blockSize]}
	for i := from; i < to; i++ {
		ev.BlockHashes = append(ev.BlockHashes, kvevents.UintHash(c.base+uint64(i)))
	}
	if from > 0 {
		ev.ParentBlockHash = kvevents.Some(kvevents.UintHash(c.base + uint64(from-1)))
	}
	return ev
}

func (c chain) removed(from, to int) *kvevents.BlockRemoved {
	ev := &kvevents.BlockRemoved{Medium: kvevents.Some("GPU")}
	for i := from; i < to; i++ {
		ev.BlockHashes = append(ev.BlockHashes, kvevents.UintHash(c.base+uint64(i)))
	}
	return ev
}

func encodeBatch(t testing.TB, events ...kvevents.Event) []byte {
	t.Helper()
	b, err := kvevents.Encode(&kvevents.Batch{TS: 1, Events: events, DataParallelRank: kvevents.Some[int64](0)}, kvevents.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func frames(topic string, seq uint64, payload []byte) [][]byte {
	return kvevents.Message{Topic: []byte(topic), Seq: seq, Payload: payload}.Frames()
}

// chanSource is a Source whose lists a test pushes.
type chanSource struct {
	ch chan []Provider
}

func newChanSource() *chanSource { return &chanSource{ch: make(chan []Provider)} }

func (s *chanSource) Run(ctx context.Context, update func([]Provider)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case l := <-s.ch:
			update(l)
		}
	}
}

func (s *chanSource) set(t testing.TB, l ...Provider) {
	t.Helper()
	select {
	case s.ch <- l:
	case <-time.After(5 * time.Second):
		t.Fatal("source not read")
	}
}
