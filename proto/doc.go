// Package proto holds rolter's .proto sources and, checked in beside them,
// the generated Go code, so building never needs protoc or buf.
//
// # Overview
//
// The control-plane API is package rolter.controlplane.v1, generated into
// rolter.dev/proto/rolter/controlplane/v1 (Go package controlplanev1).
// `make proto` regenerates it with buf, protoc-gen-go and protoc-gen-go-grpc
// pinned in tools/go.mod; a test in this module fails when a .proto file
// changed without regenerating (see genstamp.txt), and
// tests/proto compares the compiled .proto with the checked-in descriptor.
package proto
