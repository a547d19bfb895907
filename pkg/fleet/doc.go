// Package fleet makes several rolter proxies behind an L4 balancer route as
// well as one. Each proxy is a [Node]; nodes tell one another, over NATS
// (or, in the routing simulator, over a modelled delay), what they routed
// where and how much they have in flight, and fold what their peers say into
// their own balancers.
//
// # What is shared
//
// Affinity: a route whose balancer keeps a prefix tree (cache_aware, the
// pipeline's prefix_cache scorer) is built with routing.Spec.Share set to
// [Route.Record], which queues each local pick. Every flush interval (25 ms
// by default) the node records the queued picks in the balancer's shared
// index, off the request path, collects the prompt-prefix hashes worth
// publishing (rolter.dev/pkg/chunkindex: 8 bytes per new 64 bytes of
// prompt, and a hot prefix about once per half index window) and publishes
// them per route and target in one rolter.fleet.v1.Observations message. A receiver folds each target's hashes into its balancer's shared
// index, which cache_aware consults next to its own tree, so the match
// fraction it compares against its threshold reflects what the whole fleet
// sent to each replica.
//
// Queued prefill: a route whose balancer predicts from the prefill queued
// at each target (predicted_ttft, routing.SharedQueue) is connected with
// [Route.SetQueue]. Every queue interval (5 ms), while at least one route
// is so connected (the ticker does not run otherwise), the node publishes, per
// target with anything pending (and once after its queue empties, or after
// a first token there), what that balancer has pending: requests, tokens,
// the oldest's tokens and age, and the age of its last first token there,
// as Observations.queues, valid for 3 intervals. A receiver hands each
// report to its balancer, which adds the peers' queues to its own. A
// balancer that also shares its speculation ([Speculation],
// routing.SharedSpeculation) adds to each target's report the KV block
// identities its picks speculated there since the last one, which the
// receiver's balancer speculates too. One that shares its arrivals
// ([Arrivals], routing.SharedArrivals) adds the ages of the requests that
// reached it since its last report (at most 1,024, 4 bytes each), from
// which the receiver's balancer learns whether the fleet's requests come in
// bursts that no single proxy receives two of; the receiver ages them by
// the sender's trip (below). A balancer may also ask for its queue report
// to leave at once, between ticks (routing.ReportTrigger; [Node.Urgent]):
// predicted_ttft does for each pick of a burst, so that its turns last a
// couple of trips rather than two intervals.
//
// Load: every load interval (100 ms) each node publishes its in-flight count
// per route target (rolter.fleet.v1.Loads, which doubles as a heartbeat).
// [Route.PeerLoad] is the sum of the latest counts of the peers heard within
// their report's TTL; the data plane adds it to its own live count before a
// pick, so the load guard and least load see the fleet's load. The peers
// whose counts for a route are live also give the node its place among the
// route's nodes (its rank by id, their number), handed to a queue balancer
// (routing.SharedQueue.SetPlace) whenever it changes: predicted_ttft breaks
// ties on its own share of the targets first, so that the proxies' picks of
// one burst do not collide.
//
// Trip: each load report also echoes every live peer's latest (its seq and
// how long it was held). A node hearing the echo of one of its own reports
// takes the round trip on its own clock, less the time held, smoothed as
// TCP does; half the longest to a live peer is its trip ([Stats].Trip),
// handed to a balancer that paces its turns by it (routing.ReportPacer).
//
// Routes are matched by name and layout (a digest of strategy, parameters and
// ordered targets): during a rolling config change an entry for another
// layout is dropped and counted, never applied to the wrong target.
//
// # Failure behaviour
//
// Nothing on the request path waits for the network: Record appends to a
// bounded queue (a full queue drops and counts), PeerLoad reads an atomic. With NATS down or a peer silent, a
// peer's loads expire after their TTL and the node routes on its own view;
// shared prefixes age out through the same LRU ceiling as the proxy's own.
// A node that binds a route it did not have (at start, or a config change
// adding one) asks its peers for a snapshot of their shared index (request
// and reply, one peer answers) and folds it, so a new proxy starts warm.
//
// # Subjects
//
// rolter.fleet.v1.<group>.obs, .load and .snap; the group (default
// "default") keeps separate fleets on one NATS apart.
package fleet
