package cpfollow_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"rolter.dev/pkg/syncbuf"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"rolter.dev/dataplane/internal/cpfollow"
	"rolter.dev/dataplane/internal/metrics"
	"rolter.dev/pkg/config"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const routeDoc = `
[[providers]]
name = "a"
kind = "openai_compatible"
api_base = "http://127.0.0.1:9"

[[routes]]
model = %q
targets = [{ provider = "a" }]
`

// snap builds a snapshot message of a config with one route.
func snap(rev int64, model string) *pb.WatchResponse {
	doc := fmt.Sprintf(routeDoc, model)
	sum := sha256.Sum256([]byte(doc))
	return &pb.WatchResponse{
		VersionInfo: fmt.Sprint(rev), Revision: rev, ConfigToml: doc, ClusterId: 7,
		ContentHash: hex.EncodeToString(sum[:]), ControlplaneId: "fake",
	}
}

// fakeCP is a scripted snapshot service: it sends what the test queues
// and reports the answers it gets.
type fakeCP struct {
	pb.UnimplementedSnapshotServiceServer
	addr    string
	send    chan *pb.WatchResponse
	answers chan *pb.WatchRequest
	srv     *grpc.Server
}

func startFake(t *testing.T) *fakeCP {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeCP{addr: ln.Addr().String(), send: make(chan *pb.WatchResponse, 8), answers: make(chan *pb.WatchRequest, 8), srv: grpc.NewServer()}
	pb.RegisterSnapshotServiceServer(f.srv, f)
	var wg sync.WaitGroup
	wg.Go(func() { _ = f.srv.Serve(ln) })
	t.Cleanup(func() {
		f.srv.Stop()
		wg.Wait()
	})
	return f
}

func (f *fakeCP) Watch(stream pb.SnapshotService_WatchServer) error {
	hello, err := stream.Recv()
	if err != nil {
		return err
	}
	f.answers <- hello
	errc := make(chan error, 1)
	go func() { // ends with the stream
		for {
			req, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			f.answers <- req
		}
	}()
	for n := 0; ; n++ {
		select {
		case <-stream.Context().Done():
			return nil
		case err := <-errc:
			return err
		case m := <-f.send:
			m.Nonce = fmt.Sprint("n", n)
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

func (f *fakeCP) answer(t *testing.T) *pb.WatchRequest {
	t.Helper()
	select {
	case a := <-f.answers:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("no answer from the follower")
		return nil
	}
}

type applier struct {
	mu    sync.Mutex
	snaps []*config.Snapshot
	fail  error
}

func (a *applier) Apply(s *config.Snapshot) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail != nil {
		return a.fail
	}
	a.snaps = append(a.snaps, s)
	return nil
}

func (a *applier) last() *config.Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.snaps) == 0 {
		return nil
	}
	return a.snaps[len(a.snaps)-1]
}

func newFollower(t *testing.T, addrs []string, cache string, pepper string) (*cpfollow.Follower, *applier) {
	t.Helper()
	reg := prometheus.NewRegistry()
	a := &applier{}
	f := cpfollow.New(cpfollow.Options{
		Addrs: addrs, NodeID: "n1", CacheFile: cache, KeyPepper: []byte(pepper), Applier: a,
		Metrics: metrics.New(reg), Registerer: reg, Logger: slog.New(slog.DiscardHandler),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	})
	return f, a
}

func run(t *testing.T, f *cpfollow.Follower) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// TestAckNackAndOrdering walks a follower through the protocol: ACK of a
// new snapshot, no-op for identical content, no rollback to an older
// revision, NACK with field paths for a bad config (the old one stays),
// NACK for a pepper mismatch.
func TestAckNackAndOrdering(t *testing.T) {
	cp := startFake(t)
	f, a := newFollower(t, []string{cp.addr}, "", "pepper-0123456789")
	run(t, f)
	if hello := cp.answer(t); hello.GetNode().GetId() != "n1" || hello.GetVersionInfo() != "" {
		t.Fatalf("hello: %v", hello)
	}

	cp.send <- snap(10, "m1")
	if ack := cp.answer(t); ack.GetResponseNonce() != "n0" || ack.GetVersionInfo() != "10" || ack.GetErrorDetail() != nil {
		t.Fatalf("ack: %v", ack)
	}
	if s := a.last(); s == nil || s.Route("m1") == nil || s.Version != "10" {
		t.Fatalf("applied: %v", s)
	}

	same := snap(11, "m1")
	cp.send <- same
	if ack := cp.answer(t); ack.GetVersionInfo() != "11" || ack.GetErrorDetail() != nil || len(a.snaps) != 1 {
		t.Fatalf("identical content: %v, %d applies", ack, len(a.snaps))
	}

	cp.send <- snap(9, "old")
	if ack := cp.answer(t); ack.GetVersionInfo() != "11" || ack.GetErrorDetail() != nil || a.last().Route("old") != nil {
		t.Fatalf("older revision: %v", ack)
	}

	bad := snap(12, "m2")
	bad.ConfigToml = strings.Replace(bad.ConfigToml, `provider = "a"`, `provider = "ghost"`, 1)
	cp.send <- bad
	nack := cp.answer(t)
	if nack.GetVersionInfo() != "11" || len(nack.GetErrorDetail().GetViolations()) != 1 ||
		nack.GetErrorDetail().GetViolations()[0].GetField() != "routes[0].targets[0].provider" {
		t.Fatalf("nack: %v", nack)
	}
	if a.last().Route("m1") == nil || f.Version() != "11" {
		t.Fatal("a refused snapshot replaced the running one")
	}

	// A config without routes (the last one deleted behind the control
	// plane's back, a truncated push) is refused like any bad config.
	empty := snap(12, "none")
	empty.ConfigToml = "[[providers]]\nname = \"a\"\nkind = \"openai_compatible\"\napi_base = \"http://127.0.0.1:9\"\n"
	cp.send <- empty
	if nack := cp.answer(t); nack.GetVersionInfo() != "11" || len(nack.GetErrorDetail().GetViolations()) != 1 ||
		nack.GetErrorDetail().GetViolations()[0].GetField() != "routes" || a.last().Route("m1") == nil {
		t.Fatalf("no routes: %v", nack)
	}

	keyed := snap(13, "m3")
	keyed.ConfigToml += "[[virtual_keys]]\nname = \"k\"\nkey_digest = \"" + strings.Repeat("ab", 32) + "\"\n"
	keyed.PepperCheck = config.PepperCheck([]byte("the-control-planes-pepper"))
	cp.send <- keyed
	if nack := cp.answer(t); !strings.Contains(nack.GetErrorDetail().GetMessage(), "key pepper differs") {
		t.Fatalf("pepper mismatch: %v", nack)
	}
	keyed.PepperCheck = config.PepperCheck([]byte("pepper-0123456789"))
	cp.send <- keyed
	if ack := cp.answer(t); ack.GetErrorDetail() != nil || ack.GetVersionInfo() != "13" {
		t.Fatalf("same pepper: %v", ack)
	}
}

// TestFailoverAndCache: the follower moves to the next address when its
// control plane goes away, and a new follower starts from the cache file.
func TestFailoverAndCache(t *testing.T) {
	cp1, cp2 := startFake(t), startFake(t)
	cache := filepath.Join(t.TempDir(), "sub", "snapshot.json")
	f, _ := newFollower(t, []string{cp1.addr, cp2.addr}, cache, "")
	run(t, f)
	cp1.answer(t)
	cp1.send <- snap(5, "m1")
	cp1.answer(t)
	cp1.srv.Stop()
	hello := cp2.answer(t)
	if hello.GetVersionInfo() != "5" {
		t.Fatalf("hello after failover: %v", hello)
	}
	cp2.send <- snap(6, "m2")
	cp2.answer(t)

	st, err := os.Stat(cache)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("cache file: %v, %v", st, err)
	}
	g, a := newFollower(t, []string{"127.0.0.1:1"}, cache, "")
	if err := g.LoadCache(); err != nil {
		t.Fatal(err)
	}
	if s := a.last(); s == nil || s.Route("m2") == nil || g.Version() != "6" {
		t.Fatalf("from cache: %v", s)
	}
}

// TestSnapshotSpans: every snapshot the follower handles is a span with its
// version and whether it was applied or refused (and why); the span ends
// before the answer goes out.
func TestSnapshotSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	cp := startFake(t)
	reg := prometheus.NewRegistry()
	cache := filepath.Join(t.TempDir(), "snapshot.json")
	f := cpfollow.New(cpfollow.Options{
		Addrs: []string{cp.addr}, NodeID: "n1", CacheFile: cache, Applier: &applier{},
		Metrics: metrics.New(reg), Registerer: reg, Logger: slog.New(slog.DiscardHandler), TracerProvider: tp,
	})
	run(t, f)
	cp.answer(t) // hello

	last := func() map[attribute.Key]string {
		t.Helper()
		spans := exp.GetSpans()
		if len(spans) == 0 {
			t.Fatal("no span")
		}
		s := spans[len(spans)-1]
		if s.Name != "cpfollow.snapshot" {
			t.Fatalf("span %q", s.Name)
		}
		out := map[attribute.Key]string{"status": s.Status.Code.String()}
		for _, kv := range s.Attributes {
			out[kv.Key] = kv.Value.String()
		}
		return out
	}
	check := func(what string, want map[attribute.Key]string) {
		t.Helper()
		got := last()
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q (%v)", what, k, got[k], v, got)
			}
		}
	}

	cp.send <- snap(10, "m1")
	cp.answer(t)
	check("new", map[attribute.Key]string{
		cpfollow.AttrVersion: "10", cpfollow.AttrRevision: "10", cpfollow.AttrResult: "applied", cpfollow.AttrSource: "controlplane",
		cpfollow.AttrControlPlaneID: "fake", cpfollow.AttrNodeID: "n1", cpfollow.AttrRunning: "10", "status": "Unset",
	})
	cp.send <- snap(11, "m1")
	cp.answer(t)
	check("same content", map[attribute.Key]string{cpfollow.AttrVersion: "11", cpfollow.AttrResult: "unchanged"})
	cp.send <- snap(9, "old")
	cp.answer(t)
	check("older", map[attribute.Key]string{cpfollow.AttrVersion: "9", cpfollow.AttrResult: "stale", cpfollow.AttrRunning: "11"})

	bad := snap(12, "m2")
	bad.ConfigToml = strings.Replace(bad.ConfigToml, `provider = "a"`, `provider = "ghost"`, 1)
	cp.send <- bad
	nack := cp.answer(t)
	check("refused", map[attribute.Key]string{
		cpfollow.AttrVersion: "12", cpfollow.AttrResult: "refused", cpfollow.AttrRunning: "11",
		cpfollow.AttrError: nack.GetErrorDetail().GetMessage(), "status": "Error",
	})
	if !strings.Contains(last()[cpfollow.AttrError], "routes[0].targets[0].provider") {
		t.Errorf("refusal reason without its field: %q", last()[cpfollow.AttrError])
	}
	if n := len(exp.GetSpans()); n != 4 {
		t.Errorf("%d spans for 4 snapshots", n)
	}

	// The cached snapshot loaded at startup is a span too.
	reg = prometheus.NewRegistry()
	g := cpfollow.New(cpfollow.Options{
		Addrs: []string{"127.0.0.1:1"}, NodeID: "n2", CacheFile: cache, Applier: &applier{},
		Metrics: metrics.New(reg), Registerer: reg, Logger: slog.New(slog.DiscardHandler), TracerProvider: tp,
	})
	if err := g.LoadCache(); err != nil {
		t.Fatal(err)
	}
	check("cache", map[attribute.Key]string{cpfollow.AttrVersion: "11", cpfollow.AttrSource: "cache", cpfollow.AttrResult: "applied", cpfollow.AttrNodeID: "n2"})
}

// TestNoSnapshotIsNotServed: with an unreadable cache and no control
// plane, the follower says it has no snapshot (the proxy answers 503), not
// that it still serves the last one.
func TestNoSnapshotIsNotServed(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "snapshot.json")
	if err := os.WriteFile(cache, []byte("{unreadable"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	reg := prometheus.NewRegistry()
	f := cpfollow.New(cpfollow.Options{
		Addrs: []string{"127.0.0.1:1"}, NodeID: "n1", CacheFile: cache, Applier: &applier{},
		Metrics: metrics.New(reg), Registerer: reg, Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	})
	if err := f.LoadCache(); err == nil {
		t.Fatal("an unreadable cache loaded")
	}
	run(t, f)
	deadline := time.Now().Add(30 * time.Second) // fail-safe
	for !strings.Contains(logs.String(), "no control plane reachable") {
		if time.Now().After(deadline) {
			t.Fatalf("nothing logged:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out := logs.String(); strings.Contains(out, "still serving") || !strings.Contains(out, "no snapshot yet") {
		t.Fatalf("log:\n%s", out)
	}
}
