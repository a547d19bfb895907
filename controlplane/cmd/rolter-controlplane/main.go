// Command rolter-controlplane stores rolter's routes, providers and virtual
// keys in etcd, serves the gRPC admin API, and pushes versioned config
// snapshots to every data plane and kvwatcher.
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"rolter.dev/controlplane/app"
	"rolter.dev/controlplane/internal/auth"
)

func main() {
	var (
		listen        = flag.String("listen", "127.0.0.1:7070", "gRPC listen address (admin and snapshot services)")
		metricsListen = flag.String("metrics-listen", "", "HTTP address serving Prometheus /metrics (off when empty)")
		etcd          = flag.String("etcd", "", "comma-separated etcd endpoints")
		embedDir      = flag.String("embed-etcd", "", "run an embedded etcd with its data in this directory (single machine)")
		embedListen   = flag.String("embed-etcd-listen", "127.0.0.1:2379", "client address of the embedded etcd")
		prefix        = flag.String("prefix", "/rolter/v1/", "etcd key prefix")
		tokenFile     = flag.String("token-file", "", "file of admin tokens, one per line (also $ROLTER_ADMIN_TOKENS, comma-separated)")
		nodeTokenFile = flag.String("node-token-file", "", "file of node tokens, which may only follow snapshots (also $ROLTER_NODE_TOKENS)")
		pepperFile    = flag.String("key-pepper-file", "", "file holding the virtual-key pepper ($ROLTER_KEY_PEPPER takes precedence)")
		tlsCert       = flag.String("tls-cert", "", "TLS certificate (PEM)")
		tlsKey        = flag.String("tls-key", "", "TLS private key (PEM)")
		tlsClientCA   = flag.String("tls-client-ca", "", "CA bundle (PEM) that client certificates must chain to (mutual TLS)")
		insecure      = flag.Bool("insecure", false, "serve without TLS outside --dev (only behind a trusted network layer)")
		dev           = flag.Bool("dev", false, "development mode: no TLS needed, generates and prints a token and a pepper when none is given")
		id            = flag.String("id", "", "replica ID (default hostname-random)")
		logLevel      = flag.String("log-level", "info", "debug, info, warn or error")
	)
	flag.Parse()
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fatalf("bad --log-level: %v", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	admin := auth.SplitList(os.Getenv("ROLTER_ADMIN_TOKENS"))
	if *tokenFile != "" {
		t, err := auth.ReadFile(*tokenFile)
		if err != nil {
			fatalf("%v", err)
		}
		admin = append(admin, t...)
	}
	node := auth.SplitList(os.Getenv("ROLTER_NODE_TOKENS"))
	if *nodeTokenFile != "" {
		t, err := auth.ReadFile(*nodeTokenFile)
		if err != nil {
			fatalf("%v", err)
		}
		node = append(node, t...)
	}
	pepper := []byte(os.Getenv("ROLTER_KEY_PEPPER"))
	if len(pepper) == 0 && *pepperFile != "" {
		b, err := os.ReadFile(*pepperFile)
		if err != nil {
			fatalf("read --key-pepper-file: %v", err)
		}
		pepper = []byte(strings.TrimSpace(string(b)))
	}
	if *dev {
		if len(admin) == 0 {
			tok := randomToken()
			admin = append(admin, tok)
			fmt.Printf("rolter-controlplane --dev: admin token (pass it to rolterctl with --token or $ROLTER_TOKEN):\n  %s\n", tok)
		}
		if len(pepper) == 0 {
			var err error
			if pepper, err = devPepper(*embedDir); err != nil {
				fatalf("%v", err)
			}
			fmt.Printf("rolter-controlplane --dev: key pepper (data planes need the same: export ROLTER_KEY_PEPPER=...):\n  %s\n", pepper)
		}
	}
	switch {
	case len(admin) == 0:
		fatalf("no admin token: use --token-file or $ROLTER_ADMIN_TOKENS (or --dev)")
	case len(pepper) < 16:
		fatalf("the key pepper must be at least 16 characters: set $ROLTER_KEY_PEPPER or --key-pepper-file (or --dev)")
	case *etcd == "" && *embedDir == "":
		fatalf("one of --etcd and --embed-etcd is required")
	case *etcd != "" && *embedDir != "":
		fatalf("--etcd and --embed-etcd exclude each other")
	}
	tlsCfg, err := serverTLS(*tlsCert, *tlsKey, *tlsClientCA)
	if err != nil {
		fatalf("%v", err)
	}
	if tlsCfg == nil && !*dev && !*insecure {
		fatalf("TLS is required outside --dev: give --tls-cert and --tls-key (or --insecure behind a trusted network layer)")
	}
	var endpoints []string
	if *etcd != "" {
		endpoints = auth.SplitList(*etcd)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := app.Start(ctx, app.Options{
		Listen: *listen, MetricsListen: *metricsListen, EtcdEndpoints: endpoints,
		EmbedEtcdDir: *embedDir, EmbedEtcdListen: *embedListen, Prefix: *prefix,
		AdminTokens: admin, NodeTokens: node, TLS: tlsCfg, KeyPepper: pepper, ID: *id, Logger: log,
	})
	if err != nil {
		log.Error("cannot start", "err", err)
		os.Exit(1)
	}
	if err := a.Wait(); err != nil {
		log.Error("stopped", "err", err)
		os.Exit(1)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "rolter-controlplane: "+format+"\n", args...)
	os.Exit(2)
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "rolter-dev-" + base64.RawURLEncoding.EncodeToString(b)
}

// devPepper keeps a generated pepper beside the embedded etcd's data, so
// keys minted in dev mode survive a restart; without a data dir it is new
// each run.
func devPepper(dir string) ([]byte, error) {
	if dir == "" {
		return []byte(randomToken()), nil
	}
	path := filepath.Join(dir, "dev-key-pepper")
	if b, err := os.ReadFile(path); err == nil {
		return []byte(strings.TrimSpace(string(b))), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	p := randomToken()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, []byte(p+"\n"), 0o600); err != nil {
		return nil, err
	}
	return []byte(p), nil
}

func serverTLS(cert, key, clientCA string) (*tls.Config, error) {
	if cert == "" && key == "" {
		if clientCA != "" {
			return nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
		}
		return nil, nil
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("load TLS key pair: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("read --tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("--tls-client-ca holds no PEM certificate")
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
