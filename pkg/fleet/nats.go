package fleet

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// warmTimeout bounds a snapshot request.
const warmTimeout = 2 * time.Second

// Run connects the node to its peers over nc until ctx ends: it subscribes
// to the group's subjects, publishes observations every flush interval,
// queued prefill every queue interval (and at once when a balancer asks:
// Urgent) and loads every load interval,
// answers snapshot requests, and asks for one whenever a route is bound for
// the first time. Publishing never blocks the
// request path; while NATS is down nats.go buffers (and then drops) what is
// published, and peers' loads expire, so the node routes on its own view.
func (n *Node) Run(ctx context.Context, nc *nats.Conn, log *slog.Logger) error {
	obsSubj, loadSubj, snapSubj := Subjects(n.opts.Group)
	var subs []*nats.Subscription
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	for subj, h := range map[string]nats.MsgHandler{
		obsSubj:  func(m *nats.Msg) { n.HandleObservations(m.Data, time.Now()) },
		loadSubj: func(m *nats.Msg) { n.HandleLoads(m.Data, time.Now()) },
		snapSubj: func(m *nats.Msg) {
			if m.Reply == "" {
				return
			}
			if b := n.SnapshotReply(m.Data, int(nc.MaxPayload())); b != nil {
				_ = m.Respond(b)
			}
		},
	} {
		s, err := nc.Subscribe(subj, h)
		if err != nil {
			return err
		}
		// Folding is cheap; a burst of peers' batches must not be dropped
		// as a slow consumer at nats.go's default 64 MiB either.
		_ = s.SetPendingLimits(-1, 256<<20)
		subs = append(subs, s)
	}
	flush := time.NewTicker(n.opts.FlushInterval)
	defer flush.Stop()
	load := time.NewTicker(n.opts.LoadInterval)
	defer load.Stop()
	// The queue interval is short (5 ms), so its ticker runs only while some
	// route's balancer shares its queue (SetQueue wakes it).
	queues := time.NewTicker(n.opts.QueueInterval)
	defer queues.Stop()
	queuing := n.sharesQueues()
	if !queuing {
		queues.Stop()
	}
	// publish sends b (nil: nothing to say), counting a refusal.
	publish := func(subj string, b []byte) {
		if b != nil && nc.Publish(subj, b) != nil {
			n.stats.publishErrors.Add(1)
		}
	}
	warmDone := make(chan struct{}, 1)
	warming, again := false, false
	for {
		select {
		case <-ctx.Done():
			// The last picks: a predicted_ttft route's ride with its
			// queue report (TakeQueues), the others' with the flush.
			for _, b := range [][]byte{n.FlushObservations(), n.FlushQueues()} {
				if b != nil {
					_ = nc.Publish(obsSubj, b)
				}
			}
			return nil
		case <-flush.C:
			publish(obsSubj, n.FlushObservations())
		case <-queues.C:
			n.stats.queueTicks.Add(1)
			b := n.FlushQueues()
			publish(obsSubj, b)
			if b == nil && !n.sharesQueues() {
				queues.Stop()
				queuing = false
			}
		case <-n.urgent:
			// A burst's pick: its queue report leaves now, not on the
			// next tick (routing.ReportTrigger).
			publish(obsSubj, n.FlushUrgent())
		case <-n.queuing:
			if !queuing {
				queues.Reset(n.opts.QueueInterval)
				queuing = true
			}
		case now := <-load.C:
			publish(loadSubj, n.LoadReport())
			n.Expire(now)
		case <-n.unwarmed:
			if warming {
				again = true // ask again once the request in flight is answered
				continue
			}
			warming = true
			req := n.SnapshotRequest()
			go func() {
				defer func() { warmDone <- struct{}{} }()
				rctx, cancel := context.WithTimeout(ctx, warmTimeout)
				defer cancel()
				msg, err := nc.RequestWithContext(rctx, snapSubj, req)
				if err != nil {
					if !errors.Is(err, nats.ErrNoResponders) && ctx.Err() == nil {
						log.Debug("fleet: no warm-up snapshot", "err", err)
					}
					return
				}
				folded, err := n.ApplySnapshot(msg.Data, time.Now())
				if err != nil {
					log.Warn("fleet: bad warm-up snapshot", "err", err)
					return
				}
				log.Info("fleet: warmed up from a peer", "hashes", folded)
			}()
		case <-warmDone:
			warming = false
			if again {
				again = false
				signal(n.unwarmed)
			}
		}
	}
}

// signal wakes Run's loop through ch (buffered, 1) without blocking: a
// signal already pending stands for this one.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
