package proxy

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The tests here have an upstream hang (its connection open, nothing sent)
// and check that timeouts.idle_secs ends the wait: before the client got a
// byte another target answers, after it the stream is cut and told, and
// the hung request is cancelled upstream either way.

// hangingUpstream sends a stream's headers, and first with part its first
// event, then sends nothing more until the proxy gives up on it; released
// is closed then.
func hangingUpstream(t *testing.T, part string) (*upstream, <-chan struct{}) {
	u := newUpstream(t, "hanging")
	released := make(chan struct{})
	u.handler = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, part)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the proxy cancelled the request
		close(released)
		return true
	}
	return u, released
}

const idleConfig = "[timeouts]\nidle_secs = 1\n"

// TestIdleUpstreamAfterTheStreamStarted: a replica that hangs after its
// first event gets its stream cut after timeouts.idle_secs, with the error
// event and the abort of any broken stream, counted as idle.
func TestIdleUpstreamAfterTheStreamStarted(t *testing.T) {
	d := dialects[0]
	up, released := hangingUpstream(t, d.firstSSE)
	acct, usagePath := accountingFile(t)
	p := New(Options{})
	applyDoc(t, p, idleConfig+acct+providers(up)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, newServer(t, p)+d.path, strings.NewReader(d.body(true)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read error %v after %q: a hung stream must end broken", err, body)
	}
	if !strings.HasPrefix(string(body), d.firstSSE) || !strings.Contains(string(body), d.errEvent) {
		t.Fatalf("body %q: want the first event, then the error event", body)
	}
	<-released
	if n := testutil.ToFloat64(p.metrics.UpstreamErrors.WithLabelValues("p0", "idle")); n != 1 {
		t.Fatalf("rolter_upstream_errors_total{reason=idle} = %v", n)
	}
	if r := usageRows(t, usagePath, 1)[0]; r.Status != 502 || r.Error != "upstream_error" {
		t.Fatalf("usage row %+v", r)
	}
}

// TestIdleUpstreamBeforeAnyByte: a replica that sends a stream's headers
// and then nothing (vLLM sends them before queueing and prefill; this one
// hangs) is a failed attempt once timeouts.idle_secs passed: the next
// target answers; with none, the client gets 504 upstream_timeout.
func TestIdleUpstreamBeforeAnyByte(t *testing.T) {
	d := dialects[0]
	t.Run("another target answers", func(t *testing.T) {
		hung, released := hangingUpstream(t, "")
		good := newUpstream(t, "good")
		good.handler = func(w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, d.firstSSE+d.terminal)
			return true
		}
		p := New(Options{})
		// round_robin's first pick is the first target: the hung one.
		applyDoc(t, p, idleConfig+openAuth+"[retry]\nbase_backoff_ms = 1\nmax_backoff_ms = 2\n"+providers(hung, good)+
			"[[routes]]\nmodel = \"m\"\nstrategy = \"round_robin\"\ntargets = [{ provider = \"p0\" }, { provider = \"p1\" }]\n")
		resp, body := post(t, newServer(t, p)+d.path, "", d.body(true))
		if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Provider") != "p1" || string(body) != d.firstSSE+d.terminal {
			t.Fatalf("status %d from %q: %q", resp.StatusCode, resp.Header.Get("X-Rolter-Provider"), body)
		}
		<-released
		if n := testutil.ToFloat64(p.metrics.UpstreamErrors.WithLabelValues("p0", "idle")); n != 1 {
			t.Fatalf("rolter_upstream_errors_total{reason=idle} = %v", n)
		}
	})
	t.Run("no other target", func(t *testing.T) {
		hung, released := hangingUpstream(t, "")
		p := New(Options{})
		applyDoc(t, p, idleConfig+openAuth+providers(hung)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
		resp, body := post(t, newServer(t, p)+d.path, "", d.body(true))
		if resp.StatusCode != 504 || resp.Header.Get("X-Rolter-Error") != "upstream_timeout" || !strings.Contains(string(body), "idle_secs") {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		<-released
	})
}
