// Package zmtptest is a minimal ZMQ PUB socket for tests of KV-event
// consumers: it sends exactly the frames it is given (so a test can send
// malformed messages, sequence gaps and restarts), to the connected
// subscribers whose subscriptions match the first frame, synchronously.
//
// # Concurrency
//
// All methods of a [Pub] are safe for concurrent use; Close cancels and
// waits for its goroutines.
package zmtptest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// Pub is a PUB socket that binds (see [Listen]) or connects ([Dial]).
type Pub struct {
	ln     net.Listener // nil when dialling
	ep     string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	subs map[*sub]struct{}
}

type sub struct {
	conn   *zmq4.Conn
	raw    net.Conn
	mu     sync.Mutex // guards topics and writes
	topics map[string]bool
}

func split(endpoint string) (string, error) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("zmtptest: endpoint %q: want tcp://HOST:PORT", endpoint)
	}
	return rest, nil
}

// Listen binds endpoint (tcp://HOST:PORT; port 0 picks one, see
// [Pub.Endpoint]) and accepts subscribers.
func Listen(endpoint string) (*Pub, error) {
	addr, err := split(endpoint)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := newPub()
	p.ln = ln
	p.ep = "tcp://" + ln.Addr().String()
	p.wg.Go(p.accept)
	return p, nil
}

// Dial connects to a SUB bound at endpoint (one connection, no
// reconnect).
func Dial(endpoint string) (*Pub, error) {
	addr, err := split(endpoint)
	if err != nil {
		return nil, err
	}
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	p := newPub()
	p.ep = endpoint
	if err := p.open(raw, false); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func newPub() *Pub {
	ctx, cancel := context.WithCancel(context.Background())
	return &Pub{ctx: ctx, cancel: cancel, subs: map[*sub]struct{}{}}
}

// Endpoint returns the bound endpoint, or the dialled one.
func (p *Pub) Endpoint() string { return p.ep }

func (p *Pub) accept() {
	for {
		raw, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { _ = p.open(raw, true) })
	}
}

// open handshakes and starts reading the subscriber's subscriptions.
func (p *Pub) open(raw net.Conn, server bool) error {
	_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
	c, err := zmq4.Open(raw, null.Security(), zmq4.Pub, zmq4.SocketIdentity("zmtptest"), server, nil)
	if err != nil {
		_ = raw.Close()
		return err
	}
	_ = raw.SetDeadline(time.Time{})
	s := &sub{conn: c, raw: raw, topics: map[string]bool{}}
	p.mu.Lock()
	if p.ctx.Err() != nil {
		p.mu.Unlock()
		_ = raw.Close()
		return errors.New("zmtptest: closed")
	}
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	p.wg.Go(func() {
		defer func() {
			p.mu.Lock()
			delete(p.subs, s)
			p.mu.Unlock()
			_ = raw.Close()
		}()
		for {
			msg, err := c.RecvMsg()
			if err != nil {
				return
			}
			if msg.Type == zmq4.CmdMsg || len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 {
				continue
			}
			f := msg.Frames[0]
			s.mu.Lock()
			if f[0] == 1 {
				s.topics[string(f[1:])] = true
			} else {
				delete(s.topics, string(f[1:]))
			}
			s.mu.Unlock()
		}
	})
	return nil
}

// Subscribers returns how many connected subscribers subscribed to a
// topic prefix.
func (p *Pub) Subscribers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for s := range p.subs {
		s.mu.Lock()
		if len(s.topics) > 0 {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// WaitSubscribers waits until at least n subscribers subscribed.
func (p *Pub) WaitSubscribers(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for p.Subscribers() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("zmtptest: %d subscribers after %v, want %d", p.Subscribers(), timeout, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// Send writes a message of frames to every subscriber whose subscription
// is a prefix of frames[0] (every subscriber when frames is empty).
func (p *Pub) Send(frames ...[]byte) error {
	p.mu.Lock()
	subs := make([]*sub, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	var errs []error
	for _, s := range subs {
		s.mu.Lock()
		match := len(frames) == 0
		for t := range s.topics {
			if len(frames) > 0 && strings.HasPrefix(string(frames[0]), t) {
				match = true
			}
		}
		if match {
			if err := s.conn.SendMsg(zmq4.NewMsgFrom(frames...)); err != nil {
				errs = append(errs, err)
			}
		}
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Close disconnects every subscriber and waits for the goroutines.
func (p *Pub) Close() {
	p.mu.Lock()
	p.cancel()
	for s := range p.subs {
		_ = s.raw.Close()
	}
	p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
	}
	p.wg.Wait()
}
