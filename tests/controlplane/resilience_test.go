package controlplane_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	pb "rolter.dev/proto/rolter/controlplane/v1"
)

func routeTo(ua, ub, model, provider string) string {
	return twoProviders(ua, ub) + fmt.Sprintf("[[routes]]\nmodel = %q\ntargets = [{ provider = %q }]\n", model, provider)
}

// TestControlPlaneKilled: with its control plane gone a proxy keeps
// serving its last snapshot; a proxy that knows two control planes fails
// over to the other; when the control plane comes back on its address the
// proxies reconnect and converge on changes made meanwhile.
func TestControlPlaneKilled(t *testing.T) {
	etcd := startEtcd(t)
	cp1 := startControlPlane(t, etcd, "cp1")
	cp2 := startControlPlane(t, etcd, "cp2")
	dir := t.TempDir()
	alone := startProxy(t, filepath.Join(dir, "alone.json"), pepper, cp1)
	both := startProxy(t, filepath.Join(dir, "both.json"), pepper, cp1, cp2)
	ua, ub := upstream(t, "a"), upstream(t, "b")
	if _, err := cp2.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: routeTo(ua, ub, "m1", "a")}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*proxy{alone, both} {
		eventually(t, converge, "served before the kill", serves(p, "m1", "", "a"))
	}

	cp1.kill()
	for range 20 { // keeps serving while disconnected
		for _, p := range []*proxy{alone, both} {
			if err := serves(p, "m1", "", "a")(); err != nil {
				t.Fatalf("proxy stopped serving without its control plane: %v", err)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := cp2.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: routeTo(ua, ub, "m1", "b")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*converge, "the proxy with a second address fails over", serves(both, "m1", "", "b"))
	if err := serves(alone, "m1", "", "a")(); err != nil {
		t.Fatalf("the lone proxy should still serve its last snapshot: %v", err)
	}

	cp1.start()
	eventually(t, 2*converge, "the lone proxy reconnects and converges", serves(alone, "m1", "", "b"))
	if _, err := cp1.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: routeTo(ua, ub, "m2", "a")}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*proxy{alone, both} {
		eventually(t, converge, "both converge after the restart", serves(p, "m2", "", "a"))
	}
}

// TestEtcdRestarted: when etcd goes away the control plane keeps serving
// its last snapshot and answers admin calls with UNAVAILABLE; when etcd
// comes back it recovers by itself, and a change made then reaches the
// proxies.
func TestEtcdRestarted(t *testing.T) {
	etcd := startEtcd(t)
	cp := startControlPlane(t, etcd, "cp")
	p := startProxy(t, filepath.Join(t.TempDir(), "p.json"), pepper, cp)
	ua, ub := upstream(t, "a"), upstream(t, "b")
	if _, err := cp.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: routeTo(ua, ub, "m1", "a")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, converge, "served before the etcd restart", serves(p, "m1", "", "a"))

	etcd.stop()
	short, cancel := contextWithTimeout(t, 500*time.Millisecond)
	_, err := cp.admin(t).ListRoutes(short, &pb.ListRoutesRequest{})
	cancel()
	if err == nil {
		t.Fatal("list routes succeeded with etcd down")
	}
	if err := serves(p, "m1", "", "a")(); err != nil {
		t.Fatalf("proxy stopped serving while etcd was down: %v", err)
	}

	etcd.start()
	eventually(t, 10*time.Second, "admin calls work again", func() error {
		c, cancel := contextWithTimeout(t, time.Second)
		defer cancel()
		_, err := cp.admin(t).Apply(c, &pb.ApplyRequest{ConfigToml: routeTo(ua, ub, "m1", "b")})
		return err
	})
	eventually(t, 2*converge, "the change made after the restart is pushed", serves(p, "m1", "", "b"))
}

// TestProxyRestartsFromCache: a proxy restarted while no control plane is
// up serves the snapshot it cached on disk, and follows again once one is.
func TestProxyRestartsFromCache(t *testing.T) {
	etcd := startEtcd(t)
	cp := startControlPlane(t, etcd, "cp")
	cache := filepath.Join(t.TempDir(), "snapshot.json")
	p := startProxy(t, cache, pepper, cp)
	ua, ub := upstream(t, "a"), upstream(t, "b")
	if _, err := cp.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: routeTo(ua, ub, "m1", "a")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, converge, "served before the restart", serves(p, "m1", "", "a"))

	p.stop()
	cp.kill()
	p.opts.Listen = "127.0.0.1:0"
	p.start()
	if err := serves(p, "m1", "", "a")(); err != nil {
		t.Fatalf("restarted proxy does not serve its cached snapshot: %v", err)
	}

	cp.start()
	if _, err := cp.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: routeTo(ua, ub, "m1", "b")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*converge, "follows again once the control plane is back", serves(p, "m1", "", "b"))
}
