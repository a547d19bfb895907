package zmtp_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rolter.dev/kvwatcher/internal/zmtp"
	"rolter.dev/kvwatcher/zmtptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSplit(t *testing.T) {
	tests := []struct {
		endpoint, network, addr string
		wantErr                 bool
	}{
		{"tcp://127.0.0.1:5557", "tcp", "127.0.0.1:5557", false},
		{"tcp://*:5557", "tcp", ":5557", false},
		{"tcp://[::1]:5557", "tcp", "[::1]:5557", false},
		{"ipc:///tmp/kv.sock", "unix", "/tmp/kv.sock", false},
		{"error: no scheme", "", "", true},
		{"udp://1.2.3.4:5", "", "", true},
		{"tcp://noport", "", "", true},
		{"ipc://", "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.endpoint, func(t *testing.T) {
			network, addr, err := zmtp.Split(tc.endpoint)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if network != tc.network || addr != tc.addr {
				t.Errorf("Split = %q, %q, want %q, %q", network, addr, tc.network, tc.addr)
			}
		})
	}
}

func TestSubReceivesFrames(t *testing.T) {
	pub, err := zmtptest.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := zmtp.DialSub(ctx, pub.Endpoint(), "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	nine := make([][]byte, 9)
	for i := range nine {
		nine[i] = []byte{byte(i)}
	}
	nine[0] = []byte("kv@x")
	for _, msg := range [][][]byte{
		{[]byte("other"), []byte("filtered out by the subscription")},
		{[]byte("kv@a"), make([]byte, 8), make([]byte, 300)}, // a long frame
		nine,
	} {
		if err := pub.Send(msg...); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || string(got[0]) != "kv@a" || len(got[1]) != 8 || len(got[2]) != 300 {
		t.Fatalf("first message: %d frames", len(got))
	}
	got, err = c.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 9 || got[8] != nil {
		t.Errorf("a 9-frame message: got %d frames (want 8 kept and a nil marker)", len(got))
	}
	_ = c.Close()
	if _, err := c.Recv(); err == nil {
		t.Error("Recv after Close succeeded")
	}
}

func TestReplayUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	ln, err := zmtp.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := ln.Endpoint()
	_ = ln.Close()
	if err := zmtp.Replay(ctx, ep, 0, time.Second, nil); err == nil {
		t.Error("replay from a closed port succeeded")
	}
}
