package app

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"rolter.dev/kvwatcher/internal/zmtp"
)

// evKind says what a streamEvent reports.
type evKind uint8

const (
	evMessage      evKind = iota // a message's frames
	evConnected                  // a new connection (connect mode)
	evDisconnected               // the connection src ended
)

// streamEvent is what a provider's socket side hands its goroutine. src
// names the connection (unique within the watcher), so a message from a
// new connection starts a new sequence baseline.
type streamEvent struct {
	kind   evKind
	src    uint64
	rank   int // the data-parallel rank of the endpoint it came from
	frames [][]byte
	err    error
}

// dial keeps a SUB connection to one rank's publisher (connect mode) at
// endpoint, reconnecting with backoff, and feeds k.stream until ctx ends.
func (k *worker) dial(ctx context.Context, rank int, endpoint string) {
	kv := k.spec.KV
	delay := k.w.opts.ReconnectMin
	for ctx.Err() == nil {
		// Subscribe to every topic and filter here: a publisher whose
		// topic differs from the config's (vLLM's default topic is "")
		// would otherwise be silently filtered out by the PUB socket; this
		// way it is counted and logged. One publisher per connection, so
		// nothing else arrives.
		c, err := zmtp.DialSub(ctx, endpoint, "")
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			k.w.metrics.StreamFailures.WithLabelValues(k.name, "connect").Inc()
			k.log.Debug("kv events: connect failed", "endpoint", endpoint, "err", err)
			if !sleep(ctx, delay) {
				return
			}
			delay = min(2*delay, k.w.opts.ReconnectMax)
			continue
		}
		src := k.w.nextSrc()
		k.log.Debug("kv events: connected", "endpoint", endpoint, "rank", rank, "peer", c.Remote)
		stop := context.AfterFunc(ctx, func() { _ = c.Close() })
		start := time.Now()
		var rerr error
		if k.send(ctx, streamEvent{kind: evConnected, src: src, rank: rank}) {
			warned := false
			for {
				frames, err := c.Recv()
				if err != nil {
					rerr = err
					break
				}
				if len(frames) > 0 && !bytes.HasPrefix(frames[0], []byte(kv.Topic)) {
					k.w.metrics.Skipped.WithLabelValues(k.name, "topic").Inc()
					if !warned {
						warned = true
						k.log.Warn("kv events: the publisher's topic does not match [providers.kv_events] topic; its events are ignored",
							"endpoint", endpoint, "topic", string(frames[0]), "want", kv.Topic)
					}
					continue
				}
				if !k.send(ctx, streamEvent{kind: evMessage, src: src, rank: rank, frames: frames}) {
					break
				}
			}
		}
		stop()
		_ = c.Close()
		if ctx.Err() != nil {
			return
		}
		k.send(ctx, streamEvent{kind: evDisconnected, src: src, rank: rank, err: rerr})
		if time.Since(start) > time.Second {
			delay = k.w.opts.ReconnectMin
		}
		if !sleep(ctx, delay) {
			return
		}
		delay = min(2*delay, k.w.opts.ReconnectMax)
	}
}

// send hands ev to the provider's goroutine; false when ctx ended first.
func (k *worker) send(ctx context.Context, ev streamEvent) bool {
	select {
	case k.stream <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// route is where a bound endpoint sends one topic's messages.
type route struct {
	inbox chan<- streamEvent
	done  <-chan struct{} // the provider's context
	rank  int             // the data-parallel rank whose port this is
}

// binder is a bound endpoint (bind mode) shared by the providers that name
// it: it accepts publishers and hands each message to the provider whose
// topic equals the message's topic. It owns an accept goroutine and one per
// connection, all cancelled and waited for by close.
type binder struct {
	endpoint string
	w        *Watcher
	ln       *zmtp.Listener
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	refs     int // guarded by w.mu

	mu     sync.RWMutex
	routes map[string]*route
}

func newBinder(parent context.Context, endpoint string, w *Watcher) (*binder, error) {
	ln, err := zmtp.Listen(endpoint)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(parent)
	b := &binder{endpoint: endpoint, w: w, ln: ln, ctx: ctx, cancel: cancel, routes: map[string]*route{}}
	b.wg.Go(b.accept)
	w.log.Info("kv events: bound", "endpoint", endpoint, "bound", ln.Endpoint())
	return b, nil
}

func (b *binder) add(topic string, r *route) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, dup := b.routes[topic]; dup {
		return fmt.Errorf("topic %q already has a provider on %s", topic, b.endpoint)
	}
	b.routes[topic] = r
	return nil
}

func (b *binder) remove(topic string) {
	b.mu.Lock()
	delete(b.routes, topic)
	b.mu.Unlock()
}

func (b *binder) lookup(topic []byte) *route {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.routes[string(topic)]
}

func (b *binder) close() {
	b.cancel()
	_ = b.ln.Close()
	b.wg.Wait()
}

func (b *binder) accept() {
	for {
		raw, err := b.ln.Accept()
		if err != nil {
			if b.ctx.Err() != nil {
				return
			}
			b.w.log.Warn("kv events: accept", "endpoint", b.endpoint, "err", err)
			if !sleep(b.ctx, 50*time.Millisecond) {
				return
			}
			continue
		}
		b.wg.Go(func() { b.serve(raw) })
	}
}

// serve reads one publisher's connection.
func (b *binder) serve(raw net.Conn) {
	c, err := zmtp.OpenSub(b.ctx, raw)
	if err != nil {
		b.w.log.Debug("kv events: handshake", "endpoint", b.endpoint, "err", err)
		return
	}
	stop := context.AfterFunc(b.ctx, func() { _ = c.Close() })
	defer stop()
	defer c.Close()
	src := b.w.nextSrc()
	seen := map[*route]bool{}
	var rerr error
	for {
		frames, err := c.Recv()
		if err != nil {
			rerr = err
			break
		}
		if len(frames) == 0 {
			continue
		}
		r := b.lookup(frames[0])
		if r == nil {
			b.w.metrics.UnknownTopic.WithLabelValues(b.endpoint).Inc()
			continue
		}
		seen[r] = true
		select {
		case r.inbox <- streamEvent{kind: evMessage, src: src, rank: r.rank, frames: frames}:
		case <-r.done:
		case <-b.ctx.Done():
			return
		}
	}
	for r := range seen {
		select {
		case r.inbox <- streamEvent{kind: evDisconnected, src: src, rank: r.rank, err: rerr}:
		case <-r.done:
		case <-b.ctx.Done():
			return
		}
	}
}
