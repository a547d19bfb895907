package kvwatcher_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	cpapp "rolter.dev/controlplane/app"
	"rolter.dev/kvwatcher/app"
	"rolter.dev/pkg/tlsflags"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

const (
	cpAdminToken = "admin-token-0123456789"
	cpNodeToken  = "node-token-0123456789"
)

// testCA is a certificate authority writing its certificate to a PEM file.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), name+".crt")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, file: file}
}

// serverCert issues a server certificate for 127.0.0.1.
func (ca *testCA) serverCert(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "rolter-controlplane"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// startTLSControlPlane runs a control plane (embedded etcd) serving TLS
// with a certificate of ca, and returns its address.
func startTLSControlPlane(t *testing.T, ca *testCA) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, err := cpapp.Start(ctx, cpapp.Options{
		Listen: "127.0.0.1:0", EmbedEtcdDir: t.TempDir(), EmbedEtcdListen: "127.0.0.1:0",
		AdminTokens: []string{cpAdminToken}, NodeTokens: []string{cpNodeToken},
		KeyPepper: []byte("pepper-0123456789abcdef"), ID: "cp-tls", Logger: slog.New(slog.DiscardHandler),
		TLS: &tls.Config{Certificates: []tls.Certificate{ca.serverCert(t)}, MinVersion: tls.VersionTLS12},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := a.Wait(); err != nil {
			t.Errorf("control plane: %v", err)
		}
	})
	return a.Addr().String()
}

type adminBearer string

func (b adminBearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (adminBearer) RequireTransportSecurity() bool { return true }

// applyOverTLS applies doc through the control plane's admin service.
func applyOverTLS(t *testing.T, addr string, ca *testCA, doc string) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})),
		grpc.WithPerRPCCredentials(adminBearer(cpAdminToken)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pb.NewAdminServiceClient(conn).Apply(ctx, &pb.ApplyRequest{ConfigToml: doc}); err != nil {
		t.Fatal(err)
	}
}

// logRecords is a slog handler sending every record's message and
// attributes, as one line, to a channel.
type logRecords struct {
	ch    chan string
	attrs []slog.Attr
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	add := func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true }
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	select {
	case h.ch <- b.String():
	default: // nobody waiting: drop
	}
	return nil
}
func (h *logRecords) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecords{ch: h.ch, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}
func (h *logRecords) WithGroup(string) slog.Handler { return h }

// runSource runs src until the test ends; updates receives the provider
// names of every update.
func runSource(t *testing.T, src *app.ControlPlaneSource) (updates <-chan []string) {
	t.Helper()
	ch := make(chan []string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(ps []app.Provider) {
			var names []string
			for _, p := range ps {
				names = append(names, p.Name)
			}
			select {
			case ch <- names:
			default:
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil { // Run returns once ctx ends: no hang
			t.Errorf("Run: %v", err)
		}
	})
	return ch
}

const kvProviderDoc = `
[[providers]]
name = "vllm-kv"
kind = "openai_compatible"
api_base = "http://127.0.0.1:1"
[providers.kv_events]
endpoint = "tcp://127.0.0.1:5557"

[[routes]]
model = "m1"
targets = [{ provider = "vllm-kv" }]
`

// TestControlPlaneTLS: a ControlPlaneSource configured like
// `rolter-kvwatcher --controlplane ADDR --controlplane-ca FILE` receives
// the control plane's snapshot over TLS; given another CA it receives
// nothing and logs, for every attempt, the certificate verification
// failure instead of hanging.
func TestControlPlaneTLS(t *testing.T) {
	ca := newCA(t, "rolter-test-ca")
	addr := startTLSControlPlane(t, ca)
	applyOverTLS(t, addr, ca, kvProviderDoc)
	// The fail-safe of the waits below, not a timing assertion.
	failSafe := time.After(2 * time.Minute)

	t.Run("right CA", func(t *testing.T) {
		cfg, err := tlsflags.ControlPlane{CA: ca.file}.Config([]string{addr})
		if err != nil || cfg == nil {
			t.Fatalf("TLS config %v, %v", cfg, err)
		}
		updates := runSource(t, &app.ControlPlaneSource{Addrs: []string{addr}, Token: cpNodeToken, TLSConfig: cfg, NodeID: "kvw-tls", Logger: logger()})
		// The control plane follows etcd asynchronously, so the first
		// snapshot may predate the apply (no providers); wait for the one
		// that carries it.
		for {
			select {
			case names := <-updates:
				if len(names) == 0 {
					continue
				}
				if len(names) != 1 || names[0] != "vllm-kv" {
					t.Fatalf("providers %v, want [vllm-kv]", names)
				}
			case <-failSafe:
				t.Fatal("no snapshot over TLS")
			}
			break
		}
	})

	t.Run("wrong CA", func(t *testing.T) {
		other := newCA(t, "other-ca")
		cfg, err := tlsflags.ControlPlane{CA: other.file}.Config([]string{addr})
		if err != nil || cfg == nil {
			t.Fatalf("TLS config %v, %v", cfg, err)
		}
		logs := &logRecords{ch: make(chan string)}
		updates := runSource(t, &app.ControlPlaneSource{Addrs: []string{addr}, Token: cpNodeToken, TLSConfig: cfg, NodeID: "kvw-wrong-ca", Logger: slog.New(logs)})
		// Two failed attempts in a row: the source keeps retrying, and says
		// why each time.
		for attempt := 0; attempt < 2; {
			select {
			case line := <-logs.ch:
				if !strings.HasPrefix(line, "cannot follow the control plane") {
					continue
				}
				for _, want := range []string{"addr=" + addr, "tls=true", "x509", "certificate signed by unknown authority"} {
					if !strings.Contains(line, want) {
						t.Errorf("log %q lacks %q", line, want)
					}
				}
				t.Log(line)
				attempt++
			case names := <-updates:
				t.Fatalf("providers %v received from a control plane whose certificate does not verify", names)
			case <-failSafe:
				t.Fatal("no log of the failed TLS handshake")
			}
		}
	})
}
