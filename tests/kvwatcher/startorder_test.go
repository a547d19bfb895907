package kvwatcher_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	cpapp "rolter.dev/controlplane/app"
	"rolter.dev/kvwatcher/app"
	"rolter.dev/pkg/natstest"
	"rolter.dev/pkg/porttest"
	"rolter.dev/pkg/snapcache"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// startPlainControlPlane runs a plaintext control plane (embedded etcd in
// dir) on listen; stop ends it (also at the end of the test).
func startPlainControlPlane(t *testing.T, listen, dir string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, err := cpapp.Start(ctx, cpapp.Options{
		Listen: listen, EmbedEtcdDir: dir, EmbedEtcdListen: "127.0.0.1:0",
		AdminTokens: []string{cpAdminToken}, NodeTokens: []string{cpNodeToken},
		KeyPepper: []byte("pepper-0123456789abcdef"), ID: "cp-plain", Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := a.Wait(); err != nil {
			t.Errorf("control plane: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

type plainAdminBearer string

func (b plainAdminBearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (plainAdminBearer) RequireTransportSecurity() bool { return false }

func applyPlain(t *testing.T, addr, doc string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(plainAdminBearer(cpAdminToken)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pb.NewAdminServiceClient(conn).Apply(ctx, &pb.ApplyRequest{ConfigToml: doc}); err != nil {
		t.Fatal(err)
	}
}

// service is a rolter-kvwatcher process (app.RunService) in the test.
type service struct {
	metrics string
	cancel  context.CancelFunc
	done    chan error
}

func startService(t *testing.T, o app.ServiceOptions) *service {
	t.Helper()
	o.MetricsListen = porttest.Addr(t)
	o.Logger = logger()
	o.Heartbeat = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	s := &service{metrics: "http://" + o.MetricsListen, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- app.RunService(ctx, o) }()
	t.Cleanup(s.stop)
	return s
}

func (s *service) stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	<-s.done
}

// get returns the status and body of GET path on the watcher's listener
// (0 while it does not answer).
func (s *service) get(path string) (int, string) {
	resp, err := http.Get(s.metrics + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitSynced waits until the watcher is ready and mirrors every provider.
func (s *service) waitSynced(t *testing.T, providers ...string) {
	t.Helper()
	eventually(t, "the watcher ready and synced", 30*time.Second, func() bool {
		if code, _ := s.get("/readyz"); code != http.StatusOK {
			return false
		}
		_, body := s.get("/metrics")
		for _, p := range providers {
			if !strings.Contains(body, `rolter_kvwatcher_synced{provider="`+p+`"} 1`) {
				return false
			}
		}
		return true
	})
}

// TestWatcherStartsBeforeNATSAndControlPlane: a kvwatcher started while
// neither NATS nor the control plane runs stays up and not ready; once both
// start it follows the control plane's providers, publishes, and a proxy
// routes precisely on its deltas. Restarted with its --snapshot-cache while
// the control plane is down again, it watches the cached providers, and the
// proxy keeps routing precisely on prefixes cached after the restart.
func TestWatcherStartsBeforeNATSAndControlPlane(t *testing.T) {
	natsAddr, cpAddr := porttest.Addr(t), porttest.Addr(t)
	cache := filepath.Join(t.TempDir(), "kvwatcher-snapshot.json")
	opts := app.ServiceOptions{ControlPlane: cpAddr, Token: cpNodeToken, NATSURL: "nats://" + natsAddr, SnapshotCache: cache}
	w := startService(t, opts)
	eventually(t, "the watcher up and not ready", 30*time.Second, func() bool {
		code, body := w.get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "nats") && strings.Contains(body, "no provider list")
	})
	select {
	case err := <-w.done:
		t.Fatalf("the watcher exited with NATS and the control plane down: %v", err)
	default:
	}

	_, port, _ := net.SplitHostPort(natsAddr)
	natsPort, _ := strconv.Atoi(port)
	ns := natstest.Start(t, func(o *server.Options) { o.Port = natsPort })
	a, b := newReplica(t, replicaOpts{}), newReplica(t, replicaOpts{})
	urls := serveHTTP(t, a, b)
	doc := twoReplicas{urls: urls, table: "kv_events", endpoints: [2]string{a.pub.Endpoint(), b.pub.Endpoint()},
		tableMore: fmt.Sprintf("model = %q\n", model), strategy: "precise_cache_aware",
		tail: "[routes.balancer]\nspeculative_ttl_ms = 0\n"}.config()
	stopCP := startPlainControlPlane(t, cpAddr, t.TempDir())
	applyPlain(t, cpAddr, doc)
	w.waitSynced(t, "vllm-a", "vllm-b")
	a.waitSubscribers(t, 1)
	b.waitSubscribers(t, 1)
	proxies := startProxies(t, ns, doc, 1)
	onA, onB := prompt("alpha", 320), prompt("bravo", 320)
	a.warm(onA)
	b.warm(onB)
	checkPreciseRouting(t, proxies, onA, onB)
	if c, err := snapcache.Load(cache); err != nil || c == nil || !strings.Contains(c.ConfigTOML, "vllm-b") {
		t.Fatalf("snapshot cache after following the control plane: %+v, %v", c, err)
	}

	// The control plane goes down; the watcher restarts from its cache.
	stopCP()
	w.stop()
	for _, r := range []*replica{a, b} {
		eventually(t, "the old watcher's subscription gone", 30*time.Second, func() bool { return r.pub.Stats().Subscribers == 0 })
	}
	w = startService(t, opts)
	w.waitSynced(t, "vllm-a", "vllm-b")
	a.waitSubscribers(t, 1)
	b.waitSubscribers(t, 1)
	onC, onD := prompt("charlie", 320), prompt("delta", 320)
	a.warm(onC)
	b.warm(onD)
	checkPreciseRouting(t, proxies, onC, onD)
}

// TestSnapshotCacheUnusable: a corrupt cache is ignored (logged), not
// fatal: the watcher waits for a control plane.
func TestSnapshotCacheUnusable(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(cache, []byte("{broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t)
	w := startService(t, app.ServiceOptions{ControlPlane: porttest.Addr(t), Token: cpNodeToken, NATSURL: ns.ClientURL(), SnapshotCache: cache})
	eventually(t, "not ready for want of providers", 30*time.Second, func() bool {
		code, body := w.get("/readyz")
		return code == http.StatusServiceUnavailable && !strings.Contains(body, "nats") && strings.Contains(body, "no provider list")
	})
}
