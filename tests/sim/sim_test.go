package sim

import (
	"bytes"
	"image/png"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func mustStrategy(t *testing.T, name string) Strategy {
	t.Helper()
	st, err := ParseStrategy(name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func mustRun(t *testing.T, cfg Config, w *Workload, name string) Result {
	t.Helper()
	res, err := Run(cfg, w, mustStrategy(t, name))
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != w.Requests() {
		t.Fatalf("%s: %d requests completed of %d", name, res.Requests, w.Requests())
	}
	return res
}

func smallConfig() Config {
	cfg := DefaultConfig()
	cfg.Replicas = 4
	cfg.CapacityBlocks = 1 << 16 // ample: nothing is evicted
	return cfg
}

// Same seed, same results, for every strategy (pkg/routing's draws come from
// a source seeded from Config.Seed); another seed changes the workload and so
// the results, and with the same workload still changes random's draws.
func TestDeterminism(t *testing.T) {
	cfg := smallConfig()
	cfg.CapacityBlocks = 300 // some eviction, so that order matters
	for _, name := range AllStrategies() {
		for _, wname := range []string{"gsp", "multiturn"} {
			t.Run(name+"/"+wname, func(t *testing.T) {
				a := mustRun(t, cfg, smallWorkloads()[wname], name)
				b := mustRun(t, cfg, smallWorkloads()[wname], name)
				if !reflect.DeepEqual(a, b) {
					t.Fatalf("two runs differ:\n%+v\n%+v", a, b)
				}
			})
		}
	}
	cfg2 := cfg
	cfg2.Seed = 2
	if w := smallWorkloads()["gsp"]; reflect.DeepEqual(mustRun(t, cfg, w, "random").Replicas, mustRun(t, cfg2, w, "random").Replicas) {
		t.Error("random: seeds 1 and 2 route the same workload identically")
	}
	w1 := GSP(GSPParams{Groups: 3, PromptsPerGroup: 3, SystemLen: 300, QuestionLen: 20, OutputLen: 5, Concurrency: 4}, cfg.Seed)
	w2 := GSP(GSPParams{Groups: 3, PromptsPerGroup: 3, SystemLen: 300, QuestionLen: 20, OutputLen: 5, Concurrency: 4}, cfg2.Seed)
	if reflect.DeepEqual(mustRun(t, cfg, w1, "sglang"), mustRun(t, cfg2, w2, "sglang")) {
		t.Fatal("seeds 1 and 2 give identical results")
	}
}

// With caches that hold everything, the clairvoyant oracle hits every
// prefix seen before and reaches the unbounded rate; no strategy beats
// either.
func TestClairvoyantBoundsEveryStrategy(t *testing.T) {
	cfg := smallConfig()
	for wname, w := range smallWorkloads() {
		t.Run(wname, func(t *testing.T) {
			unbounded := UnboundedHitRate(w, cfg.BlockSize)
			oracle := mustRun(t, cfg, w, Clairvoyant)
			if oracle.HitRate != unbounded {
				t.Fatalf("clairvoyant oracle %.4f, unbounded %.4f", oracle.HitRate, unbounded)
			}
			for _, name := range AllStrategies() {
				r := mustRun(t, cfg, w, name)
				if r.HitRate > oracle.HitRate+1e-12 || r.HitRate > unbounded+1e-12 {
					t.Errorf("%s hits %.4f, above the oracle's %.4f", name, r.HitRate, oracle.HitRate)
				}
			}
		})
	}
}

func TestRoundRobinSpreadsLoadEvenly(t *testing.T) {
	cfg := smallConfig()
	cfg.Replicas = 5
	for _, tc := range []struct {
		name string
		w    *Workload
	}{
		{"same sizes", Unique(UniqueParams{Requests: 103, PromptLen: 100, OutputLen: 10, Concurrency: 7}, 1)},
		{"spread sizes", Unique(UniqueParams{Requests: 103, PromptLen: 100, OutputLen: 10, Spread: 0.5, Concurrency: 7}, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRun(t, cfg, tc.w, "round_robin")
			lo, hi := r.Replicas[0].Requests, r.Replicas[0].Requests
			for _, rep := range r.Replicas {
				lo, hi = min(lo, rep.Requests), max(hi, rep.Requests)
			}
			if hi-lo > 1 {
				t.Fatalf("requests per replica from %d to %d", lo, hi)
			}
			if r.LoadImbalance > 1.12 {
				t.Fatalf("load imbalance %.3f", r.LoadImbalance)
			}
		})
	}
}

// One replica, two requests of one session: the service-time model and the
// cache agree with the vLLM simulator's numbers.
func TestServiceModel(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Replicas = 1
	cfg.PrefillPerToken = time.Millisecond
	cfg.PrefillBase = 10 * time.Millisecond
	cfg.DecodePerToken = 5 * time.Millisecond
	sys := Message{Role: "system", Content: []Segment{{Key(9), 160 - hdr("system")}}}
	q1 := Message{Role: "user", Content: []Segment{{Key(10), 30}}}
	s := &Session{Start: -1, Turns: []Turn{
		{Messages: []Message{sys, q1}, Output: 4},
		{Messages: []Message{sys, q1}, Output: 4, Think: time.Second},
	}}
	w := &Workload{Name: "hand", Sessions: []*Session{s}, Concurrency: 1}
	r := mustRun(t, cfg, w, "round_robin")
	n := hdr("system") + (160 - hdr("system")) + hdr("user") + 30 + hdr("assistant")
	// First: all n tokens computed. Second: every full block but the one
	// holding the last token is cached.
	cached := (n - 1) / 16 * 16
	if r.PromptTokens != int64(2*n) || r.CachedTokens != int64(cached) {
		t.Fatalf("prompt %d cached %d, want %d and %d", r.PromptTokens, r.CachedTokens, 2*n, cached)
	}
	ttft1 := cfg.PrefillBase + time.Duration(n)*cfg.PrefillPerToken
	ttft2 := cfg.PrefillBase + time.Duration(n-cached)*cfg.PrefillPerToken
	if want := (ttft1 + ttft2) / 2; r.TTFTMean != want {
		t.Fatalf("mean TTFT %v, want %v", r.TTFTMean, want)
	}
	decode := 3 * cfg.DecodePerToken
	if want := ttft1 + decode + time.Second + ttft2 + decode; r.Makespan != want {
		t.Fatalf("makespan %v, want %v", r.Makespan, want)
	}
}

// simultaneous is one replica prefilling 1 ms per token and k unique
// 100-word requests sent at once, one output token each; n is one
// request's prefill.
func simultaneous(k int) (cfg Config, w *Workload, n time.Duration) {
	cfg = DefaultConfig()
	cfg.Replicas = 1
	cfg.PrefillPerToken, cfg.PrefillBase = time.Millisecond, 0
	w = Unique(UniqueParams{Requests: k, PromptLen: 100, OutputLen: 1, Concurrency: k}, 1)
	return cfg, w, time.Duration(hdr("user")+100+hdr("assistant")) * time.Millisecond
}

// Prefill is one request at a time per replica: the second of two
// simultaneous requests waits for the first's prefill.
func TestSerialPrefill(t *testing.T) {
	cfg, w, n := simultaneous(2)
	if r := mustRun(t, cfg, w, "round_robin"); r.TTFTP99 != 2*n || r.TTFTP50 != n {
		t.Fatalf("TTFT p50 %v p99 %v, want %v and %v", r.TTFTP50, r.TTFTP99, n, 2*n)
	}
	cfg.ParallelPrefill = true
	if r := mustRun(t, cfg, w, "round_robin"); r.TTFTP99 != n {
		t.Fatalf("parallel prefill: TTFT p99 %v, want %v", r.TTFTP99, n)
	}
}

// With KVAdmission a request waits in its replica's queue until its
// prompt's blocks fit beside the running requests', as vLLM's scheduler
// holds it: on a cache of room for one request's blocks, the second of two
// simultaneous requests (prefilled in parallel, so only the cache can hold
// it) starts when the first finishes; without, it runs at once and its
// blocks are not cached.
func TestKVAdmission(t *testing.T) {
	cfg, w, n := simultaneous(2)
	cfg.ParallelPrefill = true
	blocks := (int(n/time.Millisecond) + cfg.BlockSize - 1) / cfg.BlockSize
	cfg.CapacityBlocks = blocks + 1
	if r := mustRun(t, cfg, w, "round_robin"); r.TTFTP99 != n {
		t.Fatalf("without admission: TTFT p99 %v, want %v", r.TTFTP99, n)
	}
	cfg.KVAdmission = true
	if r := mustRun(t, cfg, w, "round_robin"); r.TTFTP50 != n || r.TTFTP99 != 2*n {
		t.Fatalf("with admission: TTFT p50 %v p99 %v, want %v and %v", r.TTFTP50, r.TTFTP99, n, 2*n)
	}
	cfg.CapacityBlocks = 2*blocks + 1 // room for both
	if r := mustRun(t, cfg, w, "round_robin"); r.TTFTP99 != n {
		t.Fatalf("with admission and room: TTFT p99 %v, want %v", r.TTFTP99, n)
	}
}

// Slowdown scales a replica's prefill and decode: of two simultaneous
// requests spread round robin over a replica at speed and one twice as
// slow, the first gets its first token after one prefill, the second after
// two, and the second replica is busy twice as long.
func TestSlowdown(t *testing.T) {
	cfg, w, n := simultaneous(2)
	cfg.Replicas = 2
	cfg.Slowdown = []float64{1, 2}
	r := mustRun(t, cfg, w, "round_robin")
	if r.TTFTP50 != n || r.TTFTP99 != 2*n {
		t.Fatalf("TTFT p50 %v p99 %v, want %v and %v", r.TTFTP50, r.TTFTP99, n, 2*n)
	}
	if b := r.Replicas; len(b) != 2 || b[1].Busy != 2*b[0].Busy || b[0].Busy == 0 {
		t.Fatalf("busy %+v, want the second replica twice the first", b)
	}
}

// With DecodeGrowth every step grows by it per other request running
// beside: of two requests admitted at once, the second gets its first
// token one growth later (besides waiting for the first's prefill) and
// decodes each later token one growth slower; the first ran alone.
func TestDecodeGrowth(t *testing.T) {
	cfg, _, n := simultaneous(2)
	w := Unique(UniqueParams{Requests: 2, PromptLen: 100, OutputLen: 3, Concurrency: 2}, 1)
	itl := cfg.DecodePerToken
	for _, g := range []time.Duration{0, 7 * time.Millisecond} {
		cfg.DecodeGrowth = g
		r := mustRun(t, cfg, w, "round_robin")
		if want := (n + 2*n + g) / 2; r.TTFTMean != want {
			t.Fatalf("growth %v: TTFT mean %v, want %v", g, r.TTFTMean, want)
		}
		if want := (n + 2*itl + 2*n + g + 2*(itl+g)) / 2; r.LatencyMean != want {
			t.Fatalf("growth %v: latency mean %v, want %v", g, r.LatencyMean, want)
		}
	}
}

// Dynamo's router queue (dynamo:queue_tokens=N) holds a request while
// every worker has more than N prefill tokens pending and routes it at a
// first token: with one replica and three simultaneous requests, the
// second and third wait in the router, not in the engine, and every
// request still completes. TTFTs are the same as dispatching at once here
// (one replica, serial prefill), so the wait is counted from arrival.
func TestDynamoRouterQueueHoldsAndReleases(t *testing.T) {
	cfg, w, n := simultaneous(3)
	direct := mustRun(t, cfg, w, "dynamo")
	queued := mustRun(t, cfg, w, "dynamo:queue_tokens=1")
	if direct.TTFTMean != 2*n || queued.TTFTMean != direct.TTFTMean || queued.TTFTP99 != 3*n {
		t.Fatalf("TTFT mean %v (direct %v), p99 %v; want %v, %v", queued.TTFTMean, direct.TTFTMean, queued.TTFTP99, 2*n, 3*n)
	}
	// Held, the later requests are routed only once the one ahead has its
	// first token: each pick sees at most one request in flight, not two.
	for tokens, want := range map[int]int{0: 2, 1: 1} {
		maxLoad := 0
		st := Strategy{Name: "probe", Base: Dynamo, New: func(env Env) (Policy, error) {
			d := newDynamo(env.Replicas, env.BlockSize, false, nil)
			d.queueTokens = tokens
			return loadSeenProbe{d, &maxLoad}, nil
		}}
		if _, err := Run(cfg, w, st); err != nil {
			t.Fatal(err)
		}
		if maxLoad != want {
			t.Errorf("queue_tokens=%d: a pick saw %d requests in flight, want %d", tokens, maxLoad, want)
		}
	}
	d := newDynamo(2, 16, false, nil)
	d.queueTokens = 100
	d.prefill = []int{150, 100}
	if d.holds() {
		t.Fatal("holds while worker 1 is at the threshold, not over it")
	}
	d.prefill[1] = 101
	if !d.holds() {
		t.Fatal("does not hold with every worker over the threshold")
	}
	d.queueTokens = 0
	if d.holds() {
		t.Fatal("the default (no queue) holds")
	}
}

// loadSeenProbe is Dynamo's router recording the most requests in flight
// any pick saw.
type loadSeenProbe struct {
	*dynamo
	maxLoad *int
}

func (p loadSeenProbe) Pick(f *Flight, v *View) int {
	*p.maxLoad = max(*p.maxLoad, v.Loads[0])
	return p.dynamo.Pick(f, v)
}

// loadProbe wraps round robin and records the busiest moment it saw.
type loadProbe struct {
	Policy
	maxInflight *int
}

func (p loadProbe) Pick(f *Flight, v *View) int {
	sum := 0
	for _, l := range v.Loads {
		sum += l
	}
	*p.maxInflight = max(*p.maxInflight, sum+1)
	return p.Policy.Pick(f, v)
}

func (p loadProbe) Observe(target int, f *Flight, v *View) { p.Policy.Observe(target, f, v) }

func TestClosedLoopConcurrency(t *testing.T) {
	for _, c := range []int{1, 3, 8} {
		peak := 0
		rr := mustStrategy(t, "round_robin")
		st := Strategy{Name: "probe", New: func(env Env) (Policy, error) {
			p, err := rr.New(env)
			return loadProbe{p, &peak}, err
		}}
		cfg := smallConfig()
		cfg.Concurrency = c
		w := smallWorkloads()["multiturn"]
		if _, err := Run(cfg, w, st); err != nil {
			t.Fatal(err)
		}
		if peak != min(c, len(w.Sessions)) {
			t.Fatalf("concurrency %d: %d requests in flight at most", c, peak)
		}
	}
}

func TestOpenLoop(t *testing.T) {
	cfg := smallConfig()
	cfg.Rate = 2 // sessions per second
	w := Unique(UniqueParams{Requests: 200, PromptLen: 50, OutputLen: 2}, 1)
	r := mustRun(t, cfg, w, "least_load")
	// 200 Poisson arrivals at 2/s take about 100 s.
	if r.Makespan < 80*time.Second || r.Makespan > 125*time.Second {
		t.Fatalf("makespan %v for 200 arrivals at 2/s", r.Makespan)
	}
}

// P proxies each keep their own balancer state; the affinity they learn
// separately is worth less than one proxy's.
func TestProxies(t *testing.T) {
	cfg := smallConfig()
	cfg.CapacityBlocks = 400
	w := GSP(GSPParams{Groups: 8, PromptsPerGroup: 8, SystemLen: 600, QuestionLen: 30, OutputLen: 20, Concurrency: 8}, 3)
	one := mustRun(t, cfg, w, "cache_aware")
	cfg.Proxies = 4
	four := mustRun(t, cfg, w, "cache_aware")
	if four.Proxies != 4 || one.Proxies != 1 {
		t.Fatalf("proxies %d and %d", one.Proxies, four.Proxies)
	}
	if four.HitRate >= one.HitRate {
		t.Fatalf("4 proxies hit %.3f, 1 proxy %.3f: separate state should cost hits", four.HitRate, one.HitRate)
	}
}

func TestParseStrategy(t *testing.T) {
	for _, tc := range []struct {
		in, err string
	}{
		{"cache_aware", ""},
		{"cache_aware:threshold=0.3:balance_abs=8:balance_rel=2:max_trie_nodes=1000", ""},
		{"pipeline:prefix_cache=2:least_load=0.5", ""},
		{"clairvoyant", ""},
		{"oracle", "unknown strategy"},
		{"llmd_approx:prefix=2:queue=1:active=1:kv_cache=0", ""},
		{"llmd_approx_bench", ""},
		{"llmd_approx:speculate_ms=5", "unknown parameter"},
		{"llmd_approx:lru_blocks=31250", ""},
		{"llmd_approx:lru_blocks=0", "unknown parameter"},
		{"llmd_precise:lru_blocks=5", "unknown parameter"},
		{"dynamo_approx", ""},
		{"dynamo:queue_tokens=8192", ""},
		{"dynamo_approx:queue_tokens=1", ""},
		{"dynamo:queue_tokens=0", "queue_tokens=N"},
		{"dynamo:overlap=2", "queue_tokens=N"},
		{"precise_cache_aware:signal_weight=2:load_weight=0.5:speculate_ms=0", ""},
		{"llmd_precise", ""},
		{"llmd_precise:prefix=3:kv_cache=2:queue=2:active=0:speculate_ms=500", ""},
		{"llmd_precise:bogus=1", "unknown parameter"},
		{"llmd_precise:prefix=-1", "want a number"},
		{"cache_aware:speculate_ms=10", "speculate_ms"},
		{"precise_cache_aware:load_weight=-1", "negative"},
		{"nope", "unknown strategy"},
		{"predicted_ttft:kv_events=0:engine=0:stream=0", ""},
		{"predicted_ttft:stream=0.5", ""},
		{"predicted_ttft:stream=2", "share from 0 to 1"},
		{"predicted_ttft:scale_s=30:inherit=0", ""},
		{"predicted_ttft:scale_s=0", "scale_s"},
		{"predicted_ttft:restart_s=30", ""},
		{"predicted_ttft:restart_s=30:scale_s=10", "restart_s"},
		{"predicted_ttft:restart_s=30:restart_one=1", ""},
		{"predicted_ttft:restart_one=1", "only with restart_s"},
		{"predicted_ttft:scale_s=NaN", "scale_s"},
		{"predicted_ttft:inherit=2", "want 0 or 1"},
		{"cache_aware:scale_s=30", "scale_s"},
		{"predicted_ttft:drain_s=30:kv_events=0", ""},
		{"predicted_ttft:scale_s=30:drain_s=40", "one of scale_s, drain_s and restart_s"},
		{"cache_aware:stream=0", "share from 0 to 1"},
		{"cache_aware:threshold", "not key=value"},
		{"cache_aware:threshold=-1", "threshold"},
		{"pipeline:bogus=1", "unknown scorer"},
		{"sglang:threshold=0.5", "takes no parameters"},
		{"clairvoyant:foo=1", "takes no parameters"},
	} {
		_, err := ParseStrategy(tc.in)
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ParseStrategy(%q) error %v, want %q", tc.in, err, tc.err)
		}
	}
	all, err := ParseStrategies("rolter,peers")
	if err != nil || len(all) != len(AllStrategies()) {
		t.Fatalf("%d strategies, %v", len(all), err)
	}
	if _, err := ParseStrategies(" , "); err == nil {
		t.Fatal("an empty list parses")
	}
}

func TestConfigValidation(t *testing.T) {
	for _, mutate := range []func(*Config){
		func(c *Config) { c.Replicas = 0 },
		func(c *Config) { c.BlockSize = 0 },
		func(c *Config) { c.CapacityBlocks = 0 },
		func(c *Config) { c.MaxBatch = 0 },
		func(c *Config) { c.Proxies = 0 },
		func(c *Config) { c.DecodePerToken = -1 },
		func(c *Config) { c.DecodeGrowth = -1 },
		func(c *Config) { c.Rate = -1 },
		func(c *Config) { c.ClockSkew = -1 },
		func(c *Config) { c.Slowdown = []float64{1, 0} },
		func(c *Config) { c.Slowdown = []float64{math.Inf(1)} },
		func(c *Config) { c.Slowdown = []float64{math.NaN()} },
	} {
		cfg := DefaultConfig()
		mutate(&cfg)
		if _, err := Run(cfg, smallWorkloads()["unique"], mustStrategy(t, "round_robin")); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}

func TestChart(t *testing.T) {
	cfg := smallConfig()
	w := smallWorkloads()["gsp"]
	var results []Result
	for _, name := range []string{"round_robin", "cache_aware:threshold=0.3", "sglang", "clairvoyant"} {
		results = append(results, mustRun(t, cfg, w, name))
	}
	var buf bytes.Buffer
	if err := WriteChart(&buf, "test", results); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < chartTop+4*chartRow {
		t.Fatalf("chart of %v", b)
	}
	if err := WriteChart(&buf, "none", nil); err == nil {
		t.Fatal("a chart of nothing")
	}
}
