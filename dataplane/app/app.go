// Package app assembles a data-plane proxy process: config (file mode with
// hot reload), the proxy handler, health checks, engine-load scraping,
// metrics and the HTTP server. cmd/rolter-proxy and the cross-service
// tests both start proxies through it.
//
// # Lifecycle
//
// [Start] returns once the listener is bound and the first config applied
// (in control-plane mode: the cached snapshot, if any; until a snapshot
// arrives the proxy answers 503 and /readyz fails).
// Cancelling its context drains: /readyz turns 503, requests keep being
// accepted for DrainDelay (if any), the listener closes, in-flight requests
// and streams get up to DrainTimeout to finish, then the background
// goroutines stop. Shortly before DrainTimeout ends, what still runs is
// halted ([proxy.Proxy.Halt]): a stream gets an error event saying the proxy
// shut down and the response is incomplete, a request not yet answered gets
// 503 shutting_down, so that closing the connections at the deadline cuts
// no answer without a word. [App.Wait] returns when all of that is done.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"rolter.dev/dataplane/internal/cpfollow"
	"rolter.dev/dataplane/internal/engineload"
	"rolter.dev/dataplane/internal/filewatch"
	"rolter.dev/dataplane/internal/health"
	"rolter.dev/dataplane/internal/proxy"
	"rolter.dev/dataplane/internal/routingstate"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/fleet"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/respcache"
	"rolter.dev/pkg/telemetry"
)

// Options configures a data-plane process.
type Options struct {
	// ConfigPath is the TOML file (file mode). Required unless
	// ControlPlane is set.
	ConfigPath string
	// ControlPlane, when set, makes the proxy follow control planes
	// instead of a file.
	ControlPlane *ControlPlaneOptions
	// Listen overrides server.listen from the config.
	Listen string
	// Logger receives the process's logs. Required.
	Logger *slog.Logger
	// DrainDelay is how long, once shutdown starts, the proxy keeps
	// accepting and serving new requests while /readyz already answers 503,
	// so that a load balancer polling readiness (or Kubernetes removing the
	// pod's endpoint) stops sending before the listener closes. Responses
	// in that time carry "Connection: close", moving keep-alive clients to
	// another proxy. 0 (the default) closes the listener at once.
	DrainDelay time.Duration
	// DrainTimeout bounds how long in-flight requests may take after the
	// listener closes (default 30 s).
	DrainTimeout time.Duration
	// NATSURL, when set, connects to NATS to follow the kvwatchers' KV-event
	// and LMCache deltas (precise_cache_aware, predicted_ttft,
	// lmcache_aware). NATS being down at start or later leaves those
	// strategies neutral (least load);
	// the client reconnects by itself.
	NATSURL string
	// NoShare, with NATSURL, keeps this proxy's routing state to itself;
	// by default proxies share prefix observations and in-flight counts
	// (rolter.dev/pkg/fleet) so several route as well as one.
	NoShare bool
	// ShareGroup names the fleet on NATS (default "default").
	ShareGroup string
	// ShareFlush is how often batched observations are published (default
	// 25 ms): shorter means fresher peers, more and smaller messages.
	ShareFlush time.Duration
	// ShareQueueInterval is how often the prefill each predicted_ttft route
	// has queued per target is published (default 5 ms).
	ShareQueueInterval time.Duration
	// RoutingStateFile, when set, keeps what the balancers learned across
	// restarts (predicted_ttft's latency law and approximate index; see
	// package routingstate): read at start, written every
	// RoutingStateInterval and once more at shutdown. Empty: a restarted
	// proxy's balancers start from nothing.
	RoutingStateFile string
	// RoutingStateInterval is how often the file is written (default
	// DefaultRoutingStateInterval): a crash loses what was learned since.
	RoutingStateInterval time.Duration
}

// DefaultRoutingStateInterval is how often the routing state is written
// by default: a crash loses at most half a minute of learning (a restart
// with a drain loses nothing: the state is written at shutdown), and a
// write costs about 27 ms of CPU and 15 MB on disk for 16 replicas holding
// a million tokens each (docs/routing.md), off the request path.
const DefaultRoutingStateInterval = 30 * time.Second

// ControlPlaneOptions configures control-plane mode (see package cpfollow).
type ControlPlaneOptions struct {
	// Addrs are the control planes' gRPC addresses, tried in turn.
	Addrs []string
	// Token is the bearer token of the snapshot service.
	Token string
	// TLS, when set, dials with TLS; nil dials in plaintext.
	TLS *tls.Config
	// NodeID names this proxy to the control plane (default hostname-pid).
	NodeID string
	// CacheFile keeps the last applied snapshot, served at startup while
	// no control plane answers. Empty disables it.
	CacheFile string
	// KeyPepper must be the control plane's, for virtual keys to work.
	KeyPepper []byte
	// MaxBackoff caps the wait between reconnect rounds (default 5 s).
	MaxBackoff time.Duration
}

// App is a running data plane.
type App struct {
	addr  net.Addr
	proxy *proxy.Proxy
	done  chan struct{}
	err   error
}

// Start loads the config, binds the listener and serves until ctx ends.
func Start(ctx context.Context, opts Options) (*App, error) {
	log := opts.Logger
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 30 * time.Second
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tp, stopTracing, err := telemetry.Setup(ctx, "rolter-proxy")
	if err != nil {
		return nil, err
	}
	respcache.SetRedisLogger(log.With("component", "redis"))
	var kv *kvindex.Index
	var node *fleet.Node
	var nc *nats.Conn
	if opts.NATSURL != "" {
		// NoEcho: the proxy consumes nothing it publishes (fleet messages
		// from itself would only be dropped).
		// The handlers say why precise and LMCache routing went neutral
		// (and when they can recover).
		nlog := log.With("component", "nats")
		nc, err = nats.Connect(opts.NATSURL, nats.Name("rolter-proxy"), nats.MaxReconnects(-1),
			nats.RetryOnFailedConnect(true), nats.ReconnectWait(time.Second), nats.NoEcho(),
			nats.ConnectHandler(func(c *nats.Conn) { nlog.Info("nats connected", "url", c.ConnectedUrlRedacted()) }),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				nlog.Warn("nats disconnected; no KV deltas until it reconnects (their providers score neutral once stale)", "err", err)
			}),
			nats.ReconnectHandler(func(c *nats.Conn) { nlog.Info("nats reconnected", "url", c.ConnectedUrlRedacted()) }))
		if err != nil {
			return nil, fmt.Errorf("nats %s: %w", opts.NATSURL, err)
		}
		if !nc.IsConnected() {
			nlog.Warn("nats unreachable; retrying in the background", "url", opts.NATSURL)
		}
		kv, err = kvindex.New(nc, nil, kvindex.Options{Logger: log, TracerProvider: tp})
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("kv index: %w", err)
		}
		reg.MustRegister(kv.Collector())
		go func() { <-ctx.Done(); kv.Close(); nc.Close() }() // owned: ends with the app's context
		if !opts.NoShare {
			node = fleet.NewNode(fleet.Options{Group: opts.ShareGroup, FlushInterval: opts.ShareFlush, QueueInterval: opts.ShareQueueInterval})
		}
	}
	var restore []routingstate.Route
	if opts.RoutingStateFile != "" {
		routes, at, err := routingstate.Load(opts.RoutingStateFile)
		switch {
		case err != nil:
			log.Warn("routing state unreadable; every balancer starts from nothing", "file", opts.RoutingStateFile, "err", err)
		case routes != nil:
			log.Info("routing state read; each route's balancer reads back its own", "file", opts.RoutingStateFile,
				"routes", len(routes), "saved_at", at.UTC().Format(time.RFC3339), "age", time.Since(at).Round(time.Second).String())
		}
		restore = routes
	}
	p := proxy.New(proxy.Options{Logger: log, Registerer: reg, Gatherer: reg, TracerProvider: tp, KVIndex: kv, Fleet: node, Restore: restore})
	saveState := func() {
		if opts.RoutingStateFile == "" {
			return
		}
		routes, ok := p.RoutingState()
		if !ok {
			return // no config applied yet: the file keeps what the next start reads
		}
		size, err := routingstate.Save(opts.RoutingStateFile, routes)
		if err != nil {
			p.Metrics().StateSaves.WithLabelValues("error").Inc()
			log.Warn("writing the routing state", "file", opts.RoutingStateFile, "err", err)
			return
		}
		p.Metrics().StateSaves.WithLabelValues("ok").Inc()
		p.Metrics().StateBytes.Set(float64(size))
	}
	var source func(context.Context) // runs the config source until ctx ends
	if cp := opts.ControlPlane; cp != nil {
		f := cpfollow.New(cpfollow.Options{
			Addrs: cp.Addrs, Token: cp.Token, TLS: cp.TLS, NodeID: cp.NodeID, CacheFile: cp.CacheFile,
			KeyPepper: cp.KeyPepper, MaxBackoff: cp.MaxBackoff,
			Applier: p, Metrics: p.Metrics(), Registerer: reg, Logger: log, TracerProvider: tp,
		})
		if err := f.LoadCache(); err != nil {
			log.Warn("snapshot cache unusable; waiting for a control plane", "err", err)
		}
		source = f.Run
	} else {
		w := filewatch.New(opts.ConfigPath, p, p.Metrics(), log)
		if err := w.Load(); err != nil {
			return nil, fmt.Errorf("load config %s: %w", opts.ConfigPath, err)
		}
		source = w.Run
	}
	listen := opts.Listen
	if listen == "" {
		listen = config.DefaultListen
		if snap := p.Snapshot(); snap != nil {
			listen = snap.Server.Listen
		}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	// No ReadTimeout or WriteTimeout: they bound a whole request or
	// response, and would cut long streams. The proxy bounds each body read
	// (server.body_read_timeout_secs) and each write to the client
	// (server.client_write_timeout_ms) instead; IdleTimeout closes
	// keep-alive connections nobody uses.
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	a := &App{addr: ln.Addr(), proxy: p, done: make(chan struct{})}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { source(bg) })
	wg.Go(func() { health.New(p.Snapshot, p.Registry(), p.Metrics(), log).Run(bg) })
	wg.Go(func() { engineload.New(p.Snapshot, p.Registry(), p.Metrics(), log).Run(bg) })
	if opts.RoutingStateFile != "" {
		every := opts.RoutingStateInterval
		if every <= 0 {
			every = DefaultRoutingStateInterval
		}
		wg.Go(func() {
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-bg.Done():
					return
				case <-tick.C:
					saveState()
				}
			}
		})
	}
	if node != nil {
		wg.Go(func() {
			if err := node.Run(bg, nc, log.With("component", "fleet")); err != nil {
				log.Warn("fleet sharing stopped; routing on this proxy's own view", "err", err)
			}
		})
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }() // owned: Shutdown below ends it and we read serveErr
	version := "none yet"
	if snap := p.Snapshot(); snap != nil {
		version = snap.Version
	}
	log.Info("rolter-proxy listening", "addr", a.addr.String(), "config", opts.ConfigPath, "version", version)
	go func() { // owned: closes a.done after everything else has stopped
		defer close(a.done)
		select {
		case <-ctx.Done():
		case err := <-serveErr:
			a.err = err
			stopBG()
			wg.Wait()
			saveState()
			flushTraces(stopTracing)
			return
		}
		p.SetDraining(true)
		if opts.DrainDelay > 0 {
			log.Info("draining: not ready, still accepting", "delay", opts.DrainDelay.String())
			time.Sleep(opts.DrainDelay)
		}
		log.Info("draining", "timeout", opts.DrainTimeout.String())
		sctx, cancel := context.WithTimeout(context.Background(), opts.DrainTimeout)
		// Halt what still runs a little before the deadline, so that its
		// handlers tell their clients and end, and Shutdown returns before
		// srv.Close would cut them without a word. Halting takes
		// milliseconds (cancel the upstream request, write one event); the
		// margin leaves room for a client that reads slowly, and a tenth at
		// most so that short drain timeouts still go mostly to streams
		// finishing by themselves. Owned: stopped below once Shutdown
		// returns.
		halt := time.AfterFunc(opts.DrainTimeout-min(time.Second, opts.DrainTimeout/10), func() {
			log.Info("drain deadline near; halting the requests still running")
			p.Halt()
		})
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("drain deadline passed; closing remaining connections", "err", err)
			_ = srv.Close()
		}
		halt.Stop()
		cancel()
		if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.err = err
		}
		stopBG()
		wg.Wait()
		saveState() // what the drain's requests taught too
		if err := p.Close(); err != nil {
			log.Warn("flushing usage records", "err", err)
		}
		flushTraces(stopTracing)
		log.Info("stopped")
	}()
	return a, nil
}

// flushTraces sends the spans still buffered, for a few seconds at most.
func flushTraces(stop func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = stop(ctx)
}

// Addr is the bound listen address.
func (a *App) Addr() net.Addr { return a.addr }

// URL is the proxy's base URL.
func (a *App) URL() string { return "http://" + a.addr.String() }

// Wait blocks until the app has stopped and returns why it stopped early,
// or nil after a clean drain.
func (a *App) Wait() error {
	<-a.done
	return a.err
}
