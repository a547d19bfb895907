package app

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"rolter.dev/kvwatcher/zmtptest"
	"rolter.dev/pkg/kvevents"
	"rolter.dev/pkg/natstest"
)

// encodeRank encodes a batch as data-parallel rank sends it.
func encodeRank(t testing.TB, rank int64, events ...kvevents.Event) []byte {
	t.Helper()
	b, err := kvevents.Encode(&kvevents.Batch{TS: 1, Events: events, DataParallelRank: kvevents.Some(rank)}, kvevents.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rankPubs binds n publishers on consecutive loopback ports, as the ranks
// of one vLLM replica do (rank r on the base port + r).
func rankPubs(t *testing.T, n int) []*zmtptest.Pub {
	t.Helper()
	for range 50 {
		base, err := zmtptest.Listen("tcp://127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(base.Endpoint()[len("tcp://"):])
		p, _ := strconv.Atoi(port)
		pubs := []*zmtptest.Pub{base}
		for r := 1; r < n; r++ {
			pub, err := zmtptest.Listen(fmt.Sprintf("tcp://127.0.0.1:%d", p+r))
			if err != nil {
				break
			}
			pubs = append(pubs, pub)
		}
		if len(pubs) == n {
			for _, pub := range pubs {
				t.Cleanup(pub.Close)
			}
			return pubs
		}
		for _, pub := range pubs {
			pub.Close()
		}
	}
	t.Fatal("no consecutive free ports")
	return nil
}

func TestRankEndpoint(t *testing.T) {
	tests := []struct {
		endpoint string
		rank     int
		want     string
		err      bool
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", false},
		{"tcp://*:5557", 3, "tcp://*:5560", false},
		{"tcp://vllm-a:5557", 1, "tcp://vllm-a:5558", false},
		{"tcp://[::1]:5557", 2, "tcp://[::1]:5559", false},
		{"", 2, "", false},
		{"ipc:///tmp/kv", 0, "ipc:///tmp/kv", false},
		{"error: ipc", 1, "", true},
		{"tcp://h:65535", 1, "", true},
		{"tcp://h:0", 1, "", true},
	}
	for _, tc := range tests {
		ep := tc.endpoint
		if ep == "error: ipc" {
			ep = "ipc:///tmp/kv"
		}
		got, err := RankEndpoint(ep, tc.rank)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("RankEndpoint(%q, %d) = %q, %v; want %q (error %t)", ep, tc.rank, got, err, tc.want, tc.err)
		}
	}
}

// Ranks on several nodes: rank r on hosts[r / (ranks per host)], at the
// port of its global rank.
func TestRankEndpointsAcrossNodes(t *testing.T) {
	kv := &KVSpec{Endpoint: "tcp://node-a:5557", ReplayEndpoint: "tcp://node-a:5600", Mode: ModeConnect,
		DataParallelSize: 4, DataParallelHosts: []string{"node-a", "[fd00::2]"}}
	want := [][2]string{
		{"tcp://node-a:5557", "tcp://node-a:5600"}, {"tcp://node-a:5558", "tcp://node-a:5601"},
		{"tcp://[fd00::2]:5559", "tcp://[fd00::2]:5602"}, {"tcp://[fd00::2]:5560", "tcp://[fd00::2]:5603"},
	}
	for r, w := range want {
		ep, replay, err := kv.RankEndpoints(r)
		if err != nil || ep != w[0] || replay != w[1] {
			t.Errorf("rank %d: %q, %q, %v; want %q, %q", r, ep, replay, err, w[0], w[1])
		}
	}
	p := Provider{Name: "p", KV: kv}
	kv.Stale = time.Second
	if err := p.validate(); err != nil {
		t.Fatalf("valid spec refused: %v", err)
	}
	for _, bad := range []func(*KVSpec){
		func(k *KVSpec) { k.Mode = ModeBind },
		func(k *KVSpec) { k.DataParallelSize = 3 },
		func(k *KVSpec) { k.DataParallelHosts = []string{"node-a", ""} },
	} {
		c := *kv
		c.DataParallelHosts = slices.Clone(kv.DataParallelHosts)
		bad(&c)
		if err := (Provider{Name: "p", KV: &c}).validate(); err == nil {
			t.Errorf("invalid spec accepted: %+v", c)
		}
	}
	// Hosts are part of what a provider is: a change restarts its watch.
	c := *kv
	c.DataParallelHosts = []string{"node-a", "node-c"}
	if p.Equal(Provider{Name: "p", KV: &c}) || !p.Equal(Provider{Name: "p", KV: kv}) {
		t.Error("Equal ignores data_parallel_hosts")
	}
}

// TestDataParallelConnectAcrossNodes: rank 1 runs on another node (here
// another loopback address) at its global rank's port; the watcher dials it
// there and merges its blocks with rank 0's.
func TestDataParallelConnectAcrossNodes(t *testing.T) {
	s := natstest.Start(t)
	rank0, err := zmtptest.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rank0.Close)
	_, port, _ := net.SplitHostPort(rank0.Endpoint()[len("tcp://"):])
	p0, _ := strconv.Atoi(port)
	rank1, err := zmtptest.Listen(fmt.Sprintf("tcp://127.0.0.2:%d", p0+1))
	if err != nil {
		t.Skipf("no second loopback address to stand for another node: %v", err)
	}
	t.Cleanup(rank1.Close)
	p := kvProvider("p", rank0.Endpoint())
	p.KV.DataParallelSize = 2
	p.KV.DataParallelHosts = []string{"127.0.0.1", "127.0.0.2"}
	startWatcher(t, natstest.Connect(t, s), StaticSource{p})
	ix := newIndex(t, natstest.Connect(t, s), "p")
	for _, pub := range []*zmtptest.Pub{rank0, rank1} {
		if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	a, b := newChain("sim-model", 2, 16, 100), newChain("sim-model", 2, 16, 300)
	send(t, rank0, frames(topic, 1, encodeRank(t, 0, a.stored(0, 2)))...)
	send(t, rank1, frames(topic, 1, encodeRank(t, 1, b.stored(0, 2)))...)
	eventually(t, "both nodes' ranks merged", func() bool {
		return ix.Fresh("p") && ix.PrefixMatch("p", a.ids()) == 2 && ix.PrefixMatch("p", b.ids()) == 2
	})
}

// TestDataParallelConnect: a provider of two ranks is two publishers on
// consecutive ports with their own sequences; its blocks are the union of
// the ranks', and a gap on one rank drops only that rank's blocks.
func TestDataParallelConnect(t *testing.T) {
	s := natstest.Start(t)
	pubs := rankPubs(t, 2)
	p := kvProvider("p", pubs[0].Endpoint())
	p.KV.DataParallelSize = 2
	r := startWatcher(t, natstest.Connect(t, s), StaticSource{p})
	ix := newIndex(t, natstest.Connect(t, s), "p")
	for _, pub := range pubs {
		if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	shared, own := newChain("sim-model", 3, 16, 100), newChain("sim-model", 2, 16, 200)
	// Each rank numbers its batches from its own baseline: interleaved,
	// they are no gap.
	send(t, pubs[0], frames(topic, 40, encodeRank(t, 0, shared.stored(0, 2)))...)
	eventually(t, "rank 0's blocks", func() bool { return ix.PrefixMatch("p", shared.ids()) == 2 })
	rank1 := newChain("sim-model", 3, 16, 100)
	rank1.base = 900 // rank 1's engine hashes differ; its identities do not
	send(t, pubs[1], frames(topic, 7, encodeRank(t, 1, rank1.stored(0, 1), own.stored(0, 2)))...)
	send(t, pubs[0], frames(topic, 41, encodeRank(t, 0, shared.stored(2, 3)))...)
	eventually(t, "both ranks merged", func() bool {
		return ix.Fresh("p") && ix.PrefixMatch("p", shared.ids()) == 3 && ix.PrefixMatch("p", own.ids()) == 2
	})
	if n := r.counter(t, "rolter_kvwatcher_stream_failures_total", "reason", "gap"); n != 0 {
		t.Fatalf("%v gaps counted across ranks", n)
	}

	// A gap on rank 1 (no replay): rank 1's blocks go, rank 0's stay; the
	// provider is neutral until rank 1's engine clears.
	send(t, pubs[1], frames(topic, 9, encodeRank(t, 1, own.removed(1, 2)))...)
	eventually(t, "rank 1 dropped", func() bool { return ix.PrefixMatch("p", own.ids()) == 0 && !ix.Fresh("p") })
	if got := ix.PrefixMatch("p", shared.ids()); got != 3 {
		t.Fatalf("rank 0's blocks went with rank 1's gap: prefix %d, want 3", got)
	}
	send(t, pubs[1], frames(topic, 10, encodeRank(t, 1, &kvevents.AllBlocksCleared{}, own.stored(0, 1)))...)
	eventually(t, "rank 1 synced again", func() bool { return ix.Fresh("p") && ix.PrefixMatch("p", own.ids()) == 1 })
	if got := ix.PrefixMatch("p", shared.ids()); got != 3 {
		t.Fatalf("prefix %d after rank 1's clear, want 3", got)
	}

	// Rank 0's publisher goes away: its blocks that rank 1 does not hold
	// leave (rank 1 holds none of shared now).
	pubs[0].Close()
	eventually(t, "rank 0 dropped", func() bool { return ix.PrefixMatch("p", shared.ids()) == 0 && !ix.Fresh("p") })
	if got := ix.PrefixMatch("p", own.ids()); got != 1 {
		t.Fatalf("rank 1's blocks went with rank 0's disconnect: %d", got)
	}
}

// TestDataParallelBind: in bind mode every rank connects to the watcher's
// port + rank, and the batch's data_parallel_rank says which rank sent it.
func TestDataParallelBind(t *testing.T) {
	s := natstest.Start(t)
	// Two consecutive free ports for the watcher to bind.
	probe := rankPubs(t, 2)
	base := probe[0].Endpoint()
	for _, p := range probe {
		p.Close()
	}
	spec := Provider{Name: "a", KV: &KVSpec{Endpoint: base, Topic: "kv@a@m", Mode: ModeBind, Model: "m", MaxBlocks: 100,
		Stale: 2 * time.Second, DataParallelSize: 2}}
	r := startWatcher(t, natstest.Connect(t, s), StaticSource{spec})
	ix := newIndex(t, natstest.Connect(t, s), "a")
	ep1, _ := RankEndpoint(base, 1)
	var pubs []*zmtptest.Pub
	for _, ep := range []string{base, ep1} {
		eventually(t, "bound "+ep, func() bool { _, ok := r.w.BoundEndpoint(ep); return ok })
		pub, err := zmtptest.Dial(ep)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pub.Close)
		pubs = append(pubs, pub)
	}
	eventually(t, "subscriptions", func() bool { return pubs[0].Subscribers() == 1 && pubs[1].Subscribers() == 1 })
	c0, c1 := newChain("m", 2, 16, 1), newChain("m", 3, 16, 2)
	send(t, pubs[0], frames("kv@a@m", 0, encodeRank(t, 0, c0.stored(0, 2)))...)
	eventually(t, "rank 0's blocks", func() bool { return ix.PrefixMatch("a", c0.ids()) == 2 })
	if ix.Fresh("a") {
		t.Fatal("fresh before rank 1 has a stream")
	}
	send(t, pubs[1], frames("kv@a@m", 0, encodeRank(t, 1, c1.stored(0, 3)))...)
	send(t, pubs[1], frames("kv@a@m", 1, encodeRank(t, 5, c1.removed(0, 3)))...) // no such rank
	eventually(t, "both ranks", func() bool {
		return ix.Fresh("a") && ix.PrefixMatch("a", c0.ids()) == 2 && ix.PrefixMatch("a", c1.ids()) == 3
	})
	eventually(t, "bad rank counted", func() bool { return r.counter(t, "rolter_kvwatcher_malformed_total", "reason", "rank") == 1 })
	// Rank 1's connection ends: only its blocks leave.
	pubs[1].Close()
	eventually(t, "rank 1 cleared", func() bool { return ix.PrefixMatch("a", c1.ids()) == 0 })
	if got := ix.PrefixMatch("a", c0.ids()); got != 2 {
		t.Fatalf("rank 0 lost its blocks: %d", got)
	}
}

// TestLargeDeltaIsSplit: a change of more identities than one NATS message
// holds goes out as several deltas in sequence.
func TestLargeDeltaIsSplit(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true, MaxPayload: 2048})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	pubs := rankPubs(t, 2)
	p := kvProvider("p", pubs[0].Endpoint())
	p.KV.DataParallelSize = 2
	p.KV.MaxBlocks = 10_000 // 5,000 per rank
	r := startWatcher(t, natstest.Connect(t, ns), StaticSource{p})
	ix := newIndex(t, natstest.Connect(t, ns), "p")
	for _, pub := range pubs {
		if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	big := newChain("sim-model", 700, 1, 5)
	send(t, pubs[1], frames(topic, 0, encodeRank(t, 1, big.stored(0, 700)))...)
	send(t, pubs[0], frames(topic, 0, encodeRank(t, 0, newChain("sim-model", 1, 1, 6).stored(0, 1)))...)
	eventually(t, "all 700 blocks", func() bool { return ix.Fresh("p") && ix.PrefixMatch("p", big.ids()) == 700 })
	if n := r.counter(t, "rolter_kvwatcher_published_messages_total", "type", "delta"); n < 4 {
		t.Errorf("%v deltas for 5.6 kB of identities under a 2 kB limit", n)
	}
	if n := r.counter(t, "rolter_kvwatcher_publish_errors_total"); n != 0 {
		t.Errorf("%v publish errors", n)
	}
	// Rank 1's clear removes them all, in parts too.
	pubs[1].Close()
	eventually(t, "removed", func() bool { return ix.PrefixMatch("p", big.ids()) == 0 })
	if s, _ := ix.Stats("p"); s.Gaps != 0 || s.Malformed != 0 {
		t.Errorf("index saw %d gaps, %d malformed", s.Gaps, s.Malformed)
	}
}
