// Package app assembles a control-plane process: the etcd client (or an
// embedded etcd), the config watcher, the snapshot hub and push service,
// the admin service, authentication, gRPC health and reflection, and
// metrics. cmd/rolter-controlplane and the cross-service tests start
// control planes through it.
//
// # Lifecycle
//
// [Start] returns once the gRPC listener is bound. Cancelling its context
// stops the server (open snapshot streams are cut, so nodes reconnect
// elsewhere), then the background goroutines, then the etcd client and any
// embedded etcd. [App.Wait] returns when all of that is done.
package app

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"rolter.dev/controlplane/internal/admin"
	"rolter.dev/controlplane/internal/auth"
	"rolter.dev/controlplane/internal/metrics"
	"rolter.dev/controlplane/internal/push"
	"rolter.dev/controlplane/internal/state"
	"rolter.dev/controlplane/internal/store"
	"rolter.dev/controlplane/internal/watch"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/telemetry"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// Options configures a control-plane process.
type Options struct {
	// Listen is the gRPC address (admin and snapshot services). Required.
	Listen string
	// MetricsListen, when set, serves Prometheus metrics at /metrics.
	MetricsListen string
	// EtcdEndpoints are the etcd client URLs or host:port pairs; ignored
	// with EmbedEtcdDir.
	EtcdEndpoints []string
	// EmbedEtcdDir runs an embedded single-member etcd with its data in
	// this directory (the single-machine default).
	EmbedEtcdDir string
	// EmbedEtcdListen is the embedded etcd's client address (default
	// 127.0.0.1:2379; port 0 picks a free one).
	EmbedEtcdListen string
	// Prefix is the etcd key prefix (default /rolter/v1/).
	Prefix string
	// AdminTokens may call everything; NodeTokens only the snapshot
	// service. At least one admin token is required.
	AdminTokens []string
	NodeTokens  []string
	// TLS, when set, serves gRPC over TLS (set ClientCAs and ClientAuth
	// for mutual TLS).
	TLS *tls.Config
	// KeyPepper digests virtual-key secrets. Required; every replica and
	// every data plane must use the same.
	KeyPepper []byte
	// ID names this replica (default hostname-random).
	ID string
	// Logger receives the process's logs. Required.
	Logger *slog.Logger
	// Registerer receives the metrics (default: a new registry, also
	// served at MetricsListen).
	Registerer prometheus.Registerer
	// Gatherer serves MetricsListen; defaults with Registerer.
	Gatherer prometheus.Gatherer
	// TracerProvider receives the spans of admin writes and snapshot
	// pushes (default: OTLP export when the OTEL_* environment asks for
	// it, see pkg/telemetry; otherwise none).
	TracerProvider trace.TracerProvider
}

// App is a running control plane.
type App struct {
	id        string
	addr      net.Addr
	endpoints []string
	done      chan struct{}
	err       error
}

// Start connects to etcd, binds the listener and serves until ctx ends.
func Start(ctx context.Context, opts Options) (*App, error) {
	log := opts.Logger
	if len(opts.KeyPepper) == 0 {
		return nil, errors.New("controlplane: a key pepper is required")
	}
	tokens, err := auth.New(opts.AdminTokens, opts.NodeTokens)
	if err != nil {
		return nil, err
	}
	if opts.ID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		opts.ID = host + "-" + hex.EncodeToString(b)
	}
	log = log.With("controlplane_id", opts.ID)
	if opts.Registerer == nil {
		r := prometheus.NewRegistry()
		r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		opts.Registerer, opts.Gatherer = r, r
	}
	m := metrics.New(opts.Registerer)
	tokens.OnRefusal(func(ctx context.Context, method string, reason auth.Reason) {
		m.RefusedRequests.WithLabelValues(method, string(reason)).Inc()
		addr := ""
		if p, ok := peer.FromContext(ctx); ok {
			addr = p.Addr.String()
		}
		log.Warn("call refused", "method", method, "reason", string(reason), "peer", addr)
	})

	var stack cleanup
	fail := func(err error) (*App, error) {
		stack.run()
		return nil, err
	}
	if opts.TracerProvider == nil {
		tp, stopTracing, err := telemetry.Setup(ctx, "rolter-controlplane")
		if err != nil {
			return nil, err
		}
		stack.push(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := stopTracing(sctx); err != nil {
				log.Warn("cannot flush traces", "err", err)
			}
		})
		opts.TracerProvider = tp
	}
	endpoints := opts.EtcdEndpoints
	if opts.EmbedEtcdDir != "" {
		closing := &atomic.Bool{}
		e, err := startEmbedded(opts.EmbedEtcdDir, opts.EmbedEtcdListen, closing)
		if err != nil {
			return fail(err)
		}
		stack.push(func() {
			closing.Store(true) // etcd logs its listeners' closing as errors
			e.Close()
		})
		endpoints = []string{e.Clients[0].Addr().String()}
		log.Info("embedded etcd ready", "dir", opts.EmbedEtcdDir, "endpoint", endpoints[0])
	}
	if len(endpoints) == 0 {
		return fail(errors.New("controlplane: no etcd endpoints (--etcd or --embed-etcd)"))
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second,
		DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: 5 * time.Second,
		Logger: zap.NewNop(),
		// Reconnect soon after etcd comes back (gRPC's default backoff
		// grows to two minutes).
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	})
	if err != nil {
		return fail(fmt.Errorf("controlplane: etcd client: %w", err))
	}
	stack.push(func() { _ = cli.Close() })

	layout := store.NewLayout(opts.Prefix)
	st := store.New(cli, layout, opts.ID, log)
	pepperCheck := config.PepperCheck(opts.KeyPepper)
	ectx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = st.EnsurePepper(ectx, pepperCheck)
	cancel()
	if err != nil {
		return fail(err)
	}

	hub := push.NewHub()
	reg := push.NewRegistry(opts.ID, cli, layout, hub, m, log)
	pushSrv := push.NewServer(opts.ID, hub, reg, pepperCheck, opts.TracerProvider, log)
	adminSrv := admin.New(st, opts.KeyPepper, reg, opts.TracerProvider, log)
	healthSrv := health.NewServer()
	healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	w := watch.New(cli, layout, func(s *state.State) {
		changed, err := hub.Set(s)
		if err != nil {
			log.Error("cannot render the config snapshot", "revision", s.Revision, "err", err)
			return
		}
		if changed {
			m.ConfigRevision.Set(float64(s.Revision))
			log.Info("publishing config", "snapshot_version", s.Revision)
			healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		}
	}, m, log)

	serverOpts := []grpc.ServerOption{
		// adminInterceptor first, so refused admin calls are counted too.
		grpc.ChainUnaryInterceptor(adminInterceptor(m), tokens.UnaryInterceptor),
		grpc.ChainStreamInterceptor(tokens.StreamInterceptor),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(4096),
		grpc.MaxRecvMsgSize(16 << 20),
	}
	if opts.TLS != nil {
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	srv := grpc.NewServer(serverOpts...)
	pb.RegisterAdminServiceServer(srv, adminSrv)
	pb.RegisterSnapshotServiceServer(srv, pushSrv)
	healthpb.RegisterHealthServer(srv, healthSrv)
	reflection.Register(srv)

	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return fail(fmt.Errorf("controlplane: listen: %w", err))
	}
	var metricsSrv *http.Server
	if opts.MetricsListen != "" && opts.Gatherer != nil {
		mln, err := net.Listen("tcp", opts.MetricsListen)
		if err != nil {
			_ = ln.Close()
			return fail(fmt.Errorf("controlplane: metrics listen: %w", err))
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		stack.push(func() { _ = metricsSrv.Close() })
		go func() { _ = metricsSrv.Serve(mln) }() // owned: closed by the cleanup stack
		log.Info("metrics listening", "addr", mln.Addr().String())
	}

	a := &App{id: opts.ID, addr: ln.Addr(), endpoints: endpoints, done: make(chan struct{})}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(bg) })
	wg.Go(func() { reg.Run(bg) })
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }() // owned: Stop below ends it and we read serveErr
	log.Info("rolter-controlplane listening", "addr", a.addr.String(), "tls", opts.TLS != nil, "etcd", strings.Join(endpoints, ","))
	go func() { // owned: closes a.done after everything else has stopped
		defer close(a.done)
		select {
		case <-ctx.Done():
		case err := <-serveErr:
			a.err = err
			serveErr <- nil
		}
		healthSrv.Shutdown()
		// Snapshot streams never end by themselves: end them, give unary
		// calls a moment, then cut whatever is left.
		pushSrv.Shutdown()
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }() // owned: ends when Stop below runs at the latest
		select {
		case <-stopped:
		case <-time.After(time.Second):
		}
		srv.Stop()
		<-stopped
		<-serveErr
		stopBG()
		wg.Wait()
		stack.run()
		log.Info("stopped")
	}()
	return a, nil
}

// ID is the replica's ID.
func (a *App) ID() string { return a.id }

// Addr is the bound gRPC address.
func (a *App) Addr() net.Addr { return a.addr }

// EtcdEndpoints are the etcd endpoints in use (the embedded one's address
// with EmbedEtcdDir).
func (a *App) EtcdEndpoints() []string { return a.endpoints }

// Wait blocks until the app has stopped and returns why it stopped early,
// or nil after a clean stop.
func (a *App) Wait() error {
	<-a.done
	return a.err
}

func adminInterceptor(m *metrics.Metrics) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, "/rolter.controlplane.v1.AdminService/") {
			return handler(ctx, req)
		}
		ctx, cancel := admin.WithDefaultTimeout(ctx)
		defer cancel()
		resp, err := handler(ctx, req)
		method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
		m.AdminRequests.WithLabelValues(method, status.Code(err).String()).Inc()
		return resp, err
	}
}

func startEmbedded(dir, listen string, closing *atomic.Bool) (*embed.Etcd, error) {
	if listen == "" {
		listen = "127.0.0.1:2379"
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.Lock(os.Stderr), zapcore.ErrorLevel)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(quietOnClose{Core: core, closing: closing}))
	cfg.MaxTxnOps = 4096
	// Node status writes add revisions; keep an hour of history.
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = "periodic", "1h"
	cu, err := url.Parse("http://" + listen)
	if err != nil {
		return nil, fmt.Errorf("controlplane: embedded etcd listen %q: %w", listen, err)
	}
	pu, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls = []url.URL{*cu}
	if cu.Port() != "0" {
		cfg.AdvertiseClientUrls = []url.URL{*cu}
	}
	cfg.ListenPeerUrls = []url.URL{*pu}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("controlplane: embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("controlplane: embedded etcd: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, errors.New("controlplane: embedded etcd not ready after 30s")
	}
}

// cleanup runs release functions in reverse order.
type cleanup []func()

func (c *cleanup) push(f func()) { *c = append(*c, f) }

func (c *cleanup) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}

// quietOnClose drops etcd's log entries once the process is stopping.
type quietOnClose struct {
	zapcore.Core
	closing *atomic.Bool
}

func (q quietOnClose) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if q.closing.Load() {
		return ce
	}
	return q.Core.Check(e, ce)
}

func (q quietOnClose) With(fields []zapcore.Field) zapcore.Core {
	return quietOnClose{Core: q.Core.With(fields), closing: q.closing}
}
