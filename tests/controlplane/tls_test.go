package controlplane_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	dpapp "rolter.dev/dataplane/app"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// selfSigned returns a certificate for 127.0.0.1 and a pool trusting it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rolter-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// TestTLSMetricsHealth: a control plane serving TLS is followed by a proxy
// that verifies it, refuses plaintext clients, reports SERVING on gRPC
// health once it has a snapshot, and exposes its nodes in metrics.
func TestTLSMetricsHealth(t *testing.T) {
	cert, pool := selfSigned(t)
	etcd := startEtcd(t)
	opts := controlPlaneOptions(t, etcd, "tls")
	opts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	cp := startControlPlaneWith(t, opts)

	p := startProxyWith(t, filepath.Join(t.TempDir(), "p.json"), pepper, func(o *dpapp.ControlPlaneOptions) {
		o.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}, cp)

	conn, err := grpc.NewClient(cp.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})),
		grpc.WithPerRPCCredentials(bearer(adminToken)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	admin := pb.NewAdminServiceClient(conn)
	ua, ub := upstream(t, "a"), upstream(t, "b")
	if _, err := admin.Apply(ctx(t), &pb.ApplyRequest{ConfigToml: routeTo(ua, ub, "m1", "a")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, converge, "served over a TLS control plane", serves(p, "m1", "", "a"))

	h, err := healthpb.NewHealthClient(conn).Check(ctx(t), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v, %v", h, err)
	}
	plain := adminClient(t, cp.addr, adminToken)
	if _, err := plain.ListRoutes(ctx(t), &pb.ListRoutesRequest{}); err == nil {
		t.Error("a plaintext client was served by a TLS control plane")
	}

	eventually(t, converge, "metrics show the node and its ack", func() error {
		if n := metricValue(t, cp.reg, "rolter_controlplane_connected_nodes", "role", "dataplane"); n != 1 {
			return fmt.Errorf("connected nodes %v", n)
		}
		// One ack at least: the proxy may connect before or after the
		// apply, so it acks one or two versions.
		if n := metricValue(t, cp.reg, "rolter_controlplane_node_acks_total", "result", "ack"); n < 1 {
			return fmt.Errorf("acks %v", n)
		}
		return nil
	})
	n, err := testutil.GatherAndCount(cp.reg, "rolter_controlplane_push_latency_seconds", "rolter_controlplane_node_config_revision", "rolter_controlplane_config_revision")
	if err != nil || n != 3 {
		t.Errorf("metrics: %d series, %v", n, err)
	}
	if problems, err := testutil.GatherAndLint(cp.reg); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %v", problems, err)
	}
}

// metricValue returns the value of the series of name with label = value.
func metricValue(t *testing.T, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}
