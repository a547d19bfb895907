// Package backoff computes retry delays for upstream calls.
//
// It follows the reference gateway's `[retry]` section (base_backoff_ms=100,
// max_backoff_ms=2000): full-jitter exponential backoff, where attempt k (1
// for the first retry) waits a uniform fraction of min(max, base*2^(k-1)).
// An upstream Retry-After header, when present, replaces the jittered delay,
// capped at [MaxRetryAfter].
//
// [Delay] and [RetryAfter] are pure: the random fraction and the current time
// are arguments, so callers and tests control them. [Next] draws the fraction
// itself.
package backoff
