package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"rolter.dev/pkg/reliability"
	"rolter.dev/pkg/usage"
)

// The tests here play clients that stop reading a response, or read it
// slowly, against a proxy whose server.client_write_timeout_ms is 1 s.
// Nothing is timed: the stalled client is cut off whenever the proxy gets
// to it, and the slow readers take as long as they take.

// writeTimeoutServer gives 1 s per write. Not less: on a loaded 2-core CI
// machine a reader that kept reading was once held up past 200 ms for one
// piece, and a stalled HTTP/2 client was once counted closed rather than
// cut off: net/http applies a stream's write deadline asynchronously, in
// the connection's serve loop, so a write that completed just before its
// deadline can leave the timer to reset the stream while the next write
// has a deadline of its own, which that write's error then does not pass.
const writeTimeoutServer = "[server]\nrequire_auth = false\nclient_write_timeout_ms = 1000\n"

// shortWriteTimeoutServer gives 200 ms per write, for a test that waits
// past the deadline of a response that was taken whole.
const shortWriteTimeoutServer = "[server]\nrequire_auth = false\nclient_write_timeout_ms = 200\n"

// Socket buffer sizes. A tiny one makes a client that stops reading block
// the proxy's writes after a few KiB instead of after the megabytes the
// kernel would buffer by itself. A client that reads is given a small one
// too, but not below the loopback MSS (64 KiB): a window smaller than a
// segment makes TCP wait for its persist timer (200 ms and more) before it
// sends again, and a reading client would look stalled.
const (
	tinyBuffer  = 4 << 10
	smallBuffer = 256 << 10
)

// sendBuffers gives the proxy's accepted connections a send buffer of
// size bytes.
type sendBuffers struct {
	net.Listener
	size int
}

func (l sendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(l.size)
	}
	return c, err
}

// serveSmallBuffers serves p with send buffers of size bytes, over
// HTTP/1.1 or, with h2, HTTP/2 (TLS), and returns its URL and a client
// whose connections have receive buffers of that size.
func serveSmallBuffers(t *testing.T, p *Proxy, h2 bool, size int) (string, *http.Client) {
	t.Helper()
	srv := httptest.NewUnstartedServer(p)
	srv.Listener = sendBuffers{srv.Listener, size}
	startServer(t, srv, h2)
	tr := srv.Client().Transport.(*http.Transport).Clone()
	var d net.Dialer
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			receiveBuffer(c, size)
		}
		return c, err
	}
	t.Cleanup(tr.CloseIdleConnections)
	return srv.URL, &http.Client{Transport: tr}
}

// receiveBuffer sets a client connection's receive buffer: what the client
// does not read fills it.
func receiveBuffer(c net.Conn, size int) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(size)
	}
}

// endlessUpstream answers every request with a response that never ends
// (SSE events, or a JSON body), written as fast as the proxy takes it.
// When the request's context ends, which only the proxy can cause, it
// closes cancelled.
func endlessUpstream(t *testing.T, stream bool, cancelled chan<- struct{}) *upstream {
	up := newUpstream(t, "endless")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		chunk := strings.Repeat("x", 1<<10)
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
			chunk = `data: {"choices":[{"delta":{"content":"` + chunk + `"}}]}` + "\n\n"
		} else {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"c","choices":[{"message":{"content":"`)
		}
		rc := http.NewResponseController(w)
		for r.Context().Err() == nil {
			if _, err := io.WriteString(w, chunk); err != nil {
				break
			}
			if err := rc.Flush(); err != nil {
				break
			}
		}
		<-r.Context().Done()
		close(cancelled)
		return true
	}
	return up
}

// stalledClient is a client that sent a request and reads none of the
// response: over HTTP/1.1 a raw connection with a tiny receive buffer;
// over HTTP/2 Go's client with a stream window of 64 KiB (HTTP/2's
// initial one; Go's own default is 4 MiB), which, as nothing is read,
// never sends a WINDOW_UPDATE, so the proxy can send no more than the
// window on the stream.
type stalledClient struct {
	conn net.Conn       // HTTP/1.1
	resp *http.Response // HTTP/2
}

// stall sends body to the chat completions endpoint of the proxy at url
// (client is the one serveSmallBuffers returned for it), as a client that
// then reads nothing. Over HTTP/2 it returns once the response's headers
// arrived.
func stall(t *testing.T, url string, client *http.Client, h2 bool, body string) *stalledClient {
	t.Helper()
	if !h2 {
		c := rawConn(t, url)
		receiveBuffer(c, tinyBuffer)
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		return &stalledClient{conn: c}
	}
	tr := client.Transport.(*http.Transport).Clone()
	tr.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerStream: 64 << 10}
	t.Cleanup(tr.CloseIdleConnections)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %d, want an HTTP/2 200", resp.Proto, resp.StatusCode)
	}
	return &stalledClient{resp: resp}
}

// wantCut reads, once the proxy has given up on the client, what reached
// it, and fails unless that cannot pass for a complete response: over
// HTTP/1.1 the proxy closed the connection, after a chunked 200 that lacks
// its terminator; over HTTP/2 it reset the stream. It returns the body
// bytes that arrived (HTTP/2) or everything the connection carried
// (HTTP/1.1).
func (c *stalledClient) wantCut(t *testing.T) []byte {
	t.Helper()
	if c.conn != nil {
		_ = c.conn.SetReadDeadline(time.Now().Add(20 * time.Second)) // a failsafe, not a measure
		got, err := io.ReadAll(c.conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the client's connection is still open after %d bytes", len(got))
		}
		if !bytes.HasPrefix(got, []byte("HTTP/1.1 200 OK\r\n")) || !bytes.Contains(got, []byte("Transfer-Encoding: chunked\r\n")) {
			t.Fatalf("the response began %.200q", got)
		}
		if bytes.HasSuffix(got, []byte("\r\n0\r\n\r\n")) {
			t.Fatal("the cut response ends with the chunked terminator, like a complete one")
		}
		return got
	}
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(c.resp.Body)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			t.Fatalf("the body ended cleanly after %d bytes: a cut response passes for a complete one", len(r.b))
		}
		if !strings.Contains(r.err.Error(), "INTERNAL_ERROR") {
			t.Fatalf("HTTP/2 read error %v after %d bytes, want a stream reset", r.err, len(r.b))
		}
		return r.b
	case <-time.After(20 * time.Second): // a failsafe, not a measure
		t.Fatal("the client's stream is still open")
	}
	return nil
}

// wantCutOff checks the counts once a proxy's last request was cut off
// for not reading, after served requests answered 200: the request left
// every in-flight count (the proxy's, and route m's target's), is counted
// as a write timeout and never as a closed connection, and is a 499 with
// error client_write_timeout, never a 200, in the metrics and in its
// usage row (the last of the file at usagePath), which it returns. It
// waits for that row: the request has ended.
func wantCutOff(t *testing.T, p *Proxy, usagePath string, served int) usage.Record {
	t.Helper()
	rows := usageRows(t, usagePath, served+1) // the request has ended
	waitFor(t, func() bool {
		return testutil.ToFloat64(p.metrics.InFlight) == 0 && p.rt.Load().routes["m"].pools[0].targets[0].state.InFlight() == 0
	})
	if n := testutil.ToFloat64(p.metrics.ClientDisconnects.WithLabelValues("write_timeout")); n != 1 {
		t.Fatalf("rolter_client_disconnects_total{reason=write_timeout} = %v, want 1", n)
	}
	if n := testutil.ToFloat64(p.metrics.ClientDisconnects.WithLabelValues("closed")); n != 0 {
		t.Fatalf("rolter_client_disconnects_total{reason=closed} = %v, want 0", n)
	}
	if ok, cut := testutil.ToFloat64(p.metrics.Requests.WithLabelValues("/v1/chat/completions", "m", "200", "")),
		testutil.ToFloat64(p.metrics.Requests.WithLabelValues("/v1/chat/completions", "m", "499", "")); ok != float64(served) || cut != 1 {
		t.Fatalf("rolter_requests_total code=200: %v, code=499: %v; want %d and 1", ok, cut, served)
	}
	r := rows[len(rows)-1]
	if len(rows) != served+1 || r.Status != 499 || r.Error != codeClientWriteTimeout {
		t.Fatalf("usage rows %+v, want %d, the last with status 499 and error %s", rows, served+1, codeClientWriteTimeout)
	}
	return r
}

// TestClientThatStopsReadingIsCutOff: a client that sends a request and
// then never reads (see stalledClient) is cut off once a write to it has
// waited server.client_write_timeout_ms: the upstream request is cancelled
// (the upstream sees its context end), the request leaves every in-flight
// count, is counted as a write timeout (a 499, never a success, in the
// metrics and the usage row; the attempt client_gone), nothing is cached,
// and the response ends so that it cannot pass for a complete one
// (HTTP/1.1: the connection closed without the chunked terminator;
// HTTP/2: the stream reset). For a stream, for a JSON body relayed as it
// comes, and for one first buffered for the response cache; over HTTP/1.1
// and HTTP/2 (where the stream's flow-control window fills, not a socket
// buffer).
func TestClientThatStopsReadingIsCutOff(t *testing.T) {
	tests := []struct {
		name          string
		stream, cache bool
	}{
		{"stream", true, true},
		{"json, relayed as it comes", false, false},
		{"json, buffered for the cache (then too large to store)", false, true},
	}
	for _, tc := range tests {
		for _, h2 := range []bool{false, true} {
			t.Run(tc.name+"/"+protoName(h2), func(t *testing.T) {
				cancelled := make(chan struct{})
				up := endlessUpstream(t, tc.stream, cancelled)
				usagePath := filepath.Join(t.TempDir(), "usage.jsonl")
				doc := writeTimeoutServer + fmt.Sprintf("[accounting]\nsink = \"file\"\npath = %q\n", usagePath)
				if tc.cache {
					doc += "[cache]\nenabled = true\n"
				}
				doc += providers(up) + "[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n"
				if tc.cache {
					doc += "[routes.cache]\nttl_secs = 600\n"
				}
				p := New(Options{})
				applyDoc(t, p, doc)
				url, client := serveSmallBuffers(t, p, h2, tinyBuffer)

				c := stall(t, url, client, h2, fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, tc.stream))
				select {
				case <-cancelled:
				case <-time.After(20 * time.Second): // a failsafe, not a measure
					t.Fatal("the upstream request was never cancelled: the proxy is still writing to a client that does not read")
				}
				wantCutOff(t, p, usagePath, 0)
				wantOutcomes(t, p, map[string]float64{"client_gone": 1})
				if tc.cache {
					if s := p.rt.Load().cache.cache.Stats(); s.Stores != 0 {
						t.Fatalf("cache stats %+v: the cut response was stored", s)
					}
				}
				c.wantCut(t)
			})
		}
	}
}

// largeUpstream answers every request with a 200 of about size bytes: a
// JSON body, or SSE events of 1 KiB ending with [DONE]. It returns the
// body too.
func largeUpstream(t *testing.T, stream bool, size int) (*upstream, string) {
	var body string
	if stream {
		ev := `data: {"choices":[{"delta":{"content":"` + strings.Repeat("x", 1<<10) + `"}}]}` + "\n\n"
		body = strings.Repeat(ev, size/len(ev)+1) + "data: [DONE]\n\n"
	} else {
		body = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("x", size) + `"}}]}`
	}
	up := newUpstream(t, "large")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		_, _ = io.WriteString(w, body)
		return true
	}
	return up, body
}

// cacheLarge is the end of a config with route m on provider p0 whose
// answers are cached (in process), up to 32 MiB each.
const cacheLarge = "[cache]\nenabled = true\nmax_entry_bytes = 33554432\n" +
	"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n[routes.cache]\nttl_secs = 600\n"

// fillCache sends body to the proxy at url once, reads its answer whole
// (through a server with the kernel's own socket buffers: no write waits
// long) and checks that it came from the upstream and was stored.
func fillCache(t *testing.T, p *Proxy, url, body, want string) {
	t.Helper()
	resp, got := post(t, url+"/v1/chat/completions", "", body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Rolter-Cache") != "MISS" || string(got) != want {
		t.Fatalf("the first request: %d, x-rolter-cache %q, %d bytes of %d", resp.StatusCode, resp.Header.Get("X-Rolter-Cache"), len(got), len(want))
	}
	waitFor(t, func() bool { return p.rt.Load().cache.cache.Stats().Stores == 1 })
}

// TestReplayToAClientThatStopsReadingIsCutOff: a response replayed from
// the cache to a client that never reads (see stalledClient) is cut off
// like a relayed one: a cached body of 4 MiB, far more than the socket
// buffers or the HTTP/2 stream window take, fills them, the write waits
// server.client_write_timeout_ms and fails, and the request is counted as
// a write timeout, a 499 (not the entry's 200) in the metrics and its
// usage row, leaves the proxy's in-flight count, and ends so that it
// cannot pass for a complete response. Neither the upstream nor its
// target counts are touched by the replay. For a JSON body (written
// whole) and a stream (replayed event by event), over HTTP/1.1 and HTTP/2.
func TestReplayToAClientThatStopsReadingIsCutOff(t *testing.T) {
	for _, stream := range []bool{false, true} {
		for _, h2 := range []bool{false, true} {
			t.Run(fmt.Sprintf("stream=%v/%s", stream, protoName(h2)), func(t *testing.T) {
				up, answer := largeUpstream(t, stream, 4<<20)
				usagePath := filepath.Join(t.TempDir(), "usage.jsonl")
				p := New(Options{})
				applyDoc(t, p, writeTimeoutServer+fmt.Sprintf("[accounting]\nsink = \"file\"\npath = %q\n", usagePath)+providers(up)+cacheLarge)
				body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
				fillCache(t, p, newServer(t, p), body, answer)

				url, client := serveSmallBuffers(t, p, h2, tinyBuffer)
				c := stall(t, url, client, h2, body)
				r := wantCutOff(t, p, usagePath, 1)
				if r.CacheHit != "exact" {
					t.Fatalf("usage row %+v, want an exact cache hit", r)
				}
				if s := p.rt.Load().cache.cache.Stats(); s.Hits != 1 || s.Stores != 1 {
					t.Fatalf("cache stats %+v, want the one entry and one hit", s)
				}
				if n := up.hits.Load(); n != 1 {
					t.Fatalf("the upstream was called %d times, want once (the replay is the cache's)", n)
				}
				wantOutcomes(t, p, map[string]float64{"ok": 1})
				if got := c.wantCut(t); len(got) >= len(answer) {
					t.Fatalf("the client got %d bytes of the %d-byte entry", len(got), len(answer))
				}
			})
		}
	}
}

// slowReader is a client that reads slower than the proxy writes, and
// keeps reading: at most 16 KiB at a time, each after a pause far shorter
// than the proxy's timeout.
type slowReader struct {
	r     io.Reader
	pause time.Duration // before each read
}

func (s slowReader) Read(b []byte) (int, error) {
	time.Sleep(s.pause)
	return s.r.Read(b[:min(len(b), 16<<10)])
}

// TestSlowReaderGetsTheWholeStream: the timeout bounds each write, not the
// response. A stream that waits longer than the timeout for its upstream's
// next event (over HTTP/2 the deadline is a timer, which would reset the
// stream unless it is cleared between writes), then sends 2 MiB, several
// times what the socket buffers hold, while the client reads it slowly (so
// the proxy's writes block, each for less than the timeout), reaches the
// client whole, over HTTP/1.1 and HTTP/2, and counts as a 200. The timeout
// is 1 s (writeTimeoutServer), so the upstream's pause is 1.5 s; the two
// protocols run in parallel, so the test waits for it once.
func TestSlowReaderGetsTheWholeStream(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(protoName(h2), func(t *testing.T) {
			t.Parallel()
			events := []string{"data: {\"n\":0}\n\n"}
			for i := 1; i <= 2048; i++ {
				events = append(events, fmt.Sprintf("data: {\"n\":%d,\"pad\":%q}\n\n", i, strings.Repeat("x", 1<<10)))
			}
			events = append(events, "data: [DONE]\n\n")
			up := newUpstream(t, "a")
			up.handler = func(w http.ResponseWriter, r *http.Request) bool {
				w.Header().Set("Content-Type", "text/event-stream")
				rc := http.NewResponseController(w)
				for i, ev := range events {
					if i == 1 {
						// No event for longer than the proxy's timeout: the
						// time the upstream takes is not the client's.
						select {
						case <-time.After(1500 * time.Millisecond):
						case <-r.Context().Done():
							return true
						}
					}
					_, _ = io.WriteString(w, ev)
					_ = rc.Flush()
				}
				return true
			}
			p := New(Options{})
			applyDoc(t, p, writeTimeoutServer+"[accounting]\nsink = \"none\"\n"+providers(up)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
			url, client := serveSmallBuffers(t, p, h2, smallBuffer)
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(slowReader{resp.Body, time.Millisecond})
			if err != nil {
				t.Fatalf("after %d bytes: %v", len(got), err)
			}
			if want := strings.Join(events, ""); string(got) != want {
				t.Fatalf("got %d bytes, want the whole stream (%d bytes)", len(got), len(want))
			}
			waitFor(t, func() bool { return testutil.ToFloat64(p.metrics.InFlight) == 0 })
			wantServedWhole(t, p, 1)
		})
	}
}

// TestSlowReaderGetsTheWholeBody: a JSON body the proxy holds whole
// before it writes it (buffered to be stored in the cache, then replayed
// from it) is written to the client a bounded piece at a time, each with
// its own timeout, like a relayed one: a 16 MiB body, which the slow
// client takes at least twice the timeout to read (at most 16 KiB per
// read, 2 ms apart: over 2 s, against 1 s), reaches it whole, stored and
// then replayed, over HTTP/1.1 and HTTP/2, and both are 200s. The timeout
// is 1 s (writeTimeoutServer): each 32 KiB piece must be taken within it,
// and on a loaded 2-core CI machine a reader that keeps reading was once
// held up past 200 ms (cut after 13 MB).
func TestSlowReaderGetsTheWholeBody(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(protoName(h2), func(t *testing.T) {
			up, answer := largeUpstream(t, false, 16<<20)
			p := New(Options{})
			applyDoc(t, p, writeTimeoutServer+"[accounting]\nsink = \"none\"\n"+providers(up)+cacheLarge)
			url, client := serveSmallBuffers(t, p, h2, smallBuffer)
			for i, want := range []string{"MISS", "HIT"} {
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(slowReader{resp.Body, 2 * time.Millisecond})
				resp.Body.Close()
				if err != nil {
					t.Fatalf("request %d (%s): after %d bytes: %v", i+1, want, len(got), err)
				}
				if c := resp.Header.Get("X-Rolter-Cache"); c != want || string(got) != answer {
					t.Fatalf("request %d: x-rolter-cache %q, %d bytes; want %s and the whole body (%d bytes)", i+1, c, len(got), want, len(answer))
				}
				waitFor(t, func() bool { return testutil.ToFloat64(p.metrics.InFlight) == 0 })
			}
			wantServedWhole(t, p, 2)
		})
	}
}

// TestKeepAliveConnectionOutlivesTheWriteDeadline: the deadline a response
// sets for the server's last writes after the handler does not outlive it
// on an HTTP/1.1 connection (net/http clears it once the response is
// finished): the next request on the connection, however long it sat idle
// in between, is answered, including the "100 Continue" the server writes
// before any handler write when a request has "Expect: 100-continue" (as
// curl sends with large bodies).
func TestKeepAliveConnectionOutlivesTheWriteDeadline(t *testing.T) {
	up := newUpstream(t, "a")
	p := New(Options{})
	applyDoc(t, p, shortWriteTimeoutServer+"[accounting]\nsink = \"none\"\n"+providers(up)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	c := rawConn(t, newServer(t, p))
	br := bufio.NewReader(c)
	const body = `{"model":"m"}`
	for i := range 2 {
		head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", len(body))
		if i == 0 {
			fmt.Fprintf(c, "%s\r\n%s", head, body)
		} else {
			time.Sleep(400 * time.Millisecond) // idle past the last response's deadline
			fmt.Fprintf(c, "%sExpect: 100-continue\r\n\r\n", head)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusContinue {
				t.Fatalf("request 2 on the connection: %v %v, want 100 Continue", resp, err)
			}
			io.WriteString(c, body)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the connection: %v", i+1, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), `"served_by":"a"`) {
			t.Fatalf("request %d on the connection: %d %q %v", i+1, resp.StatusCode, b, err)
		}
	}
	if n := testutil.ToFloat64(p.metrics.ClientDisconnects.WithLabelValues("write_timeout")); n != 0 {
		t.Fatalf("rolter_client_disconnects_total{reason=write_timeout} = %v, want 0", n)
	}
}

// wantOutcomes checks rolter_target_requests_total of route m's target p0
// by outcome: want's counts, and 0 for the outcomes it does not name.
func wantOutcomes(t *testing.T, p *Proxy, want map[string]float64) {
	t.Helper()
	for _, outcome := range []string{"ok", "error", "client_gone"} {
		if n := testutil.ToFloat64(p.metrics.TargetRequests.WithLabelValues("m", "p0", outcome)); n != want[outcome] {
			t.Errorf("rolter_target_requests_total{outcome=%q} = %v, want %v", outcome, n, want[outcome])
		}
	}
}

// TestClientGoneIsNoVerdictOnTheTarget: an attempt whose client goes away
// before its answer reached it whole (before the upstream's headers, in
// the middle of a stream, while a body is buffered for the cache) is
// counted as outcome client_gone, never ok, and is neither a success nor a
// failure of the target's breaker: a half-open breaker whose probe it was
// stays half-open (not closed by an answer nobody saw whole) and lets the
// next request probe (not wedged waiting for a verdict that never comes).
func TestClientGoneIsNoVerdictOnTheTarget(t *testing.T) {
	tests := []struct {
		name   string
		stream bool
		cache  bool
		part   string // what the upstream sends before it waits; "" = not even its headers
	}{
		{"before the upstream's headers", true, false, ""},
		{"mid-stream", true, false, "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n"},
		{"while a body is buffered for the cache", false, true, `{"id":"c","choices":[`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			arrived, cancelled := make(chan struct{}), make(chan struct{})
			up := newUpstream(t, "up")
			up.handler = func(w http.ResponseWriter, r *http.Request) bool {
				if tc.part != "" {
					if tc.stream {
						w.Header().Set("Content-Type", "text/event-stream")
					} else {
						w.Header().Set("Content-Type", "application/json")
					}
					_, _ = io.WriteString(w, tc.part)
					w.(http.Flusher).Flush()
				}
				close(arrived)
				<-r.Context().Done() // only the proxy ends it
				close(cancelled)
				return true
			}
			doc := openAuth + "[breaker]\nenabled = true\nfailure_threshold = 1\nopen_secs = 30\n"
			if tc.cache {
				doc += "[cache]\nenabled = true\n"
			}
			doc += providers(up) + "[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n"
			if tc.cache {
				doc += "[routes.cache]\nttl_secs = 600\n"
			}
			// headers is closed when the proxy has the upstream's headers.
			headers := make(chan struct{})
			base := http.DefaultTransport.(*http.Transport).Clone()
			t.Cleanup(base.CloseIdleConnections)
			tr := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := base.RoundTrip(r)
				if err == nil {
					close(headers)
				}
				return resp, err
			})
			p := New(Options{Transport: tr})
			applyDoc(t, p, doc)
			url := newServer(t, p)
			rt := p.rt.Load()
			state := rt.routes["m"].pools[0].targets[0].state
			// The breaker opened an hour ago: this request is its half-open probe.
			if !state.BreakerFailure(time.Now().Add(-time.Hour), rt.breaker) {
				t.Fatal("the breaker did not open")
			}

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, tc.stream)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
			done := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					if tc.stream && tc.part != "" {
						// The stream started: the client has its first event.
						line, rerr := bufio.NewReader(resp.Body).ReadString('\n')
						if rerr != nil || !strings.HasPrefix(line, "data: ") {
							err = fmt.Errorf("first line %q, %w", line, rerr)
						}
					}
					cancel() // the client goes away mid-stream
					resp.Body.Close()
				}
				done <- err
			}()
			switch {
			case tc.part == "":
				<-arrived
				cancel() // the client goes away before the upstream's headers
			case !tc.stream:
				<-headers
				cancel() // the client goes away while the proxy reads the body
			}
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
			<-cancelled // the upstream request was cancelled
			waitFor(t, func() bool { return testutil.ToFloat64(p.metrics.InFlight) == 0 })

			if n := testutil.ToFloat64(p.metrics.ClientDisconnects.WithLabelValues("closed")); n != 1 {
				t.Fatalf("rolter_client_disconnects_total{reason=closed} = %v, want 1", n)
			}
			wantOutcomes(t, p, map[string]float64{"client_gone": 1})
			if n := testutil.ToFloat64(p.metrics.BreakerClosed.WithLabelValues("p0")); n != 0 {
				t.Errorf("rolter_breaker_closed_total = %v: a client that left closed the breaker", n)
			}
			if n := testutil.ToFloat64(p.metrics.BreakerOpened.WithLabelValues("p0")); n != 0 {
				t.Errorf("rolter_breaker_opened_total = %v: a client that left opened the breaker", n)
			}
			if st := state.BreakerState(); st != reliability.HalfOpen {
				t.Errorf("breaker %v after its probe's client left, want half_open", st)
			}
			if !state.BreakerAllows(time.Now(), rt.breaker) {
				t.Error("the breaker admits no new probe: the abandoned probe still holds it")
			}
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// wantServedWhole checks that p answered n chat requests with 200s and
// counted no client as gone.
func wantServedWhole(t *testing.T, p *Proxy, n float64) {
	t.Helper()
	if got := testutil.ToFloat64(p.metrics.Requests.WithLabelValues("/v1/chat/completions", "m", "200", "")); got != n {
		t.Fatalf("rolter_requests_total{code=200} = %v, want %v", got, n)
	}
	for _, reason := range []string{"write_timeout", "closed"} {
		if got := testutil.ToFloat64(p.metrics.ClientDisconnects.WithLabelValues(reason)); got != 0 {
			t.Fatalf("rolter_client_disconnects_total{reason=%s} = %v, want 0", reason, got)
		}
	}
}
