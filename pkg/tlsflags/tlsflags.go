// Package tlsflags holds the command-line flags with which a node (the
// rolter-proxy, the rolter-kvwatcher) chooses how it dials the control
// planes: --controlplane-ca, --controlplane-tls, --controlplane-insecure,
// --controlplane-cert and --controlplane-key, and the *tls.Config they
// make. Both binaries register them here, so they keep the same names,
// defaults and meaning.
//
// Without any of them a node dials in plaintext when every control-plane
// address is loopback, and with TLS (the system roots) otherwise.
package tlsflags

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
)

// ControlPlane is the value of the control-plane TLS flags.
type ControlPlane struct {
	// CA is a PEM bundle verifying the control planes' certificates
	// (implies TLS); empty: the system roots.
	CA string
	// TLS asks for TLS with the system roots even to loopback addresses.
	TLS bool
	// Insecure dials in plaintext even off loopback; it excludes the
	// other flags.
	Insecure bool
	// Cert and Key are a client certificate and key for mutual TLS.
	Cert, Key string
}

// Register defines the flags on fs (flag.CommandLine when nil), writing
// into c.
func (c *ControlPlane) Register(fs *flag.FlagSet) {
	if fs == nil {
		fs = flag.CommandLine
	}
	fs.StringVar(&c.CA, "controlplane-ca", "", "CA bundle (PEM) to verify the control plane's TLS certificate (implies TLS)")
	fs.BoolVar(&c.TLS, "controlplane-tls", false, "use TLS with the system roots (the default unless every address is loopback)")
	fs.BoolVar(&c.Insecure, "controlplane-insecure", false, "plaintext to the control plane even off loopback")
	fs.StringVar(&c.Cert, "controlplane-cert", "", "client certificate (PEM) for mutual TLS")
	fs.StringVar(&c.Key, "controlplane-key", "", "client key (PEM) for mutual TLS")
}

// Config returns the TLS configuration for dialing the control planes at
// addrs (host:port), or nil to dial them in plaintext: with
// --controlplane-insecure, or when every address is loopback and no TLS
// flag is given. It reads the CA and the client key pair.
func (c ControlPlane) Config(addrs []string) (*tls.Config, error) {
	loopback := true
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("--controlplane %q: %w", a, err)
		}
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			loopback = false
		}
	}
	if c.Insecure && (c.TLS || c.CA != "" || c.Cert != "" || c.Key != "") {
		return nil, errors.New("--controlplane-insecure excludes the TLS flags")
	}
	if c.Insecure || (loopback && !c.TLS && c.CA == "" && c.Cert == "" && c.Key == "") {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CA != "" {
		pem, err := os.ReadFile(c.CA)
		if err != nil {
			return nil, fmt.Errorf("read --controlplane-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, errors.New("--controlplane-ca holds no PEM certificate")
		}
	}
	if c.Cert != "" || c.Key != "" {
		pair, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("load --controlplane-cert/--controlplane-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
