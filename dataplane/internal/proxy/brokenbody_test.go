package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"rolter.dev/pkg/syncbuf"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"rolter.dev/pkg/usage"
)

// The tests here have an upstream break off its response body (it aborts
// its connection mid-body, as a killed replica does) and check that the
// client can always tell, and that every count says "upstream error".

// dialectCase is one API family: its endpoint, a request, and the first
// part of a response of each kind.
type dialectCase struct {
	name      string
	path      string
	request   string // without "stream"
	firstSSE  string // a first complete event
	firstJSON string // the first bytes of a JSON body
	errEvent  string // how the error event the proxy adds begins
	terminal  string // the event that ends a stream
}

var dialects = []dialectCase{
	{
		name: "openai", path: "/v1/chat/completions",
		request:   `{"model":"m","messages":[{"role":"user","content":"hi"}]`,
		firstSSE:  "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
		firstJSON: `{"id":"c","choices":[`,
		errEvent:  `data: {"error":{"message":"the upstream broke off`,
		terminal:  "data: [DONE]\n\n",
	},
	{
		name: "anthropic", path: "/v1/messages",
		request:   `{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"hi"}]`,
		firstSSE:  "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
		firstJSON: `{"id":"c","type":"message","content":[`,
		errEvent:  "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"the upstream broke off",
		terminal:  "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
	},
}

func (d dialectCase) body(stream bool) string {
	return d.request + fmt.Sprintf(`,"stream":%v}`, stream)
}

// breakingUpstream sends the first part of a response (an SSE event, or
// the first 64 KiB of a JSON body declared 1 MiB long), then, once die is
// closed or sent a value, aborts its connection, or with clean ends the
// body as if it were complete (an engine that shuts down gracefully ends
// its running streams so, without their terminal event).
func breakingUpstream(t *testing.T, d dialectCase, stream, clean bool, die <-chan struct{}) *upstream {
	u := newUpstream(t, "breaking")
	u.handler = func(w http.ResponseWriter, r *http.Request) bool {
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, d.firstSSE)
		} else {
			// More than the proxy holds back before it starts a JSON body.
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(1<<20))
			_, _ = io.WriteString(w, d.firstJSON+strings.Repeat(" ", 64<<10))
		}
		w.(http.Flusher).Flush()
		select {
		case <-die:
		case <-r.Context().Done():
		}
		if clean {
			return true
		}
		panic(http.ErrAbortHandler) // the connection drops mid-body
	}
	return u
}

// accountingFile starts a config: open to clients without a key, with a
// file accounting sink; it returns the config and the file.
func accountingFile(t *testing.T) (string, string) {
	path := filepath.Join(t.TempDir(), "usage.jsonl")
	return fmt.Sprintf("[server]\nrequire_auth = false\n[accounting]\nsink = \"file\"\npath = %q\n", path), path
}

// usageRows waits for n usage rows and returns them.
func usageRows(t *testing.T, path string, n int) []usage.Record {
	t.Helper()
	var rows []usage.Record
	waitFor(t, func() bool {
		b, _ := os.ReadFile(path)
		rows = rows[:0]
		for line := range bytes.SplitSeq(bytes.TrimSpace(b), []byte("\n")) {
			var r usage.Record
			if json.Unmarshal(line, &r) == nil {
				rows = append(rows, r)
			}
		}
		return len(rows) >= n
	})
	return rows
}

// serveProxy serves p over HTTP/1.1 or, with h2, over HTTP/2 (TLS), and
// returns its URL and a client for it.
func serveProxy(tb testing.TB, p *Proxy, h2 bool) (string, *http.Client) {
	tb.Helper()
	srv := httptest.NewUnstartedServer(p)
	startServer(tb, srv, h2)
	return srv.URL, srv.Client()
}

// startServer starts srv over HTTP/1.1 or, with h2, over HTTP/2 (TLS), and
// closes it when the test ends.
func startServer(tb testing.TB, srv *httptest.Server, h2 bool) {
	if h2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	tb.Cleanup(srv.Close)
}

func protoName(h2 bool) string {
	if h2 {
		return "h2"
	}
	return "h1"
}

// TestResponseCutAfterItStarted: a response that the upstream breaks off
// after the client got its first bytes never ends like a complete one,
// nor does a stream whose body ended cleanly before its terminal event. A
// stream gets an error event in the endpoint's dialect, then the
// connection is aborted (HTTP/1.1: no chunked terminator or a short
// Content-Length body, so the client reads an unexpected EOF; HTTP/2: a
// stream reset). The request is a 502 upstream_error in the metrics and
// the usage row, the target's attempt an error, and nothing stays in
// flight.
func TestResponseCutAfterItStarted(t *testing.T) {
	for _, d := range dialects {
		for _, end := range []string{"aborted", "stream ended cleanly", "json aborted"} {
			stream, clean := end != "json aborted", end == "stream ended cleanly"
			for _, h2 := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/%s", d.name, end, protoName(h2)), func(t *testing.T) {
					die := make(chan struct{})
					up := breakingUpstream(t, d, stream, clean, die)
					acct, usagePath := accountingFile(t)
					spans := tracetest.NewSpanRecorder()
					var logs syncbuf.Buffer
					p := New(Options{
						TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
						Logger:         slog.New(slog.NewJSONHandler(&logs, nil)),
					})
					applyDoc(t, p, acct+providers(up)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
					url, client := serveProxy(t, p, h2)

					req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+d.path, strings.NewReader(d.body(stream)))
					resp, err := client.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					if resp.StatusCode != 200 || resp.ProtoMajor != map[bool]int{false: 1, true: 2}[h2] {
						t.Fatalf("status %d over %s", resp.StatusCode, resp.Proto)
					}
					first := d.firstJSON + strings.Repeat(" ", 16<<10)
					if stream {
						first = d.firstSSE
					}
					got := make([]byte, len(first))
					if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != first {
						t.Fatalf("first part %.100q, %v", got, err)
					}
					close(die) // the upstream dies now, after the client has its first bytes
					rest, err := io.ReadAll(resp.Body)
					if err == nil {
						t.Fatalf("the body ended cleanly after %q: a cut response passes for a complete one", rest)
					}
					if !h2 && !errors.Is(err, io.ErrUnexpectedEOF) {
						t.Fatalf("HTTP/1.1 read error %v, want an unexpected EOF", err)
					}
					if h2 && !strings.Contains(err.Error(), "INTERNAL_ERROR") {
						t.Fatalf("HTTP/2 read error %v, want a stream reset", err)
					}
					if stream {
						// The error event, alone after the relayed event.
						ev := strings.TrimLeft(string(rest), "\n")
						if !strings.HasPrefix(ev, d.errEvent) || !strings.HasSuffix(ev, "}\n\n") {
							t.Fatalf("after the cut: %q, want an error event starting %q", rest, d.errEvent)
						}
						if d.name == "openai" && !strings.Contains(ev, `"code":"upstream_error"`) {
							t.Fatalf("error event %q lacks the code", ev)
						}
					} else if strings.TrimLeft(string(rest), " ") != "" {
						t.Fatalf("a JSON body got %.100q after the cut", rest)
					}

					rows := usageRows(t, usagePath, 1)
					if r := rows[0]; r.Status != 502 || r.Error != "upstream_error" || !r.UsageUnknown || r.Provider != "p0" {
						t.Fatalf("usage row %+v, want status 502, error upstream_error, usage_unknown", r)
					}
					if n := testutil.ToFloat64(p.metrics.Requests.WithLabelValues(d.path, "m", "502", "")); n != 1 {
						t.Fatalf("rolter_requests_total{code=502} = %v", n)
					}
					if n := testutil.ToFloat64(p.metrics.Requests.WithLabelValues(d.path, "m", "200", "")); n != 0 {
						t.Fatalf("rolter_requests_total{code=200} = %v", n)
					}
					if ok, bad := testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", "ok")),
						testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", "error")); ok != 0 || bad != 1 {
						t.Fatalf("target outcomes ok=%v error=%v, want 0 and 1", ok, bad)
					}
					if n := testutil.ToFloat64(p.metrics.UpstreamErrors.WithLabelValues("p0", "body")); n != 1 {
						t.Fatalf("rolter_upstream_errors_total{reason=body} = %v", n)
					}
					waitFor(t, func() bool {
						return testutil.ToFloat64(p.metrics.InFlight) == 0 && p.rt.Load().routes["m"].pools[0].targets[0].state.InFlight() == 0
					})
					var span sdktrace.ReadOnlySpan
					for _, s := range spans.Ended() {
						if s.Name() == "rolter.request" {
							span = s
						}
					}
					if span == nil || span.Status().Code != codes.Error || !hasAttr(span, "rolter.error", "upstream_error") {
						t.Fatalf("request span %v", span)
					}
					if l := logs.String(); !strings.Contains(l, `"msg":"request"`) || !strings.Contains(l, `"status":502`) || !strings.Contains(l, `"error":"upstream_error"`) {
						t.Fatalf("access log %s", l)
					}
				})
			}
		}
	}
}

// TestResponseBrokenBeforeItStartedIsRetried: an upstream that breaks off
// before the client got a byte (a stream that sent only its headers, or a
// JSON body cut short, buffered or not, its body broken or ended as if
// whole) is a failed attempt like any other:
// the next target answers. With no other target the client gets a 502 in
// the endpoint's dialect, never the partial body.
func TestResponseBrokenBeforeItStartedIsRetried(t *testing.T) {
	type mode struct {
		name   string
		stream bool
		extra  string // config making the JSON body buffered
		part   bool   // the upstream sends its first part before dying
		clean  bool   // the upstream ends its body instead of aborting
	}
	modes := []mode{
		{"stream, headers only", true, "", false, false},
		{"stream, headers only, ended cleanly", true, "", false, true},
		{"json, buffered for the delivery policy", false, "[guardrails]\n[[guardrails.rules]]\nname = \"email\"\nbuiltin = \"email\"\nstage = \"post_call\"\naction = \"block\"\n", true, false},
		{"json, headers only", false, "", false, false},
		{"json, a short part", false, "", true, false},
		{"json, a short part, ended cleanly", false, "", true, true},
		{"json, buffered for the delivery policy, a short part, ended cleanly", false, "[guardrails]\n[[guardrails.rules]]\nname = \"email\"\nbuiltin = \"email\"\nstage = \"post_call\"\naction = \"block\"\n", true, true},
	}
	for _, d := range dialects {
		for _, m := range modes {
			t.Run(d.name+"/"+m.name, func(t *testing.T) {
				dd := d
				dd.firstJSON = strings.Replace(d.firstJSON, `"c"`, `"ann@example.com"`, 1)
				bad := newUpstream(t, "bad")
				bad.handler = func(w http.ResponseWriter, r *http.Request) bool {
					if m.stream {
						w.Header().Set("Content-Type", "text/event-stream")
					} else {
						w.Header().Set("Content-Type", "application/json")
						if !m.clean { // else chunked, and ended as if whole
							w.Header().Set("Content-Length", "4096")
						}
					}
					w.WriteHeader(200)
					if m.part {
						_, _ = io.WriteString(w, dd.firstJSON)
					}
					w.(http.Flusher).Flush()
					if m.clean {
						return true
					}
					panic(http.ErrAbortHandler)
				}
				good := newUpstream(t, "good")
				good.handler = func(w http.ResponseWriter, r *http.Request) bool {
					if m.stream {
						w.Header().Set("Content-Type", "text/event-stream")
						_, _ = io.WriteString(w, d.firstSSE+"data: [DONE]\n\n")
						return true
					}
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"id":"c","served_by":"good"}`)
					return true
				}
				route := "[[routes]]\nmodel = \"m\"\nstrategy = \"round_robin\"\n"
				retry := "[retry]\nbase_backoff_ms = 1\nmax_backoff_ms = 2\n"

				t.Run("another target answers", func(t *testing.T) {
					acct, usagePath := accountingFile(t)
					p := New(Options{})
					// round_robin's first pick is the first target: the bad one.
					applyDoc(t, p, m.extra+retry+acct+providers(bad, good)+route+"targets = [{ provider = \"p0\" }, { provider = \"p1\" }]\n")
					url := newServer(t, p)
					hits := bad.hits.Load()
					resp, body := post(t, url+d.path, "", d.body(m.stream))
					if bad.hits.Load() != hits+1 {
						t.Fatal("the breaking target was not tried first")
					}
					if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Provider") != "p1" {
						t.Fatalf("status %d from %q: %s", resp.StatusCode, resp.Header.Get("X-Rolter-Provider"), body)
					}
					if resp.Header.Get("Content-Length") == "4096" || strings.Contains(string(body), "ann@example.com") {
						t.Fatalf("the broken attempt leaked into the answer: %v %s", resp.Header, body)
					}
					if r := usageRows(t, usagePath, 1)[0]; r.Status != 200 || r.Provider != "p1" || r.Error != "" {
						t.Fatalf("usage row %+v", r)
					}
					if n := testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", "error")); n != 1 {
						t.Fatalf("the broken attempt counted %v times as an error", n)
					}
				})

				t.Run("no other target", func(t *testing.T) {
					acct, usagePath := accountingFile(t)
					p := New(Options{})
					applyDoc(t, p, m.extra+acct+providers(bad)+route+"targets = [{ provider = \"p0\" }]\n")
					url := newServer(t, p)
					resp, body := post(t, url+d.path, "", d.body(m.stream))
					if resp.StatusCode != 502 || resp.Header.Get("X-Rolter-Error") != "upstream_error" {
						t.Fatalf("status %d: %s", resp.StatusCode, body)
					}
					if strings.Contains(string(body), "ann@example.com") || strings.Contains(string(body), "choices") {
						t.Fatalf("the partial body reached the client: %s", body)
					}
					var shape struct {
						Type  string `json:"type"`
						Error struct {
							Type string `json:"type"`
							Code string `json:"code"`
						} `json:"error"`
					}
					if err := json.Unmarshal(body, &shape); err != nil {
						t.Fatalf("%v: %s", err, body)
					}
					if d.name == "anthropic" && (shape.Type != "error" || shape.Error.Type != "api_error") ||
						d.name == "openai" && shape.Error.Code != "upstream_error" {
						t.Fatalf("not the %s error shape: %s", d.name, body)
					}
					if r := usageRows(t, usagePath, 1)[0]; r.Status != 502 || r.Error != "upstream_error" || !r.UsageUnknown {
						t.Fatalf("usage row %+v", r)
					}
					if ok, bad := testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", "ok")),
						testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", "error")); ok != 0 || bad != 1 {
						t.Fatalf("target outcomes ok=%v error=%v", ok, bad)
					}
				})
			})
		}
	}
}

// TestCutStreamIsNeverCached: a stream broken off before its terminal
// event is not stored, so the next identical request goes upstream again
// rather than replaying half an answer.
func TestCutStreamIsNeverCached(t *testing.T) {
	d := dialects[0]
	die := make(chan struct{})
	up := breakingUpstream(t, d, true, false, die)
	p := New(Options{})
	applyDoc(t, p, "[server]\nrequire_auth = false\n[cache]\nenabled = true\n"+providers(up)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n[routes.cache]\nttl_secs = 600\n")
	url := newServer(t, p)
	for i := range 2 {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+d.path, strings.NewReader(d.body(true)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if c := resp.Header.Get("X-Rolter-Cache"); c != "MISS" {
			t.Fatalf("request %d: cache %q", i, c)
		}
		rd := bufio.NewReader(resp.Body)
		if _, err := rd.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		die <- struct{}{} // this request's upstream dies after the first event
		_, err = io.ReadAll(rd)
		resp.Body.Close()
		if err == nil {
			t.Fatalf("request %d: the cut stream ended cleanly", i)
		}
	}
	if n := up.hits.Load(); n != 2 {
		t.Fatalf("upstream called %d times, want 2", n)
	}
	if s := p.rt.Load().cache.cache.Stats(); s.Stores != 0 || s.Incomplete != 2 {
		t.Fatalf("cache stats %+v, want no store and 2 incomplete", s)
	}
}

func hasAttr(s sdktrace.ReadOnlySpan, key, value string) bool {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key && kv.Value.AsString() == value {
			return true
		}
	}
	return false
}

// TestStreamBrokenAfterItsTerminalEventIsComplete: an upstream that breaks
// off after the stream's terminal event ([DONE], message_stop) lost nothing
// of the answer: the client's stream ends cleanly and the request is a 200.
func TestStreamBrokenAfterItsTerminalEventIsComplete(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			up := newUpstream(t, "up")
			up.handler = func(w http.ResponseWriter, r *http.Request) bool {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, d.firstSSE+d.terminal)
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			}
			acct, usagePath := accountingFile(t)
			p := New(Options{})
			applyDoc(t, p, acct+providers(up)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, newServer(t, p)+d.path, strings.NewReader(d.body(true)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil || string(body) != d.firstSSE+d.terminal {
				t.Fatalf("body %q, %v; want the whole stream, ended cleanly", body, err)
			}
			if r := usageRows(t, usagePath, 1)[0]; r.Status != 200 || r.Error != "" {
				t.Fatalf("usage row %+v", r)
			}
		})
	}
}

// TestStreamWithTheUpstreamsErrorEvent: a stream that carries the
// upstream's own error event (vLLM sends one when generation fails
// mid-stream, then data: [DONE]; Anthropic's ends after it) reaches the
// client as sent, which is told, and the proxy does not report it as a
// success: a server error is a 502 upstream_error and a failure of the
// target, a client error the request's status (the target answered, and
// is not parked); neither teaches routing a completion, and neither is
// cached.
func TestStreamWithTheUpstreamsErrorEvent(t *testing.T) {
	cases := []struct {
		name, path, request, stream string
		status                      int // the request's, as counted
		targetFailed                bool
	}{
		{"openai, a server error, then [DONE]", "/v1/chat/completions", dialects[0].body(true),
			dialects[0].firstSSE + "data: {\"error\":{\"message\":\"engine died\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n", 502, true},
		{"openai, a server error, then the end", "/v1/chat/completions", dialects[0].body(true),
			dialects[0].firstSSE + "data: {\"error\":{\"message\":\"engine died\",\"type\":\"InternalServerError\",\"code\":500}}\n\n", 502, true},
		{"openai, a bad request", "/v1/chat/completions", dialects[0].body(true),
			dialects[0].firstSSE + "data: {\"error\":{\"message\":\"bad tool call\",\"type\":\"BadRequestError\",\"code\":400}}\n\ndata: [DONE]\n\n", 400, false},
		{"anthropic error event", "/v1/messages", dialects[1].body(true),
			dialects[1].firstSSE + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"engine died\"}}\n\n", 502, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, "up")
			up.handler = func(w http.ResponseWriter, r *http.Request) bool {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, tc.stream)
				return true
			}
			acct, usagePath := accountingFile(t)
			p := New(Options{})
			applyDoc(t, p, acct+"[cache]\nenabled = true\n"+providers(up)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n[routes.cache]\nttl_secs = 600\n")
			url := newServer(t, p)
			for i := range 2 {
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+tc.path, strings.NewReader(tc.request))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || string(body) != tc.stream {
					t.Fatalf("request %d: status %d, body %q, %v; want the stream as the upstream sent it", i, resp.StatusCode, body, err)
				}
			}
			if n := up.hits.Load(); n != 2 {
				t.Fatalf("upstream called %d times: the failed stream was cached", n)
			}
			// The client can read the stream's end before the handler has
			// counted the request: wait for both requests' records.
			usage := usageRows(t, usagePath, 2)
			code := strconv.Itoa(tc.status)
			waitFor(t, func() bool {
				return testutil.ToFloat64(p.metrics.Requests.WithLabelValues(tc.path, "m", code, "")) >= 2 &&
					testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", "ok"))+
						testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", "error")) >= 2
			})
			if n := testutil.ToFloat64(p.metrics.Requests.WithLabelValues(tc.path, "m", code, "")); n != 2 {
				t.Fatalf("rolter_requests_total{code=%s} = %v, want 2", code, n)
			}
			if ok, bad := testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", "ok")),
				testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", "error")); ok != 0 || bad != 2 {
				t.Fatalf("target outcomes ok=%v error=%v, want 0 and 2", ok, bad)
			}
			wantFailed := 0.0
			if tc.targetFailed {
				wantFailed = 2
			}
			if n := testutil.ToFloat64(p.metrics.UpstreamErrors.WithLabelValues("p0", "event")); n != wantFailed {
				t.Fatalf("rolter_upstream_errors_total{reason=event} = %v, want %v", n, wantFailed)
			}
			for _, r := range usage {
				if r.Status != tc.status || tc.status == 502 && r.Error != "upstream_error" {
					t.Fatalf("usage row %+v, want status %d", r, tc.status)
				}
			}
		})
	}
}
