// Package proto holds rolter's .proto sources and, checked in beside them,
// the generated Go code, so building never needs protoc or buf.
//
// # Overview
//
// Three packages, each generated into rolter.dev/proto/<path> (Go package
// <name><version>):
//
//   - rolter.controlplane.v1: the control plane's admin and snapshot gRPC
//     services (controlplanev1).
//   - rolter.kv.v1: the KV-cache deltas rolter-kvwatcher publishes over NATS
//     and proxies apply (kvv1; see rolter.dev/pkg/kvdelta).
//   - rolter.fleet.v1: what proxies tell one another over NATS to route as
//     one, routing observations and in-flight counts (fleetv1; see
//     rolter.dev/pkg/fleet).
//
// `make proto` regenerates them with buf, protoc-gen-go and protoc-gen-go-grpc
// pinned in tools/go.mod; a test in this module fails when a .proto file
// changed without regenerating (see genstamp.txt), and
// tests/proto compares the compiled .proto with the checked-in descriptor.
package proto
