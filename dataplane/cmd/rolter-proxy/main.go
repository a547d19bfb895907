// Command rolter-proxy is rolter's data plane: an OpenAI- and
// Anthropic-compatible HTTP proxy that routes each request to the replica
// most likely to hold its prompt prefix in KV cache.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"rolter.dev/dataplane/app"
	"rolter.dev/pkg/fleet"
)

func main() {
	configPath := flag.String("config", "rolter.toml", "TOML config file (watched and hot-reloaded); ignored with --controlplane")
	listen := flag.String("listen", "", "listen address (overrides server.listen)")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	cpAddrs := flag.String("controlplane", "", "follow these control planes (comma-separated host:port) instead of --config")
	token := flag.String("token", "", "bearer token for the control plane's snapshot service (also $ROLTER_NODE_TOKEN)")
	tokenFile := flag.String("token-file", "", "file holding the control-plane token")
	cpCA := flag.String("controlplane-ca", "", "CA bundle (PEM) to verify the control plane's TLS certificate (implies TLS)")
	cpTLS := flag.Bool("controlplane-tls", false, "use TLS with the system roots (the default unless every address is loopback)")
	cpInsecure := flag.Bool("controlplane-insecure", false, "plaintext to the control plane even off loopback")
	cpCert := flag.String("controlplane-cert", "", "client certificate (PEM) for mutual TLS")
	cpKey := flag.String("controlplane-key", "", "client key (PEM) for mutual TLS")
	nodeID := flag.String("node-id", "", "node ID reported to the control plane (default hostname-pid)")
	cache := flag.String("snapshot-cache", "", "file caching the last control-plane snapshot, served at startup while no control plane answers")
	pepperFile := flag.String("key-pepper-file", "", "file holding the virtual-key pepper, the control plane's ($ROLTER_KEY_PEPPER takes precedence)")
	natsURL := flag.String("nats", "", "NATS URL: the kvwatchers' KV-event deltas (precise_cache_aware, lmcache_aware) and the proxies' shared routing state")
	share := flag.Bool("share", true, "with --nats: share routing observations and in-flight counts with the other proxies of the fleet")
	shareFlush := flag.Duration("share-flush", fleet.DefaultFlushInterval, "with --share: how often batched routing observations are published")
	shareGroup := flag.String("share-group", "default", "with --share: the fleet's name; proxies share state only within one group")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "rolter-proxy: bad -log-level: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	opts := app.Options{ConfigPath: *configPath, Listen: *listen, Logger: log, NATSURL: *natsURL, NoShare: !*share, ShareGroup: *shareGroup, ShareFlush: *shareFlush}
	if *cpAddrs != "" {
		cp, err := controlPlaneOptions(*cpAddrs, *token, *tokenFile, *cpCA, *cpCert, *cpKey, *cpTLS, *cpInsecure, *pepperFile)
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

func controlPlaneOptions(addrs, token, tokenFile, ca, cert, key string, useTLS, plaintext bool, pepperFile string) (*app.ControlPlaneOptions, error) {
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
	loopback := true
	for _, a := range cp.Addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("--controlplane %q: %w", a, err)
		}
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			loopback = false
		}
	}
	if plaintext && (useTLS || ca != "" || cert != "") {
		return nil, fmt.Errorf("--controlplane-insecure excludes the TLS flags")
	}
	if plaintext || (loopback && !useTLS && ca == "" && cert == "") {
		return cp, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("read --controlplane-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--controlplane-ca holds no PEM certificate")
		}
	}
	if cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("load --controlplane-cert/--controlplane-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	cp.TLS = cfg
	return cp, nil
}
