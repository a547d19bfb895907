package backoff

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	ms   = time.Millisecond
	base = 100 * ms
	maxD = 2000 * ms
)

func TestDelay(t *testing.T) {
	tests := []struct {
		name      string
		attempt   int
		base, max time.Duration
		rnd       float64
		want      time.Duration
	}{
		{"first retry top", 1, base, maxD, 0.999999, 99999900 * time.Nanosecond},
		{"first retry half", 1, base, maxD, 0.5, 50 * ms},
		{"second retry half", 2, base, maxD, 0.5, 100 * ms},
		{"third retry half", 3, base, maxD, 0.5, 200 * ms},
		{"fifth retry half", 5, base, maxD, 0.5, 800 * ms},
		{"sixth retry capped", 6, base, maxD, 0.5, 1000 * ms},
		{"huge attempt capped", 1000, base, maxD, 0.5, 1000 * ms},
		{"attempt 62 capped", 62, base, maxD, 0.25, 500 * ms},
		{"attempt 63 capped", 63, base, maxD, 0.25, 500 * ms},
		{"attempt 64 capped", 64, base, maxD, 0.25, 500 * ms},
		{"max int attempt", math.MaxInt, base, maxD, 0.25, 500 * ms},
		{"zero rnd", 3, base, maxD, 0, 0},
		{"negative rnd", 3, base, maxD, -0.5, 0},
		{"NaN rnd", 3, base, maxD, math.NaN(), 0},
		{"rnd 1 gives cap", 3, base, maxD, 1, 400 * ms},
		{"rnd above 1 gives cap", 9, base, maxD, 7, maxD},
		{"+Inf rnd gives cap", 9, base, maxD, math.Inf(1), maxD},
		{"attempt 0 counts as 1", 0, base, maxD, 0.5, 50 * ms},
		{"negative attempt counts as 1", -5, base, maxD, 0.5, 50 * ms},
		{"max below base", 1, base, 60 * ms, 0.5, 30 * ms},
		{"zero base", 3, 0, maxD, 0.5, 0},
		{"negative base", 3, -base, maxD, 0.5, 0},
		{"zero max", 3, base, 0, 0.5, 0},
		{"negative max", 3, base, -maxD, 0.5, 0},
		{"no overflow near max int", 40, time.Hour, math.MaxInt64, 1, math.MaxInt64},
		{"max int base", 2, math.MaxInt64, math.MaxInt64, 0.5, time.Duration(float64(math.MaxInt64) * 0.5)},
		{"max int cap just below 1", 70, time.Second, math.MaxInt64, math.Nextafter(1, 0), time.Duration(float64(math.MaxInt64) * math.Nextafter(1, 0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Delay(tt.attempt, tt.base, tt.max, tt.rnd); got != tt.want {
				t.Fatalf("Delay(%d, %v, %v, %v) = %v, want %v", tt.attempt, tt.base, tt.max, tt.rnd, got, tt.want)
			}
		})
	}
}

// TestDelayBounds: for every attempt the delay lies in [0, cap) and the caps
// double from base up to max.
func TestDelayBounds(t *testing.T) {
	prevCap := time.Duration(0)
	for attempt := 1; attempt <= 100; attempt++ {
		limit := Delay(attempt, base, maxD, 1)
		if attempt == 1 && limit != base {
			t.Fatalf("cap(1) = %v, want %v", limit, base)
		}
		if limit != min(2*prevCap, maxD) && attempt > 1 {
			t.Fatalf("cap(%d) = %v, want min(2*%v, %v)", attempt, limit, prevCap, maxD)
		}
		prevCap = limit
		for _, r := range []float64{0, 0.1, 0.5, 0.9, math.Nextafter(1, 0)} {
			if d := Delay(attempt, base, maxD, r); d < 0 || d >= limit {
				t.Fatalf("Delay(%d, rnd=%v) = %v outside [0, %v)", attempt, r, d, limit)
			}
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2025, 3, 4, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		header string
		want   time.Duration
		ok     bool
	}{
		{"120", 120 * time.Second, true},
		{"0", 0, true},
		{"  7 ", 7 * time.Second, true},
		{"007", 7 * time.Second, true},
		{"\t3\t", 3 * time.Second, true},
		{"9223372036", 9223372036 * time.Second, true},
		{"9223372037", math.MaxInt64, true}, // too large for a Duration: saturates
		{"99999999999999999999999999999", math.MaxInt64, true},
		{"", 0, false},
		{"   ", 0, false},
		{"-1", 0, false},
		{"+5", 0, false},
		{"1.5", 0, false},
		{"5s", 0, false},
		{"1e3", 0, false},
		{"5 6", 0, false},
		{"0x10", 0, false},
		{"five", 0, false},
		{"\u0663", 0, false}, // Arabic-Indic digit three
		{"Tue, 04 Mar 2025 10:00:30 GMT", 30 * time.Second, true},
		{"Tuesday, 04-Mar-25 10:01:00 GMT", time.Minute, true},
		{"Tue Mar  4 10:00:05 2025", 5 * time.Second, true},
		{"Tue, 04 Mar 2025 10:00:00 GMT", 0, false}, // now: not in the future
		{"Tue, 04 Mar 2025 09:59:00 GMT", 0, false}, // past
		{"Tue, 04 Mar 2025 10:00:30 PST", 0, false}, // IMF-fixdate is GMT only
		{"Tue, 04 Mar 2025 25:00:30 GMT", 0, false},
		{"2025-03-04T10:00:30Z", 0, false}, // RFC 3339 is not an HTTP-date
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.header), func(t *testing.T) {
			got, ok := RetryAfter(tt.header, now)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("RetryAfter(%q) = %v, %v; want %v, %v", tt.header, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestRetryAfterMatchesNetHTTP: every HTTP-date net/http accepts parses to
// the same instant here.
func TestRetryAfterMatchesNetHTTP(t *testing.T) {
	now := time.Date(2025, 3, 4, 10, 0, 0, 0, time.UTC)
	at := now.Add(90 * time.Second)
	for _, h := range []string{
		at.Format(http.TimeFormat),
		at.Format(time.RFC850),
		at.Format(time.ANSIC),
	} {
		want, err := http.ParseTime(h)
		if err != nil {
			t.Fatalf("net/http cannot parse %q: %v", h, err)
		}
		got, ok := RetryAfter(h, now)
		if !ok || got != want.Sub(now) {
			t.Fatalf("RetryAfter(%q) = %v, %v; want %v", h, got, ok, want.Sub(now))
		}
	}
}

func TestNext(t *testing.T) {
	tests := []struct {
		name       string
		retryAfter time.Duration
		want       time.Duration
	}{
		{"retry-after overrides", 5 * time.Second, 5 * time.Second},
		{"retry-after zero", 0, 0},
		{"retry-after capped", 31 * time.Second, MaxRetryAfter},
		{"retry-after huge", math.MaxInt64, MaxRetryAfter},
		{"retry-after negative", -time.Second, 0},
		{"retry-after below backoff still wins", ms, ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Next(4, base, maxD, tt.retryAfter, true); got != tt.want {
				t.Fatalf("Next(retryAfter=%v) = %v, want %v", tt.retryAfter, got, tt.want)
			}
		})
	}
	t.Run("jitter without retry-after", func(t *testing.T) {
		for attempt := 1; attempt <= 8; attempt++ {
			limit := Delay(attempt, base, maxD, 1)
			var sum time.Duration
			const draws = 2000
			for i := 0; i < draws; i++ {
				d := Next(attempt, base, maxD, time.Hour, false) // ignored: no header
				if d < 0 || d >= limit {
					t.Fatalf("Next(%d) = %v outside [0, %v)", attempt, d, limit)
				}
				sum += d
			}
			// The mean of a uniform [0, limit) is limit/2; allow ±10%.
			if mean := sum / draws; mean < limit*4/10 || mean > limit*6/10 {
				t.Fatalf("Next(%d): mean %v, want ≈%v", attempt, mean, limit/2)
			}
		}
	})
}

func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{
		"120", "0", " 7 ", "-1", "+5", "1.5", "", "99999999999999999999",
		"Tue, 04 Mar 2025 10:00:30 GMT", "Tuesday, 04-Mar-25 10:01:00 GMT",
		"Tue Mar  4 10:00:05 2025", "Tue, 04 Mar 2025 09:59:00 GMT", "garbage",
	} {
		f.Add(s)
	}
	now := time.Date(2025, 3, 4, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, h string) {
		d, ok := RetryAfter(h, now)
		if !ok {
			if d != 0 {
				t.Fatalf("RetryAfter(%q) = %v with ok=false", h, d)
			}
			return
		}
		if d < 0 {
			t.Fatalf("RetryAfter(%q) = %v < 0", h, d)
		}
		s := strings.TrimSpace(h)
		if s == "" {
			t.Fatalf("RetryAfter(%q) accepted an empty value", h)
		}
		if s[0] >= '0' && s[0] <= '9' {
			// Delta-seconds: digits only, and the value round-trips.
			n, err := strconv.ParseUint(s, 10, 64)
			if err == nil && n <= math.MaxInt64/uint64(time.Second) {
				if d != time.Duration(n)*time.Second {
					t.Fatalf("RetryAfter(%q) = %v, want %ds", h, d, n)
				}
			} else if strings.Trim(s, "0123456789") != "" || d != math.MaxInt64 {
				t.Fatalf("RetryAfter(%q) = %v, want saturation for a long digit run", h, d)
			}
			return
		}
		// HTTP-date: net/http agrees, and the delay is in the future.
		at, err := http.ParseTime(s)
		if err != nil || at.Sub(now) != d || d == 0 {
			t.Fatalf("RetryAfter(%q) = %v; net/http: %v, %v", h, d, at, err)
		}
		if got := Next(1, base, maxD, d, true); got < 0 || got > MaxRetryAfter {
			t.Fatalf("Next with Retry-After %v = %v", d, got)
		}
	})
}

// TestReconnect: the waits after losing a peer start at minDelay, stay
// under a second for a restart of up to 8 s (so a restarted control plane
// is followed within a second of its return), grow with the outage, are
// jittered, and never pass maxDelay.
func TestReconnect(t *testing.T) {
	const lo, hi = 100 * time.Millisecond, 5 * time.Second
	for _, tc := range []struct {
		lost     time.Duration
		min, max time.Duration // over rnd in [0, 1)
	}{
		{0, 50 * time.Millisecond, 100 * time.Millisecond},
		{600 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond},
		{4 * time.Second, 250 * time.Millisecond, 500 * time.Millisecond},
		{8 * time.Second, 500 * time.Millisecond, time.Second},
		{time.Hour, hi / 2, hi},
	} {
		a, b := Reconnect(tc.lost, lo, hi, 0), Reconnect(tc.lost, lo, hi, 0.999999)
		if a != tc.min || b > tc.max || b <= a {
			t.Errorf("lost %v: waits %v..%v, want %v..%v (jittered)", tc.lost, a, b, tc.min, tc.max)
		}
	}
	if d := Reconnect(time.Second, 0, hi, 0.5); d != 0 {
		t.Errorf("minDelay 0: %v", d)
	}
	if d := Reconnect(2*time.Second, lo, hi, math.NaN()); d != 250*time.Millisecond/2 {
		t.Errorf("NaN rnd: %v", d)
	}
}
