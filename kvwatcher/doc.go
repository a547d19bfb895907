// Package kvwatcher is the module of rolter-kvwatcher, the service that
// subscribes to vLLM ZMQ KV events and polls LMCache occupancy, and
// publishes compact per-provider deltas over NATS (see
// rolter.dev/pkg/kvdelta) that every proxy applies to its index
// (rolter.dev/pkg/kvindex). The service is in package app; cmd/ holds the
// binary.
package kvwatcher
