// Package ctl is rolterctl: a command-line client of the control plane's
// admin API. cmd/rolterctl only calls [Run].
//
// # Exit codes
//
// Scripts can rely on these: 0 success; 1 internal or unexpected error;
// 2 usage error; 3 config refused (validation failed, with field paths);
// 4 not found; 5 conflict (a concurrent change won, or the object already
// exists); 6 authentication or permission refused; 7 control plane or etcd
// unavailable.
package ctl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// Exit codes.
const (
	ExitOK          = 0
	ExitError       = 1
	ExitUsage       = 2
	ExitInvalid     = 3
	ExitNotFound    = 4
	ExitConflict    = 5
	ExitAuth        = 6
	ExitUnavailable = 7
)

const usage = `rolterctl manages a rolter control plane.

Usage:
  rolterctl [flags] apply -f rolter.toml [--dry-run] [--prune-keys] [--expected-revision N]
  rolterctl [flags] validate -f rolter.toml
  rolterctl [flags] get provider|route|key NAME
  rolterctl [flags] get config
  rolterctl [flags] list providers|routes|keys
  rolterctl [flags] create provider|route -f entry.toml
  rolterctl [flags] update provider|route -f entry.toml [--revision N]
  rolterctl [flags] delete provider|route|key NAME [--revision N]
  rolterctl [flags] keys create NAME [--models m1,m2] [--providers p1] [--expires RFC3339] [--cache true|false] [--disabled]
  rolterctl [flags] keys rotate|disable|enable|delete NAME
  rolterctl [flags] keys list
  rolterctl [flags] status

An entry file holds one [[providers]] or [[routes]] table (or its keys at
the top level), in the schema of rolter.toml.

Flags:
`

// Env reads environment variables (os.Getenv in main).
type Env func(string) string

// globals are the flags common to every command.
type globals struct {
	addr, token, tokenFile, ca, serverName, output string
	useTLS, plaintext                              bool
	timeout                                        time.Duration
}

// Run executes one rolterctl invocation and returns its exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, env Env) int {
	fs := flag.NewFlagSet("rolterctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var g globals
	def := env("ROLTER_CONTROLPLANE")
	if def == "" {
		def = "127.0.0.1:7070"
	}
	fs.StringVar(&g.addr, "controlplane", def, "control plane address host:port ($ROLTER_CONTROLPLANE)")
	fs.StringVar(&g.token, "token", "", "admin bearer token ($ROLTER_TOKEN)")
	fs.StringVar(&g.tokenFile, "token-file", "", "file holding the admin token")
	fs.BoolVar(&g.useTLS, "tls", false, "use TLS with the system roots (the default unless the address is loopback)")
	fs.BoolVar(&g.plaintext, "insecure", false, "plaintext even off loopback")
	fs.StringVar(&g.ca, "tls-ca", "", "CA bundle (PEM) to verify the control plane (implies TLS)")
	fs.StringVar(&g.serverName, "tls-server-name", "", "server name to verify instead of the address's host")
	fs.StringVar(&g.output, "o", "table", "output: table or json")
	fs.DurationVar(&g.timeout, "timeout", 15*time.Second, "timeout of the call")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if g.output != "table" && g.output != "json" {
		fmt.Fprintf(stderr, "rolterctl: -o must be table or json, got %q\n", g.output)
		return ExitUsage
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return ExitUsage
	}
	token := env("ROLTER_TOKEN")
	if g.token != "" {
		token = g.token
	}
	if g.tokenFile != "" {
		b, err := os.ReadFile(g.tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "rolterctl: %v\n", err)
			return ExitUsage
		}
		token = strings.TrimSpace(string(b))
	}
	creds, err := transport(g)
	if err != nil {
		fmt.Fprintf(stderr, "rolterctl: %v\n", err)
		return ExitUsage
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: token, secure: g.ca != "" || g.useTLS}))
	}
	conn, err := grpc.NewClient(g.addr, opts...)
	if err != nil {
		fmt.Fprintf(stderr, "rolterctl: %v\n", err)
		return ExitUsage
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	c := &cmd{client: pb.NewAdminServiceClient(conn), out: stdout, errw: stderr, json: g.output == "json"}
	err = c.dispatch(ctx, rest)
	return c.exit(err)
}

func transport(g globals) (credentials.TransportCredentials, error) {
	host, _, err := net.SplitHostPort(g.addr)
	if err != nil {
		return nil, fmt.Errorf("--controlplane %q: %w", g.addr, err)
	}
	ip := net.ParseIP(host)
	loopback := host == "localhost" || (ip != nil && ip.IsLoopback())
	if g.plaintext && (g.useTLS || g.ca != "") {
		return nil, errors.New("--insecure excludes --tls and --tls-ca")
	}
	if g.plaintext || (loopback && !g.useTLS && g.ca == "") {
		return insecure.NewCredentials(), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: g.serverName}
	if g.ca != "" {
		pem, err := os.ReadFile(g.ca)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", g.ca)
		}
	}
	return credentials.NewTLS(cfg), nil
}

type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// usageError is a command-line mistake.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// exit prints err and maps it to an exit code.
func (c *cmd) exit(err error) int {
	if err == nil {
		return ExitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(c.errw, "rolterctl: %s (rolterctl -h for help)\n", ue.msg)
		return ExitUsage
	}
	var refused *refusedError
	if errors.As(err, &refused) {
		fmt.Fprintf(c.errw, "rolterctl: %s\n", refused.msg)
		return ExitInvalid
	}
	st, ok := status.FromError(err)
	if !ok {
		fmt.Fprintf(c.errw, "rolterctl: %v\n", err)
		return ExitError
	}
	fmt.Fprintf(c.errw, "rolterctl: %s\n", st.Message())
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition:
		return ExitInvalid
	case codes.NotFound:
		return ExitNotFound
	case codes.Aborted, codes.AlreadyExists:
		return ExitConflict
	case codes.Unauthenticated, codes.PermissionDenied:
		return ExitAuth
	case codes.Unavailable, codes.DeadlineExceeded:
		return ExitUnavailable
	}
	return ExitError
}

// refusedError is a Validate that found problems.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }
