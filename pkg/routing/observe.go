package routing

import (
	"time"

	"rolter.dev/pkg/prefixtree"
)

// Optional interfaces a Balancer may implement. Callers discover them with a
// type assertion on the Balancer they hold; all are safe for concurrent use
// with Pick and Observe.

// Learner is implemented by balancers that learn from finished requests
// (predicted_latency). The proxy calls Learn once per successful attempt
// only (failed attempts teach nothing), with the target's in-flight count as
// it was read for the pick, before the attempt's own increment.
type Learner interface {
	Learn(target int, ctx *Context, queueDepth int, latency time.Duration)
}

// TreeStats describes one target's prefix tree: its size in byte nodes (the
// unit of Spec.MaxTrieNodes), its resident prompts and its eviction count.
type TreeStats = prefixtree.Stats

// TrieStats is implemented by balancers that keep prefix trees (cache_aware,
// and pipeline when its prefix_cache scorer is on). TrieStats returns one
// entry per target, in target order, for metrics; it allocates and is meant
// for scrapes, not the request path.
type TrieStats interface {
	TrieStats() []TreeStats
}

// DecisionCounter is implemented by balancers that count how their picks
// were decided (cache_aware, predicted_latency). Decisions returns the count
// of every outcome the balancer can produce, zero counts included, keyed by
// the Decision* names; it allocates and is meant for scrapes.
type DecisionCounter interface {
	Decisions() map[string]uint64
}

// Decision outcomes, as reported by [DecisionCounter].
const (
	// DecisionAffinityHit: cache_aware pinned the request to the target
	// with the best prefix match.
	DecisionAffinityHit = "affinity_hit"
	// DecisionLoadSpill: the best match cleared the threshold, but its
	// target was past both balance margins, so the least-loaded target got
	// the request.
	DecisionLoadSpill = "load_spill"
	// DecisionLeastLoad: no match cleared the threshold and loads were
	// known: the least-loaded target got the request.
	DecisionLeastLoad = "least_load"
	// DecisionLeastWarmed: no match cleared the threshold, loads were
	// unknown, and every eligible target had served prompts: the one that
	// had served the fewest got the request.
	DecisionLeastWarmed = "least_warmed"
	// DecisionCold: no match cleared the threshold, loads were unknown, and
	// some eligible target had served no prompt yet: round robin.
	DecisionCold = "cold"
	// DecisionPredicted: predicted_latency had a prediction for at least one
	// eligible target.
	DecisionPredicted = "predicted"
	// DecisionUnpredicted: predicted_latency had no prediction for any
	// eligible target, so load alone decided.
	DecisionUnpredicted = "unpredicted"
)

// LawReporter is implemented by balancers that learn a latency law from
// the first tokens they are told of (predicted_ttft). Law returns its
// current state, for metrics: an operator can see whether the law is
// fitted, and whether what it learned is plausible for the engines (a
// prefill rate, a fixed cost per request). It does not allocate.
type LawReporter interface {
	Law() LawState
}

// SilenceReporter is implemented by balancers that watch what comes back
// from each target (predicted_ttft). Silent appends to dst, per target,
// how long the target has owed the balancer an answer (a first token, or a
// whole answer for a client that does not stream) without sending any
// back, to it or, as their reports tell, to its peers: since the later of
// the oldest owed request's dispatch (for a whole answer, its predicted
// first token) and the target's latest answer, 0 when it owes none. A
// replica that froze grows it without bound; a healthy busy one keeps it
// near the gap between its answers.
type SilenceReporter interface {
	Silent(dst []time.Duration) []time.Duration
}

// LawState is a learned time-to-first-token law: TTFT (ms) = BaseMS +
// AheadMS × the requests queued ahead + QueuedMSPer1K × their uncached
// prompt tokens / 1,000 + OwnMSPer1K × this request's uncached prompt
// tokens / 1,000. Until Fitted the balancer routes on a unit law whose
// weights are not milliseconds, and the weights here are zero.
// DecodeMSPer1K is what an answer that came back whole (a client that does
// not stream) took per 1,000 output tokens beyond its first token: the
// decode the fit separates from it (0 while no such answer was seen).
// PerRunningMS is the batch term's slope: the TTFT each request running at
// a target adds there, learned from the law's residuals where the engines'
// steps slow with their batch (0 until it is determined; predicted_ttft's
// batch term).
type LawState struct {
	Fitted bool
	// Samples is the number of first tokens and whole answers the fit in
	// use was made on (0 until fitted); FirstTokens counts every first
	// token reported, those that teach the law nothing included (see
	// predicted_ttft's FirstToken), and WholeAnswers every whole answer.
	Samples, FirstTokens, WholeAnswers                        int
	BaseMS, AheadMS, QueuedMSPer1K, OwnMSPer1K, DecodeMSPer1K float64
	PerRunningMS                                              float64
	// BytesPerToken is the learned ratio of prompt bytes to the engine's
	// prompt tokens (the default until an engine reported a count).
	BytesPerToken float64
}
