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
	"syscall"

	"rolter.dev/dataplane/app"
)

func main() {
	configPath := flag.String("config", "rolter.toml", "TOML config file (watched and hot-reloaded)")
	listen := flag.String("listen", "", "listen address (overrides server.listen)")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "rolter-proxy: bad -log-level: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := app.Start(ctx, app.Options{ConfigPath: *configPath, Listen: *listen, Logger: log})
	if err != nil {
		log.Error("cannot start", "err", err)
		os.Exit(1)
	}
	if err := a.Wait(); err != nil {
		log.Error("stopped", "err", err)
		os.Exit(1)
	}
}
