package auth

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestCheck(t *testing.T) {
	tokens, err := New([]string{"admin-token-0000001", "admin-token-0000002"}, []string{"node-token-00000001"})
	if err != nil {
		t.Fatal(err)
	}
	const (
		adminMethod = "/rolter.controlplane.v1.AdminService/ListRoutes"
		watch       = "/rolter.controlplane.v1.SnapshotService/Watch"
		health      = "/grpc.health.v1.Health/Check"
		unknown     = "/other.Service/Call"
	)
	tests := []struct {
		name   string
		method string
		auth   string
		want   codes.Code
	}{
		{name: "ok: admin token, admin method", method: adminMethod, auth: "Bearer admin-token-0000001", want: codes.OK},
		{name: "ok: second admin token", method: adminMethod, auth: "Bearer admin-token-0000002", want: codes.OK},
		{name: "ok: admin token may watch", method: watch, auth: "Bearer admin-token-0000001", want: codes.OK},
		{name: "ok: node token may watch", method: watch, auth: "Bearer node-token-00000001", want: codes.OK},
		{name: "ok: health needs no token", method: health, want: codes.OK},
		{name: "error: node token on an admin method", method: adminMethod, auth: "Bearer node-token-00000001", want: codes.PermissionDenied},
		{name: "error: no token", method: adminMethod, want: codes.Unauthenticated},
		{name: "error: no token on watch", method: watch, want: codes.Unauthenticated},
		{name: "error: wrong token", method: adminMethod, auth: "Bearer admin-token-0000003", want: codes.Unauthenticated},
		{name: "error: not a bearer", method: adminMethod, auth: "Basic admin-token-0000001", want: codes.Unauthenticated},
		{name: "error: unknown services need an admin token", method: unknown, auth: "Bearer node-token-00000001", want: codes.PermissionDenied},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.auth != "" {
				ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", tc.auth))
			}
			if got := status.Code(tokens.check(ctx, tc.method)); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNewRefusesWeakConfig(t *testing.T) {
	if _, err := New(nil, []string{"node-token-00000001"}); err == nil {
		t.Error("no admin token accepted")
	}
	if _, err := New([]string{"short"}, nil); err == nil {
		t.Error("a short token accepted")
	}
}
