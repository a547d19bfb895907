package app_test

import (
	"context"
	"log/slog"
	"rolter.dev/pkg/syncbuf"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"rolter.dev/controlplane/app"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// TestRefusedCallsAreCountedAndLogged: admin calls with no, a wrong or a
// node-only token are counted by reason (and by code among the admin
// requests) and logged without the token.
func TestRefusedCallsAreCountedAndLogged(t *testing.T) {
	reg := prometheus.NewRegistry()
	logs := &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(t.Context())
	a, err := app.Start(ctx, app.Options{
		Listen: "127.0.0.1:0", EmbedEtcdDir: t.TempDir(), EmbedEtcdListen: "127.0.0.1:0",
		AdminTokens: []string{adminToken}, NodeTokens: []string{nodeToken}, KeyPepper: []byte("pepper-0123456789abcdef"),
		Logger: slog.New(slog.NewJSONHandler(logs, nil)), Registerer: reg, Gatherer: reg,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := a.Wait(); err != nil {
			t.Errorf("control plane: %v", err)
		}
	}()
	const wrong = "wrong-token-0123456789"
	for _, tok := range []string{"", wrong, nodeToken, adminToken} {
		_, _ = pb.NewAdminServiceClient(dial(t, a.Addr().String(), tok)).ListRoutes(t.Context(), &pb.ListRoutesRequest{})
	}
	const text = `
# HELP rolter_controlplane_refused_requests_total Calls refused for their bearer token, by method and reason (missing, invalid, node_token).
# TYPE rolter_controlplane_refused_requests_total counter
rolter_controlplane_refused_requests_total{method="/rolter.controlplane.v1.AdminService/ListRoutes",reason="invalid"} 1
rolter_controlplane_refused_requests_total{method="/rolter.controlplane.v1.AdminService/ListRoutes",reason="missing"} 1
rolter_controlplane_refused_requests_total{method="/rolter.controlplane.v1.AdminService/ListRoutes",reason="node_token"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(text), "rolter_controlplane_refused_requests_total"); err != nil {
		t.Error(err)
	}
	const admin = `
# HELP rolter_controlplane_admin_requests_total Admin API calls by method and gRPC status code.
# TYPE rolter_controlplane_admin_requests_total counter
rolter_controlplane_admin_requests_total{code="OK",method="ListRoutes"} 1
rolter_controlplane_admin_requests_total{code="PermissionDenied",method="ListRoutes"} 1
rolter_controlplane_admin_requests_total{code="Unauthenticated",method="ListRoutes"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(admin), "rolter_controlplane_admin_requests_total"); err != nil {
		t.Error(err)
	}
	out := logs.String()
	for _, reason := range []string{"missing", "invalid", "node_token"} {
		found := false
		for _, line := range strings.Split(out, "\n") {
			found = found || strings.Contains(line, `"msg":"call refused"`) && strings.Contains(line, `"reason":"`+reason+`"`) &&
				strings.Contains(line, `"method":"/rolter.controlplane.v1.AdminService/ListRoutes"`)
		}
		if !found {
			t.Errorf("no refusal logged for %s:\n%s", reason, out)
		}
	}
	for _, tok := range []string{wrong, nodeToken, adminToken} {
		if strings.Contains(out, tok) {
			t.Errorf("a token is in the logs: %s", tok)
		}
	}
}
