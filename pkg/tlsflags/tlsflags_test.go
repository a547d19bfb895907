package tlsflags_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rolter.dev/pkg/tlsflags"
)

// writePair writes a self-signed certificate and its key as PEM files.
func writePair(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "c.crt"), filepath.Join(dir, "c.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func parse(t *testing.T, args ...string) tlsflags.ControlPlane {
	t.Helper()
	var c tlsflags.ControlPlane
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.Register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConfig(t *testing.T) {
	cert, key := writePair(t)
	notPEM := filepath.Join(t.TempDir(), "x")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	loop := []string{"127.0.0.1:7070", "localhost:7071", "[::1]:7072"}
	remote := []string{"127.0.0.1:7070", "cp-1:7070"}
	for _, tc := range []struct {
		name  string
		args  []string
		addrs []string
		// tls: a config is returned; roots: with the CA; client: with a
		// client certificate; err: the error contains it.
		tls, roots, client bool
		err                string
	}{
		{name: "loopback plaintext", addrs: loop},
		{name: "remote defaults to TLS", addrs: remote, tls: true},
		{name: "insecure remote", args: []string{"--controlplane-insecure"}, addrs: remote},
		{name: "tls on loopback", args: []string{"--controlplane-tls"}, addrs: loop, tls: true},
		{name: "ca", args: []string{"--controlplane-ca", cert}, addrs: loop, tls: true, roots: true},
		{name: "mutual", args: []string{"--controlplane-ca", cert, "--controlplane-cert", cert, "--controlplane-key", key}, addrs: remote, tls: true, roots: true, client: true},
		{name: "key without cert", args: []string{"--controlplane-key", key}, addrs: loop, err: "--controlplane-cert/--controlplane-key"},
		{name: "insecure and ca", args: []string{"--controlplane-insecure", "--controlplane-ca", cert}, addrs: remote, err: "excludes"},
		{name: "insecure and tls", args: []string{"--controlplane-insecure", "--controlplane-tls"}, addrs: remote, err: "excludes"},
		{name: "missing ca", args: []string{"--controlplane-ca", filepath.Join(t.TempDir(), "none")}, addrs: remote, err: "read --controlplane-ca"},
		{name: "ca not PEM", args: []string{"--controlplane-ca", notPEM}, addrs: remote, err: "no PEM certificate"},
		{name: "bad address", addrs: []string{"cp-1"}, err: `--controlplane "cp-1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(t, tc.args...).Config(tc.addrs)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (cfg != nil) != tc.tls {
				t.Fatalf("TLS config %v, want TLS %v", cfg, tc.tls)
			}
			if cfg == nil {
				return
			}
			if cfg.MinVersion < 0x0303 {
				t.Errorf("MinVersion %x, want TLS 1.2 at least", cfg.MinVersion)
			}
			if (cfg.RootCAs != nil) != tc.roots {
				t.Errorf("RootCAs set %v, want %v", cfg.RootCAs != nil, tc.roots)
			}
			if (len(cfg.Certificates) == 1) != tc.client {
				t.Errorf("%d client certificates, want client %v", len(cfg.Certificates), tc.client)
			}
		})
	}
}

// TestRegister: the flags' names and defaults, which the deploy files and
// both binaries' --help rely on.
func TestRegister(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	new(tlsflags.ControlPlane).Register(fs)
	want := map[string]string{"controlplane-ca": "", "controlplane-tls": "false", "controlplane-insecure": "false", "controlplane-cert": "", "controlplane-key": ""}
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if def, ok := want[f.Name]; !ok || f.DefValue != def {
			t.Errorf("flag %s default %q (want %q, known %v)", f.Name, f.DefValue, def, ok)
		}
	})
	if n != len(want) {
		t.Errorf("%d flags, want %d", n, len(want))
	}
}
