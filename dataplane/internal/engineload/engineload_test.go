package engineload_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"rolter.dev/dataplane/internal/engineload"
	"rolter.dev/dataplane/internal/metrics"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/reliability"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// replica serves a vLLM-shaped /metrics whose running and waiting counts
// the test sets, or whatever body / status it is told to.
type replica struct {
	srv              *httptest.Server
	running, waiting atomic.Int64
	body             atomic.Pointer[string] // overrides the exposition when set
	status           atomic.Int64           // overrides 200 when set
	scrapes          atomic.Int64
	mu               sync.Mutex
	auth             string
}

func newReplica(t *testing.T) *replica {
	r := &replica{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.scrapes.Add(1)
		r.mu.Lock()
		r.auth = req.Header.Get("Authorization")
		r.mu.Unlock()
		if req.URL.Path != "/metrics" {
			http.NotFound(w, req)
			return
		}
		if s := r.status.Load(); s != 0 {
			w.WriteHeader(int(s))
			return
		}
		if b := r.body.Load(); b != nil {
			fmt.Fprint(w, *b)
			return
		}
		// Two data-parallel engines: the load is split across them.
		run, wait := r.running.Load(), r.waiting.Load()
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\n"+
			"vllm:num_requests_running{engine=\"0\",model_name=\"m\"} %d\nvllm:num_requests_running{engine=\"1\",model_name=\"m\"} %d\n"+
			"vllm:num_requests_running_total{engine=\"0\"} 1000\n"+
			"vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %d\nvllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0\n",
			run/2, run-run/2, wait)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

type fixture struct {
	snap atomic.Pointer[config.Snapshot]
	reg  *reliability.Registry
	m    *metrics.Metrics
}

func compile(t *testing.T, doc string) *config.Snapshot {
	t.Helper()
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := config.Compile(cfg, config.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// provider is a [[providers]] table for r, with engine_load lines (none:
// no table).
func provider(name string, r *replica, engineLoad string) string {
	s := fmt.Sprintf("[[providers]]\nname = %q\nkind = \"openai_compatible\"\napi_base = %q\napi_key = \"secret-%s\"\n", name, r.srv.URL+"/v1", name)
	if engineLoad != "none" {
		s += "[providers.engine_load]\n" + engineLoad
	}
	return s
}

// start runs a scraper over doc until the returned stop is called; stop
// returns once Run has.
func start(t *testing.T, doc string) (*fixture, func(string), func()) {
	t.Helper()
	f := &fixture{reg: reliability.NewRegistry(), m: metrics.New(prometheus.NewRegistry())}
	f.snap.Store(compile(t, doc))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		engineload.New(f.snap.Load, f.reg, f.m, slog.New(slog.DiscardHandler)).Run(ctx)
	}()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return f, func(doc string) { f.snap.Store(compile(t, doc)) }, stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *fixture) load(name string) (int, bool) {
	return f.reg.Provider(name).EngineLoad(time.Now(), time.Minute)
}

func (f *fixture) gauge(name string) float64 {
	return testutil.ToFloat64(f.m.EngineLoad.WithLabelValues(name))
}

func (f *fixture) series() int { return testutil.CollectAndCount(f.m.EngineLoad) }

func TestScrapesAndFollowsReloads(t *testing.T) {
	a, b := newReplica(t), newReplica(t)
	a.running.Store(5)
	a.waiting.Store(3)
	b.running.Store(1)
	f, reload, stop := start(t, provider("a", a, "interval_ms = 50\n")+provider("b", b, "none"))

	waitFor(t, "a's load (5 running over two engines + 3 waiting)", func() bool { n, ok := f.load("a"); return ok && n == 8 })
	if f.gauge("a") != 8 {
		t.Errorf("gauge %v, want 8", f.gauge("a"))
	}
	a.mu.Lock()
	if a.auth != "Bearer secret-a" {
		t.Errorf("Authorization %q", a.auth)
	}
	a.mu.Unlock()
	if b.scrapes.Load() != 0 {
		t.Error("b scraped without [providers.engine_load]")
	}
	a.running.Store(0)
	waitFor(t, "a's load follows the replica", func() bool { n, ok := f.load("a"); return ok && n == 3 })

	// Enable b: it gets its own goroutine.
	reload(provider("a", a, "interval_ms = 50\n") + provider("b", b, "interval_ms = 50\n"))
	waitFor(t, "b scraped", func() bool { n, ok := f.load("b"); return ok && n == 1 })

	// Disable a: its goroutine stops, its value is forgotten, its gauge gone.
	reload(provider("a", a, "none") + provider("b", b, "interval_ms = 50\n"))
	waitFor(t, "a forgotten", func() bool { _, ok := f.load("a"); return !ok })
	if f.series() != 1 {
		t.Errorf("%d gauge series, want b's only", f.series())
	}
	n := a.scrapes.Load()
	waitFor(t, "b scraped again", func() bool { return b.scrapes.Load() > 3 })
	if d := a.scrapes.Load() - n; d > 1 { // one may have been in flight
		t.Errorf("a scraped %d more times after its table was removed", d)
	}

	// Remove b from the config altogether; stopping Run leaves no goroutine
	// (goleak checks at exit).
	reload(provider("a", a, "none"))
	waitFor(t, "b's gauge removed", func() bool { return f.series() == 0 })
	stop()
}

func TestFailuresKeepTheLastValueUntilStale(t *testing.T) {
	a := newReplica(t)
	a.running.Store(4)
	f, _, _ := start(t, provider("a", a, "interval_ms = 50\nstale_ms = 100000\n"))
	waitFor(t, "first scrape", func() bool { n, ok := f.load("a"); return ok && n == 4 })
	fails := func() float64 { return testutil.ToFloat64(f.m.EngineLoadFails.WithLabelValues("a")) }

	bad := []struct {
		name   string
		body   string
		status int
	}{
		{"status", "", http.StatusServiceUnavailable},
		{"NaN", "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n", 0},
		{"negative", "vllm:num_requests_running 1\nvllm:num_requests_waiting -2\n", 0},
		{"missing metric", "vllm:num_requests_running 9\n", 0},
		{"malformed", "vllm:num_requests_running{ 9\nvllm:num_requests_waiting 0\n", 0},
		{"not metrics", "<html>hello</html>\n", 0},
		{"over 4 MiB", strings.Repeat("# padding padding padding padding\n", engineload.MaxBody/32) + "vllm:num_requests_running 9\nvllm:num_requests_waiting 0\n", 0},
	}
	for _, tc := range bad {
		before := fails()
		if tc.status != 0 {
			a.status.Store(int64(tc.status))
		} else {
			a.body.Store(&tc.body)
		}
		waitFor(t, tc.name+" counted as a failure", func() bool { return fails() >= before+2 })
		if n, ok := f.load("a"); !ok || n != 4 {
			t.Errorf("%s: load %d, %v; want the last good value, 4", tc.name, n, ok)
		}
		a.status.Store(0)
		a.body.Store(nil)
	}
	a.waiting.Store(2)
	waitFor(t, "recovered", func() bool { n, ok := f.load("a"); return ok && n == 6 })
}

func TestStaleAfterFailures(t *testing.T) {
	a := newReplica(t)
	a.running.Store(4)
	f, _, _ := start(t, provider("a", a, "interval_ms = 50\nstale_ms = 200\n"))
	waitFor(t, "first scrape", func() bool { n, ok := f.load("a"); return ok && n == 4 })
	a.status.Store(http.StatusInternalServerError)
	waitFor(t, "stale", func() bool {
		_, ok := f.reg.Provider("a").EngineLoad(time.Now(), 200*time.Millisecond)
		return !ok
	})
}

func TestSlowReplicaTimesOut(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-release:
		case <-req.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	doc := fmt.Sprintf("[[providers]]\nname = \"s\"\nkind = \"openai_compatible\"\napi_base = %q\n[providers.engine_load]\ninterval_ms = 50\nstale_ms = 100\n", slow.URL)
	f, _, stop := start(t, doc)
	waitFor(t, "timeouts counted", func() bool { return testutil.ToFloat64(f.m.EngineLoadFails.WithLabelValues("s")) >= 2 })
	stop()
}

// TestScrapesWaitingAndCapacity: the scrape stores the waiting count apart
// and the KV capacity of vllm:cache_config_info (num_gpu_blocks ×
// block_size, summed over data-parallel engines, in vLLM's label layout);
// an exposition without a usable gauge leaves the capacity unknown and the
// load still scraped.
func TestScrapesWaitingAndCapacity(t *testing.T) {
	const info = `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="661",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="661",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4"} 1.0
`
	const load = "vllm:num_requests_running{engine=\"0\"} 4\nvllm:num_requests_waiting{engine=\"0\"} 2\nvllm:num_requests_waiting{engine=\"1\"} 1\n"
	for _, tc := range []struct {
		name, body string
		capacity   int
	}{
		{"two engines", load + info, 2 * 661 * 16},
		{"no gauge", load, 0},
		{"not profiled yet", load + `vllm:cache_config_info{block_size="16",num_gpu_blocks="None",engine="0"} 1` + "\n", 0},
		{"one engine unusable", load + info + `vllm:cache_config_info{block_size="x",num_gpu_blocks="1",engine="2"} 1` + "\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReplica(t)
			body := tc.body
			r.body.Store(&body)
			f, _, _ := start(t, provider("p", r, "interval_ms = 50\n"))
			waitFor(t, "a scrape", func() bool { _, ok := f.load("p"); return ok })
			if n, _ := f.load("p"); n != 7 {
				t.Errorf("load %d, want 7", n)
			}
			if n, ok := f.reg.Provider("p").EngineWaiting(time.Now(), time.Minute); !ok || n != 3 {
				t.Errorf("waiting %d %v, want 3", n, ok)
			}
			if got := f.reg.Provider("p").KVCapacityTokens(); got != tc.capacity {
				t.Errorf("capacity %d tokens, want %d", got, tc.capacity)
			}
		})
	}
}
