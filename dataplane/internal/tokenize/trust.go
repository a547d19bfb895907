package tokenize

import "time"

// The conversions of this package follow one vLLM source; an engine of
// another release, or a chat template that renders some request shape
// otherwise, computes another prompt than the /tokenize body the proxy
// built, and ids that match none of its blocks route worse than no ids at
// all (every replica looks cold). The proxy compares each routed request's
// ids with the prompt length its answer reports (a mismatch proves them
// wrong) and tells the client here; an endpoint whose ids are wrong more
// often than right is not tokenized for a while, and its requests route on
// the approximate state instead.
const (
	// TrustWindow is how many checks of a model and endpoint one verdict
	// reads: a window that closes with fewer than TrustMismatches
	// mismatches, or with matches in the majority, starts the next one
	// afresh.
	TrustWindow = 32
	// TrustMismatches is the fewest mismatches that distrust an endpoint,
	// and only while they outnumber the matches of their window: one
	// request shape the conversion gets wrong among many it gets right does
	// not cost the others their precise routing, and eight wrong requests
	// in a row are not chance.
	TrustMismatches = 8
	// DistrustFirst is how long an endpoint is first distrusted; each
	// distrust that follows the last without a window of trusted checks
	// between them lasts twice the one before, up to DistrustMax. After it
	// the endpoint is tokenized and checked again: an engine upgraded in
	// place (or a template fixed) gets its precise routing back.
	DistrustFirst = time.Minute
	// DistrustMax bounds a distrust.
	DistrustMax = time.Hour
)

type trustKey struct{ model, path string }

// verdicts are one model and endpoint's checks since its window opened.
type verdicts struct {
	checks, mismatches int
	until              time.Time     // distrusted until then
	next               time.Duration // how long the next distrust lasts
}

// Check records whether the ids of a request to model's endpoint path had
// as many tokens as the prompt the engine reported. It returns how long the
// endpoint is now distrusted when this check distrusted it (0 otherwise),
// for the caller to say so once. Checks of requests routed before a
// distrust began, arriving while it lasts, are not counted.
func (c *Client) Check(model, path string, match bool, now time.Time) time.Duration {
	c.trustMu.Lock()
	defer c.trustMu.Unlock()
	k := trustKey{model, path}
	v := c.trust[k]
	if v == nil {
		v = &verdicts{next: DistrustFirst}
		c.trust[k] = v
	}
	if now.Before(v.until) {
		return 0
	}
	v.checks++
	if !match {
		v.mismatches++
	}
	if v.mismatches >= TrustMismatches && 2*v.mismatches > v.checks {
		d := v.next
		v.until, v.next = now.Add(d), min(2*d, DistrustMax)
		v.checks, v.mismatches = 0, 0
		return d
	}
	if v.checks >= TrustWindow {
		// A window the ids passed: the next distrust starts short again.
		v.checks, v.mismatches, v.next = 0, 0, DistrustFirst
	}
	return 0
}

// Distrusted reports whether model's endpoint path is distrusted at now: its
// requests are not tokenized (nor answered from the cache, which holds the
// same conversion's ids).
func (c *Client) Distrusted(model, path string, now time.Time) bool {
	c.trustMu.Lock()
	defer c.trustMu.Unlock()
	v := c.trust[trustKey{model, path}]
	return v != nil && now.Before(v.until)
}
