package fleet_test

import (
	"testing"
	"time"

	"rolter.dev/pkg/fleet"
	"rolter.dev/pkg/routing"
)

// FuzzDecode feeds arbitrary bytes to every decoder and to a node's
// handlers: errors are fine, panics are not, and a message that decodes
// must not name a target out of range.
func FuzzDecode(f *testing.F) {
	a := newMember(f, "a", 1)
	a.own[0] = 3
	for i := range 3 {
		a.send(conversation(i))
	}
	f.Add(a.node.FlushObservations())
	now := time.Second
	q := newTTFTMember(f, "q", &now)
	q.b.(routing.SharedQueue).SetPlace(0, 2)
	q.b.(routing.Deferrer).Defer(&routing.Context{Prompt: conversation(1)}, nil, routing.Set{})
	q.b.Observe(1, &routing.Context{Prompt: conversation(1)})
	f.Add(q.node.FlushQueues())
	f.Add(a.node.LoadReport())
	// A load report echoing one of fuzzq's (below): a trip to measure.
	echo := newMember(f, "b", 1)
	echo.node.HandleLoads(newTTFTMember(f, "fuzzq", &now).node.LoadReport(), time.Now())
	f.Add(echo.node.LoadReport())
	f.Add(a.node.SnapshotRequest())
	f.Add(a.node.SnapshotReply(newMember(f, "b", 1).node.SnapshotRequest(), 1<<20))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if m, err := fleet.DecodeObservations(data); err == nil {
			for _, r := range m.Routes {
				for _, tc := range r.Targets {
					if tc.Target >= 256 {
						t.Fatalf("target %d accepted", tc.Target)
					}
				}
			}
			for _, r := range m.Queues {
				if len(r.ArrivalAgesUs) > routing.MaxReportedArrivals {
					t.Fatalf("%d arrivals accepted", len(r.ArrivalAgesUs))
				}
				for _, tq := range r.Targets {
					if tq.Target >= 256 {
						t.Fatalf("queue of target %d accepted", tq.Target)
					}
				}
			}
		}
		if m, err := fleet.DecodeLoads(data); err == nil && len(m.Echoes) > 255 {
			t.Fatalf("%d echoes accepted", len(m.Echoes))
		}
		_, _ = fleet.DecodeSnapshotRequest(data)
		_, _ = fleet.DecodeSnapshot(data)
		n := newMember(t, "fuzz", 1)
		n.node.HandleObservations(data, time.Now())
		n.node.HandleLoads(data, time.Now())
		_, _ = n.node.ApplySnapshot(data, time.Now())
		_ = n.node.SnapshotReply(data, 1<<16)
		for i := range targets {
			if n.route.PeerLoad(i) < 0 {
				t.Fatal("negative peer load")
			}
		}
		// A predicted_ttft route folds queue reports; whatever they say,
		// it still picks a target.
		at := time.Second
		qm := newTTFTMember(t, "fuzzq", &at)
		qm.b.(routing.SharedQueue).SetPlace(1, 2)
		qm.node.LoadReport()
		qm.node.HandleLoads(data, time.Now())
		if trip := qm.node.Stats(time.Now()).Trip; trip < 0 {
			t.Fatalf("trip %v after an echo", trip)
		}
		// Twice, so that a report echoing qm's gives the round trip and
		// its clock an offset: whatever the clock says, at most a day.
		qm.node.HandleLoads(data, time.Now())
		if off := qm.node.Stats(time.Now()).ClockOffset; off < 0 || off > 24*time.Hour {
			t.Fatalf("clock offset %v", off)
		}
		qm.node.HandleObservations(data, time.Now())
		if d := qm.b.(routing.Deferrer).Defer(&routing.Context{Prompt: conversation(2)}, nil, routing.Set{}); d < 0 {
			t.Fatalf("Defer = %v after folding", d)
		}
		if got := qm.b.Pick(&routing.Context{Prompt: conversation(2)}, nil, routing.Set{}); got < 0 || got >= targets {
			t.Fatalf("picked %d after folding", got)
		}
	})
}
