package backoff

import (
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// MaxRetryAfter caps the delay a Retry-After header can impose on a retry.
const MaxRetryAfter = 30 * time.Second

// Delay is the full-jitter exponential backoff before retry number attempt
// (1 for the first retry): limit = min(maxDelay, base*2^(attempt-1)),
// computed without overflow, and the result is limit*rnd for rnd in [0, 1).
//
// Out-of-range inputs are clamped rather than rejected: attempt < 1 counts as
// 1, a non-positive base or maxDelay gives 0, rnd < 0 (or NaN) gives 0 and
// rnd >= 1 gives limit.
func Delay(attempt int, base, maxDelay time.Duration, rnd float64) time.Duration {
	if base <= 0 || maxDelay <= 0 || !(rnd > 0) {
		return 0
	}
	shift := max(attempt, 1) - 1
	limit := maxDelay
	if shift < 63 && base <= maxDelay>>uint(shift) {
		limit = base << uint(shift) // <= maxDelay, so no overflow
	}
	if rnd >= 1 {
		return limit
	}
	// float64(limit) <= 2^63 and rnd < 1, so the product is below 2^63 and
	// converts safely; rounding can still land on limit, which is excluded.
	d := time.Duration(float64(limit) * rnd)
	if d >= limit {
		d = limit - 1
	}
	return d
}

// RetryAfter parses an HTTP Retry-After header value: either delta-seconds
// (ASCII digits only, e.g. "120") or an HTTP-date (IMF-fixdate, RFC 850 or
// asctime, as net/http accepts), measured from now. Surrounding spaces are
// ignored. It reports false for an empty, negative, signed, fractional or
// otherwise unparsable value, and for a date that is not after now (so clock
// skew between the upstream and us cannot force an immediate retry; the
// caller then uses its own backoff). "0" is a valid zero delay. A delta too
// large for a time.Duration saturates at math.MaxInt64.
func RetryAfter(header string, now time.Time) (time.Duration, bool) {
	h := strings.TrimSpace(header)
	if h == "" {
		return 0, false
	}
	if h[0] >= '0' && h[0] <= '9' {
		return deltaSeconds(h)
	}
	for _, layout := range httpDateLayouts {
		if t, err := time.Parse(layout, h); err == nil {
			if d := t.Sub(now); d > 0 {
				return d, true
			}
			return 0, false
		}
	}
	return 0, false
}

// httpDateLayouts are the HTTP-date forms of RFC 9110 §5.6.7, as in
// net/http.ParseTime.
var httpDateLayouts = [...]string{
	"Mon, 02 Jan 2006 15:04:05 GMT", // IMF-fixdate (http.TimeFormat)
	time.RFC850,                     // obsolete RFC 850
	time.ANSIC,                      // obsolete asctime
}

// deltaSeconds parses a run of ASCII digits as seconds, saturating.
func deltaSeconds(h string) (time.Duration, bool) {
	const maxSecs = math.MaxInt64 / int64(time.Second)
	var secs int64
	for i := 0; i < len(h); i++ {
		c := h[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if secs <= maxSecs {
			secs = secs*10 + int64(c-'0')
		}
	}
	if secs > maxSecs {
		return math.MaxInt64, true
	}
	return time.Duration(secs) * time.Second, true
}

// Next is the delay before retry number attempt: the Retry-After delay when
// the upstream sent one (hasRetryAfter), clamped to [0, MaxRetryAfter];
// otherwise [Delay] with a fresh random fraction from math/rand/v2.
func Next(attempt int, base, maxDelay, retryAfter time.Duration, hasRetryAfter bool) time.Duration {
	if hasRetryAfter {
		return min(max(retryAfter, 0), MaxRetryAfter)
	}
	return Delay(attempt, base, maxDelay, rand.Float64())
}

// Reconnect is the wait before the next attempt to reach a peer (a control
// plane) that has been unreachable for lostFor: an eighth of lostFor,
// clamped to [minDelay, maxDelay], with equal jitter (uniform in
// [limit/2, limit) for rnd in [0, 1)). The first attempts after a loss thus
// come within minDelay, and a peer back after an outage of T is found
// within T/8 of returning (a restart of up to 8 s: within a second); the
// attempts thin out as the outage lasts (about 8·ln(T/0.8 s)+8 of them in
// an outage of T up to 40 s, then one per maxDelay), without counting
// them. The cost against plain exponential rounds: more attempts against a
// peer that stays down for minutes. minDelay <= 0 or maxDelay < minDelay
// gives 0.
func Reconnect(lostFor, minDelay, maxDelay time.Duration, rnd float64) time.Duration {
	if minDelay <= 0 || maxDelay < minDelay {
		return 0
	}
	limit := min(max(lostFor/8, minDelay), maxDelay)
	if !(rnd > 0) {
		rnd = 0
	}
	if rnd >= 1 {
		rnd = 1
	}
	d := limit/2 + time.Duration(float64(limit/2)*rnd)
	return min(d, limit)
}
