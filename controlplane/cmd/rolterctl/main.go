// Command rolterctl manages a rolter control plane: apply a whole config,
// get, list, create, update and delete providers, routes and virtual keys,
// mint, rotate and disable keys, and show which node runs which version.
// Run `rolterctl -h` for the commands; exit codes are documented in
// package ctl.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"rolter.dev/controlplane/internal/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ctl.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
