package fleet_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"rolter.dev/pkg/fleet"
	"rolter.dev/pkg/natstest"
	"rolter.dev/pkg/routing"
	fleetv1 "rolter.dev/proto/rolter/fleet/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runMember connects m to NATS until the test ends.
func runMember(t *testing.T, s *server.Server, m *member) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := m.node.Run(ctx, nc, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait(); nc.Close() })
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestOverNATS(t *testing.T) {
	s := natstest.Start(t)
	a, b := newMember(t, "a", 3), newMember(t, "b", 3)
	runMember(t, s, a)
	runMember(t, s, b)

	// Loads: a's in-flight counts reach b (the counts are read under the
	// node's lock, so the test sets them before a report is due).
	eventually(t, "b hears a", func() bool { return b.node.Stats(time.Now()).Peers == 1 })
	// Each measures its trip to the other from the other's echoes: more
	// than nothing, less than a load interval on one machine.
	eventually(t, "a and b measure their trip", func() bool {
		ta, tb := a.node.Stats(time.Now()).Trip, b.node.Stats(time.Now()).Trip
		return ta > 0 && tb > 0
	})
	if ta := a.node.Stats(time.Now()).Trip; ta >= a.node.Options().LoadInterval {
		t.Fatalf("a's trip to b through a local NATS: %v", ta)
	}
	// One machine, one clock: the offset measured is the trips' asymmetry,
	// well under a load interval.
	eventually(t, "a measures b's clock", func() bool { return a.node.Stats(time.Now()).ClockOffset > 0 })
	if off := a.node.Stats(time.Now()).ClockOffset; off >= a.node.Options().LoadInterval {
		t.Fatalf("a's clock offset to b on one machine: %v", off)
	}
	placed := a.send(conversation(1))
	eventually(t, "a's observation reaches b", func() bool { return b.node.Stats(time.Now()).ChunksFolded > 0 })
	if got := b.send(conversation(1) + " again"); got != placed {
		t.Fatalf("b picked %d, a placed the conversation on %d", got, placed)
	}

	// A late node warms up from a snapshot.
	late := newMember(t, "late", 3)
	runMember(t, s, late)
	eventually(t, "late warms up", func() bool { return late.node.Stats(time.Now()).SnapshotsApplied == 1 })
	if got := late.send(conversation(1) + " once more"); got != placed {
		t.Fatalf("the warmed node picked %d, want %d", got, placed)
	}
}

func TestNATSDownFallsBackToOwnView(t *testing.T) {
	s := natstest.Start(t)
	a, b := newMember(t, "a", 3), newMember(t, "b", 3)
	a.own[1] = 7
	runMember(t, s, a)
	runMember(t, s, b)
	eventually(t, "b sees a's load", func() bool { return b.route.PeerLoad(1) == 7 })
	s.Shutdown()
	eventually(t, "a's load expires at b", func() bool { return b.route.PeerLoad(1) == 0 })
	// b keeps routing on its own view.
	if got := b.send("anything"); got < 0 || got >= targets {
		t.Fatalf("pick %d with NATS down", got)
	}
}

// The queue ticker runs only while a route shares its queue: a node whose
// routes share none never looks (over several load intervals), and one
// connected later starts publishing its queue.
func TestQueueTickerOnlyWithQueues(t *testing.T) {
	s := natstest.Start(t)
	now := time.Second
	a, b := newMember(t, "a", 9), newTTFTMember(t, "b", &now)
	runMember(t, s, a)
	runMember(t, s, b.member)
	eventually(t, "b hears a three times", func() bool { return b.node.Stats(time.Now()).LoadReports >= 3 })
	if got := a.node.Stats(time.Now()).QueueTicks; got != 0 {
		t.Fatalf("%d queue ticks on a node sharing no queue", got)
	}
	q, err := routing.New(routing.Spec{Strategy: routing.PredictedTTFT, Weights: []int{1, 1, 1, 1},
		Now: func() time.Duration { return now }})
	if err != nil {
		t.Fatal(err)
	}
	q.Observe(2, &routing.Context{Prompt: strings.Repeat("a long unrelated prompt. ", 400)})
	a.route.SetQueue(q.(routing.SharedQueue))
	eventually(t, "a's queue reaches b", func() bool { return b.node.Stats(time.Now()).QueueReports > 0 })
	if a.node.Stats(time.Now()).QueueTicks == 0 {
		t.Fatal("a published its queue without a queue tick")
	}
}

// A predicted_ttft route's queued prefill crosses NATS on the queue
// interval: b routes around the long prefill a has queued at target 2.
func TestQueuesOverNATS(t *testing.T) {
	s := natstest.Start(t)
	now := time.Second // never advanced: the balancers' clock is read by the NATS goroutines
	a, b := newTTFTMember(t, "a", &now), newTTFTMember(t, "b", &now)
	a.b.Observe(2, &routing.Context{Prompt: strings.Repeat("a long unrelated prompt. ", 400)})
	runMember(t, s, a.member)
	runMember(t, s, b.member)
	eventually(t, "a's queue reaches b", func() bool { return b.node.Stats(time.Now()).QueueReports > 0 })
	b.avoids(t, 2)
	// Their load reports give each its place: b, second of two, breaks its
	// ties on its home targets 1 and 3.
	eventually(t, "b keeps its ties to targets 1 and 3", func() bool {
		for i := range 40 {
			if got := b.b.Pick(&routing.Context{Prompt: conversation(400 + i)}, nil, routing.Set{}); got != 1 && got != 3 {
				return false
			}
		}
		return true
	})
}

// At shutdown a node publishes its last picks: a predicted_ttft route's,
// which ride with its queue reports, as well as the flush's. The queue
// interval here is an hour, so only the shutdown can send them.
func TestLastPicksAtShutdown(t *testing.T) {
	now := time.Second
	a, b, nc, got := untickedTTFTNode(t, &now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, nc, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	b.Observe(2, &routing.Context{Prompt: strings.Repeat("the last prompt before shutdown. ", 40)})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	awaitObservations(t, got, 5*time.Second, "the pick made before shutdown was never published", func(msg *fleetv1.Observations) bool {
		for _, r := range msg.Routes {
			for _, tc := range r.Targets {
				if tc.Target == 2 && len(tc.Chunks) > 0 {
					return true
				}
			}
		}
		return false
	})
}

// A pick in a burst leaves at once: the balancer asks (routing's
// ReportTrigger) and Run publishes its queue report between ticks. The
// intervals here are an hour, so no tick can send it.
func TestBurstPickReportedAtOnce(t *testing.T) {
	now := time.Second
	a, b, nc, got := untickedTTFTNode(t, &now)
	b.(routing.SharedQueue).SetPlace(0, 2) // as a peer's load report would
	runNode(t, nc, a)

	d := b.(routing.Deferrer)
	lone := &routing.Context{Prompt: "a lone request"}
	d.Defer(lone, nil, routing.Set{})
	b.Observe(1, lone)
	burst := &routing.Context{Prompt: strings.Repeat("the second request of a burst. ", 40)}
	d.Defer(burst, nil, routing.Set{}) // in the same instant: a burst
	b.Observe(2, burst)
	awaitObservations(t, got, 10*time.Second, "the burst's pick was not published before the queue tick", func(msg *fleetv1.Observations) bool {
		for _, q := range msg.Queues {
			for _, tq := range q.Targets {
				if tq.Target == 2 && tq.Requests == 1 {
					return true
				}
			}
		}
		return false
	})
	if st := a.Stats(time.Now()); st.UrgentReports == 0 || st.QueueTicks != 0 {
		t.Fatalf("urgent reports %d, queue ticks %d: want the report sent at once", st.UrgentReports, st.QueueTicks)
	}
}

// awaitObservations reads got until a message satisfies found, failing
// with missing after within.
func awaitObservations(t *testing.T, got <-chan *fleetv1.Observations, within time.Duration, missing string, found func(*fleetv1.Observations) bool) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case msg := <-got:
			if found(msg) {
				return
			}
		case <-deadline:
			t.Fatal(missing)
		}
	}
}

// untickedTTFTNode is a node whose intervals are an hour (no tick comes
// within a test) with a predicted_ttft route on the virtual clock *now,
// the NATS connection to run it on, and the observations published on its
// group as they arrive.
func untickedTTFTNode(t *testing.T, now *time.Duration) (*fleet.Node, routing.Balancer, *nats.Conn, <-chan *fleetv1.Observations) {
	t.Helper()
	s := natstest.Start(t)
	a := fleet.NewNode(fleet.Options{ID: "a", LoadInterval: time.Hour, FlushInterval: time.Hour, QueueInterval: time.Hour})
	route := a.Bind("llama", 9, targets)
	b, err := routing.New(routing.Spec{Strategy: routing.PredictedTTFT, Weights: []int{1, 1, 1, 1}, Share: route.Record,
		Now: func() time.Duration { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	route.SetAffinity(b.(routing.SharedAffinity))
	route.SetQueue(b.(routing.SharedQueue))
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	got := make(chan *fleetv1.Observations, 64)
	obsSubj, _, _ := fleet.Subjects(a.Options().Group)
	sub, err := nc.Subscribe(obsSubj, func(m *nats.Msg) {
		if msg, err := fleet.DecodeObservations(m.Data); err == nil {
			select {
			case got <- msg:
			default: // the test has what it needs
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return a, b, nc, got
}

// runNode runs n over nc until the test ends.
func runNode(t *testing.T, nc *nats.Conn, n *fleet.Node) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx, nc, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}
