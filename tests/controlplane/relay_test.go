package controlplane_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// relay forwards loopback TCP connections to a target that can be cut
// (every connection closed, new ones refused) and reopened elsewhere.
type relay struct {
	ln     net.Listener
	mu     sync.Mutex
	target string // "" while cut
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func startRelay(t *testing.T) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, conns: map[net.Conn]bool{}}
	r.wg.Go(r.accept)
	t.Cleanup(func() {
		ln.Close()
		r.cut()
		r.wg.Wait()
	})
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) open(target string) {
	r.mu.Lock()
	r.target = target
	r.mu.Unlock()
}

func (r *relay) cut() {
	r.mu.Lock()
	r.target = ""
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
}

func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.target == "" {
		c.Close()
		return false
	}
	r.conns[c] = true
	return true
}

func (r *relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		target := r.target
		r.mu.Unlock()
		if target == "" {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		if !r.track(c) || !r.track(up) {
			c.Close()
			up.Close()
			continue
		}
		for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
			r.wg.Go(func() {
				_, _ = io.Copy(pair[0], pair[1])
				pair[0].Close()
				pair[1].Close()
				r.mu.Lock()
				delete(r.conns, pair[0])
				delete(r.conns, pair[1])
				r.mu.Unlock()
			})
		}
	}
}
