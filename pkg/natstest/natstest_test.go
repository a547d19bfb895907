package natstest_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"rolter.dev/pkg/natstest"
)

func TestStartConnect(t *testing.T) {
	s := natstest.Start(t, func(o *server.Options) { o.MaxPayload = 1 << 10 })
	nc := natstest.Connect(t, s)
	if got := nc.MaxPayload(); got != 1<<10 {
		t.Errorf("max payload %d, want the option's 1024", got)
	}
	sub, err := nc.SubscribeSync("x")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("x", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil || string(m.Data) != "hello" {
		t.Fatalf("received %v, %v", m, err)
	}
}
