// Package tools pins the code-generation, lint and benchmark tools of the
// rolter workspace as `tool` directives in go.mod (buf, protoc-gen-go,
// protoc-gen-go-grpc, staticcheck, benchstat). go.work uses this module,
// so `go tool NAME` runs them from any module of the workspace; they never
// enter a product module's go.mod.
package tools
