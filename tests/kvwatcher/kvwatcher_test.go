package kvwatcher_test

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"rolter.dev/kvwatcher/app"
	"rolter.dev/pkg/kvevents"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/natstest"
)

// TestWarmPrefixIsResident: a replica warms a prefix; within a second the
// proxies' index holds the identities computed from the same token ids, in
// both of vLLM's event forms.
func TestWarmPrefixIsResident(t *testing.T) {
	for _, layout := range []struct {
		name string
		l    kvevents.Layout
	}{{"array", kvevents.LayoutArray}, {"map", kvevents.LayoutMap}} {
		t.Run(layout.name, func(t *testing.T) {
			s := natstest.Start(t)
			r := newReplica(t, replicaOpts{layout: layout.l})
			startWatcher(t, s, app.StaticSource{kvProvider("vllm-a", r.pub.Endpoint(), "", 5*time.Second)})
			ix := newIndex(t, s, "vllm-a")
			r.waitSubscribers(t, 1)

			toks := prompt("alpha", 300) // 18 full blocks
			want := ids(toks)
			r.warm(toks)
			took := eventually(t, "the prefix resident", time.Second, func() bool {
				return ix.Fresh("vllm-a") && ix.PrefixMatch("vllm-a", want) == len(want)
			})
			t.Logf("resident %d blocks %v after the BlockStored", len(want), took)
			if got := ix.BlockSize("vllm-a"); got != blockSize {
				t.Errorf("BlockSize = %d, want %d", got, blockSize)
			}
			// A request sharing the first 10 blocks then diverging matches 10.
			other := slices.Concat(toks[:10*blockSize], prompt("beta", 100))
			if got := ix.PrefixMatch("vllm-a", ids(other)); got != 10 {
				t.Errorf("diverging prompt matches %d blocks, want 10", got)
			}
			// Another model's identities never match.
			if got := ix.PrefixMatch("vllm-a", kvindex.Identities(kvindex.Seed("other-model"), toks, blockSize)); got != 0 {
				t.Errorf("another model matches %d blocks", got)
			}
		})
	}
}

// TestEvictionRemoves: the replica evicts a prefix's blocks to make room;
// the index follows within a second.
func TestEvictionRemoves(t *testing.T) {
	s := natstest.Start(t)
	r := newReplica(t, replicaOpts{capacity: 12})
	startWatcher(t, s, app.StaticSource{kvProvider("vllm-a", r.pub.Endpoint(), "", 5*time.Second)})
	ix := newIndex(t, s, "vllm-a")
	r.waitSubscribers(t, 1)

	a, b := prompt("alpha", 8*blockSize), prompt("beta", 8*blockSize)
	r.warm(a)
	eventually(t, "a resident", time.Second, func() bool { return ix.PrefixMatch("vllm-a", ids(a)) == 8 })
	r.warm(b) // 8 more blocks in a cache of 12: 4 of a's go
	want := r.resident(a)
	if want >= 8 {
		t.Fatalf("the replica kept %d of a's blocks; the test needs an eviction", want)
	}
	eventually(t, "a's eviction", time.Second, func() bool {
		return ix.PrefixMatch("vllm-a", ids(a)) == want && ix.PrefixMatch("vllm-a", ids(b)) == 8
	})
}

// TestGapTriggersReplay: a message lost between replica and watcher is
// fetched from the replica's replay socket.
func TestGapTriggersReplay(t *testing.T) {
	s := natstest.Start(t)
	r := newReplica(t, replicaOpts{replay: true})
	rl := newRelay(t, r.pub.Endpoint(), func(seq uint64) bool { return seq == 1 })
	r.waitSubscribers(t, 1)
	w := startWatcher(t, s, app.StaticSource{kvProvider("vllm-a", rl.pub.Endpoint(), r.pub.ReplayEndpoint(), 5*time.Second)})
	ix := newIndex(t, s, "vllm-a")
	if err := rl.pub.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// On connecting, the watcher catches up from the replay buffer (empty
	// yet); let it finish so the gap below is a live one.
	eventually(t, "catch-up", time.Second, func() bool {
		return w.metric(t, "rolter_kvwatcher_replay_attempts_total", "kind", "catchup") == 1
	})
	x, y, z := prompt("x", 64), prompt("y", 64), prompt("z", 64)
	r.warm(x) // seq 0
	r.warm(y) // seq 1: dropped by the relay
	r.warm(z) // seq 2: the gap shows
	eventually(t, "all three prefixes resident", 2*time.Second, func() bool {
		return ix.Fresh("vllm-a") && ix.PrefixMatch("vllm-a", ids(x)) == 4 && ix.PrefixMatch("vllm-a", ids(y)) == 4 && ix.PrefixMatch("vllm-a", ids(z)) == 4
	})
	// The replay's batches reach the index before the replay ends (it
	// waits for the socket to go idle) and is counted.
	eventually(t, "the gap replay counted", 2*time.Second, func() bool {
		return w.metric(t, "rolter_kvwatcher_replay_attempts_total", "kind", "gap") >= 1
	})
	if got := w.metric(t, "rolter_kvwatcher_replay_attempts_total", "kind", "gap", "result", "ok"); got != 1 {
		t.Errorf("gap replays = %v, want 1", got)
	}
	if got := w.metric(t, "rolter_kvwatcher_stream_failures_total", "reason", "gap"); got != 1 {
		t.Errorf("gaps = %v, want 1", got)
	}
}

// TestGapWithoutReplayIsNeutral: without a replay socket a gap clears the
// provider, which stays neutral until the engine clears its cache.
func TestGapWithoutReplayIsNeutral(t *testing.T) {
	s := natstest.Start(t)
	r := newReplica(t, replicaOpts{})
	rl := newRelay(t, r.pub.Endpoint(), func(seq uint64) bool { return seq == 1 })
	r.waitSubscribers(t, 1)
	startWatcher(t, s, app.StaticSource{kvProvider("vllm-a", rl.pub.Endpoint(), "", 5*time.Second)})
	ix := newIndex(t, s, "vllm-a")
	if err := rl.pub.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	x, y, z := prompt("x", 64), prompt("y", 64), prompt("z", 64)
	r.warm(x)
	eventually(t, "x resident", time.Second, func() bool { return ix.Fresh("vllm-a") && ix.PrefixMatch("vllm-a", ids(x)) == 4 })
	r.warm(y) // dropped
	r.warm(z)
	eventually(t, "neutral", time.Second, func() bool { return !ix.Fresh("vllm-a") && ix.PrefixMatch("vllm-a", ids(x)) == 0 })
	r.warm(prompt("w", 64)) // still neutral: no AllBlocksCleared yet
	time.Sleep(100 * time.Millisecond)
	if ix.Fresh("vllm-a") {
		t.Fatal("fresh again without an engine clear")
	}
	r.srv.Cache().Clear() // AllBlocksCleared
	r.warm(z)
	eventually(t, "synced after the clear", time.Second, func() bool { return ix.Fresh("vllm-a") && ix.PrefixMatch("vllm-a", ids(z)) == 4 })
}

// TestReplicaRestartClears: a replica restarts (new process, sequence back
// at 0, empty cache): its old blocks leave the index.
func TestReplicaRestartClears(t *testing.T) {
	s := natstest.Start(t)
	r := newReplica(t, replicaOpts{})
	ep := r.pub.Endpoint()
	startWatcher(t, s, app.StaticSource{kvProvider("vllm-a", ep, "", 5*time.Second)})
	ix := newIndex(t, s, "vllm-a")
	r.waitSubscribers(t, 1)
	old := prompt("old", 64)
	r.warm(old)
	eventually(t, "old resident", time.Second, func() bool { return ix.PrefixMatch("vllm-a", ids(old)) == 4 })

	_ = r.pub.Close()
	r2 := newReplica(t, replicaOpts{endpoint: ep})
	r2.waitSubscribers(t, 1)
	eventually(t, "old cleared", time.Second, func() bool { return ix.PrefixMatch("vllm-a", ids(old)) == 0 })
	fresh := prompt("new", 64)
	r2.warm(fresh)
	eventually(t, "new resident", time.Second, func() bool {
		return ix.Fresh("vllm-a") && ix.PrefixMatch("vllm-a", ids(fresh)) == 4
	})
}

// TestWatcherKilledGoesStale: killing the watcher makes the provider stale
// after stale_secs; a restarted watcher catches up from the replica's
// replay buffer and the index follows it.
func TestWatcherKilledGoesStale(t *testing.T) {
	const stale = time.Second
	s := natstest.Start(t)
	r := newReplica(t, replicaOpts{replay: true})
	src := app.StaticSource{kvProvider("vllm-a", r.pub.Endpoint(), r.pub.ReplayEndpoint(), stale)}
	w1 := startWatcher(t, s, src)
	ix := newIndex(t, s, "vllm-a")
	r.waitSubscribers(t, 1)
	toks := prompt("alpha", 128)
	r.warm(toks)
	eventually(t, "fresh", time.Second, func() bool { return ix.Fresh("vllm-a") && ix.PrefixMatch("vllm-a", ids(toks)) == 8 })

	w1.kill()
	killed := time.Now()
	eventually(t, "stale", 2*stale, func() bool { return !ix.Fresh("vllm-a") })
	if took := time.Since(killed); took > stale+300*time.Millisecond {
		t.Errorf("stale after %v, want about stale_secs (%v)", took, stale)
	}

	startWatcher(t, s, src)
	took := eventually(t, "fresh again with the state caught up", 3*time.Second, func() bool {
		return ix.Fresh("vllm-a") && ix.PrefixMatch("vllm-a", ids(toks)) == 8
	})
	t.Logf("fresh %v after the restart", took)
	if st, _ := ix.Stats("vllm-a"); st.Failovers != 1 {
		t.Errorf("failovers = %d, want 1", st.Failovers)
	}
}

// TestLateIndexResyncs: a proxy started after the events were published
// gets the state from a snapshot.
func TestLateIndexResyncs(t *testing.T) {
	s := natstest.Start(t)
	r := newReplica(t, replicaOpts{})
	startWatcher(t, s, app.StaticSource{kvProvider("vllm-a", r.pub.Endpoint(), "", 5*time.Second)})
	r.waitSubscribers(t, 1)
	toks := prompt("alpha", 256)
	r.warm(toks)
	time.Sleep(200 * time.Millisecond) // published before the index exists
	ix := newIndex(t, s, "vllm-a")
	eventually(t, "resynced", time.Second, func() bool {
		return ix.Fresh("vllm-a") && ix.PrefixMatch("vllm-a", ids(toks)) == 16
	})
	if st, _ := ix.Stats("vllm-a"); st.Resyncs != 1 {
		t.Errorf("resyncs = %d, want 1", st.Resyncs)
	}
}

// TestTwoWatchersDoNotDoubleCount: two watchers for one replica; the index
// follows one epoch and its resident set equals each watcher's state, also
// after evictions and after the followed watcher dies.
func TestTwoWatchersDoNotDoubleCount(t *testing.T) {
	s := natstest.Start(t)
	r := newReplica(t, replicaOpts{capacity: 20})
	src := app.StaticSource{kvProvider("vllm-a", r.pub.Endpoint(), "", 5*time.Second)}
	w1 := startWatcher(t, s, src)
	w2 := startWatcher(t, s, src)
	ix := newIndex(t, s, "vllm-a")
	r.waitSubscribers(t, 2)
	prompts := [][]uint32{prompt("a", 128), prompt("b", 128), prompt("c", 128)} // 24 blocks in 20: evictions
	for _, p := range prompts {
		r.warm(p)
	}
	state := func(w *watcher) float64 { return w.metric(t, "rolter_kvwatcher_state_blocks") }
	check := func(stage string) {
		t.Helper()
		eventually(t, stage+": index = replica", 2*time.Second, func() bool {
			st, _ := ix.Stats("vllm-a")
			if !ix.Fresh("vllm-a") || st.Resident != r.srv.Cache().Stats().Resident {
				return false
			}
			for _, p := range prompts {
				if ix.PrefixMatch("vllm-a", ids(p)) != r.resident(p) {
					return false
				}
			}
			return true
		})
	}
	check("both watchers")
	eventually(t, "watcher states", time.Second, func() bool {
		return state(w1) == float64(r.srv.Cache().Stats().Resident) && state(w2) == state(w1)
	})

	st, _ := ix.Stats("vllm-a")
	followed := w1
	if st.Epoch == w2.w.Epoch() {
		followed = w2
	}
	before := st.Failovers
	followed.kill()
	eventually(t, "failover", 2*time.Second, func() bool { st, _ := ix.Stats("vllm-a"); return st.Failovers == before+1 })
	r.warm(prompts[0])
	check("after failover")
}

// TestBindModeTopics: the watcher binds one endpoint; two replicas connect
// to it and are told apart by topic.
func TestBindModeTopics(t *testing.T) {
	s := natstest.Start(t)
	const bind = "tcp://127.0.0.1:0"
	spec := func(name, topic string) app.Provider {
		return app.Provider{Name: name, KV: &app.KVSpec{Endpoint: bind, Topic: topic, Mode: app.ModeBind, Model: model, MaxBlocks: 1000, Stale: 5 * time.Second}}
	}
	w := startWatcher(t, s, app.StaticSource{spec("pod-a", "kv@pod-a@sim-model"), spec("pod-b", "kv@pod-b@sim-model")})
	ix := newIndex(t, s, "pod-a", "pod-b")
	var ep string
	eventually(t, "bound", time.Second, func() bool { var ok bool; ep, ok = w.w.BoundEndpoint(bind); return ok })
	ra := newReplica(t, replicaOpts{endpoint: ep, connect: true, topic: "kv@pod-a@sim-model"})
	rb := newReplica(t, replicaOpts{endpoint: ep, connect: true, topic: "kv@pod-b@sim-model", layout: kvevents.LayoutMap})
	ra.waitSubscribers(t, 1)
	rb.waitSubscribers(t, 1)
	pa, pb := prompt("a", 64), prompt("b", 96)
	ra.warm(pa)
	rb.warm(pb)
	eventually(t, "each replica's prefix on its provider", time.Second, func() bool {
		return ix.PrefixMatch("pod-a", ids(pa)) == 4 && ix.PrefixMatch("pod-b", ids(pb)) == 6
	})
	if ix.PrefixMatch("pod-a", ids(pb)) != 0 || ix.PrefixMatch("pod-b", ids(pa)) != 0 {
		t.Error("a provider got the other replica's blocks")
	}
}

// BenchmarkEndToEndDelay measures the delay from a replica storing blocks
// (its BlockStored leaving on the ZMQ socket) to the proxies' index
// reporting them resident: ZMQ, decode, identities, NATS, delta apply.
func BenchmarkEndToEndDelay(b *testing.B) {
	s := natstest.Start(b)
	r := newReplica(b, replicaOpts{capacity: 1 << 20})
	startWatcher(b, s, app.StaticSource{kvProvider("vllm-a", r.pub.Endpoint(), "", 5*time.Second)})
	ix := newIndex(b, s, "vllm-a")
	r.waitSubscribers(b, 1)
	var delays []time.Duration
	i := 0
	for b.Loop() {
		i++
		toks := prompt(fmt.Sprintf("p%d", i), 64)
		want := ids(toks)
		start := time.Now()
		r.warm(toks)
		for ix.PrefixMatch("vllm-a", want) != len(want) {
			if time.Since(start) > 5*time.Second {
				b.Fatal("not resident")
			}
		}
		delays = append(delays, time.Since(start))
	}
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	b.ReportMetric(float64(delays[len(delays)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(delays[len(delays)*99/100].Microseconds()), "p99-µs")
}
