package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// redisServer is a real redis-server process on a loopback port, which a
// test can stop and start again on the same port.
type redisServer struct {
	t    *testing.T
	port int
	dir  string
	cmd  *exec.Cmd
	// waitDone receives the process's exit once it has been reaped.
	waitDone chan error
}

func startRedis(t *testing.T) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed: run `make deps` (make test does)")
	}
	r := &redisServer{t: t, dir: t.TempDir()}
	for attempt := 0; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r.port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if err := r.start(); err == nil {
			break
		} else if attempt == 5 {
			t.Fatalf("start redis: %v", err)
		}
	}
	t.Cleanup(r.stop)
	return r
}

func (r *redisServer) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

func (r *redisServer) start() error {
	r.cmd = exec.Command("redis-server", "--bind", "127.0.0.1", "--port", fmt.Sprint(r.port),
		"--save", "", "--appendonly", "no", "--dir", r.dir)
	if err := r.cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }() // reaped here; stop waits on it via done
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return fmt.Errorf("redis-server exited: %v", err)
		default:
		}
		if ping(r.port) == nil {
			r.waitDone = done
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = r.cmd.Process.Kill()
	<-done
	return errors.New("redis-server did not answer PING")
}

func (r *redisServer) stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.waitDone
	r.cmd = nil
}

func (r *redisServer) restart() {
	r.t.Helper()
	r.stop()
	var err error
	for range 50 {
		if err = r.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("restart redis: %v", err)
}

func ping(port int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(string(buf[:n]), "+PONG") {
		return fmt.Errorf("unexpected reply %q", buf[:n])
	}
	return nil
}
