// Package zmtp is the watcher's side of vLLM's ZMQ sockets, built on
// zmq4's ZMTP handshake (zmq4.Open) over connections it owns: a SUB that
// dials a publisher or accepts publishers on a bound endpoint, and a DEALER
// that asks a replay ROUTER for buffered batches.
//
// # Overview
//
// zmq4's own sockets hide connections: a SUB whose publisher went away just
// stops receiving, and a listening SUB merges every publisher into one
// stream. The watcher needs to see a reconnect (its sequence baseline
// starts over) and which connection a message came from, so it dials and
// accepts itself, lets zmq4 do the ZMTP 3 greeting and NULL handshake, and
// reads frames itself, with a size limit per frame.
//
// # Concurrency
//
// A [Conn] is read by one goroutine; Close may be called from any.
// A [Listener]'s Accept may be called from one goroutine while Close is
// called from another.
package zmtp

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"rolter.dev/pkg/kvevents"
)

const (
	// HandshakeTimeout bounds the ZMTP greeting and handshake.
	HandshakeTimeout = 5 * time.Second
	// MaxFrame is the largest frame accepted; a larger one ends the
	// connection.
	MaxFrame = kvevents.DefaultMaxPayload
	// maxFrames is the most frames of one message kept; the rest are read
	// and dropped (the message is malformed anyway).
	maxFrames = 8
)

// ErrFrameTooLarge ends a connection whose peer sent a frame over MaxFrame.
var ErrFrameTooLarge = errors.New("zmtp: frame too large")

// Split turns a ZMQ endpoint into a Go network and address: tcp://HOST:PORT
// (HOST "*" is every interface when listening) or ipc://PATH.
func Split(endpoint string) (network, addr string, err error) {
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok {
		return "", "", fmt.Errorf("zmtp: endpoint %q: want tcp://HOST:PORT or ipc://PATH", endpoint)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", "", fmt.Errorf("zmtp: endpoint %q: %w", endpoint, err)
		}
		if host == "*" {
			host = ""
		}
		return "tcp", net.JoinHostPort(host, port), nil
	case "ipc":
		if rest == "" {
			return "", "", fmt.Errorf("zmtp: endpoint %q: empty path", endpoint)
		}
		return "unix", rest, nil
	}
	return "", "", fmt.Errorf("zmtp: endpoint %q: unsupported transport %q (want tcp or ipc)", endpoint, scheme)
}

func identity() zmq4.SocketIdentity {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return zmq4.SocketIdentity("rolter-" + hex.EncodeToString(b[:]))
}

// Conn is one ZMTP connection after its handshake.
type Conn struct {
	raw  net.Conn
	zc   *zmq4.Conn
	br   *bufio.Reader
	once sync.Once
	// Remote is the peer's address, for logs.
	Remote string
}

// open performs the handshake on raw as sockType and returns the Conn, or
// closes raw.
func open(ctx context.Context, raw net.Conn, sockType zmq4.SocketType, server bool) (*Conn, error) {
	deadline := time.Now().Add(HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = raw.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	zc, err := zmq4.Open(raw, null.Security(), sockType, identity(), server, nil)
	if !stop() || err != nil {
		_ = raw.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("zmtp: handshake with %s: %w", raw.RemoteAddr(), err)
	}
	_ = raw.SetDeadline(time.Time{})
	return &Conn{raw: raw, zc: zc, br: bufio.NewReaderSize(raw, 64<<10), Remote: raw.RemoteAddr().String()}, nil
}

// Close closes the connection; a blocked Recv returns an error.
func (c *Conn) Close() error {
	var err error
	c.once.Do(func() { err = c.raw.Close() })
	return err
}

// Send sends a message of frames.
func (c *Conn) Send(frames ...[]byte) error {
	if err := c.zc.SendMsg(zmq4.NewMsgFrom(frames...)); err != nil {
		return fmt.Errorf("zmtp: send to %s: %w", c.Remote, err)
	}
	return nil
}

// Recv reads the next message and returns its frames (at most maxFrames
// kept, plus a nil frame when more were dropped, so that the count says the
// message was malformed). Commands are handled (PING gets a PONG) and
// skipped. The frames are freshly allocated.
func (c *Conn) Recv() ([][]byte, error) {
	for {
		frames, cmd, err := c.read()
		if err != nil {
			return nil, err
		}
		if !cmd {
			return frames, nil
		}
		if len(frames) == 1 {
			c.command(frames[0])
		}
	}
}

// SetReadDeadline bounds the next reads.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.raw.SetReadDeadline(t) }

// command answers a PING (name, then TTL and context) with a PONG carrying
// the context, as ZMTP 3.1 asks.
func (c *Conn) command(body []byte) {
	if len(body) < 1 || int(body[0]) > len(body)-1 {
		return
	}
	name, data := string(body[1:1+body[0]]), body[1+body[0]:]
	if name == zmq4.CmdPing && len(data) >= 2 {
		_ = c.zc.SendCmd(zmq4.CmdPong, data[2:])
	}
}

const (
	flagMore    = 1
	flagLong    = 2
	flagCommand = 4
)

func (c *Conn) read() (frames [][]byte, cmd bool, err error) {
	extra := false
	for {
		flags, err := c.br.ReadByte()
		if err != nil {
			return nil, false, c.wrap(err)
		}
		var size uint64
		if flags&flagLong != 0 {
			var b [8]byte
			if _, err := io.ReadFull(c.br, b[:]); err != nil {
				return nil, false, c.wrap(err)
			}
			size = binary.BigEndian.Uint64(b[:])
		} else {
			b, err := c.br.ReadByte()
			if err != nil {
				return nil, false, c.wrap(err)
			}
			size = uint64(b)
		}
		if size > MaxFrame {
			return nil, false, fmt.Errorf("%w: %d bytes from %s", ErrFrameTooLarge, size, c.Remote)
		}
		cmd = cmd || flags&flagCommand != 0
		if len(frames) < maxFrames {
			f := make([]byte, size)
			if _, err := io.ReadFull(c.br, f); err != nil {
				return nil, false, c.wrap(err)
			}
			frames = append(frames, f)
		} else {
			if _, err := c.br.Discard(int(size)); err != nil {
				return nil, false, c.wrap(err)
			}
			extra = true
		}
		if flags&flagMore == 0 || cmd {
			break
		}
	}
	if extra {
		frames = append(frames, nil)
	}
	return frames, cmd, nil
}

func (c *Conn) wrap(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("zmtp: %s closed the connection: %w", c.Remote, err)
	}
	return fmt.Errorf("zmtp: read from %s: %w", c.Remote, err)
}

// DialSub connects to the publisher at endpoint (which binds it) and
// subscribes to the topic prefix.
func DialSub(ctx context.Context, endpoint, topic string) (*Conn, error) {
	network, addr, err := Split(endpoint)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: HandshakeTimeout, KeepAlive: 15 * time.Second}
	raw, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: dial %s: %w", endpoint, err)
	}
	c, err := open(ctx, raw, zmq4.Sub, false)
	if err != nil {
		return nil, err
	}
	if err := c.Send(append([]byte{1}, topic...)); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// Listener accepts publishers that connect to a bound endpoint (vLLM's
// connect mode: the replica's endpoint names the watcher).
type Listener struct {
	ln net.Listener
}

// Listen binds endpoint.
func Listen(endpoint string) (*Listener, error) {
	network, addr, err := Split(endpoint)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: bind %s: %w", endpoint, err)
	}
	return &Listener{ln: ln}, nil
}

// Endpoint returns the bound endpoint (with the actual port).
func (l *Listener) Endpoint() string {
	a := l.ln.Addr()
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// Accept waits for the next connection; pass it to [OpenSub] (in its own
// goroutine, so that a slow handshake does not hold up the next accept).
// It returns an error once the listener is closed.
func (l *Listener) Accept() (net.Conn, error) {
	raw, err := l.ln.Accept()
	if err != nil {
		return nil, fmt.Errorf("zmtp: accept: %w", err)
	}
	return raw, nil
}

// OpenSub performs the handshake on an accepted publisher's connection and
// subscribes to every topic (the caller tells publishers apart by topic).
// On error raw is closed.
func OpenSub(ctx context.Context, raw net.Conn) (*Conn, error) {
	c, err := open(ctx, raw, zmq4.Sub, true)
	if err != nil {
		return nil, err
	}
	if err := c.Send([]byte{1}); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// Close stops accepting; connections already accepted stay open.
func (l *Listener) Close() error { return l.ln.Close() }

// Replay asks the replay ROUTER at endpoint for the batches from sequence
// start on and calls fn with each, in the order received, until the end
// marker. Each read waits at most idle; ctx bounds the whole exchange. fn's
// Message aliases frames that are not reused. It returns the first error
// from the exchange or from fn.
func Replay(ctx context.Context, endpoint string, start uint64, idle time.Duration, fn func(kvevents.Message) error) error {
	network, addr, err := Split(endpoint)
	if err != nil {
		return err
	}
	d := net.Dialer{Timeout: HandshakeTimeout}
	raw, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return fmt.Errorf("zmtp: dial replay %s: %w", endpoint, err)
	}
	c, err := open(ctx, raw, zmq4.Dealer, false)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	if err := c.Send(kvevents.ReplayRequest(start)...); err != nil {
		return err
	}
	for {
		_ = c.SetReadDeadline(time.Now().Add(idle))
		frames, err := c.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("zmtp: replay from %s: %w", endpoint, ctx.Err())
			}
			return fmt.Errorf("zmtp: replay from %s: %w", endpoint, err)
		}
		m, end, err := kvevents.ParseReplayReply(frames)
		if err != nil {
			return fmt.Errorf("zmtp: replay from %s: %w", endpoint, err)
		}
		if end {
			return nil
		}
		if err := fn(m); err != nil {
			return err
		}
	}
}
