// Package controlplane_test runs control planes, etcd and proxies together:
// real embedded etcd, real gRPC over loopback sockets, real proxies
// (dataplane/app) forwarding to fake upstreams.
package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	cpapp "rolter.dev/controlplane/app"
	dpapp "rolter.dev/dataplane/app"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

const (
	adminToken = "admin-token-0123456789"
	nodeToken  = "node-token-0123456789"
	pepper     = "test-pepper-0123456789"
	converge   = time.Second // what the issue promises
)

func testLogger(t *testing.T) *slog.Logger {
	t.Helper()
	if os.Getenv("ROLTER_TEST_LOGS") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// etcdServer is an embedded etcd that can be stopped and started again on
// the same data directory. Clients reach it through a loopback TCP relay
// whose address never changes; stopping cuts the relay's connections first,
// as a crash would, so etcd's graceful close does not wait for the
// clients' watch streams.
type etcdServer struct {
	t     *testing.T
	dir   string
	addr  string // the relay's address, what clients use
	relay *relay
	e     *embed.Etcd
}

func startEtcd(t *testing.T) *etcdServer {
	t.Helper()
	s := &etcdServer{t: t, dir: t.TempDir(), relay: startRelay(t)}
	s.addr = s.relay.addr()
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *etcdServer) start() {
	s.t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = s.dir
	cfg.LogLevel, cfg.LogOutputs = "error", []string{"/dev/null"}
	u, _ := url.Parse("http://127.0.0.1:0") // kernel picks the port: no pick-then-close race
	cfg.ListenClientUrls, cfg.ListenPeerUrls = []url.URL{*u}, []url.URL{*u}
	var err error
	if s.e, err = embed.StartEtcd(cfg); err != nil {
		s.t.Fatalf("start etcd: %v", err)
	}
	select {
	case <-s.e.Server.ReadyNotify():
	case <-time.After(10 * time.Second):
		s.t.Fatal("etcd not ready")
	}
	s.relay.open(s.e.Clients[0].Addr().String())
}

func (s *etcdServer) stop() {
	if s.e != nil {
		s.relay.cut()
		s.e.Close()
		s.e = nil
	}
}

func (s *etcdServer) client(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.addr}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// controlPlane is a running control plane that can be killed and started
// again on the same address.
type controlPlane struct {
	t      *testing.T
	opts   cpapp.Options
	app    *cpapp.App
	cancel context.CancelFunc
	addr   string
	reg    *prometheus.Registry
}

func startControlPlane(t *testing.T, etcd *etcdServer, id string) *controlPlane {
	t.Helper()
	return startControlPlaneWith(t, controlPlaneOptions(t, etcd, id))
}

func controlPlaneOptions(t *testing.T, etcd *etcdServer, id string) cpapp.Options {
	t.Helper()
	return cpapp.Options{
		Listen: "127.0.0.1:0", EtcdEndpoints: []string{etcd.addr},
		AdminTokens: []string{adminToken}, NodeTokens: []string{nodeToken},
		KeyPepper: []byte(pepper), ID: id, Logger: testLogger(t).With("cp", id),
	}
}

func startControlPlaneWith(t *testing.T, opts cpapp.Options) *controlPlane {
	t.Helper()
	c := &controlPlane{t: t, opts: opts}
	c.start()
	t.Cleanup(c.kill)
	return c
}

func (c *controlPlane) start() {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c.reg = prometheus.NewRegistry()
	c.opts.Registerer, c.opts.Gatherer = c.reg, c.reg
	var err error
	for range 50 {
		if c.app, err = cpapp.Start(ctx, c.opts); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		cancel()
		c.t.Fatalf("start control plane: %v", err)
	}
	c.cancel = cancel
	c.addr = c.app.Addr().String()
	c.opts.Listen = c.addr // a restart reuses the address
}

func (c *controlPlane) kill() {
	if c.cancel == nil {
		return
	}
	c.cancel()
	if err := c.app.Wait(); err != nil {
		c.t.Errorf("control plane stopped with %v", err)
	}
	c.cancel = nil
}

func (c *controlPlane) admin(t *testing.T) pb.AdminServiceClient {
	t.Helper()
	return adminClient(t, c.addr, adminToken)
}

func adminClient(t *testing.T, addr, token string) pb.AdminServiceClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewAdminServiceClient(conn)
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// proxy is a running data plane following control planes.
type proxy struct {
	t      *testing.T
	opts   dpapp.Options
	app    *dpapp.App
	cancel context.CancelFunc
	url    string
}

func startProxy(t *testing.T, cacheFile string, pepper string, cps ...*controlPlane) *proxy {
	t.Helper()
	return startProxyWith(t, cacheFile, pepper, nil, cps...)
}

func startProxyWith(t *testing.T, cacheFile string, pepper string, edit func(*dpapp.ControlPlaneOptions), cps ...*controlPlane) *proxy {
	t.Helper()
	addrs := make([]string, len(cps))
	for i, c := range cps {
		addrs[i] = c.addr
	}
	p := &proxy{t: t, opts: dpapp.Options{
		Listen: "127.0.0.1:0", Logger: testLogger(t).With("proxy", cacheFile), DrainTimeout: time.Second,
		ControlPlane: &dpapp.ControlPlaneOptions{
			Addrs: addrs, Token: nodeToken, CacheFile: cacheFile, KeyPepper: []byte(pepper),
			NodeID: "proxy-" + filepath.Base(cacheFile), MaxBackoff: 200 * time.Millisecond,
		},
	}}
	if edit != nil {
		edit(p.opts.ControlPlane)
	}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *proxy) start() {
	p.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, err := dpapp.Start(ctx, p.opts)
	if err != nil {
		cancel()
		p.t.Fatalf("start proxy: %v", err)
	}
	p.app, p.cancel, p.url = a, cancel, a.URL()
}

func (p *proxy) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	_ = p.app.Wait()
	p.cancel = nil
}

// chat sends a chat completion for model with key (none when empty) and
// returns the status and, on 200, which upstream answered.
func (p *proxy) chat(model, key string) (int, string) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model)
	req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, string(b)
	}
	var out struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	_ = json.Unmarshal(b, &out)
	if len(out.Choices) == 0 {
		return resp.StatusCode, string(b)
	}
	return resp.StatusCode, out.Choices[0].Message.Content
}

// upstream is a fake OpenAI-compatible replica that answers "from <name>".
func upstream(t *testing.T, name string) string {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"from %s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, req.Model, name)
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// eventually polls cond until it returns nil or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serves is a poll condition: p answers model from upstream want (status
// 200), or with status want when want is a number.
func serves(p *proxy, model, key, want string) func() error {
	return func() error {
		code, got := p.chat(model, key)
		switch {
		case want == fmt.Sprint(code):
			return nil
		case code == http.StatusOK && got == "from "+want:
			return nil
		}
		return fmt.Errorf("%s %s: got %d %s, want %s", p.url, model, code, got, want)
	}
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}
