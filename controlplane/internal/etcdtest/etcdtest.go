// Package etcdtest runs a real etcd member in process for the control
// plane's tests (go.etcd.io/etcd/server/v3/embed), on random loopback ports
// with its data in the test's temporary directory, stopped when the test
// ends.
package etcdtest

import (
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// TB is the part of testing.TB the helper uses (so that this package, not
// being a test, does not import testing).
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Start starts a single-member etcd and returns a client of it, both closed
// at the end of the test.
func Start(t TB) *clientv3.Client {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.LogLevel, cfg.LogOutputs = "error", []string{"/dev/null"}
	u, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.ListenPeerUrls = []url.URL{*u}, []url.URL{*u}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("etcdtest: start etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(10 * time.Second):
		t.Fatal("etcdtest: etcd not ready after 10s")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Clients[0].Addr().String()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
