package tokenize

import (
	"bytes"
	"encoding/json"
	"time"
)

// The conversions of this package follow one vLLM source; an engine of
// another release, or a chat template that renders some request shape
// otherwise, computes another prompt than the /tokenize body the proxy
// built, and ids that match none of its blocks route worse than no ids at
// all (every replica looks cold). The proxy compares each routed request's
// ids with the prompt length its answer reports (a mismatch proves them
// wrong) and tells the client here; an endpoint whose ids are wrong more
// often than right, or an endpoint's requests of one [Shape] whose ids
// are, is not tokenized for a while, and its requests route on the
// approximate state instead.
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

// Shape is what a request's conversion rendered beyond plain text turns:
// the parts a template or a converter is likeliest to render otherwise
// than the source followed. Each shape of an endpoint has a verdict of
// its own besides the endpoint's, so that one shape converted wrongly is
// distrusted alone even while the endpoint's other requests, right, are
// the majority.
type Shape uint8

const (
	// ShapeTools: tool definitions (rendered by the template, often as
	// JSON of the request's own objects).
	ShapeTools Shape = 1 << iota
	// ShapeToolTurns: tool calls or results in the conversation.
	ShapeToolTurns
	// ShapeKwargs: template inputs beyond the messages (chat_template,
	// chat_template_kwargs, documents, a reasoning effort).
	ShapeKwargs
	// ShapeSystem: a system prompt given apart from the messages
	// (Anthropic's system, Responses' instructions), which the
	// conversion places.
	ShapeSystem
)

// String names the shape's parts, for logs: "tools+kwargs", or "text".
func (s Shape) String() string {
	names := [...]string{"tools", "tool_turns", "kwargs", "system"}
	var b []byte
	for i, n := range names {
		if s&(1<<i) != 0 {
			if len(b) > 0 {
				b = append(b, '+')
			}
			b = append(b, n...)
		}
	}
	if len(b) == 0 {
		return "text"
	}
	return string(b)
}

// allShapes keys an endpoint's own verdict, over every shape.
const allShapes Shape = 0xff

var (
	kwargFields = []string{"chat_template", "chat_template_kwargs", "documents", "reasoning_effort", "reasoning", "output_config"}
	// toolTokens are the JSON strings a tool turn has as a key or value;
	// a text that is exactly one of them (a quote within a string is
	// escaped, so no longer text holds them) only puts its request in
	// another shape's verdict.
	toolTokens = [][]byte{[]byte(`"tool_calls"`), []byte(`"tool"`), []byte(`"tool_use"`), []byte(`"tool_result"`),
		[]byte(`"function_call"`), []byte(`"function_call_output"`)}
)

// shapeOf returns the shape of a request body's top-level fields.
func shapeOf(fields map[string]json.RawMessage) Shape {
	var s Shape
	if t := bytes.TrimSpace(fields["tools"]); !isNull(t) && !bytes.Equal(t, []byte("[]")) {
		s |= ShapeTools
	}
	for _, k := range kwargFields {
		if !isNull(fields[k]) {
			s |= ShapeKwargs
			break
		}
	}
	if !isNull(fields["system"]) || !isNull(fields["instructions"]) {
		s |= ShapeSystem
	}
	turns := fields["messages"]
	if turns == nil {
		turns = fields["input"] // Responses
	}
	for _, tok := range toolTokens {
		if bytes.Contains(turns, tok) {
			s |= ShapeToolTurns
			break
		}
	}
	return s
}

type trustKey struct {
	model, path string
	shape       Shape
}

// verdicts are one model and endpoint's checks since its window opened.
type verdicts struct {
	checks, mismatches int
	until              time.Time     // distrusted until then
	next               time.Duration // how long the next distrust lasts
}

// Check records whether the ids of a request of shape to model's endpoint
// path had as many tokens as the prompt the engine reported, in the
// endpoint's verdict and in its shape's. It returns how long the endpoint
// or the shape is now distrusted when this check distrusted it (0
// otherwise), and whether it was the shape alone, for the caller to say so
// once. Checks of requests routed before a distrust began, arriving while
// it lasts, are not counted.
func (c *Client) Check(model, path string, shape Shape, match bool, now time.Time) (d time.Duration, shapeOnly bool) {
	c.trustMu.Lock()
	defer c.trustMu.Unlock()
	all := c.check(trustKey{model, path, allShapes}, match, now)
	one := c.check(trustKey{model, path, shape}, match, now)
	if all > 0 {
		return all, false
	}
	return one, one > 0
}

// check records one check in k's verdict; the caller holds trustMu.
func (c *Client) check(k trustKey, match bool, now time.Time) time.Duration {
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

// Distrusted reports whether model's endpoint path, or its requests of
// shape, are distrusted at now: such requests are not tokenized (nor
// answered from the cache, which holds the same conversion's ids).
func (c *Client) Distrusted(model, path string, shape Shape, now time.Time) bool {
	c.trustMu.Lock()
	defer c.trustMu.Unlock()
	for _, s := range [2]Shape{allShapes, shape} {
		if v := c.trust[trustKey{model, path, s}]; v != nil && now.Before(v.until) {
			return true
		}
	}
	return false
}
