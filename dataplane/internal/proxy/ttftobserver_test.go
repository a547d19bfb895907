package proxy

import (
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"rolter.dev/pkg/routing"
)

// recordingBalancer wraps a predicted_ttft balancer and counts, per
// attempt, the calls that end it there.
type recordingBalancer struct {
	routing.Balancer
	mu       sync.Mutex
	observed int
	first    int
	whole    []int                    // output tokens of each WholeAnswer
	learned  int                      // Learn calls
	ends     map[*routing.Context]int // Learn or Abandon calls per attempt
}

func (b *recordingBalancer) Observe(target int, ctx *routing.Context) {
	b.mu.Lock()
	b.observed++
	b.mu.Unlock()
	b.Balancer.Observe(target, ctx)
}

func (b *recordingBalancer) FirstToken(target int, ctx *routing.Context, ttft time.Duration, promptTokens int) {
	b.mu.Lock()
	b.first++
	b.mu.Unlock()
	b.Balancer.(routing.TTFTObserver).FirstToken(target, ctx, ttft, promptTokens)
}

func (b *recordingBalancer) WholeAnswer(target int, ctx *routing.Context, latency time.Duration, promptTokens, outputTokens int) {
	b.mu.Lock()
	b.whole = append(b.whole, outputTokens)
	b.mu.Unlock()
	b.Balancer.(routing.TTFTObserver).WholeAnswer(target, ctx, latency, promptTokens, outputTokens)
}

func (b *recordingBalancer) Abandon(target int, ctx *routing.Context) {
	b.end(ctx)
	b.Balancer.(routing.TTFTObserver).Abandon(target, ctx)
}

func (b *recordingBalancer) Learn(target int, ctx *routing.Context, queueDepth int, latency time.Duration) {
	b.end(ctx)
	b.mu.Lock()
	b.learned++
	b.mu.Unlock()
	b.Balancer.(routing.Learner).Learn(target, ctx, queueDepth, latency)
}

// recordedTTFTProxy serves route m, predicted_ttft over up, with its
// balancer recorded.
func recordedTTFTProxy(t *testing.T, up *upstream) (*Proxy, *recordingBalancer, string, *http.Client) {
	t.Helper()
	p := New(Options{Logger: slog.New(slog.DiscardHandler)})
	applyDoc(t, p, openAuth+providers(up)+"[[routes]]\nmodel = \"m\"\nstrategy = \"predicted_ttft\"\ntargets = [{ provider = \"p0\" }]\n")
	pl := p.rt.Load().routes["m"].pools[0]
	rec := &recordingBalancer{Balancer: pl.balancer, ends: map[*routing.Context]int{}}
	pl.balancer = rec
	url, client := serveProxy(t, p, false)
	return p, rec, url, client
}

func (b *recordingBalancer) end(ctx *routing.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ends[ctx]++
}

// TestEveryObservedAttemptEnds: whatever way an attempt ends (completed,
// refused before its first token, cut by the upstream after it), the
// balancer hears exactly one Learn or Abandon for it. An attempt cut after
// its first token used to hear nothing more, and predicted_ttft counted it
// in flight for good (its fleet scale drifted). An answer that a client
// not streaming gets whole is reported whole, with its usage's output
// tokens, and no first token (its first bytes are its end).
func TestEveryObservedAttemptEnds(t *testing.T) {
	d := dialects[0]
	for _, tc := range []struct {
		name      string
		handler   func(die chan struct{}) func(w http.ResponseWriter, r *http.Request) bool
		wantFirst int
		buffered  bool
		wantWhole []int
	}{
		{"completed, not streamed", func(chan struct{}) func(http.ResponseWriter, *http.Request) bool {
			return func(w http.ResponseWriter, _ *http.Request) bool {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}`)
				return true
			}
		}, 0, true, []int{7}},
		{"completed", func(chan struct{}) func(http.ResponseWriter, *http.Request) bool {
			return func(w http.ResponseWriter, _ *http.Request) bool {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, d.firstSSE+d.terminal)
				return true
			}
		}, 1, false, nil},
		{"refused", func(chan struct{}) func(http.ResponseWriter, *http.Request) bool {
			return func(w http.ResponseWriter, _ *http.Request) bool {
				w.WriteHeader(http.StatusBadRequest)
				_, _ = io.WriteString(w, `{"error":{"message":"no"}}`)
				return true
			}
		}, 0, false, nil},
		{"cut after the first token", func(die chan struct{}) func(http.ResponseWriter, *http.Request) bool {
			return func(w http.ResponseWriter, r *http.Request) bool {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, d.firstSSE)
				w.(http.Flusher).Flush()
				select {
				case <-die:
				case <-r.Context().Done():
				}
				panic(http.ErrAbortHandler)
			}
		}, 1, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			die := make(chan struct{})
			up := newUpstream(t, "u")
			up.handler = tc.handler(die)
			p, rec, url, client := recordedTTFTProxy(t, up)

			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+d.path, strings.NewReader(d.body(!tc.buffered)))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode == http.StatusOK {
				buf := make([]byte, len(d.firstSSE))
				_, _ = io.ReadFull(resp.Body, buf)
			}
			close(die)
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			waitFor(t, func() bool {
				rec.mu.Lock()
				defer rec.mu.Unlock()
				return len(rec.ends) > 0 && testutil.ToFloat64(p.metrics.InFlight) == 0
			})

			rec.mu.Lock()
			defer rec.mu.Unlock()
			if rec.observed != 1 || rec.first != tc.wantFirst {
				t.Fatalf("observed %d attempts, %d first tokens; want 1, %d", rec.observed, rec.first, tc.wantFirst)
			}
			if !slices.Equal(rec.whole, tc.wantWhole) {
				t.Fatalf("whole answers with output tokens %v, want %v", rec.whole, tc.wantWhole)
			}
			if len(rec.ends) != 1 {
				t.Fatalf("ends heard for %d attempts, want 1", len(rec.ends))
			}
			for _, n := range rec.ends {
				if n != 1 {
					t.Fatalf("the attempt's end was reported %d times, want once", n)
				}
			}
		})
	}
}

// routeMetric returns the value of the metric name of route m (variant
// none), false when it is not exported.
func routeMetric(t *testing.T, reg *prometheus.Registry, name string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["model"] == "m" && labels["variant"] == "" {
				if c := m.GetCounter(); c != nil {
					return c.GetValue(), true
				}
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// ttftRouteProxy returns a proxy, and the registry of its metrics, whose
// route m is predicted_ttft over one upstream that streams d's first
// event and terminal, once release is closed (nil: at once).
func ttftRouteProxy(t *testing.T, d dialectCase, release <-chan struct{}) (*Proxy, *prometheus.Registry) {
	t.Helper()
	up := newUpstream(t, "u")
	up.handler = func(w http.ResponseWriter, _ *http.Request) bool {
		if release != nil {
			<-release
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, d.firstSSE+d.terminal)
		return true
	}
	reg := prometheus.NewRegistry()
	p := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: reg, Gatherer: reg})
	applyDoc(t, p, openAuth+providers(up)+"[[routes]]\nmodel = \"m\"\nstrategy = \"predicted_ttft\"\ntargets = [{ provider = \"p0\" }]\n")
	return p, reg
}

// TestSilentMetric: rolter_predicted_ttft_silent_seconds shows a target
// that owes an answer and sends none back, and returns to 0 once it has
// answered.
func TestSilentMetric(t *testing.T) {
	d := dialects[0]
	release := make(chan struct{})
	p, reg := ttftRouteProxy(t, d, release)
	silent := func() float64 { v, _ := routeMetric(t, reg, "rolter_predicted_ttft_silent_seconds"); return v }
	if v, ok := routeMetric(t, reg, "rolter_predicted_ttft_silent_seconds"); !ok || v != 0 {
		t.Fatalf("silent %v s (exported %v) before any request, want 0", v, ok)
	}
	url, client := serveProxy(t, p, false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+d.path, strings.NewReader(d.body(true)))
		if resp, err := client.Do(req); err == nil {
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, func() bool { return silent() > 0 })
	close(release)
	<-done
	if v := silent(); v != 0 {
		t.Fatalf("silent %v s after the answer, want 0", v)
	}
}

// TestLawMetrics: a predicted_ttft route exports its law: not fitted and
// no first token at first, then the first tokens it was told of. (Whether
// and what it fits is routing's TestPredictedTTFTReportsItsLaw.)
func TestLawMetrics(t *testing.T) {
	d := dialects[0]
	p, reg := ttftRouteProxy(t, d, nil)
	value := func(name string) (float64, bool) { return routeMetric(t, reg, name) }
	if v, ok := value("rolter_predicted_ttft_law_fitted"); !ok || v != 0 {
		t.Fatalf("law fitted = %v (exported %v), want 0", v, ok)
	}
	if _, ok := value("rolter_predicted_ttft_law_ms"); ok {
		t.Fatal("an unfitted law's weights exported")
	}
	url, client := serveProxy(t, p, false)
	for range 3 {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+d.path, strings.NewReader(d.body(true)))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	waitFor(t, func() bool { v, _ := value("rolter_predicted_ttft_first_tokens_total"); return v == 3 })
	if v, ok := value("rolter_predicted_ttft_bytes_per_token"); !ok || v <= 0 {
		t.Fatalf("bytes per token %v (exported %v)", v, ok)
	}
}
