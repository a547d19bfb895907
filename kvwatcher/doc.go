// Package kvwatcher will hold the service that subscribes to vLLM ZMQ KV
// events and polls LMCache occupancy, and publishes compact per-provider
// deltas over NATS. Not built yet; see the issues.
package kvwatcher
