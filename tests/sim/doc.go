// Package sim is rolter's offline routing simulator: an event-driven,
// seeded simulation (a virtual clock, nothing sleeps) of clients sending a
// workload through one or more proxies to N simulated vLLM replicas, run once
// per routing strategy so that the strategies are compared on identical
// traffic. cmd/rolter-sim is its command line; docs/routing.md has the model,
// the peers' constants with their sources, and the results.
//
// # Replicas
//
// Each replica has the vLLM simulator's prefix cache ([vllmsim.Cache]: full
// blocks of Config.BlockSize tokens addressed by chained hashes, LRU over
// Config.CapacityBlocks, blocks pinned while their request runs) and a
// service-time model: at most Config.MaxBatch requests run, the rest wait
// first in first out (with Config.KVAdmission also until their prompt's
// blocks fit beside the running requests', as vLLM's scheduler holds them;
// without it a request runs whatever the cache holds, and its blocks that
// find no room are not cached); an admitted request is looked up in the cache and
// prefills its uncached tokens at Config.PrefillPerToken each plus
// Config.PrefillBase, one request at a time per replica (prefill is compute
// bound; Config.ParallelPrefill gives the vLLM simulator's independent
// prefills), then decodes its output at Config.DecodePerToken per token.
// Config.DecodeGrowth lengthens every step by that much per other request
// running at the replica (steps that slow with the batch, as vLLM's do):
// each output token, and the step that gives the first token.
// Prompt token ids are exactly vllmsim.Tokenize(vllmsim.ChatPrompt(...)) of
// the request's messages, so the simulator and the HTTP simulator hit the
// same blocks for the same conversation.
//
// # Clients and proxies
//
// A [Workload] is a list of sessions of turns (a turn is sent after the
// previous one completed, plus a think time). Sessions are run by a closed
// loop of clients (Workload.Concurrency or Config.Concurrency), by Poisson
// arrivals (Config.Rate), or at their trace timestamps. Every request goes
// to a uniformly random proxy of Config.Proxies; each proxy has its own
// policy instance and counts its own requests in flight per replica, the
// load it hands to its balancer. Policies that read the engines' metrics
// read them as last scraped: llm-d's every 50 ms, predicted_ttft's waiting
// and running counts every 500 ms ([providers.engine_load]'s default
// interval), as a proxy sees them. Config.Ramp starts a closed loop's clients
// one by one instead of all at time 0; SpreadArrivals spreads a trace's
// same-timestamp requests over their bucket.
//
// With Config.Share the proxies share their routing state as rolter-proxy
// --nats does: each is a pkg/fleet node, its balancer built with
// routing.Spec.Share, publishing its observations every Config.ShareFlush,
// its queued prefill (predicted_ttft) every Config.ShareQueueInterval and
// at once when its balancer asks (a burst's picks: routing.ReportTrigger),
// and its in-flight counts every Config.ShareLoadInterval; every other node
// receives the encoded messages Config.ShareDelay later, and a proxy's
// balancer sees its own counts plus its peers' latest (share.go). The
// proxies know one another before the first request, as in a fleet that
// was running before the traffic came. A balancer that asks a request to
// wait for its turn in a burst (routing.Deferrer: predicted_ttft among
// sharing proxies) gets the wait before its pick, and the wait counts in
// the request's TTFT.
//
// # Strategies
//
// rolter's strategies run the real pkg/routing balancers: Pick with the
// proxy's loads, Observe right after, Learn on completion. The peers' policies
// (sglang, llmd_approx, llmd_precise, dynamo, aibrix) are re-implemented here
// with the defaults their current releases ship, plus named variants
// (llmd_approx_bench, dynamo_approx); the clairvoyant oracle reads the
// replicas' true caches and the blocks their queued requests will write.
// See [ParseStrategy] for the names and parameters.
//
// # KV events
//
// precise_cache_aware, llmd_precise and dynamo route on the replicas' KV events:
// each replica's cache reports its stored, removed and cleared blocks; a
// per-replica watcher maps them to pkg/kvindex identities at once, and every
// proxy's own index receives them Config.KVEventDelay later. The request's
// token ids (what the proxy reads from x-rolter-vllm-token-ids) map to the
// same identities. precise_cache_aware is the real balancer fed through
// routing.KVSource over one pkg/kvindex.Residency per replica (the state
// inside pkg/kvindex.Index, without its NATS plumbing) on the virtual clock.
//
// # Text
//
// Prompts are built from a fixed vocabulary of words that are one token each,
// named by [Segment]s (a key and a word count), so that a million-token trace
// costs a few bytes per block and equal keys mean equal text. [RouteContext]
// builds the routing context from the messages the way pkg/affinity does for a
// chat body.
//
// # Determinism
//
// A run is a pure function of its Config (seed included), workload and
// strategy: pkg/routing's random draws (random, power_of_two, the tie breaks
// of the scoring strategies) come from routing.Spec.IntN, a PCG seeded from
// the seed and the proxy's index, and their timers (the pipeline's session
// TTL) run on the virtual clock (routing.Spec.Now).
package sim
