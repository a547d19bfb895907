package app_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"rolter.dev/controlplane/app"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	adminToken = "admin-token-0123456789"
	nodeToken  = "node-token-0123456789"
)

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

func dial(t *testing.T, addr, token string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(token)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

const doc = `
[[providers]]
name = "a"
kind = "openai_compatible"
api_base = "http://127.0.0.1:9"

[[routes]]
model = %q
targets = [{ provider = "a" }]
`

// spans polls the exporter until want finds a span (the control plane ends
// push spans on its own goroutines), failing when the test's context ends.
func span(t *testing.T, ctx context.Context, exp *tracetest.InMemoryExporter, what string, want func(tracetest.SpanStub) bool) tracetest.SpanStub {
	t.Helper()
	for {
		for _, s := range exp.GetSpans() {
			if want(s) {
				return s
			}
		}
		select {
		case <-ctx.Done():
			var names []string
			for _, s := range exp.GetSpans() {
				names = append(names, fmt.Sprintf("%s%v", s.Name, s.Attributes))
			}
			t.Fatalf("no span %s among %s", what, strings.Join(names, "; "))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		out[kv.Key] = kv.Value
	}
	return out
}

func has(s tracetest.SpanStub, key, value string) bool {
	v, ok := attrs(s)[attribute.Key(key)]
	return ok && v.String() == value
}

// TestTraces: an admin apply and every snapshot push to a node are spans
// with the config version, the node and its answer (ack, or nack with the
// node's reason).
func TestTraces(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ctx, cancel := context.WithCancel(t.Context())
	a, err := app.Start(ctx, app.Options{
		Listen: "127.0.0.1:0", EmbedEtcdDir: t.TempDir(), EmbedEtcdListen: "127.0.0.1:0",
		AdminTokens: []string{adminToken}, NodeTokens: []string{nodeToken}, KeyPepper: []byte("pepper-0123456789abcdef"),
		ID: "cp-1", Logger: slog.New(slog.DiscardHandler), TracerProvider: tp,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := a.Wait(); err != nil {
			t.Errorf("control plane: %v", err)
		}
	})
	wait, waitCancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer waitCancel()

	admin := pb.NewAdminServiceClient(dial(t, a.Addr().String(), adminToken))
	applied, err := admin.Apply(wait, &pb.ApplyRequest{ConfigToml: fmt.Sprintf(doc, "m1")})
	if err != nil {
		t.Fatal(err)
	}
	rev1 := fmt.Sprint(applied.GetRevision())
	s := span(t, wait, exp, "admin.Apply", func(s tracetest.SpanStub) bool { return s.Name == "admin.Apply" })
	if !has(s, "rolter.admin.method", "Apply") || !has(s, "rolter.config.revision", rev1) || !has(s, "rolter.admin.code", "OK") ||
		!has(s, "rolter.config.applied", "true") || !has(s, "rolter.config.changes", "2") || !has(s, "rolter.admin.dry_run", "false") {
		t.Errorf("admin.Apply attributes: %v", s.Attributes)
	}

	// A refused write is a span with the error.
	if _, err := admin.Apply(wait, &pb.ApplyRequest{ConfigToml: "bogus = 1"}); err == nil {
		t.Fatal("a bad apply succeeded")
	}
	s = span(t, wait, exp, "a refused admin.Apply", func(s tracetest.SpanStub) bool {
		return s.Name == "admin.Apply" && has(s, "rolter.admin.code", "InvalidArgument")
	})
	if s.Status.Code != otelcodes.Error {
		t.Errorf("refused apply: status %v", s.Status)
	}

	// A put (UpdateRoute) is a span too, with the revision it wrote.
	route, err := admin.GetRoute(wait, &pb.GetRouteRequest{Model: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	up, err := admin.UpdateRoute(wait, &pb.UpdateRouteRequest{Route: route.GetRoute()})
	if err != nil {
		t.Fatal(err)
	}
	s = span(t, wait, exp, "admin.UpdateRoute", func(s tracetest.SpanStub) bool { return s.Name == "admin.UpdateRoute" })
	if !has(s, "rolter.config.revision", fmt.Sprint(up.GetRoute().GetModRevision())) || !has(s, "rolter.admin.method", "UpdateRoute") {
		t.Errorf("admin.UpdateRoute attributes: %v (route mod_revision %d)", s.Attributes, up.GetRoute().GetModRevision())
	}
	for _, s := range exp.GetSpans() {
		if strings.HasPrefix(s.Name, "admin.Get") {
			t.Errorf("a read is traced as a write: %s", s.Name)
		}
	}

	// A node: it acks the first snapshot and nacks the next.
	stream, err := pb.NewSnapshotServiceClient(dial(t, a.Addr().String(), nodeToken)).Watch(wait)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.WatchRequest{Node: &pb.NodeInfo{Id: "proxy-7", Role: pb.NodeRole_NODE_ROLE_DATAPLANE}}); err != nil {
		t.Fatal(err)
	}
	// The control plane's state follows etcd asynchronously, so a node that
	// connects right after a write may first get an older snapshot and then
	// the current one: ack each until the one with the last write.
	var first *pb.WatchResponse
	var sent []string
	for first.GetRevision() < up.GetRoute().GetModRevision() {
		if first, err = stream.Recv(); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, first.GetVersionInfo())
		if err := stream.Send(&pb.WatchRequest{VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	isPush := func(version, result string) func(tracetest.SpanStub) bool {
		return func(s tracetest.SpanStub) bool {
			return s.Name == "push.snapshot" && has(s, "rolter.config.version", version) && has(s, "rolter.push.result", result)
		}
	}
	s = span(t, wait, exp, "an acked push.snapshot", isPush(first.GetVersionInfo(), "ack"))
	for k, v := range map[string]string{
		"rolter.node.id": "proxy-7", "rolter.node.role": "dataplane", "rolter.controlplane.id": "cp-1",
		"rolter.node.version": first.GetVersionInfo(), "rolter.config.revision": fmt.Sprint(first.GetRevision()),
	} {
		if !has(s, k, v) {
			t.Errorf("acked push: %s is not %q: %v", k, v, s.Attributes)
		}
	}
	if _, ok := attrs(s)["rolter.push.nack_reason"]; ok {
		t.Errorf("acked push with a nack reason: %v", s.Attributes)
	}

	if _, err := admin.Apply(wait, &pb.ApplyRequest{ConfigToml: fmt.Sprintf(doc, "m2")}); err != nil {
		t.Fatal(err)
	}
	second, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.WatchRequest{VersionInfo: first.GetVersionInfo(), ResponseNonce: second.GetNonce(),
		ErrorDetail: &pb.ErrorDetail{Message: "routes[0].model: not today"}}); err != nil {
		t.Fatal(err)
	}
	s = span(t, wait, exp, "a nacked push.snapshot", isPush(second.GetVersionInfo(), "nack"))
	if !has(s, "rolter.push.nack_reason", "routes[0].model: not today") || !has(s, "rolter.node.version", first.GetVersionInfo()) {
		t.Errorf("nacked push attributes: %v", s.Attributes)
	}
	if s.Status.Code != otelcodes.Error {
		t.Errorf("nacked push: status %v", s.Status)
	}
	// One push span per snapshot sent.
	var pushes []string
	for _, s := range exp.GetSpans() {
		if s.Name == "push.snapshot" {
			pushes = append(pushes, attrs(s)["rolter.config.version"].String())
		}
	}
	if want := append(sent, second.GetVersionInfo()); !slices.Equal(pushes, want) {
		t.Errorf("push spans for versions %v, want %v", pushes, want)
	}
}
