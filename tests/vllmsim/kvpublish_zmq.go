package vllmsim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"rolter.dev/pkg/kvevents"
)

const (
	// zmtpHandshakeTimeout bounds a peer's ZMTP greeting and handshake.
	zmtpHandshakeTimeout = 10 * time.Second
	// zmtpLinger bounds the flush of queued messages on close.
	zmtpLinger = time.Second
	// zmtpReconnectMin and zmtpReconnectMax bound the reconnect delay in
	// connect mode (ZMQ's reconnect_ivl is 100 ms).
	zmtpReconnectMin = 100 * time.Millisecond
	zmtpReconnectMax = 2 * time.Second
)

// splitEndpoint turns a ZMQ endpoint into a Go network and address: tcp
// (host "*" is 0.0.0.0, as zmq4 maps it) or ipc (a unix socket).
func splitEndpoint(ep string) (network, addr string, err error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return "", "", fmt.Errorf("endpoint %q: want tcp://HOST:PORT or ipc://PATH", ep)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", "", fmt.Errorf("endpoint %q: %w", ep, err)
		}
		if host == "*" {
			host = "0.0.0.0"
		}
		if port == "*" {
			port = "0"
		}
		return "tcp", net.JoinHostPort(host, port), nil
	case "ipc":
		if rest == "" {
			return "", "", fmt.Errorf("endpoint %q: empty path", ep)
		}
		return "unix", rest, nil
	}
	return "", "", fmt.Errorf("endpoint %q: unsupported transport %q (want tcp or ipc)", ep, scheme)
}

// zmtpPub is a ZMQ PUB socket built on zmq4's ZMTP connections
// (zmq4.Open): it speaks ZMTP 3.0 with the NULL mechanism to any SUB or XSUB
// (libzmq, pyzmq, zmq4), binds or connects, filters by the subscribers'
// topic prefixes, and gives each subscriber its own bounded queue, dropping
// messages for a subscriber that falls HWM behind, as libzmq does.
//
// zmq4's own PUB socket is not used: in v0.17.0 its Close leaves the
// writer goroutine (pubMWriter.run) blocked forever, and its high-water mark
// is one queue shared by all subscribers.
type zmtpPub struct {
	logger  *slog.Logger
	id      zmq4.SocketIdentity
	hwm     int
	ep      string
	connect bool

	ctx    context.Context // cancelled by close
	cancel context.CancelFunc
	ln     net.Listener // nil in connect mode
	wg     sync.WaitGroup

	mu    sync.Mutex
	subs  map[*zmtpSub]struct{}
	raw   map[net.Conn]struct{} // every open connection, to close on close
	drops atomic.Uint64
}

// zmtpSub is one connected subscriber.
type zmtpSub struct {
	conn *zmq4.Conn
	raw  net.Conn
	q    chan [][]byte

	mu     sync.Mutex
	topics map[string]struct{}

	once sync.Once
	done chan struct{} // closed when the connection is finished
}

func newZMTPPub(endpoint string, connect bool, hwm int, logger *slog.Logger) (*zmtpPub, error) {
	network, addr, err := splitEndpoint(endpoint)
	if err != nil {
		return nil, fmt.Errorf("vllmsim: kv events: %w", err)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	ctx, cancel := context.WithCancel(context.Background())
	p := &zmtpPub{
		logger: logger, id: zmq4.SocketIdentity(hex.EncodeToString(id[:])), hwm: hwm, ep: endpoint, connect: connect,
		ctx: ctx, cancel: cancel,
		subs: map[*zmtpSub]struct{}{}, raw: map[net.Conn]struct{}{},
	}
	if connect {
		p.wg.Add(1)
		go p.dialLoop(network, addr)
		return p, nil
	}
	p.ln, err = net.Listen(network, addr)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("vllmsim: kv events: bind %s: %w", endpoint, err)
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

func (p *zmtpPub) endpoint() string {
	if p.ln == nil {
		return p.ep
	}
	a := p.ln.Addr()
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

func (p *zmtpPub) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			p.logger.Warn("kv events: accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if s := p.open(c, true); s != nil {
				<-s.done
			}
		}()
	}
}

// dialLoop keeps one connection to the endpoint, reconnecting with backoff.
func (p *zmtpPub) dialLoop(network, addr string) {
	defer p.wg.Done()
	delay := zmtpReconnectMin
	var d net.Dialer
	for p.ctx.Err() == nil {
		c, err := d.DialContext(p.ctx, network, addr)
		if err == nil {
			if s := p.open(c, false); s != nil {
				delay = zmtpReconnectMin
				<-s.done
			}
		}
		select {
		case <-p.ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, zmtpReconnectMax)
	}
}

// open performs the ZMTP handshake on c and serves the subscriber; it
// returns nil (and closes c) when the handshake fails.
func (p *zmtpPub) open(c net.Conn, server bool) *zmtpSub {
	if !p.track(c) {
		return nil
	}
	_ = c.SetDeadline(time.Now().Add(zmtpHandshakeTimeout))
	zc, err := zmq4.Open(c, null.Security(), zmq4.Pub, p.id, server, nil)
	if err != nil {
		p.logger.Debug("kv events: handshake", "peer", c.RemoteAddr(), "err", err)
		p.untrack(c)
		return nil
	}
	_ = c.SetDeadline(time.Time{})
	p.logger.Debug("kv events: subscriber connected", "peer", c.RemoteAddr(), "type", zc.Peer.Meta["Socket-Type"])
	s := &zmtpSub{conn: zc, raw: c, q: make(chan [][]byte, p.hwm), topics: map[string]struct{}{}, done: make(chan struct{})}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	p.wg.Add(2)
	go p.readLoop(s)
	go p.writeLoop(s)
	return s
}

// track registers a connection to close on close; false if closing.
func (p *zmtpPub) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		_ = c.Close()
		return false
	}
	p.raw[c] = struct{}{}
	return true
}

func (p *zmtpPub) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.raw, c)
	p.mu.Unlock()
	_ = c.Close()
}

// finish ends a subscriber's connection.
func (p *zmtpPub) finish(s *zmtpSub) {
	s.once.Do(func() {
		p.mu.Lock()
		delete(p.subs, s)
		p.mu.Unlock()
		p.untrack(s.raw)
		close(s.done)
	})
}

// readLoop applies the subscriber's (un)subscriptions: ZMTP 3.0 messages
// whose first byte is 1 (subscribe) or 0 (unsubscribe), then the topic.
func (p *zmtpPub) readLoop(s *zmtpSub) {
	defer p.wg.Done()
	defer p.finish(s)
	for {
		msg, err := s.conn.RecvMsg()
		if err != nil {
			p.logger.Debug("kv events: subscriber gone", "peer", s.raw.RemoteAddr(), "err", err)
			return
		}
		if msg.Type == zmq4.CmdMsg || len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 {
			continue
		}
		f := msg.Frames[0]
		p.logger.Debug("kv events: subscription", "peer", s.raw.RemoteAddr(), "subscribe", f[0] == 1, "topic", string(f[1:]))
		s.mu.Lock()
		switch f[0] {
		case 1:
			s.topics[string(f[1:])] = struct{}{}
		case 0:
			delete(s.topics, string(f[1:]))
		}
		s.mu.Unlock()
	}
}

// writeLoop sends the subscriber's queued messages; on close it flushes
// what is queued, for at most zmtpLinger.
func (p *zmtpPub) writeLoop(s *zmtpSub) {
	defer p.wg.Done()
	defer p.finish(s)
	for {
		select {
		case frames := <-s.q:
			if err := s.conn.SendMsg(zmq4.NewMsgFrom(frames...)); err != nil {
				return
			}
		case <-s.done:
			return
		case <-p.ctx.Done():
			_ = s.raw.SetWriteDeadline(time.Now().Add(zmtpLinger))
			for {
				select {
				case frames := <-s.q:
					if err := s.conn.SendMsg(zmq4.NewMsgFrom(frames...)); err != nil {
						return
					}
				default:
					return
				}
			}
		}
	}
}

func (s *zmtpSub) subscribed(topic []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t := range s.topics {
		if strings.HasPrefix(string(topic), t) {
			return true
		}
	}
	return false
}

// send queues a message for every subscriber whose subscriptions match its
// topic (frame 0), dropping it for subscribers whose queue is full.
func (p *zmtpPub) send(frames [][]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.subs {
		if !s.subscribed(frames[0]) {
			continue
		}
		select {
		case s.q <- frames:
		default:
			p.drops.Add(1)
		}
	}
}

// subscribers counts the connected subscribers that subscribed to at least
// one topic prefix (the ones that receive something).
func (p *zmtpPub) subscribers() int {
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

// close flushes the subscribers' queues (for at most zmtpLinger), closes
// every connection and waits for the goroutines.
func (p *zmtpPub) close() {
	p.mu.Lock()
	p.cancel()
	// Connections still in their handshake will not become subscribers.
	subConns := map[net.Conn]bool{}
	for s := range p.subs {
		subConns[s.raw] = true
	}
	for c := range p.raw {
		if !subConns[c] {
			_ = c.Close()
		}
	}
	p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
	}
	// The writers flush their queues and finish their subscribers.
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	timer := time.NewTimer(zmtpLinger + 500*time.Millisecond)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		p.mu.Lock()
		for c := range p.raw {
			_ = c.Close()
		}
		p.mu.Unlock()
		<-done
	}
}

// replayServer is the ROUTER socket answering replay requests.
type replayServer struct {
	sock     zmq4.Socket
	pub      *KVPublisher
	logger   *slog.Logger
	format   kvevents.ReplayFormat
	topic    []byte
	requests atomic.Uint64
	done     chan struct{}
}

func newReplayServer(endpoint string, pub *KVPublisher, logger *slog.Logger) (*replayServer, error) {
	if _, _, err := splitEndpoint(endpoint); err != nil {
		return nil, fmt.Errorf("vllmsim: kv replay: %w", err)
	}
	r := &replayServer{
		pub: pub, logger: logger, topic: []byte(pub.opts.Topic), done: make(chan struct{}),
		sock: zmq4.NewRouter(context.Background(),
			zmq4.WithLogger(log.New(slogWriter{logger}, "", 0))),
	}
	if pub.opts.LegacyReplay {
		r.format = kvevents.ReplayLegacy
	}
	if err := r.sock.Listen(endpoint); err != nil {
		_ = r.sock.Close()
		return nil, fmt.Errorf("vllmsim: kv replay: bind %s: %w", endpoint, err)
	}
	go r.serve()
	return r, nil
}

func (r *replayServer) endpoint() string {
	a := r.sock.Addr()
	if a == nil {
		return ""
	}
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// serve answers each [identity, "", seq8] request with the buffered
// batches from seq on and the end marker; anything else is ignored, as vLLM
// does.
func (r *replayServer) serve() {
	defer close(r.done)
	for {
		msg, err := r.sock.Recv()
		if err != nil {
			return
		}
		id, start, err := kvevents.ParseReplayRequest(msg.Frames)
		if err != nil {
			r.logger.Debug("kv replay: ignoring request", "err", err)
			continue
		}
		r.requests.Add(1)
		for _, m := range r.pub.since(start) {
			m.Topic = r.topic
			if err := r.sock.Send(zmq4.NewMsgFrom(append([][]byte{id}, kvevents.ReplayReply(m, r.format)...)...)); err != nil {
				break
			}
		}
		_ = r.sock.Send(zmq4.NewMsgFrom(append([][]byte{id}, kvevents.ReplayEnd(r.format)...)...))
	}
}

func (r *replayServer) close() {
	_ = r.sock.Close()
	<-r.done
}

// slogWriter sends zmq4's log lines to a slog logger at debug level.
type slogWriter struct{ logger *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.logger.Debug("zmq4: " + strings.TrimSpace(string(p)))
	return len(p), nil
}
