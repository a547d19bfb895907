package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"rolter.dev/kvwatcher/internal/metrics"
	"rolter.dev/pkg/backoff"
	"rolter.dev/pkg/telemetry"
)

// ServiceOptions configures the rolter-kvwatcher process.
type ServiceOptions struct {
	// ConfigPath is the rolter config file (file mode).
	ConfigPath string
	// ControlPlane lists the control planes' addresses (comma-separated);
	// Token is the node token of their snapshot service.
	ControlPlane, Token string
	// ControlPlaneTLS, when set, dials the control planes with TLS;
	// nil dials them in plaintext.
	ControlPlaneTLS *tls.Config
	// SnapshotCache is the control-plane snapshot cache file (see
	// ControlPlaneSource.CacheFile); empty: none.
	SnapshotCache string
	// NATSURL is the NATS server (required unless EmbedNATS is set).
	NATSURL string
	// EmbedNATS, when set, runs an in-process NATS server listening on
	// this host:port (for development: make run) and connects to it.
	EmbedNATS string
	// MetricsListen serves /metrics when not empty.
	MetricsListen string
	// Heartbeat is the status period (see Options.Heartbeat).
	Heartbeat time.Duration
	// Logger receives logs (required).
	Logger *slog.Logger
}

// RunService runs the watcher process until ctx ends: it connects to NATS,
// serves /metrics, and watches the providers of the config file.
func RunService(ctx context.Context, o ServiceOptions) error {
	var src Source
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	switch {
	case o.ControlPlane != "":
		var addrs []string
		for _, a := range strings.Split(o.ControlPlane, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		src = &ControlPlaneSource{Addrs: addrs, Token: o.Token, TLSConfig: o.ControlPlaneTLS, CacheFile: o.SnapshotCache, Logger: o.Logger}
	case o.ConfigPath != "":
		src = &FileSource{Path: o.ConfigPath, Logger: o.Logger}
	default:
		return errors.New("kvwatcher: one of --config or --controlplane is required")
	}
	log := o.Logger
	if o.EmbedNATS != "" {
		ns, err := startEmbeddedNATS(o.EmbedNATS)
		if err != nil {
			return err
		}
		defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
		log.Info("embedded nats server", "url", ns.ClientURL())
		if o.NATSURL == "" {
			o.NATSURL = ns.ClientURL()
		}
	}
	if o.NATSURL == "" {
		return errors.New("kvwatcher: --nats is required")
	}
	// NATS unreachable at start is not fatal: the client keeps trying (and
	// buffers what the watcher publishes meanwhile), /readyz says not
	// ready, and the proxies, which request snapshots on a sequence gap,
	// catch up once it connects.
	nc, err := nats.Connect(o.NATSURL, nats.Name("rolter-kvwatcher"), nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true), nats.CustomReconnectDelay(natsReconnectDelay),
		nats.ConnectHandler(func(c *nats.Conn) { log.Info("nats connected", "url", c.ConnectedUrlRedacted()) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("nats disconnected", "err", err) }),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrlRedacted()) }))
	if err != nil {
		return fmt.Errorf("kvwatcher: nats %s: %w", o.NATSURL, err)
	}
	defer nc.Close()
	if !nc.IsConnected() {
		log.Warn("nats unreachable; retrying in the background (not ready until connected)", "url", o.NATSURL)
	}
	if err := metrics.RegisterNATS(reg, nc.IsConnected); err != nil {
		return fmt.Errorf("kvwatcher: metrics: %w", err)
	}
	// Spans are exported only when the standard OTEL_* variables ask for it
	// (the proxy reads the same ones).
	tp, stopTracing, err := telemetry.Setup(ctx, "rolter-kvwatcher")
	if err != nil {
		return fmt.Errorf("kvwatcher: %w", err)
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		if err := stopTracing(sctx); err != nil {
			log.Warn("flushing traces", "err", err)
		}
	}()
	w, err := New(Options{Source: src, NATS: nc, Logger: log, Registerer: reg, Heartbeat: o.Heartbeat, TracerProvider: tp})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	if o.MetricsListen != "" {
		ln, err := net.Listen("tcp", o.MetricsListen)
		if err != nil {
			return fmt.Errorf("kvwatcher: metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		mux.HandleFunc("/readyz", func(rw http.ResponseWriter, _ *http.Request) {
			if why := notReady(nc, w); why != "" {
				http.Error(rw, "not ready: "+why, http.StatusServiceUnavailable)
				return
			}
			_, _ = rw.Write([]byte("ready\n"))
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("kvwatcher: metrics server: %w", err)
				cancel()
			}
		}()
		defer func() {
			sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer scancel()
			_ = srv.Shutdown(sctx)
			<-done
		}()
		log.Info("serving metrics", "addr", ln.Addr().String())
	}
	runErr := w.Run(ctx)
	_ = nc.Flush()
	select {
	case err := <-errc:
		return err
	default:
	}
	return runErr
}

// natsReconnectDelay is the wait before NATS connect attempt n (1 after the
// first failed round over the servers): full-jitter exponential from 100 ms
// to 2 s, so a fleet of watchers does not retry in lockstep and a NATS
// server that comes back is found within about a second.
func natsReconnectDelay(attempt int) time.Duration {
	return backoff.Delay(attempt, 100*time.Millisecond, 2*time.Second, rand.Float64())
}

// notReady says why the watcher is not ready ("" when it is): it is once
// NATS is connected and its Source has given it a provider list.
func notReady(nc *nats.Conn, w *Watcher) string {
	var why []string
	if !nc.IsConnected() {
		why = append(why, "nats "+strings.ToLower(nc.Status().String()))
	}
	if !w.Configured() {
		why = append(why, "no provider list yet")
	}
	return strings.Join(why, "; ")
}

// startEmbeddedNATS runs a NATS server on addr (host:port).
func startEmbeddedNATS(addr string) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("kvwatcher: --embed-nats %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("kvwatcher: --embed-nats %q: bad port", addr)
	}
	ns, err := server.NewServer(&server.Options{Host: host, Port: port, NoSigs: true, NoLog: true})
	if err != nil {
		return nil, fmt.Errorf("kvwatcher: embedded nats: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("kvwatcher: embedded nats did not start")
	}
	return ns, nil
}
