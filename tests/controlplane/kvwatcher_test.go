package controlplane_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	kvapp "rolter.dev/kvwatcher/app"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// TestKVWatcherFollowsControlPlane: a kvwatcher following the control plane
// learns the providers with KV events from the applied config, and follows
// a change.
func TestKVWatcherFollowsControlPlane(t *testing.T) {
	etcd := startEtcd(t)
	cp := startControlPlane(t, etcd, "cp")
	ua, ub := upstream(t, "a"), upstream(t, "b")
	doc := routeTo(ua, ub, "m1", "a") + `
[[providers]]
name = "vllm-kv"
kind = "openai_compatible"
api_base = "http://127.0.0.1:1"
[providers.kv_events]
endpoint = "tcp://127.0.0.1:5557"
`
	if _, err := cp.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: doc}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var names []string
	src := &kvapp.ControlPlaneSource{Addrs: []string{cp.addr}, Token: nodeToken, Logger: testLogger(t)}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = src.Run(runCtx, func(ps []kvapp.Provider) {
			mu.Lock()
			defer mu.Unlock()
			names = names[:0]
			for _, p := range ps {
				names = append(names, p.Name)
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	has := func(want ...string) func() error {
		return func() error {
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(names, want) {
				return fmt.Errorf("providers %v, want %v", names, want)
			}
			return nil
		}
	}
	eventually(t, 5*time.Second, "the watcher follows the applied provider", has("vllm-kv"))
	if _, err := cp.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: routeTo(ua, ub, "m1", "a")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the watcher drops the removed provider", has())
}
