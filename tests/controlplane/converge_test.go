package controlplane_test

import (
	"fmt"
	"path/filepath"
	"testing"

	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// openAuth opens a config that has no keys (server.require_auth defaults
// to true); the tests that send no key rely on it.
const openAuth = "[server]\nrequire_auth = false\n"

// twoProviders opens with openAuth: append no [server] table to it.
func twoProviders(a, b string) string {
	return openAuth + fmt.Sprintf(`
[[providers]]
name = "a"
kind = "openai_compatible"
api_base = %q

[[providers]]
name = "b"
kind = "openai_compatible"
api_base = %q
`, a, b)
}

// TestConvergence: two control planes on one etcd, two proxies each
// following a different one. A route applied through one control plane is
// served by both proxies within a second; a delete through the other takes
// effect the same way; Status lists both nodes at the new version.
func TestConvergence(t *testing.T) {
	etcd := startEtcd(t)
	cp1 := startControlPlane(t, etcd, "cp1")
	cp2 := startControlPlane(t, etcd, "cp2")
	dir := t.TempDir()
	p1 := startProxy(t, filepath.Join(dir, "p1.json"), pepper, cp1)
	p2 := startProxy(t, filepath.Join(dir, "p2.json"), pepper, cp2)
	ua, ub := upstream(t, "a"), upstream(t, "b")

	// m2 stays when m1 is deleted below: the last route cannot be.
	doc := twoProviders(ua, ub) + `
[[routes]]
model = "m1"
targets = [{ provider = "a" }]
[[routes]]
model = "m2"
targets = [{ provider = "a" }]
`
	resp, err := cp1.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: doc})
	if err != nil {
		t.Fatal(err)
	}
	// Two providers, two routes, and the settings (require_auth = false).
	if !resp.GetApplied() || len(resp.GetChanges()) != 5 {
		t.Fatalf("apply: %v", resp)
	}
	for _, p := range []*proxy{p1, p2} {
		eventually(t, converge, "route m1 served after apply", serves(p, "m1", "", "a"))
	}

	// Update through the other control plane: the target moves to b.
	upd := `{"model": "m1", "targets": [{"provider": "b"}], "strategy": "round_robin"}`
	if _, err := cp2.admin(t).UpdateRoute(ctx(t), &pb.UpdateRouteRequest{Route: &pb.Route{Model: "m1", Spec: mustStruct(t, upd)}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*proxy{p1, p2} {
		eventually(t, converge, "route m1 moved to b", serves(p, "m1", "", "b"))
	}

	del, err := cp2.admin(t).DeleteRoute(ctx(t), &pb.DeleteRouteRequest{Model: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*proxy{p1, p2} {
		eventually(t, converge, "route m1 gone after delete", serves(p, "m1", "", "404"))
	}

	want := fmt.Sprint(del.GetRevision())
	eventually(t, 3*converge, "status lists both nodes at the delete's version", func() error {
		st, err := cp1.admin(t).Status(ctx(t), &pb.StatusRequest{})
		if err != nil {
			return err
		}
		if len(st.GetNodes()) != 2 || len(st.GetControlplanes()) != 2 {
			return fmt.Errorf("status: %v", st)
		}
		for _, n := range st.GetNodes() {
			if n.GetAckedVersion() != want || n.GetState() != pb.NodeState_NODE_STATE_ACKED {
				return fmt.Errorf("node %s at %s (%s), want %s", n.GetNodeId(), n.GetAckedVersion(), n.GetState(), want)
			}
		}
		return nil
	})
}
