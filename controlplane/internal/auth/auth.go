// Package auth checks the bearer tokens of control-plane calls.
//
// # Overview
//
// Two token sets: admin tokens may call everything; node tokens may only
// follow snapshots (data planes and kvwatchers need no admin rights). Each
// set may hold several tokens, so tokens can be rotated without downtime.
// Tokens are kept as SHA-256 digests and compared in constant time. gRPC
// health and reflection need no token, so probes and grpcurl's listing
// work; every other method without a valid token is refused with
// UNAUTHENTICATED (no or unknown token) or PERMISSION_DENIED (a node token
// on an admin method).
package auth

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Tokens holds the accepted tokens. It is immutable after [New] (and
// [Tokens.OnRefusal], called before serving).
type Tokens struct {
	admin   [][sha256.Size]byte
	node    [][sha256.Size]byte
	refused func(ctx context.Context, method string, reason Reason)
}

// Reason is why a call was refused.
type Reason string

// The reasons of a refusal.
const (
	ReasonMissing   Reason = "missing"    // no bearer token
	ReasonInvalid   Reason = "invalid"    // a token of neither set
	ReasonNodeToken Reason = "node_token" // a node token on an admin method
)

// OnRefusal makes every refused call also call f (to count and log it; f
// never sees the token). Call it before serving.
func (t *Tokens) OnRefusal(f func(ctx context.Context, method string, reason Reason)) { t.refused = f }

// MinTokenLength is the shortest token accepted.
const MinTokenLength = 16

// New returns the token sets. Every admin token is also accepted for the
// snapshot service.
func New(admin, node []string) (*Tokens, error) {
	t := &Tokens{}
	for _, tok := range admin {
		if len(tok) < MinTokenLength {
			return nil, fmt.Errorf("auth: an admin token is shorter than %d characters", MinTokenLength)
		}
		t.admin = append(t.admin, sha256.Sum256([]byte(tok)))
	}
	for _, tok := range node {
		if len(tok) < MinTokenLength {
			return nil, fmt.Errorf("auth: a node token is shorter than %d characters", MinTokenLength)
		}
		t.node = append(t.node, sha256.Sum256([]byte(tok)))
	}
	if len(t.admin) == 0 {
		return nil, errors.New("auth: no admin token")
	}
	return t, nil
}

// ReadFile reads tokens from a file, one per line; blank lines and lines
// starting with # are skipped.
func ReadFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth: read %s: %w", path, err)
	}
	return out, nil
}

// SplitList splits a comma-separated token list (an environment variable).
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

type level int

const (
	open level = iota
	node
	admin
)

// required maps a full method name to the token it needs.
func required(method string) level {
	switch {
	case strings.HasPrefix(method, "/grpc.health.v1.Health/"),
		strings.HasPrefix(method, "/grpc.reflection.v1.ServerReflection/"),
		strings.HasPrefix(method, "/grpc.reflection.v1alpha.ServerReflection/"):
		return open
	case strings.HasPrefix(method, "/rolter.controlplane.v1.SnapshotService/"):
		return node
	default:
		return admin
	}
}

func matches(set [][sha256.Size]byte, d [sha256.Size]byte) bool {
	ok := 0
	for i := range set {
		ok |= subtle.ConstantTimeCompare(set[i][:], d[:])
	}
	return ok == 1
}

// check authorizes a call to method with the metadata in ctx, reporting a
// refusal to the OnRefusal hook.
func (t *Tokens) check(ctx context.Context, method string) error {
	reason, err := t.authorize(ctx, method)
	if err != nil && t.refused != nil {
		t.refused(ctx, method, reason)
	}
	return err
}

func (t *Tokens) authorize(ctx context.Context, method string) (Reason, error) {
	need := required(method)
	if need == open {
		return "", nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var tok string
	for _, v := range md.Get("authorization") {
		if rest, ok := strings.CutPrefix(v, "Bearer "); ok {
			tok = strings.TrimSpace(rest)
		} else if rest, ok := strings.CutPrefix(v, "bearer "); ok {
			tok = strings.TrimSpace(rest)
		}
	}
	if tok == "" {
		return ReasonMissing, status.Error(codes.Unauthenticated, "missing bearer token (authorization: Bearer <token>)")
	}
	d := sha256.Sum256([]byte(tok))
	isAdmin := matches(t.admin, d)
	switch {
	case isAdmin:
		return "", nil
	case matches(t.node, d):
		if need == node {
			return "", nil
		}
		return ReasonNodeToken, status.Error(codes.PermissionDenied, "a node token may only follow snapshots")
	}
	return ReasonInvalid, status.Error(codes.Unauthenticated, "invalid bearer token")
}

// UnaryInterceptor refuses unary calls without the token their method needs.
func (t *Tokens) UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := t.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// StreamInterceptor refuses streams without the token their method needs.
func (t *Tokens) StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := t.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
