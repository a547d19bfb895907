package usage

import "time"

// Cache hit kinds of [Record.CacheHit].
const (
	CacheHitExact    = "exact"
	CacheHitSemantic = "semantic"
)

// Record is the accounting row of one request. It holds identifiers,
// counts and timings only: never a prompt, a completion or a key.
type Record struct {
	// TS is when the request finished.
	TS time.Time `json:"ts"`
	// RequestID is the request's x-request-id.
	RequestID string `json:"request_id"`
	// KeyID identifies the caller's virtual key ("" for none); never the
	// key itself.
	KeyID string `json:"key_id"`
	// Model is the model the client asked for.
	Model string `json:"model"`
	// Provider and TargetModel name the upstream that answered (empty for
	// a cache hit).
	Provider    string `json:"provider"`
	TargetModel string `json:"target_model"`
	// Status is the status the client got (a refusal's status when
	// withheld; 502 when the upstream broke off a response that had
	// started, whose status line had said otherwise).
	Status int `json:"status"`
	// Stream is the request's stream flag.
	Stream bool `json:"stream"`
	// Token counts from the upstream's usage (see [Usage]); zero for a
	// cache hit.
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	CachedTokens     int64 `json:"cached_tokens"`
	// CostUSD is the cost from [[model_prices]]; zero for a cache hit.
	CostUSD float64 `json:"cost_usd"`
	// LatencyMS is the time to the last byte; TTFTMS to the first.
	LatencyMS float64 `json:"latency_ms"`
	TTFTMS    float64 `json:"ttft_ms"`
	// CacheHit is "exact", "semantic" or "" (no hit).
	CacheHit string `json:"cache_hit"`
	// Withheld marks a response the delivery policy refused: the upstream
	// call (if any) is billed, the client got the refusal.
	Withheld bool `json:"withheld"`
	// WithheldReason is the refusal's reason (a code and a rule or plugin
	// name, never content).
	WithheldReason string `json:"withheld_reason,omitempty"`
	// UsageUnknown marks a response that reported no usage.
	UsageUnknown bool `json:"usage_unknown"`
	// Unpriced marks a response whose model has no price.
	Unpriced bool `json:"unpriced"`
	// Error is a short error code for a failed request (never content).
	Error string `json:"error,omitempty"`
}

// Millis converts d to milliseconds with microsecond precision, for
// LatencyMS and TTFTMS.
func Millis(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}
