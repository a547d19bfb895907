package kvindex_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeWatcher publishes a provider's deltas and answers its snapshot
// requests as rolter-kvwatcher does, from a set it keeps.
type fakeWatcher struct {
	t     testing.TB
	nc    *nats.Conn
	name  string
	epoch uint64

	mu     sync.Mutex
	seq    uint64
	ids    map[uint64]bool
	status kvdelta.Status
	snaps  int
	sub    *nats.Subscription
}

func newFakeWatcher(t testing.TB, nc *nats.Conn, name string, epoch uint64) *fakeWatcher {
	t.Helper()
	f := &fakeWatcher{t: t, nc: nc, name: name, epoch: epoch, ids: map[uint64]bool{},
		status: kvdelta.Status{KV: true, Synced: true, KVAge: 0, KVStale: 5 * time.Second, BlockSize: 16}}
	sub, err := nc.Subscribe(kvdelta.SnapshotSubject(name), f.serve)
	if err != nil {
		t.Fatal(err)
	}
	f.sub = sub
	t.Cleanup(f.stop)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fakeWatcher) stop() { _ = f.sub.Unsubscribe() }

func (f *fakeWatcher) serve(msg *nats.Msg) {
	req, err := kvdelta.Decode(msg.Data)
	if err != nil || (req.Epoch != 0 && req.Epoch != f.epoch) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snaps++
	var ids []uint64
	for id := range f.ids {
		ids = append(ids, id)
	}
	per := kvdelta.PartIDs(int(f.nc.MaxPayload()), f.name)
	parts := max((len(ids)+per-1)/per, 1)
	for i := range parts {
		m := kvdelta.Message{Type: kvdelta.TypeSnapshot, Epoch: f.epoch, Seq: f.seq, Provider: f.name, Status: f.status,
			Part: i, Parts: parts, IDs: ids[min(i*per, len(ids)):min((i+1)*per, len(ids))]}
		f.publish(msg.Reply, &m)
	}
}

func (f *fakeWatcher) publish(subject string, m *kvdelta.Message) {
	b, err := kvdelta.Encode(m)
	if err != nil {
		f.t.Error(err)
		return
	}
	if err := f.nc.Publish(subject, b); err != nil {
		f.t.Error(err)
	}
}

// delta applies ops to the fake's set and publishes them; with skip, the
// delta takes a sequence number but is not published (a lost message).
func (f *fakeWatcher) delta(skip bool, ops ...kvdelta.Op) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, op := range ops {
		for _, id := range op.IDs {
			f.ids[id] = op.Kind == kvdelta.OpStored
			if op.Kind == kvdelta.OpRemoved {
				delete(f.ids, id)
			}
		}
		if op.Kind == kvdelta.OpCleared {
			clear(f.ids)
		}
	}
	f.seq++
	if !skip {
		f.publish(kvdelta.Subject(f.name), &kvdelta.Message{Type: kvdelta.TypeDelta, Epoch: f.epoch, Seq: f.seq, Provider: f.name, Status: f.status, Ops: ops})
	}
}

func (f *fakeWatcher) heartbeat() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.publish(kvdelta.Subject(f.name), &kvdelta.Message{Type: kvdelta.TypeStatus, Epoch: f.epoch, Seq: f.seq, Provider: f.name, Status: f.status})
}

func (f *fakeWatcher) setStatus(fn func(*kvdelta.Status)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.status)
}

func stored(ids ...uint64) kvdelta.Op  { return kvdelta.Op{Kind: kvdelta.OpStored, IDs: ids} }
func removed(ids ...uint64) kvdelta.Op { return kvdelta.Op{Kind: kvdelta.OpRemoved, IDs: ids} }

func newIndex(t testing.TB, nc *nats.Conn, providers ...string) *kvindex.Index {
	t.Helper()
	ix, err := kvindex.New(nc, providers, kvindex.Options{FailoverAfter: 300 * time.Millisecond, RetryMin: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond, SnapshotTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ix.Close)
	return ix
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLateIndexResyncsFromSnapshot(t *testing.T) {
	s := natstest.Start(t)
	f := newFakeWatcher(t, natstest.Connect(t, s), "p", 1)
	f.delta(false, stored(1, 2, 3))
	f.delta(false, removed(3))
	ix := newIndex(t, natstest.Connect(t, s), "p")
	eventually(t, "fresh", func() bool { return ix.Fresh("p") })
	if got := ix.PrefixMatch("p", []uint64{1, 2, 3}); got != 2 {
		t.Errorf("PrefixMatch = %d, want 2", got)
	}
	if got := ix.BlockSize("p"); got != 16 {
		t.Errorf("BlockSize = %d, want 16", got)
	}
	f.delta(false, stored(3, 4))
	eventually(t, "the next delta", func() bool { return ix.PrefixMatch("p", []uint64{1, 2, 3, 4}) == 4 })
	st, _ := ix.Stats("p")
	if st.Epoch != 1 || st.Seq != 3 || st.Resyncs != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestGapResyncs(t *testing.T) {
	s := natstest.Start(t)
	f := newFakeWatcher(t, natstest.Connect(t, s), "p", 1)
	ix := newIndex(t, natstest.Connect(t, s), "p")
	eventually(t, "loaded", func() bool { st, _ := ix.Stats("p"); return st.Loaded && !st.Resyncing })
	f.delta(false, stored(1))
	f.delta(true, stored(2)) // lost
	f.delta(false, stored(3))
	eventually(t, "resync after the gap", func() bool { return ix.PrefixMatch("p", []uint64{1, 2, 3}) == 3 })
	st, _ := ix.Stats("p")
	if st.Gaps == 0 || st.Resyncs < 2 {
		t.Errorf("stats %+v: want a gap and a second resync", st)
	}

	// A lost last delta shows on the next heartbeat.
	f.delta(true, removed(1))
	f.heartbeat()
	eventually(t, "resync after the heartbeat", func() bool { return ix.PrefixMatch("p", []uint64{1}) == 0 })
}

func TestFreshness(t *testing.T) {
	s := natstest.Start(t)
	f := newFakeWatcher(t, natstest.Connect(t, s), "p", 1)
	f.setStatus(func(st *kvdelta.Status) { st.KVStale = 300 * time.Millisecond })
	ix := newIndex(t, natstest.Connect(t, s), "p")
	eventually(t, "fresh", func() bool { return ix.Fresh("p") })
	// No message for longer than stale: stale.
	eventually(t, "stale", func() bool { return !ix.Fresh("p") })
	f.heartbeat()
	eventually(t, "fresh again", func() bool { return ix.Fresh("p") })

	// Not synced (an unrepaired gap at the watcher): not fresh.
	f.setStatus(func(st *kvdelta.Status) { st.Synced = false })
	f.heartbeat()
	eventually(t, "neutral", func() bool { return !ix.Fresh("p") })
	// An engine that never sent an event: not fresh.
	f.setStatus(func(st *kvdelta.Status) { st.Synced, st.KVAge = true, -1 })
	f.heartbeat()
	time.Sleep(50 * time.Millisecond)
	if ix.Fresh("p") {
		t.Error("fresh without any event")
	}
	if ix.Fresh("unknown") {
		t.Error("an unknown provider is fresh")
	}
}

func TestTwoWatchersDoNotDoubleCount(t *testing.T) {
	s := natstest.Start(t)
	a := newFakeWatcher(t, natstest.Connect(t, s), "p", 0xa)
	b := newFakeWatcher(t, natstest.Connect(t, s), "p", 0xb)
	ix := newIndex(t, natstest.Connect(t, s), "p")
	eventually(t, "fresh", func() bool { return ix.Fresh("p") })
	st, _ := ix.Stats("p")
	followed, other := a, b
	if st.Epoch == 0xb {
		followed, other = b, a
	}
	// Both watchers see the engine store 1 and 2 and remove 1; the removal
	// reaches the index from one of them while the other's store of 1 is
	// still coming: only the followed one's order counts.
	followed.delta(false, stored(1, 2))
	other.delta(false, stored(1, 2))
	followed.delta(false, removed(1))
	other.delta(false, stored(5)) // the other watcher's view differs: ignored
	eventually(t, "removal", func() bool { return ix.PrefixMatch("p", []uint64{2}) == 1 && ix.PrefixMatch("p", []uint64{1}) == 0 })
	time.Sleep(50 * time.Millisecond)
	if ix.PrefixMatch("p", []uint64{5}) != 0 || ix.PrefixMatch("p", []uint64{1}) != 0 {
		t.Fatal("the index applied the other watcher's deltas")
	}
	if st, _ := ix.Stats("p"); st.Resident != 1 {
		t.Errorf("resident = %d, want 1", st.Resident)
	}

	// The followed watcher goes silent: the index fails over to the other
	// one, resyncing from its snapshot.
	followed.stop()
	deadline := time.Now().Add(3 * time.Second)
	for {
		other.heartbeat()
		if st, _ := ix.Stats("p"); st.Epoch == other.epoch && ix.Fresh("p") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no failover")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := ix.PrefixMatch("p", []uint64{5}); got != 1 {
		t.Errorf("after failover PrefixMatch(5) = %d, want the new epoch's state", got)
	}
	if st, _ := ix.Stats("p"); st.Failovers != 1 {
		t.Errorf("failovers = %d", st.Failovers)
	}
}

func TestSpeculate(t *testing.T) {
	s := natstest.Start(t)
	f := newFakeWatcher(t, natstest.Connect(t, s), "p", 1)
	ix := newIndex(t, natstest.Connect(t, s), "p")
	eventually(t, "loaded", func() bool { return ix.Fresh("p") })
	ix.Speculate("p", []uint64{1, 2}, 200*time.Millisecond)
	if got := ix.PrefixMatch("p", []uint64{1, 2, 3}); got != 2 {
		t.Fatalf("PrefixMatch = %d, want 2 speculative", got)
	}
	// An event confirms 1; 2 expires.
	f.delta(false, stored(1))
	eventually(t, "confirmation", func() bool { st, _ := ix.Stats("p"); return st.Resident == 1 && st.Speculative == 1 })
	time.Sleep(250 * time.Millisecond)
	if got := ix.PrefixMatch("p", []uint64{1, 2}); got != 1 {
		t.Errorf("after expiry PrefixMatch = %d, want 1", got)
	}
	ix.Speculate("unknown", []uint64{1}, time.Second) // ignored
	if got := ix.SpeculateAppend("p", []uint64{1, 4}, time.Second, nil); len(got) != 1 || got[0] != 4 {
		t.Errorf("SpeculateAppend = %v, want [4] (1 is resident)", got)
	}
	if got := ix.SpeculateAppend("unknown", []uint64{1}, time.Second, nil); got != nil {
		t.Errorf("SpeculateAppend on an unknown provider = %v", got)
	}
}

func TestOccupancy(t *testing.T) {
	s := natstest.Start(t)
	f := newFakeWatcher(t, natstest.Connect(t, s), "lm", 1)
	f.setStatus(func(st *kvdelta.Status) {
		*st = kvdelta.Status{LM: true, LMAvailable: true, Occupancy: 0.75, LMAge: 0, LMStale: 300 * time.Millisecond}
	})
	ix := newIndex(t, natstest.Connect(t, s), "lm")
	f.heartbeat()
	eventually(t, "occupancy", func() bool { _, _, fresh := ix.Occupancy("lm"); return fresh })
	occ, avail, _ := ix.Occupancy("lm")
	if occ != 0.75 || !avail {
		t.Errorf("Occupancy = %v, %v", occ, avail)
	}
	eventually(t, "stale occupancy", func() bool { _, _, fresh := ix.Occupancy("lm"); return !fresh })
	if ix.Fresh("lm") {
		t.Error("an LMCache-only provider has fresh KV state")
	}
}

func TestLargeSnapshotInParts(t *testing.T) {
	s := natstest.Start(t, func(o *server.Options) { o.MaxPayload = 4096 })
	f := newFakeWatcher(t, natstest.Connect(t, s), "p", 1)
	ids := make([]uint64, 5000)
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	f.delta(true, stored(ids...)) // only the snapshot carries them
	ix := newIndex(t, natstest.Connect(t, s), "p")
	eventually(t, "loaded", func() bool { return ix.Fresh("p") })
	if got := ix.PrefixMatch("p", ids); got != len(ids) {
		t.Errorf("PrefixMatch = %d, want %d", got, len(ids))
	}
}

func TestSetProviders(t *testing.T) {
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	fa := newFakeWatcher(t, nc, "a", 1)
	fb := newFakeWatcher(t, nc, "b.c", 1)
	fa.delta(false, stored(1))
	fb.delta(false, stored(2))
	ix := newIndex(t, natstest.Connect(t, s), "a")
	eventually(t, "a", func() bool { return ix.Fresh("a") })
	if err := ix.SetProviders([]string{"b.c"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b.c", func() bool { return ix.Fresh("b.c") && ix.PrefixMatch("b.c", []uint64{2}) == 1 })
	if ix.Fresh("a") || ix.PrefixMatch("a", []uint64{1}) != 0 {
		t.Error("a is still followed")
	}
	if got := ix.Providers(); len(got) != 1 || got[0] != "b.c" {
		t.Errorf("Providers = %v", got)
	}
}

// TestSilentWatcherIsStale: a watcher that stops heartbeating makes its
// provider stale after a few missed beats, long before stale_secs; the
// collector says so; heartbeats resuming make it fresh again.
func TestSilentWatcherIsStale(t *testing.T) {
	s := natstest.Start(t)
	f := newFakeWatcher(t, natstest.Connect(t, s), "p", 1)
	f.setStatus(func(st *kvdelta.Status) { st.KVStale = time.Hour })
	ix := newIndex(t, natstest.Connect(t, s), "p")
	beat := func(stop <-chan struct{}) {
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				f.heartbeat()
			}
		}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); beat(stop) }()
	eventually(t, "fresh with a known heartbeat", func() bool {
		st, _ := ix.Stats("p")
		return ix.Fresh("p") && st.Heartbeat > 0 && !st.Silent
	})
	close(stop)
	<-done
	eventually(t, "stale after missed heartbeats (stale_secs is an hour)", func() bool { return !ix.Fresh("p") })
	if st, _ := ix.Stats("p"); !st.Silent || st.Age < 0 {
		t.Fatalf("stats %+v: want silent", st)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(ix.Collector())
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			got[mf.GetName()] += v
		}
	}
	if got["rolter_kvindex_fresh"] != 0 || got["rolter_kvindex_watcher_silent"] != 1 || got["rolter_kvindex_watcher_info"] != 1 ||
		got["rolter_kvindex_resyncs_total"] < 1 || got["rolter_kvindex_age_seconds"] <= 0 {
		t.Fatalf("collected %v", got)
	}
	stop, done = make(chan struct{}), make(chan struct{})
	go func() { defer close(done); beat(stop) }()
	defer func() { close(stop); <-done }()
	eventually(t, "fresh again once heartbeats resume", func() bool { return ix.Fresh("p") })
}
