// Command rolter-kvwatcher subscribes to the vLLM KV events and LMCache
// occupancy of the configured providers and publishes compact per-provider
// deltas over NATS, which every rolter-proxy applies to its local index.
//
//	rolter-kvwatcher (--config FILE | --controlplane ADDR [--token T] [--snapshot-cache FILE] [--controlplane-ca FILE ...]) (--nats URL | --embed-nats HOST:PORT) [--metrics-listen ADDR]
//
// The control-plane TLS flags (--controlplane-ca, --controlplane-tls,
// --controlplane-insecure, --controlplane-cert, --controlplane-key) are the
// proxy's (pkg/tlsflags): TLS unless every address is loopback.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"rolter.dev/kvwatcher/app"
	"rolter.dev/pkg/tlsflags"
)

const usage = "usage: rolter-kvwatcher (--config FILE | --controlplane ADDR [--token T] [--snapshot-cache FILE] [--controlplane-ca FILE]) (--nats URL | --embed-nats HOST:PORT)"

func main() {
	configPath := flag.String("config", "", "rolter TOML config file (polled for changes)")
	cp := flag.String("controlplane", "", "control plane address(es), comma-separated: follow its snapshots instead of --config")
	cache := flag.String("snapshot-cache", "", "file caching the last control-plane snapshot, whose providers are watched at startup while no control plane answers")
	token := flag.String("token", "", "bearer token for the control plane (also $ROLTER_NODE_TOKEN)")
	var cpTLS tlsflags.ControlPlane
	cpTLS.Register(flag.CommandLine)
	natsURL := flag.String("nats", "", "NATS server URL, e.g. nats://127.0.0.1:4222")
	embedNATS := flag.String("embed-nats", "", "run an in-process NATS server on this host:port and use it (development)")
	metricsListen := flag.String("metrics-listen", "127.0.0.1:9465", "address serving /metrics (empty: none)")
	heartbeat := flag.Duration("heartbeat", app.DefaultHeartbeat, "period of the per-provider status messages")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "rolter-kvwatcher: bad --log-level: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if (*configPath == "") == (*cp == "") || (*natsURL == "" && *embedNATS == "") {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if *token == "" {
		*token = os.Getenv("ROLTER_NODE_TOKEN")
	}
	opts := app.ServiceOptions{
		ConfigPath: *configPath, ControlPlane: *cp, Token: *token, SnapshotCache: *cache, NATSURL: *natsURL, EmbedNATS: *embedNATS,
		MetricsListen: *metricsListen, Heartbeat: *heartbeat, Logger: log,
	}
	if *cp != "" {
		var addrs []string
		for _, a := range strings.Split(*cp, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		cfg, err := cpTLS.Config(addrs)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rolter-kvwatcher: %v\n", err)
			os.Exit(2)
		}
		opts.ControlPlaneTLS = cfg
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.RunService(ctx, opts); err != nil {
		log.Error("rolter-kvwatcher stopped", "err", err)
		os.Exit(1)
	}
}
