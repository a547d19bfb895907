package controlplane_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// violationsOf returns the field paths and messages of an INVALID_ARGUMENT.
func violationsOf(t *testing.T, err error) []string {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		t.Fatalf("want INVALID_ARGUMENT, got %v", err)
	}
	var out []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField()+": "+v.GetDescription())
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no field violations in %v", err)
	}
	return out
}

// TestBadConfigRefused: a config with a missing provider, a bad strategy,
// an unknown key or broken TOML is refused with field paths, and nothing
// changes (the stored revision and every proxy's config stay as they were).
func TestBadConfigRefused(t *testing.T) {
	etcd := startEtcd(t)
	cp := startControlPlane(t, etcd, "cp")
	p := startProxy(t, filepath.Join(t.TempDir(), "p.json"), pepper, cp)
	ua, ub := upstream(t, "a"), upstream(t, "b")
	good := twoProviders(ua, ub) + "[[routes]]\nmodel = \"m1\"\ntargets = [{ provider = \"a\" }]\n"
	admin := cp.admin(t)
	applied, err := admin.Apply(ctx(t), &pb.ApplyRequest{ConfigToml: good})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, converge, "good config served", serves(p, "m1", "", "a"))

	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{
			name: "error: route names a missing provider",
			doc:  twoProviders(ua, ub) + "[[routes]]\nmodel = \"m1\"\ntargets = [{ provider = \"b\" }, { provider = \"ghost\" }]\n",
			want: []string{`routes[0].targets[1].provider: unknown provider "ghost"`},
		},
		{
			name: "error: unknown strategy",
			doc:  twoProviders(ua, ub) + "[[routes]]\nmodel = \"m1\"\nstrategy = \"fastest\"\ntargets = [{ provider = \"b\" }]\n",
			want: []string{`routes[0].strategy: unknown strategy "fastest"`},
		},
		{
			name: "error: unknown key",
			doc:  twoProviders(ua, ub) + "[[routes]]\nmodel = \"m1\"\ntargets = [{ provider = \"b\", wieght = 2 }]\n",
			want: []string{`routes[0].targets[0].wieght: unknown key (did you mean "weight"?)`},
		},
		{
			name: "error: a config without routes (an empty file)",
			doc:  "",
			want: []string{"routes: no routes"},
		},
		{
			name: "error: malformed TOML",
			doc:  "[[routes]\nmodel = \n",
			want: []string{"line 1"},
		},
		{
			name: "error: server.key_pepper is the control plane's secret",
			doc:  strings.Replace(good, openAuth, openAuth+"key_pepper = \"0123456789abcdef\"\n", 1),
			want: []string{"server.key_pepper: not accepted by the control plane"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, dry := range []bool{true, false} {
				_, err := admin.Apply(ctx(t), &pb.ApplyRequest{ConfigToml: tc.doc, DryRun: dry})
				got := strings.Join(violationsOf(t, err), "\n")
				for _, w := range tc.want {
					if !strings.Contains(got, w) {
						t.Errorf("dry_run=%v: missing %q in:\n%s", dry, w, got)
					}
				}
			}
			v, err := admin.Validate(ctx(t), &pb.ValidateRequest{ConfigToml: tc.doc})
			if err != nil || v.GetValid() || len(v.GetViolations()) == 0 {
				t.Errorf("validate: %v, %v", v, err)
			}
		})
	}
	cfg, err := admin.GetConfig(ctx(t), &pb.GetConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GetRevision() != applied.GetRevision() {
		t.Errorf("refused configs changed the revision: %d, want %d", cfg.GetRevision(), applied.GetRevision())
	}
	if err := serves(p, "m1", "", "a")(); err != nil {
		t.Errorf("proxy changed: %v", err)
	}

	// Object writes are checked against the whole config too.
	_, err = admin.CreateRoute(ctx(t), &pb.CreateRouteRequest{Route: &pb.Route{Model: "m2",
		Spec: mustStruct(t, `{"targets": [{"provider": "ghost"}]}`)}})
	if got := strings.Join(violationsOf(t, err), "\n"); !strings.Contains(got, `routes["m2"].targets[0].provider: unknown provider "ghost"`) {
		t.Errorf("create route: %s", got)
	}
	_, err = admin.DeleteProvider(ctx(t), &pb.DeleteProviderRequest{Name: "a"})
	if got := strings.Join(violationsOf(t, err), "\n"); !strings.Contains(got, `routes["m1"].targets[0].provider: unknown provider "a"`) {
		t.Errorf("delete referenced provider: %s", got)
	}

	// A dry run reports the diff and changes nothing.
	next := twoProviders(ua, ub) + "[[routes]]\nmodel = \"m1\"\nstrategy = \"random\"\ntargets = [{ provider = \"a\" }]\n"
	dry, err := admin.Apply(ctx(t), &pb.ApplyRequest{ConfigToml: next, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if dry.GetApplied() || len(dry.GetChanges()) != 1 || dry.GetChanges()[0].GetFields()[0].GetPath() != "strategy" ||
		dry.GetChanges()[0].GetFields()[0].GetAfter() != `"random"` {
		t.Errorf("dry run: %v", dry)
	}
	again, err := admin.Apply(ctx(t), &pb.ApplyRequest{ConfigToml: good})
	if err != nil || again.GetApplied() || again.GetRevision() != applied.GetRevision() {
		t.Errorf("re-applying the same config: %v, %v", again, err)
	}
}

// TestConcurrentUpdates: two clients update one route from the same
// revision; exactly one wins and the other gets ABORTED, so no update is
// lost. An Apply against a stale revision is refused the same way.
func TestConcurrentUpdates(t *testing.T) {
	etcd := startEtcd(t)
	cp1 := startControlPlane(t, etcd, "cp1")
	cp2 := startControlPlane(t, etcd, "cp2")
	ua, ub := upstream(t, "a"), upstream(t, "b")
	doc := twoProviders(ua, ub) + "[[routes]]\nmodel = \"m1\"\ntargets = [{ provider = \"a\" }]\n"
	applied, err := cp1.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: doc})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		got, err := cp1.admin(t).GetRoute(ctx(t), &pb.GetRouteRequest{Model: "m1"})
		if err != nil {
			t.Fatal(err)
		}
		rev := got.GetRoute().GetModRevision()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, c := range []*controlPlane{cp1, cp2} {
			admin := c.admin(t)
			provider := []string{"a", "b"}[i]
			wg.Go(func() {
				_, errs[i] = admin.UpdateRoute(ctx(t), &pb.UpdateRouteRequest{ExpectedRevision: rev, Route: &pb.Route{
					Model: "m1", Spec: mustStruct(t, fmt.Sprintf(`{"targets": [{"provider": %q, "weight": %d}]}`, provider, round+2)),
				}})
			})
		}
		wg.Wait()
		var won, lost int
		for _, err := range errs {
			switch status.Code(err) {
			case codes.OK:
				won++
			case codes.Aborted:
				lost++
				if !strings.Contains(err.Error(), "changed by another writer") {
					t.Errorf("conflict message: %v", err)
				}
			default:
				t.Fatalf("unexpected: %v", err)
			}
		}
		if won != 1 || lost != 1 {
			t.Fatalf("round %d: %d won, %d lost: %v", round, won, lost, errs)
		}
	}
	_, err = cp2.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: doc, ExpectedRevision: applied.GetRevision()})
	if status.Code(err) != codes.Aborted {
		t.Errorf("apply at a stale revision: %v", err)
	}
	_, err = cp2.admin(t).CreateRoute(ctx(t), &pb.CreateRouteRequest{Route: &pb.Route{Model: "m1", Spec: mustStruct(t, `{"targets": [{"provider": "a"}]}`)}})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("create existing: %v", err)
	}
	_, err = cp2.admin(t).GetRoute(ctx(t), &pb.GetRouteRequest{Model: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("get missing: %v", err)
	}
}

// TestAdminNeedsToken: admin calls without a valid token are refused; a
// node token may follow snapshots but not administer.
func TestAdminNeedsToken(t *testing.T) {
	etcd := startEtcd(t)
	cp := startControlPlane(t, etcd, "cp")
	tests := []struct {
		name  string
		token string
		want  codes.Code
	}{
		{name: "error: no token", token: "", want: codes.Unauthenticated},
		{name: "error: wrong token", token: "not-the-admin-token-at-all", want: codes.Unauthenticated},
		{name: "error: node token on the admin API", token: nodeToken, want: codes.PermissionDenied},
		{name: "ok: admin token", token: adminToken, want: codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			admin := adminClient(t, cp.addr, tc.token)
			_, err := admin.ListRoutes(ctx(t), &pb.ListRoutesRequest{})
			if status.Code(err) != tc.want {
				t.Errorf("list routes: %v, want %v", err, tc.want)
			}
			_, err = admin.Apply(ctx(t), &pb.ApplyRequest{ConfigToml: routeTo("http://127.0.0.1:9", "http://127.0.0.1:9", "m1", "a")})
			if status.Code(err) != tc.want {
				t.Errorf("apply: %v, want %v", err, tc.want)
			}
		})
	}
	// The snapshot stream needs a token too.
	stream, err := pbSnapshot(t, cp.addr, "").Watch(ctx(t))
	if err == nil {
		_ = stream.Send(&pb.WatchRequest{Node: &pb.NodeInfo{Id: "intruder"}})
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("watch without token: %v", err)
	}
	var st interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &st) {
		t.Errorf("not a status: %v", err)
	}
}
