package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"rolter.dev/pkg/reliability"
	"rolter.dev/pkg/routing"
)

// The tests here halt the proxy (Proxy.Halt, what the app calls just before
// its drain deadline) while a request is running, and check that the client
// can tell its answer is not whole, that the request is not retried, and
// that none of it counts against the target.

// haltEvents are the error events a halted stream ends with, by dialect.
var haltEvents = map[string]string{
	"openai":    `data: {"error":{"message":"the proxy shut down before the response finished; the response is incomplete","type":"api_error","code":"shutting_down","param":null}}` + "\n\n",
	"anthropic": "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"the proxy shut down before the response finished; the response is incomplete\"}}\n\n",
}

// haltBreaker opens a target's breaker at its first failure, so that a
// halt counted as one would show.
const haltBreaker = "[breaker]\nenabled = true\nfailure_threshold = 1\nopen_secs = 30\n"

// probing opens the breaker of route m's first target an hour ago, so that
// the next request sent to it is its half-open probe; it returns the
// target's state.
func probing(t *testing.T, p *Proxy) *reliability.Target {
	t.Helper()
	rt := p.rt.Load()
	state := rt.routes["m"].pools[0].targets[0].state
	if !state.BreakerFailure(time.Now().Add(-time.Hour), rt.breaker) {
		t.Fatal("the breaker did not open")
	}
	return state
}

// wantNoVerdict checks that p0's halted attempt was counted as
// shutting_down and left the target as it was: not parked, no failure,
// its breaker still half-open and admitting the next probe (the halted
// probe released).
func wantNoVerdict(t *testing.T, p *Proxy, state *reliability.Target) {
	t.Helper()
	for outcome, want := range map[string]float64{"ok": 0, "error": 0, "client_gone": 0, "shutting_down": 1} {
		if n := testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", outcome)); n != want {
			t.Errorf("rolter_target_requests_total{provider=p0,outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
	for _, reason := range []string{"transport", "timeout", "body", "idle"} {
		if n := testutil.ToFloat64(p.metrics.UpstreamErrors.WithLabelValues("p0", reason)); n != 0 {
			t.Errorf("rolter_upstream_errors_total{reason=%q} = %v: a halt counted as the target's failure", reason, n)
		}
	}
	if n := testutil.ToFloat64(p.metrics.BreakerOpened.WithLabelValues("p0")) + testutil.ToFloat64(p.metrics.BreakerClosed.WithLabelValues("p0")); n != 0 {
		t.Errorf("the breaker changed %v times on a halt", n)
	}
	rt := p.rt.Load()
	if st := state.BreakerState(); st != reliability.HalfOpen {
		t.Errorf("breaker %v after its probe was halted, want half_open", st)
	}
	if !state.BreakerAllows(time.Now(), rt.breaker) {
		t.Error("the breaker admits no new probe: the halted probe still holds it")
	}
	if state.CoolingDown(time.Now()) {
		t.Error("the target is parked after a halt")
	}
}

// learnRecorder also counts Learn calls: routing must learn nothing from a
// halted attempt.
type learnRecorder struct {
	*recordingBalancer
	learned atomic.Int32
}

func (b *learnRecorder) Learn(target int, ctx *routing.Context, queueDepth int, latency time.Duration) {
	b.learned.Add(1)
	b.recordingBalancer.Learn(target, ctx, queueDepth, latency)
}

// TestHaltEndsAStartedResponse: a response that had started when the proxy
// halts gets, if a stream, the shutting-down error event (not "the
// upstream broke off"), and its connection is aborted, so it never ends
// like a complete one; a JSON body relayed past the cache (too large to
// store) is aborted the same way. The upstream request is cancelled, the
// request is a 503 shutting_down everywhere it is counted, nothing is
// cached, routing learns nothing and the target is not blamed.
func TestHaltEndsAStartedResponse(t *testing.T) {
	type testCase struct {
		name   string
		d      dialectCase
		stream bool
		h2     bool
	}
	var tests []testCase
	for _, d := range dialects {
		for _, h2 := range []bool{false, true} {
			tests = append(tests, testCase{fmt.Sprintf("stream/%s/%s", d.name, protoName(h2)), d, true, h2})
		}
	}
	tests = append(tests, testCase{"json too large for the cache/openai/h1", dialects[0], false, false})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.d
			// The upstream sends part, then waits for the proxy to cancel
			// it; the client reads first. A JSON body is declared 1 MiB,
			// and part of it is more than the cache keeps and than the
			// server buffers before it writes.
			part, first := d.firstSSE, d.firstSSE
			if !tc.stream {
				part, first = d.firstJSON+strings.Repeat(" ", 64<<10), d.firstJSON+strings.Repeat(" ", 16<<10)
			}
			released := make(chan struct{})
			up := newUpstream(t, "up")
			up.handler = func(w http.ResponseWriter, r *http.Request) bool {
				if tc.stream {
					w.Header().Set("Content-Type", "text/event-stream")
				} else {
					w.Header().Set("Content-Type", "application/json")
					w.Header().Set("Content-Length", strconv.Itoa(1<<20))
				}
				_, _ = io.WriteString(w, part)
				w.(http.Flusher).Flush()
				<-r.Context().Done() // only the proxy ends it
				close(released)
				return true
			}
			acct, usagePath := accountingFile(t)
			p := New(Options{Logger: slog.New(slog.DiscardHandler)})
			applyDoc(t, p, acct+haltBreaker+"[cache]\nenabled = true\nmax_entry_bytes = 1024\n"+providers(up)+
				"[[routes]]\nmodel = \"m\"\nstrategy = \"predicted_ttft\"\ntargets = [{ provider = \"p0\" }]\n[routes.cache]\nttl_secs = 600\n")
			state := probing(t, p)
			pl := p.rt.Load().routes["m"].pools[0]
			bal := &learnRecorder{recordingBalancer: &recordingBalancer{Balancer: pl.balancer, ends: map[*routing.Context]int{}}}
			pl.balancer = bal
			url, client := serveProxy(t, p, tc.h2)

			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+d.path, strings.NewReader(d.body(tc.stream)))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got := make([]byte, len(first))
			if _, err := io.ReadFull(resp.Body, got); err != nil || resp.StatusCode != 200 || string(got) != first {
				t.Fatalf("status %d, first part %.100q, %v", resp.StatusCode, got, err)
			}
			p.Halt() // the response has started: the client has its first bytes
			rest, err := io.ReadAll(resp.Body)
			switch {
			case err == nil:
				t.Fatalf("the body ended cleanly after %q: a halted response passes for a complete one", rest)
			case !tc.h2 && !errors.Is(err, io.ErrUnexpectedEOF):
				t.Fatalf("HTTP/1.1 read error %v, want an unexpected EOF", err)
			case tc.h2 && !strings.Contains(err.Error(), "INTERNAL_ERROR"):
				t.Fatalf("HTTP/2 read error %v, want a stream reset", err)
			}
			if tc.stream {
				if want := haltEvents[d.name]; string(rest) != want {
					t.Fatalf("after the halt: %q, want the error event %q", rest, want)
				}
			} else if strings.TrimLeft(string(rest), " ") != "" {
				t.Fatalf("a JSON body got %.100q after the halt", rest)
			}
			<-released // the upstream request was cancelled

			if r := usageRows(t, usagePath, 1)[0]; r.Status != 503 || r.Error != "shutting_down" || !r.UsageUnknown || r.Provider != "p0" {
				t.Fatalf("usage row %+v, want status 503, error shutting_down, usage_unknown", r)
			}
			waitFor(t, func() bool { return testutil.ToFloat64(p.metrics.InFlight) == 0 && state.InFlight() == 0 })
			if n := testutil.ToFloat64(p.metrics.Requests.WithLabelValues(d.path, "m", "503", "")); n != 1 {
				t.Fatalf("rolter_requests_total{code=503} = %v, want 1", n)
			}
			wantNoVerdict(t, p, state)
			if s := p.rt.Load().cache.cache.Stats(); s.Stores != 0 {
				t.Fatalf("cache stats %+v: a halted response was stored", s)
			}
			bal.mu.Lock()
			ends := len(bal.ends)
			bal.mu.Unlock()
			if n := bal.learned.Load(); n != 0 || ends != 1 {
				t.Fatalf("the balancer learned %d times and heard the end of %d attempts; want 0 and 1 (an Abandon)", n, ends)
			}
		})
	}
}

// TestHaltBeforeTheResponseStarted: a request whose upstream had not
// started its answer when the proxy halts (no headers yet, or a stream's
// headers and no event) is answered 503 shutting_down in its dialect at
// once, not retried on the other target; the upstream request is
// cancelled and the target not blamed. A request arriving after the halt
// gets the same 503 without reaching an upstream.
func TestHaltBeforeTheResponseStarted(t *testing.T) {
	for _, d := range dialects {
		for _, headers := range []bool{false, true} {
			name := d.name + "/before the upstream's headers"
			if headers {
				name = d.name + "/after its headers, before its first event"
			}
			t.Run(name, func(t *testing.T) {
				h := newHeld()
				hung := newUpstream(t, "hung")
				hung.handler = func(w http.ResponseWriter, r *http.Request) bool {
					if headers {
						w.Header().Set("Content-Type", "text/event-stream")
						w.WriteHeader(http.StatusOK)
						w.(http.Flusher).Flush()
					}
					h.hold(r)
					return true
				}
				other := newUpstream(t, "other") // would answer, if it were asked
				acct, usagePath := accountingFile(t)
				p := New(Options{Logger: slog.New(slog.DiscardHandler)})
				// round_robin's first pick is the first target: the hung one.
				applyDoc(t, p, acct+haltBreaker+"[retry]\nbase_backoff_ms = 1\nmax_backoff_ms = 2\n"+providers(hung, other)+
					"[[routes]]\nmodel = \"m\"\nstrategy = \"round_robin\"\ntargets = [{ provider = \"p0\" }, { provider = \"p1\" }]\n")
				state := probing(t, p)
				url := newServer(t, p)

				done := postAsync(t, url+d.path, d.body(true))
				<-h.arrived
				p.Halt()
				haltedAnswer(t, d, done)
				<-h.released // the upstream request was cancelled
				if n := other.hits.Load(); n != 0 {
					t.Fatalf("the other target was asked %d times after the halt", n)
				}
				if n := testutil.ToFloat64(p.metrics.Retries.WithLabelValues("m")); n != 0 {
					t.Fatalf("rolter_retries_total = %v, want 0", n)
				}
				if r := usageRows(t, usagePath, 1)[0]; r.Status != 503 || r.Error != "shutting_down" || r.Provider != "p0" {
					t.Fatalf("usage row %+v, want status 503, error shutting_down", r)
				}
				waitFor(t, func() bool { return testutil.ToFloat64(p.metrics.InFlight) == 0 && state.InFlight() == 0 })
				wantNoVerdict(t, p, state)

				haltedAnswer(t, d, postAsync(t, url+d.path, d.body(true)))
				if n, m := hung.hits.Load(), other.hits.Load(); n != 1 || m != 0 {
					t.Fatalf("upstreams asked %d and %d times, want 1 and 0: a request after the halt reached one", n, m)
				}
			})
		}
	}
}

// wantShuttingDown checks a 503 shutting_down answer in d's dialect.
func wantShuttingDown(t *testing.T, d dialectCase, resp *http.Response, body []byte) {
	t.Helper()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("X-Rolter-Error") != "shutting_down" {
		t.Fatalf("status %d, x-rolter-error %q: %s", resp.StatusCode, resp.Header.Get("X-Rolter-Error"), body)
	}
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	ok := e.Error.Type == "api_error" && e.Error.Code == "shutting_down"
	if d.name == "anthropic" {
		ok = e.Type == "error" && e.Error.Type == "overloaded_error"
	}
	if !ok {
		t.Fatalf("error body %s is not a shutting_down error in the %s dialect", body, d.name)
	}
}

// held holds the requests it is given until the proxy cancels them:
// arrived is closed when the first one arrives, released when it ends.
type held struct {
	arrived, released chan struct{}
	once              sync.Once
}

func newHeld() *held { return &held{arrived: make(chan struct{}), released: make(chan struct{})} }

func (h *held) hold(r *http.Request) {
	first := false
	// Read first: the server watches for the proxy's cancel only then.
	_, _ = io.Copy(io.Discard, r.Body)
	h.once.Do(func() { first = true; close(h.arrived) })
	<-r.Context().Done() // only the proxy ends it
	if first {
		close(h.released)
	}
}

// callEnds reports, in order, why each call p makes to the server at base
// ended: the cause its context ended with.
func callEnds(t *testing.T, p *Proxy, base string) <-chan error {
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	ends, next := make(chan error, 16), p.client.Transport
	p.client.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Host == u.Host {
			ctx := r.Context()
			context.AfterFunc(ctx, func() { ends <- context.Cause(ctx) })
		}
		return next.RoundTrip(r)
	})
	return ends
}

// endedByHalt checks that the next call ends reports was cancelled by the
// halt, not by its timeout.
func endedByHalt(t *testing.T, ends <-chan error) {
	t.Helper()
	if cause := <-ends; !errors.Is(cause, errHalted) {
		t.Fatalf("the call ended with %v, not by the halt", cause)
	}
}

// answer is a response read whole, or the error that ended it.
type answer struct {
	resp *http.Response
	body []byte
	err  error
}

// postAsync POSTs body to url in the background (hdr: name, value pairs).
func postAsync(t *testing.T, url, body string, hdr ...string) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- answer{resp, b, err}
	}()
	return done
}

// haltedAnswer waits for the answer of a request in flight when the proxy
// halted and checks that it is a 503 shutting_down in d's dialect.
func haltedAnswer(t *testing.T, d dialectCase, done <-chan answer) {
	t.Helper()
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	wantShuttingDown(t, d, a.resp, a.body)
}

// TestHaltEndsACountTokensRequest: a count_tokens request whose count is
// running when the proxy halts (on an anthropic provider, or on an
// engine's /tokenize) is answered 503 shutting_down in Anthropic's shape at
// once: the call is cancelled and no other target is asked. One arriving
// after the halt gets the same 503 without being read.
func TestHaltEndsACountTokensRequest(t *testing.T) {
	for _, kind := range []string{"anthropic", "openai_compatible"} {
		t.Run(kind, func(t *testing.T) {
			h := newHeld()
			hung, other := newUpstream(t, "hung"), newUpstream(t, "other")
			hung.handler = func(w http.ResponseWriter, r *http.Request) bool { h.hold(r); return true }
			other.handler = func(w http.ResponseWriter, r *http.Request) bool { // an engine that would count
				_, _ = io.WriteString(w, `{"count":42,"max_model_len":4096,"tokens":[]}`)
				return true
			}
			// The hung target is asked first (anthropic ones come before
			// engines, engines in config order). request_secs is 10 s: the
			// call is cut by the halt, not by it.
			p := New(Options{Logger: slog.New(slog.DiscardHandler)})
			ends := callEnds(t, p, hung.URL)
			applyDoc(t, p, openAuth+"[timeouts]\nrequest_secs = 10\n"+strings.Replace(providers(hung, other), "openai_compatible", kind, 1)+
				"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }, { provider = \"p1\" }]\n")
			url := newServer(t, p) + countTokensPath
			const body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

			done := postAsync(t, url, body)
			<-h.arrived
			p.Halt()
			haltedAnswer(t, dialects[1], done)
			<-h.released // the call was cancelled
			endedByHalt(t, ends)
			if n := other.hits.Load(); n != 0 {
				t.Fatalf("the other target was asked %d times after the halt", n)
			}
			waitFor(t, func() bool {
				return testutil.ToFloat64(p.metrics.Requests.WithLabelValues(countTokensPath, "m", "503", "")) == 1
			})

			// Refused before it is read, as on the other endpoints: even
			// one naming no model of the proxy.
			for _, b := range []string{body, `{"model":"nope","messages":[]}`} {
				haltedAnswer(t, dialects[1], postAsync(t, url, b))
			}
			if n, m := hung.hits.Load(), other.hits.Load(); n != 1 || m != 0 {
				t.Fatalf("targets asked %d and %d times, want 1 and 0: a request after the halt reached one", n, m)
			}
		})
	}
}

// routeCounter counts the times routing is consulted (Defer, Pick).
type routeCounter struct {
	routing.Balancer
	asked atomic.Int32
}

func (b *routeCounter) Pick(ctx *routing.Context, loads []int, eligible routing.Set) int {
	b.asked.Add(1)
	return b.Balancer.Pick(ctx, loads, eligible)
}

func (b *routeCounter) Defer(*routing.Context, []int, routing.Set) time.Duration {
	b.asked.Add(1)
	return 0
}

// TestHaltCutsTokenize: a request waiting for its token ids from a
// replica's /tokenize when the proxy halts is answered 503 shutting_down
// at once. The call is cancelled and counted shutting_down, not as the
// replica's timeout or error, and its /tokenize is not parked; the request
// is neither routed nor sent.
func TestHaltCutsTokenize(t *testing.T) {
	h := newHeld()
	up := newUpstream(t, "v")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/tokenize" {
			h.hold(r)
			return true
		}
		return false
	}
	// tokenize_timeout_ms is 10 s: the call is cut by the halt, not by it.
	p, url := kvRouteProxy(t, up, "predicted_ttft")
	ends := callEnds(t, p, up.URL)
	pl := p.rt.Load().routes["m"].pools[0]
	bal := &routeCounter{Balancer: pl.balancer}
	pl.balancer = bal

	done := postAsync(t, url+"/v1/completions", `{"model":"m","prompt":"hello there"}`)
	<-h.arrived
	p.Halt()
	haltedAnswer(t, dialects[0], done)
	<-h.released
	endedByHalt(t, ends)
	for outcome, want := range map[string]float64{"shutting_down": 1, "timeout": 0, "error": 0} {
		if n := testutil.ToFloat64(p.metrics.Tokenize.WithLabelValues("m", outcome)); n != want {
			t.Errorf("rolter_tokenize_total{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
	if p.tok.Parked(up.URL, time.Now()) {
		t.Error("the replica's /tokenize is parked after a halt")
	}
	if n := bal.asked.Load(); n != 0 {
		t.Errorf("routing was asked %d times for a request halted before it", n)
	}
	if n := up.hits.Load(); n != 1 {
		t.Errorf("the replica was called %d times, want 1 (/tokenize only)", n)
	}
	waitFor(t, func() bool {
		return testutil.ToFloat64(p.metrics.Requests.WithLabelValues("/v1/completions", "m", "503", "")) == 1
	})
}

// TestHaltCutsTheDeliveryPolicy: a request whose answer waits for a
// post_response plugin (the upstream's answer read whole, live or from the
// cache), or whose body waits for the PII sanitizer's request leg, when the
// proxy halts is answered 503 shutting_down at once, whatever the plugin's
// or sanitizer's failure mode would make of a failed call: the call is
// cancelled, the answer is not sent, and the target is neither blamed nor
// credited. The timeouts are 10 s: the calls are cut by the halt, not by
// them.
func TestHaltCutsTheDeliveryPolicy(t *testing.T) {
	tests := []struct {
		name, policy string
		hit          bool // the answer is a cache hit (a first request fills the cache)
		upstreamHits int32
	}{
		{"plugin fail_open", "[[plugins]]\nname = \"p\"\nurl = %q\nstage = \"post_response\"\ntimeout_ms = 10000\n", false, 1},
		{"plugin fail_closed", "[[plugins]]\nname = \"p\"\nurl = %q\nstage = \"post_response\"\ntimeout_ms = 10000\nfailure_mode = \"fail_closed\"\n", false, 1},
		{"plugin on a cache hit", "[[plugins]]\nname = \"p\"\nurl = %q\nstage = \"post_response\"\ntimeout_ms = 10000\n", true, 1},
		{"pii request leg fail_closed", "[pii_sanitizer]\nenabled = true\nurl = %q\ntimeout_ms = 10000\nfailure_mode = \"fail_closed\"\n", false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHeld()
			var calls atomic.Int32
			policy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 && tc.hit { // the call of the request that fills the cache
					_, _ = io.WriteString(w, `{"action":"allow"}`)
					return
				}
				h.hold(r)
			}))
			t.Cleanup(policy.Close)
			up := newUpstream(t, "up")
			acct, usagePath := accountingFile(t)
			p := New(Options{Logger: slog.New(slog.DiscardHandler)})
			ends := callEnds(t, p, policy.URL)
			applyDoc(t, p, acct+haltBreaker+"[cache]\nenabled = true\n"+fmt.Sprintf(tc.policy, policy.URL)+providers(up)+
				"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n[routes.cache]\nttl_secs = 600\n")
			url := newServer(t, p) + "/v1/chat/completions"
			const body = `{"model":"m","messages":[{"role":"user","content":"mail ann@example.com"}]}`
			rows := 1
			if tc.hit {
				if resp, b := post(t, url, "", body); resp.StatusCode != 200 {
					t.Fatalf("the request filling the cache: %d %s", resp.StatusCode, b)
				}
				<-ends // its plugin call's
				rows++
			}
			state := probing(t, p)

			done := postAsync(t, url, body)
			<-h.arrived
			p.Halt()
			haltedAnswer(t, dialects[0], done)
			<-h.released
			endedByHalt(t, ends)
			if n := up.hits.Load(); n != tc.upstreamHits {
				t.Fatalf("the upstream was called %d times, want %d", n, tc.upstreamHits)
			}
			if r := usageRows(t, usagePath, rows)[rows-1]; r.Status != 503 || r.Error != "shutting_down" || r.Withheld {
				t.Fatalf("usage row %+v, want status 503, error shutting_down, not withheld", r)
			}
			waitFor(t, func() bool { return testutil.ToFloat64(p.metrics.InFlight) == 0 && state.InFlight() == 0 })
			if !tc.hit && tc.upstreamHits > 0 {
				wantNoVerdict(t, p, state)
			}
		})
	}
}

// TestHaltEndsAnEmbeddingsRequest: /v1/embeddings makes its attempts as
// the other endpoints do, so a halt ends one the same way: 503
// shutting_down, the upstream call cancelled, the target not blamed.
func TestHaltEndsAnEmbeddingsRequest(t *testing.T) {
	h := newHeld()
	up := newUpstream(t, "up")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool { h.hold(r); return true }
	acct, usagePath := accountingFile(t)
	p := New(Options{Logger: slog.New(slog.DiscardHandler)})
	ends := callEnds(t, p, up.URL)
	applyDoc(t, p, acct+haltBreaker+providers(up)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	state := probing(t, p)
	done := postAsync(t, newServer(t, p)+"/v1/embeddings", `{"model":"m","input":"hi"}`)
	<-h.arrived
	p.Halt()
	haltedAnswer(t, dialects[0], done)
	<-h.released
	endedByHalt(t, ends)
	if r := usageRows(t, usagePath, 1)[0]; r.Status != 503 || r.Error != "shutting_down" {
		t.Fatalf("usage row %+v, want status 503, error shutting_down", r)
	}
	waitFor(t, func() bool { return testutil.ToFloat64(p.metrics.InFlight) == 0 && state.InFlight() == 0 })
	wantNoVerdict(t, p, state)
}
