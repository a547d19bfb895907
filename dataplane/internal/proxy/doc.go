// Package proxy is the data plane's HTTP surface: the OpenAI and Anthropic
// endpoints, authentication with virtual keys, route selection, the retry
// loop with failover, and streaming relay of upstream responses.
//
// # Overview
//
// A request loads the current runtime (one config snapshot with its
// balancers) exactly once and uses it to the end, so a reload never changes
// a request midway. The flow is: request id → credentials → body (413, 408,
// 400; a refusal of an unread body is answered at once, see clientbody.go)
// → route (404) → key allow-lists (403) → attempts. Each attempt computes the
// eligible targets once (untried, allowed to the key, able to serve the
// endpoint, not parked, healthy, breaker closed) from atomic reads, asks the
// route's balancer, observes the pick, and sends. A retryable failure parks
// the target and, while nothing has reached the client, retries on an
// untried target after a jittered backoff; a body that breaks off is such a
// failure too. A response that breaks off after it has started cannot be
// retried: it ends with an error event (streams) and an aborted connection,
// never like a complete one. [Proxy.Halt], at the end of a drain, ends what
// still runs the same way, as 503 shutting_down, and as no verdict on the
// targets (nor a retry). If no target is eligible the attempt fails
// open past cooldown, health and breaker, never past the key's provider
// allow-list. Every write to the client is bounded by
// server.client_write_timeout_ms (clientwrite.go): a client that stops
// reading is cut off and its upstream request cancelled, as for a client
// that disconnects. A browser's CORS preflight to an API path is answered
// before all of it, and every other response of an API path gets its
// CORS headers as they go out (cors.go).
//
// # Concurrency
//
// [Proxy] is safe for concurrent use. The runtime is swapped atomically by
// [Proxy.Apply]; requests in flight finish on the runtime they started with.
package proxy
