// Command rolter-proxy is rolter's data plane: an OpenAI- and
// Anthropic-compatible HTTP proxy that routes each request to the replica
// most likely to hold its prompt prefix in KV cache.
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
	"time"

	"rolter.dev/dataplane/app"
	"rolter.dev/pkg/fleet"
	"rolter.dev/pkg/tlsflags"
)

func main() {
	configPath := flag.String("config", "rolter.toml", "TOML config file (watched and hot-reloaded); ignored with --controlplane")
	listen := flag.String("listen", "", "listen address (overrides server.listen)")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	cpAddrs := flag.String("controlplane", "", "follow these control planes (comma-separated host:port) instead of --config")
	token := flag.String("token", "", "bearer token for the control plane's snapshot service (also $ROLTER_NODE_TOKEN)")
	tokenFile := flag.String("token-file", "", "file holding the control-plane token")
	var cpTLS tlsflags.ControlPlane
	cpTLS.Register(flag.CommandLine)
	nodeID := flag.String("node-id", "", "node ID reported to the control plane (default hostname-pid)")
	cache := flag.String("snapshot-cache", "", "file caching the last control-plane snapshot, served at startup while no control plane answers")
	pepperFile := flag.String("key-pepper-file", "", "file holding the virtual-key pepper, the control plane's ($ROLTER_KEY_PEPPER takes precedence)")
	natsURL := flag.String("nats", "", "NATS URL: the kvwatchers' KV-event deltas (precise_cache_aware, predicted_ttft, lmcache_aware) and the proxies' shared routing state")
	share := flag.Bool("share", true, "with --nats: share routing observations and in-flight counts with the other proxies of the fleet")
	shareFlush := flag.Duration("share-flush", fleet.DefaultFlushInterval, "with --share: how often batched routing observations are published")
	shareQueue := flag.Duration("share-queue-interval", fleet.DefaultQueueInterval, "with --share: how often each predicted_ttft route's queued prefill per target is published (a burst's picks also at once; a fifth of it is the least slack of a turn in a burst)")
	shareGroup := flag.String("share-group", "default", "with --share: the fleet's name; proxies share state only within one group")
	drainDelay := flag.Duration("drain-delay", 0, "on SIGTERM: answer /readyz with 503 but keep accepting requests this long (longer than your load balancer takes to notice), then close the listener")
	drainTimeout := flag.Duration("drain-timeout", 30*time.Second, "on SIGTERM: how long in-flight requests and streams may take once the listener is closed")
	stateFile := flag.String("routing-state", "", "file keeping what the balancers learned (predicted_ttft's latency law and prefix index) across restarts: read at start, written every --routing-state-interval and at shutdown")
	stateEvery := flag.Duration("routing-state-interval", app.DefaultRoutingStateInterval, "with --routing-state: how often it is written (a crash loses what was learned since)")
	flag.Parse()
	if *drainDelay < 0 || *drainTimeout <= 0 || *stateEvery <= 0 {
		fmt.Fprintln(os.Stderr, "rolter-proxy: --drain-delay must be >= 0, --drain-timeout and --routing-state-interval > 0")
		os.Exit(2)
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "rolter-proxy: bad -log-level: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	opts := app.Options{ConfigPath: *configPath, Listen: *listen, Logger: log, NATSURL: *natsURL, NoShare: !*share, ShareGroup: *shareGroup, ShareFlush: *shareFlush,
		ShareQueueInterval: *shareQueue, DrainDelay: *drainDelay, DrainTimeout: *drainTimeout, RoutingStateFile: *stateFile, RoutingStateInterval: *stateEvery}
	if *cpAddrs != "" {
		cp, err := controlPlaneOptions(*cpAddrs, *token, *tokenFile, cpTLS, *pepperFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rolter-proxy: %v\n", err)
			os.Exit(2)
		}
		cp.NodeID, cp.CacheFile = *nodeID, *cache
		opts.ControlPlane = cp
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := app.Start(ctx, opts)
	if err != nil {
		log.Error("cannot start", "err", err)
		os.Exit(1)
	}
	if err := a.Wait(); err != nil {
		log.Error("stopped", "err", err)
		os.Exit(1)
	}
}

func controlPlaneOptions(addrs, token, tokenFile string, tlsOpts tlsflags.ControlPlane, pepperFile string) (*app.ControlPlaneOptions, error) {
	cp := &app.ControlPlaneOptions{}
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cp.Addrs = append(cp.Addrs, a)
		}
	}
	cp.Token = os.Getenv("ROLTER_NODE_TOKEN")
	if token != "" {
		cp.Token = token
	}
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("read --token-file: %w", err)
		}
		cp.Token = strings.TrimSpace(string(b))
	}
	cp.KeyPepper = []byte(os.Getenv("ROLTER_KEY_PEPPER"))
	if len(cp.KeyPepper) == 0 && pepperFile != "" {
		b, err := os.ReadFile(pepperFile)
		if err != nil {
			return nil, fmt.Errorf("read --key-pepper-file: %w", err)
		}
		cp.KeyPepper = []byte(strings.TrimSpace(string(b)))
	}
	cfg, err := tlsOpts.Config(cp.Addrs)
	if err != nil {
		return nil, err
	}
	cp.TLS = cfg
	return cp, nil
}
