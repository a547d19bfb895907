package watch_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"rolter.dev/controlplane/internal/etcdtest"
	"rolter.dev/controlplane/internal/metrics"
	"rolter.dev/controlplane/internal/state"
	"rolter.dev/controlplane/internal/store"
	"rolter.dev/controlplane/internal/watch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestWatch: the watcher publishes the listed state, then every change; a
// state that fails the consistency check (written behind the control
// plane's back) is counted and not published; a compaction past the
// watcher's revision makes it re-list.
func TestWatch(t *testing.T) {
	cli := etcdtest.Start(t)
	l := store.NewLayout("")
	m := metrics.New(prometheus.NewRegistry())
	var mu sync.Mutex
	var got []*state.State
	w := watch.New(cli, l, func(s *state.State) {
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
	}, m, slog.New(slog.DiscardHandler))
	latest := func() *state.State {
		mu.Lock()
		defer mu.Unlock()
		if len(got) == 0 {
			return nil
		}
		return got[len(got)-1]
	}
	wait := func(what string, cond func(*state.State) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for s := latest(); s == nil || !cond(s); s = latest() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: last published %+v", what, s)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	put := func(key, val string) int64 {
		t.Helper()
		resp, err := cli.Txn(t.Context()).Then(clientv3.OpPut(key, val), clientv3.OpPut(l.Marker(), "test")).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(ctx) })
	defer func() {
		cancel()
		wg.Wait()
	}()

	wait("initial empty state", func(s *state.State) bool { return s.Revision == 0 })
	provider := l.Key(state.ID{Kind: state.KindProvider, Name: "a"})
	rev := put(provider, "name = 'a'\nkind = 'openai_compatible'\napi_base = 'http://a'\n")
	wait("provider added", func(s *state.State) bool { return s.Revision == rev && len(s.Providers) == 1 })

	route := l.Key(state.ID{Kind: state.KindRoute, Name: "m"})
	bad := put(route, "model = 'm'\nstrategy = 'round_robin'\ntargets = [{ provider = 'ghost', weight = 1 }]\n")
	time.Sleep(100 * time.Millisecond)
	if s := latest(); s.Revision == bad {
		t.Fatal("an inconsistent state was published")
	}
	if testutil.ToFloat64(m.StatesRejected) < 1 {
		t.Error("rejected state not counted")
	}
	fixed := put(route, "model = 'm'\nstrategy = 'round_robin'\ntargets = [{ provider = 'a', weight = 1 }]\n")
	wait("fixed route published", func(s *state.State) bool { return s.Revision == fixed && len(s.Routes) == 1 })

	if _, err := cli.Txn(t.Context()).Then(clientv3.OpDelete(route), clientv3.OpPut(l.Marker(), "test")).Commit(); err != nil {
		t.Fatal(err)
	}
	wait("delete published", func(s *state.State) bool { return len(s.Routes) == 0 })
}
