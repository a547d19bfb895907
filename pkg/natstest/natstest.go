// Package natstest runs the real NATS server (nats-server/v2) in process for
// tests: on a random loopback port, logging nothing, shut down when the test
// ends.
package natstest

import (
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// TB is the part of testing.TB the helpers use (so that this package, not
// being a test, does not import testing).
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// Start starts a server, lets each option adjust its settings first (e.g.
// MaxPayload), and stops it at the end of the test.
func Start(t TB, opts ...func(*server.Options)) *server.Server {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true}
	for _, f := range opts {
		f(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(5 * time.Second) {
		s.Shutdown()
		t.Fatal("natstest: the server is not ready after 5s")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// Connect connects a client to s, closed at the end of the test.
func Connect(t TB, s *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
