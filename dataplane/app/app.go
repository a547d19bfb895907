// Package app assembles a data-plane proxy process: config (file mode with
// hot reload), the proxy handler, health checks, metrics and the HTTP
// server. cmd/rolter-proxy and the cross-service tests both start proxies
// through it.
//
// # Lifecycle
//
// [Start] returns once the listener is bound and the first config applied.
// Cancelling its context drains: /readyz turns 503, the listener closes,
// in-flight requests and streams get up to DrainTimeout to finish, then the
// background goroutines stop. [App.Wait] returns when all of that is done.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"rolter.dev/dataplane/internal/filewatch"
	"rolter.dev/dataplane/internal/health"
	"rolter.dev/dataplane/internal/proxy"
)

// Options configures a data-plane process.
type Options struct {
	// ConfigPath is the TOML file (file mode). Required.
	ConfigPath string
	// Listen overrides server.listen from the config.
	Listen string
	// Logger receives the process's logs. Required.
	Logger *slog.Logger
	// DrainTimeout bounds how long in-flight requests may take after
	// shutdown starts (default 30 s).
	DrainTimeout time.Duration
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
	p := proxy.New(proxy.Options{Logger: log, Registerer: reg, Gatherer: reg})
	w := filewatch.New(opts.ConfigPath, p, p.Metrics(), log)
	if err := w.Load(); err != nil {
		return nil, fmt.Errorf("load config %s: %w", opts.ConfigPath, err)
	}
	listen := opts.Listen
	if listen == "" {
		listen = p.Snapshot().Server.Listen
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	a := &App{addr: ln.Addr(), proxy: p, done: make(chan struct{})}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(bg) })
	wg.Go(func() { health.New(p.Snapshot, p.Registry(), p.Metrics(), log).Run(bg) })
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }() // owned: Shutdown below ends it and we read serveErr
	log.Info("rolter-proxy listening", "addr", a.addr.String(), "config", opts.ConfigPath, "version", p.Snapshot().Version)
	go func() { // owned: closes a.done after everything else has stopped
		defer close(a.done)
		select {
		case <-ctx.Done():
		case err := <-serveErr:
			a.err = err
			stopBG()
			wg.Wait()
			return
		}
		p.SetDraining(true)
		log.Info("draining", "timeout", opts.DrainTimeout.String())
		sctx, cancel := context.WithTimeout(context.Background(), opts.DrainTimeout)
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("drain deadline passed; closing remaining connections", "err", err)
			_ = srv.Close()
		}
		cancel()
		if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.err = err
		}
		stopBG()
		wg.Wait()
		log.Info("stopped")
	}()
	return a, nil
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
