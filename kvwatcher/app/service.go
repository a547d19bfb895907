package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
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
		src = &ControlPlaneSource{Addrs: addrs, Token: o.Token, TLSConfig: o.ControlPlaneTLS, Logger: o.Logger}
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
	nc, err := nats.Connect(o.NATSURL, nats.Name("rolter-kvwatcher"), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("nats disconnected", "err", err) }),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrlRedacted()) }))
	if err != nil {
		return fmt.Errorf("kvwatcher: connect to nats %s: %w", o.NATSURL, err)
	}
	defer nc.Close()
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
