// Package tools pins the code-generation and lint tools of the rolter
// workspace as `tool` directives in go.mod (buf, protoc-gen-go,
// protoc-gen-go-grpc, staticcheck). Run
// them with `go tool -modfile=tools/go.mod NAME` or from this directory with
// `go tool NAME`; they never enter a product module's go.mod.
package tools
