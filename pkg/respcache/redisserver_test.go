package respcache_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// redisServer is a real redis-server process on loopback, for tests. It
// fails the test, never skips, when redis-server is not installed.
type redisServer struct {
	t    *testing.T
	bin  string
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // receives the process's exit once
}

// startRedis starts redis-server on a free loopback port (and a unix socket
// in its temporary directory) and stops it when the test ends.
func startRedis(t *testing.T) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is required (apt-get install -y redis-server): %v", err)
	}
	s := &redisServer{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(s.Kill)
	// Reserve a port by listening on :0 and closing; another process can
	// take it before redis binds, so retry on "Address already in use".
	for attempt := 0; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.port = l.Addr().(*net.TCPAddr).Port
		l.Close()
		err = s.start()
		if err == nil {
			return s
		}
		if !errors.Is(err, errAddrInUse) || attempt == 10 {
			t.Fatalf("start redis-server: %v", err)
		}
	}
}

var errAddrInUse = errors.New("address already in use")

// start runs redis-server on s.port and waits until it answers PING.
func (s *redisServer) start() error {
	out := &bytes.Buffer{}
	cmd := exec.Command(s.bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(s.port),
		"--unixsocket", s.Socket(), "--unixsocketperm", "700",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // ends with the process; Kill waits for it
	deadline := time.After(10 * time.Second)
	for {
		if ping(s.Addr()) == nil {
			s.mu.Lock()
			s.cmd, s.exited = cmd, exited
			s.mu.Unlock()
			return nil
		}
		select {
		case err := <-exited:
			if strings.Contains(out.String(), "Address already in use") {
				return errAddrInUse
			}
			return fmt.Errorf("redis-server exited (%v): %s", err, out.String())
		case <-deadline:
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server not ready after 10s: %s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Restart starts redis-server again on the same port, after [Kill].
func (s *redisServer) Restart() {
	s.t.Helper()
	var err error
	for range 50 { // the port may linger briefly after the kill
		if err = s.start(); !errors.Is(err, errAddrInUse) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("restart redis-server: %v", err)
	}
}

// Kill stops the server at once (SIGKILL) and waits until it is gone.
func (s *redisServer) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Addr is the server's host:port.
func (s *redisServer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is the server's redis:// URL.
func (s *redisServer) URL() string { return "redis://" + s.Addr() + "/0" }

// Socket is the server's unix socket path.
func (s *redisServer) Socket() string { return filepath.Join(s.dir, "redis.sock") }

// Do sends one command over a fresh connection and returns the first reply
// line, for test setup (CLIENT PAUSE, writing junk).
func (s *redisServer) Do(args ...string) string {
	s.t.Helper()
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		s.t.Fatal(err)
	}
	defer c.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(b.String())); err != nil {
		s.t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		s.t.Fatal(err)
	}
	return strings.TrimSpace(line)
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}
