package kvwatcher_test

import (
	"fmt"
	"testing"
	"time"

	"rolter.dev/kvwatcher/app"
	"rolter.dev/pkg/natstest"
	"rolter.dev/pkg/porttest"
	"rolter.dev/tests/vllmsim"
)

// TestDataParallelReplica: a replica running two data-parallel ranks is two
// engines, each publishing its own KV events on the base port + rank and
// replaying on the replay port + rank, as vLLM's ZmqEventPublisher does
// (offset_endpoint_port). A watcher started after both ranks cached their
// prompts catches up from each rank's replay socket, and the proxies' index
// sees the union; one rank's restart leaves the other's blocks alone.
func TestDataParallelReplica(t *testing.T) {
	s := natstest.Start(t)
	ranks, pubPort, replayPort := dpRanks(t, 2)
	onRank0, onRank1 := prompt("rank-zero", 128), prompt("rank-one", 128)
	ranks[0].warm(onRank0)
	ranks[1].warm(onRank1)

	p := kvProvider("vllm-dp", fmt.Sprintf("tcp://127.0.0.1:%d", pubPort), fmt.Sprintf("tcp://127.0.0.1:%d", replayPort), time.Minute)
	p.KV.DataParallelSize = 2
	w := startWatcher(t, s, app.StaticSource{p})
	ix := newIndex(t, s, "vllm-dp")
	full := len(ids(onRank0))
	eventually(t, "both ranks' prompts through their replay sockets", 5*time.Second, func() bool {
		return ix.Fresh("vllm-dp") && ix.PrefixMatch("vllm-dp", ids(onRank0)) == full && ix.PrefixMatch("vllm-dp", ids(onRank1)) == full
	})
	// A replay is counted once its socket goes idle, after the blocks it
	// carried were published: the index can see them first.
	eventually(t, "one catch-up replay per rank", 5*time.Second, func() bool {
		return w.metric(t, "rolter_kvwatcher_replay_attempts_total", "kind", "catchup", "result", "ok") >= 2
	})
	if n := w.metric(t, "rolter_kvwatcher_replay_attempts_total", "kind", "catchup", "result", "ok"); n != 2 {
		t.Errorf("%v catch-up replays, want one per rank", n)
	}
	// Rank 1's engine restarts (its publisher starts again at sequence 0
	// with an empty cache): only its blocks leave the provider.
	ranks[1].restart(t)
	ranks[1].warm(prompt("rank-one-again", 64))
	eventually(t, "rank 1's old blocks gone", 5*time.Second, func() bool {
		return ix.PrefixMatch("vllm-dp", ids(onRank1)) == 0 && ix.PrefixMatch("vllm-dp", ids(prompt("rank-one-again", 64))) > 0
	})
	if got := ix.PrefixMatch("vllm-dp", ids(onRank0)); got != full {
		t.Fatalf("rank 0's blocks went with rank 1's restart: %d of %d", got, full)
	}
}

// dpRank is one data-parallel rank of a simulated replica: its own engine
// (prefix cache) and KV publisher.
type dpRank struct {
	*replica
	rank             int
	endpoint, replay string
}

// restart replaces the rank's engine and publisher by new ones on the same
// ports, as a restarted vLLM engine core does.
func (r *dpRank) restart(t *testing.T) {
	t.Helper()
	_ = r.pub.Close()
	for range 100 {
		next, err := newRankReplica(r.rank, r.endpoint, r.replay)
		if err == nil {
			t.Cleanup(func() { _ = next.pub.Close() })
			r.replica = next
			return
		}
		time.Sleep(10 * time.Millisecond) // the old sockets may linger a moment
	}
	t.Fatal("cannot restart the rank")
}

func newRankReplica(rank int, endpoint, replay string) (*replica, error) {
	pub, err := vllmsim.NewKVPublisher(vllmsim.KVPublisherOptions{Endpoint: endpoint, ReplayEndpoint: replay, DataParallelRank: rank})
	if err != nil {
		return nil, err
	}
	srv, err := vllmsim.New(vllmsim.Options{Models: []string{model}, Listener: pub})
	if err != nil {
		_ = pub.Close()
		return nil, err
	}
	return &replica{srv: srv, pub: pub}, nil
}

// dpRanks starts n ranks on consecutive loopback ports: rank r publishes on
// pubPort + r and replays on replayPort + r.
func dpRanks(t *testing.T, n int) (ranks []*dpRank, pubPort, replayPort int) {
	t.Helper()
	for range 50 {
		pubPort = porttest.Free(t, 2*n)
		replayPort = pubPort + n
		ranks = ranks[:0]
		ok := true
		for r := range n {
			ep, rep := fmt.Sprintf("tcp://127.0.0.1:%d", pubPort+r), fmt.Sprintf("tcp://127.0.0.1:%d", replayPort+r)
			rr, err := newRankReplica(r, ep, rep)
			if err != nil {
				ok = false
				break
			}
			ranks = append(ranks, &dpRank{replica: rr, rank: r, endpoint: ep, replay: rep})
		}
		if ok {
			for _, r := range ranks {
				t.Cleanup(func() { _ = r.pub.Close() })
			}
			return ranks, pubPort, replayPort
		}
		for _, r := range ranks {
			_ = r.pub.Close()
		}
	}
	t.Fatal("no free run of ports")
	return nil, 0, 0
}
