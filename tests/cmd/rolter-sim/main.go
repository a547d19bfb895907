// Command rolter-sim is the offline routing simulator: it replays a
// workload against simulated vLLM replicas (the vLLM simulator's prefix
// cache, a prefill/decode service-time model) under each routing strategy,
// rolter's real balancers and the peers' published policies, and reports
// each strategy's token-level prefix-cache hit rate, load imbalance, TTFT
// and throughput. Runs are deterministic for a seed and use a virtual clock:
// nothing sleeps.
//
//	rolter-sim --workload gsp
//	rolter-sim --workload trace --trace ../shared/traces/mooncake_conversation_trace.jsonl --json
//	rolter-sim --workload gsp --strategies round_robin,cache_aware,cache_aware:threshold=0.3,sglang --png gsp.png
//
// Every run also reports two reference lines: unbounded_hit_rate (one
// infinite cache: the workload's physical limit) and the clairvoyant greedy
// oracle (strategy "clairvoyant", run whether listed or not), and each
// strategy's hit rate relative to both (hit_vs_unbounded,
// hit_vs_clairvoyant).
//
// See docs/routing.md for the model, the peers' constants and the results.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"rolter.dev/pkg/fleet"
	"rolter.dev/tests/sim"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "rolter-sim:", err)
		os.Exit(2)
	}
}

type options struct {
	workload    string
	strategies  string
	jsonOut     bool
	pngPath     string
	quiet       bool
	cfg         sim.Config
	prefillUS   float64
	prefillMS   float64
	itlMS       float64
	itlGrowthMS float64
	gsp         sim.GSPParams
	mt          sim.MultiturnParams
	agent       sim.AgentParams
	unique      sim.UniqueParams
	tracePath   string
	traceLimit  int
	traceSpread bool
	speedup     float64
	traceBlock  int
	thinkMS     float64
	toolMS      float64
	variants    string // --variants: one route split over variants (variant.go)
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{cfg: sim.DefaultConfig(), gsp: sim.DefaultGSP(), mt: sim.DefaultMultiturn(),
		agent: sim.DefaultAgent(), unique: sim.DefaultUnique()}
	fs := flag.NewFlagSet("rolter-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: rolter-sim [flags]\n\nStrategies: %s\n(\"all\", \"rolter\" and \"peers\" name groups; a rolter strategy takes Spec fields as name:key=value:key=value,\ne.g. cache_aware:threshold=0.3:balance_abs=8, precise_cache_aware:load_weight=0.5:speculate_ms=0;\nllmd_approx, llmd_approx_bench and llmd_precise take the scorer weights prefix, kv_cache, queue, active; llmd_precise also speculate_ms;\nevery run also reports the clairvoyant oracle and the unbounded single-cache hit rate)\n\nFlags:\n",
			strings.Join(sim.AllStrategies(), ", "))
		fs.PrintDefaults()
	}
	fs.StringVar(&o.workload, "workload", "gsp", "workload: gsp, multiturn, agent, unique or trace")
	fs.StringVar(&o.strategies, "strategies", "all", "comma-separated strategies to compare")
	fs.BoolVar(&o.jsonOut, "json", false, "print one JSON object per strategy instead of the table")
	fs.StringVar(&o.pngPath, "png", "", "write a PNG chart of hit rate and imbalance per strategy to this file")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress bar")
	fs.StringVar(&o.variants, "variants", "", "run one route split over variants instead of --strategies: NAME=WEIGHT:STRATEGY@REPLICAS,… e.g. stable=90:cache_aware@0-5,canary=10:cache_aware@6-7 (replicas as indexes and ranges joined by +); reports per variant")

	c := &o.cfg
	fs.IntVar(&c.Replicas, "replicas", c.Replicas, "number of replicas")
	fs.IntVar(&c.CapacityBlocks, "capacity", c.CapacityBlocks, "prefix-cache capacity per replica, in blocks")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "prefix-cache block size, in tokens")
	fs.IntVar(&c.MaxBatch, "max-batch", c.MaxBatch, "requests a replica runs at once (vLLM max_num_seqs); more queue")
	fs.BoolVar(&c.KVAdmission, "kv-admission", c.KVAdmission, "hold a request in its replica's queue until its prompt's KV blocks fit beside the running requests' (vLLM's scheduler); off, it runs at once and what finds no room is not cached")
	fs.Float64Var(&o.prefillUS, "prefill-us", 50, "prefill time per uncached prompt token, µs")
	fs.Float64Var(&o.prefillMS, "prefill-base-ms", 5, "fixed prefill time per request, ms")
	fs.BoolVar(&c.ParallelPrefill, "parallel-prefill", false, "prefill running requests independently (vllmsim's model) instead of one at a time per replica")
	fs.Float64Var(&o.itlMS, "itl-ms", 20, "decode time per output token, ms")
	fs.Float64Var(&o.itlGrowthMS, "itl-growth-ms", 0, "an engine step's growth per other request running at the replica, added to --itl-ms and once to the time to first token (steps that slow with the batch, as vLLM's do), ms")
	fs.Func("slowdown", "a heterogeneous fleet: comma-separated factors on the replicas' prefill and decode times, repeated over the replicas (e.g. 1,2: every second replica twice as slow)", func(v string) error {
		c.Slowdown = c.Slowdown[:0]
		for _, f := range strings.Split(v, ",") {
			x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || !(x > 0) || math.IsInf(x, 0) {
				return fmt.Errorf("want finite factors > 0, got %q", f)
			}
			c.Slowdown = append(c.Slowdown, x)
		}
		return nil
	})
	fs.IntVar(&c.Proxies, "proxies", 1, "proxies, each with its own balancer state, behind a random L4 spread")
	fs.Func("share", "on: the proxies share prefix observations and in-flight counts as rolter-proxy --nats does (rolter strategies only); off: independent (default)", func(v string) error {
		switch v {
		case "on":
			c.Share = true
		case "off":
			c.Share = false
		default:
			return fmt.Errorf("want on or off, got %q", v)
		}
		return nil
	})
	fs.DurationVar(&c.ShareDelay, "share-delay", sim.DefaultShareDelay, "with --share on: a fleet message's trip from one proxy to the others")
	fs.DurationVar(&c.ShareFlush, "share-flush", fleet.DefaultFlushInterval, "with --share on: how often each proxy publishes its observations (rolter-proxy --share-flush)")
	fs.DurationVar(&c.ShareLoadInterval, "share-load-interval", fleet.DefaultLoadInterval, "with --share on: how often each proxy publishes its in-flight counts")
	fs.DurationVar(&c.ShareQueueInterval, "share-queue-interval", fleet.DefaultQueueInterval, "with --share on: how often each proxy publishes its queued prefill (predicted_ttft; rolter-proxy --share-queue-interval)")
	fs.DurationVar(&c.ClockSkew, "share-clock-skew", 0, "with --share on: set the proxies' wall clocks apart by up to this (each a uniform draw), which predicted_ttft's turns draw their order from")
	fs.IntVar(&c.Concurrency, "concurrency", 0, "closed-loop clients (0: the workload's default)")
	fs.DurationVar(&c.Ramp, "ramp", 0, "start the closed-loop clients one by one over this time instead of all at once")
	fs.Float64Var(&c.Rate, "rate", 0, "open-loop Poisson session arrivals per second instead of the closed loop")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random seed (workload text, arrivals, proxy spread, peers' tie breaks)")
	fs.BoolVar(&c.SessionKeys, "session-header", false, "send x-session-id with each session's requests")
	fs.DurationVar(&c.KVEventDelay, "kv-delay", c.KVEventDelay, "delay from a replica's KV cache change to the proxies' indexes (precise_cache_aware, llmd_precise); negative: never delivered")

	fs.IntVar(&o.gsp.Groups, "gsp-groups", o.gsp.Groups, "gsp: groups (system prompts)")
	fs.IntVar(&o.gsp.PromptsPerGroup, "gsp-prompts", o.gsp.PromptsPerGroup, "gsp: prompts per group")
	fs.IntVar(&o.gsp.SystemLen, "gsp-system-len", o.gsp.SystemLen, "gsp: system prompt tokens")
	fs.IntVar(&o.gsp.QuestionLen, "gsp-question-len", o.gsp.QuestionLen, "gsp: question tokens")
	fs.IntVar(&o.gsp.OutputLen, "gsp-output-len", o.gsp.OutputLen, "gsp: output tokens")
	fs.BoolVar(&o.gsp.Ordered, "gsp-ordered", false, "gsp: send groups in order instead of shuffled")

	fs.IntVar(&o.mt.Clients, "mt-clients", o.mt.Clients, "multiturn: conversations")
	fs.IntVar(&o.mt.Rounds, "mt-rounds", o.mt.Rounds, "multiturn: rounds per conversation")
	fs.IntVar(&o.mt.RequestLen, "mt-request-len", o.mt.RequestLen, "multiturn: mean new user tokens per round")
	fs.IntVar(&o.mt.OutputLen, "mt-output-len", o.mt.OutputLen, "multiturn: mean output tokens per round")
	fs.IntVar(&o.mt.SystemLen, "mt-system-len", o.mt.SystemLen, "multiturn: shared system prompt tokens")
	fs.Float64Var(&o.thinkMS, "mt-think-ms", 0, "multiturn: client think time between rounds, ms")
	fs.BoolVar(&o.mt.ThinkExp, "mt-think-exp", false, "multiturn: draw each think time from an exponential distribution of mean --mt-think-ms")
	fs.Float64Var(&o.mt.Spread, "mt-spread", o.mt.Spread, "multiturn: lengths uniform in mean*(1±spread)")

	fs.IntVar(&o.agent.Agents, "agent-agents", o.agent.Agents, "agent: sessions")
	fs.IntVar(&o.agent.Turns, "agent-turns", o.agent.Turns, "agent: model calls per session")
	fs.IntVar(&o.agent.SystemLen, "agent-system-len", o.agent.SystemLen, "agent: shared system prompt (tool definitions) tokens")
	fs.IntVar(&o.agent.TaskLen, "agent-task-len", o.agent.TaskLen, "agent: task tokens")
	fs.IntVar(&o.agent.ToolLen, "agent-tool-len", o.agent.ToolLen, "agent: mean tool result tokens (lognormal)")
	fs.IntVar(&o.agent.OutputLen, "agent-output-len", o.agent.OutputLen, "agent: output tokens per call")
	fs.Float64Var(&o.toolMS, "agent-tool-ms", 500, "agent: tool execution time between calls, ms")

	fs.IntVar(&o.unique.Requests, "unique-requests", o.unique.Requests, "unique: requests")
	fs.IntVar(&o.unique.PromptLen, "unique-len", o.unique.PromptLen, "unique: mean prompt tokens")
	fs.IntVar(&o.unique.OutputLen, "unique-output-len", o.unique.OutputLen, "unique: mean output tokens")
	fs.Float64Var(&o.unique.Spread, "unique-spread", o.unique.Spread, "unique: lengths uniform in mean*(1±spread)")

	fs.StringVar(&o.tracePath, "trace", "../shared/traces/mooncake_conversation_trace.jsonl", "trace: Mooncake JSONL file")
	fs.IntVar(&o.traceLimit, "trace-limit", 0, "trace: replay only the first N records (0: all)")
	fs.BoolVar(&o.traceSpread, "trace-spread", false, "trace: spread the requests of each timestamp bucket (the trace's ~3 s steps) at random over the bucket instead of all at its start")
	fs.Float64Var(&o.speedup, "speedup", 1, "trace: divide the timestamps by this")
	fs.IntVar(&o.traceBlock, "trace-block-tokens", sim.TraceBlockTokens, "trace: tokens per hash id (Mooncake's traces hash 512-token blocks; other traces of the format hash smaller ones)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.traceBlock <= 0 {
		return nil, fmt.Errorf("-trace-block-tokens: want > 0, got %d", o.traceBlock)
	}
	c.PrefillPerToken = time.Duration(o.prefillUS * float64(time.Microsecond))
	c.PrefillBase = time.Duration(o.prefillMS * float64(time.Millisecond))
	c.DecodePerToken = time.Duration(o.itlMS * float64(time.Millisecond))
	c.DecodeGrowth = time.Duration(o.itlGrowthMS * float64(time.Millisecond))
	o.mt.Think = time.Duration(o.thinkMS * float64(time.Millisecond))
	o.agent.ToolTime = time.Duration(o.toolMS * float64(time.Millisecond))
	return o, nil
}

func (o *options) buildWorkload() (*sim.Workload, error) {
	seed := o.cfg.Seed
	switch o.workload {
	case "gsp":
		return sim.GSP(o.gsp, seed), nil
	case "multiturn":
		return sim.Multiturn(o.mt, seed), nil
	case "agent":
		return sim.Agent(o.agent, seed), nil
	case "unique":
		return sim.Unique(o.unique, seed), nil
	case "trace":
		recs, err := sim.ReadTraceFile(o.tracePath, o.traceLimit)
		if err != nil {
			return nil, fmt.Errorf("trace: %w", err)
		}
		w := sim.TraceWorkload(recs, o.traceBlock, o.speedup, seed)
		if o.traceSpread {
			sim.SpreadArrivals(w, seed)
		}
		return w, nil
	}
	return nil, fmt.Errorf("unknown workload %q (want gsp, multiturn, agent, unique or trace)", o.workload)
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	if o.variants != "" {
		return runVariants(o, stdout, stderr)
	}
	strategies, err := sim.ParseStrategies(o.strategies)
	if err != nil {
		return err
	}
	w, err := o.buildWorkload()
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(strategies, func(st sim.Strategy) bool { return st.Name == sim.Clairvoyant }) {
		ref, err := sim.ParseStrategy(sim.Clairvoyant)
		if err != nil {
			return err
		}
		strategies = append(strategies, ref)
	}
	bar := newProgress(stderr, !o.quiet && isTerminal(stderr), w.Requests()*len(strategies))
	unbounded := sim.UnboundedHitRate(w, o.cfg.BlockSize)
	var results []sim.Result
	for _, st := range strategies {
		cfg := o.cfg
		bar.label = st.Name
		cfg.Progress = bar.step
		res, err := sim.Run(cfg, w, st)
		if err != nil {
			bar.clear()
			return err
		}
		results = append(results, res)
	}
	bar.clear()
	oracle := 0.0
	for _, r := range results {
		if r.Strategy == sim.Clairvoyant {
			oracle = r.HitRate
		}
	}
	if o.jsonOut {
		enc := json.NewEncoder(stdout)
		for _, r := range results {
			if err := enc.Encode(o.jsonRecord(r, unbounded, oracle)); err != nil {
				return err
			}
		}
	} else {
		o.printTable(stdout, w, results, unbounded, oracle)
	}
	if o.pngPath != "" {
		f, err := os.Create(o.pngPath)
		if err != nil {
			return err
		}
		title := fmt.Sprintf("rolter-sim %s: %d replicas x %d blocks of %d tokens, %d prox%s, seed %d",
			w.Name, o.cfg.Replicas, o.cfg.CapacityBlocks, o.cfg.BlockSize, o.cfg.Proxies, plural(o.cfg.Proxies, "y", "ies"), o.cfg.Seed)
		if err := sim.WriteChart(f, title, results); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

// shareNote describes the proxies' sharing for the table's header.
func shareNote(c sim.Config) string {
	if c.Proxies < 2 {
		return ""
	}
	if !c.Share {
		return ", independent"
	}
	return fmt.Sprintf(", sharing state (messages after %v; peers' policies independent)", c.ShareDelay)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func (o *options) jsonRecord(r sim.Result, unbounded, oracle float64) map[string]any {
	rec := map[string]any{
		"strategy":             r.Strategy,
		"workload":             r.Workload,
		"token_hit_rate":       r.HitRate,
		"load_imbalance":       r.LoadImbalance,
		"ttft_p50_ms":          ms(r.TTFTP50),
		"ttft_p99_ms":          ms(r.TTFTP99),
		"throughput_rps":       r.Throughput,
		"proxies":              r.Proxies,
		"share":                onOff(r.Shared),
		"ttft_mean_ms":         ms(r.TTFTMean),
		"latency_mean_ms":      ms(r.LatencyMean),
		"inflight_imbalance":   r.InflightImbalance,
		"unbounded_hit_rate":   unbounded,
		"hit_vs_unbounded":     ratio(r.HitRate, unbounded),
		"clairvoyant_hit_rate": oracle,
		"hit_vs_clairvoyant":   ratio(r.HitRate, oracle),
		"output_tps":           r.OutputTPS,
		"requests":             r.Requests,
		"replicas":             o.cfg.Replicas,
		"capacity_blocks":      o.cfg.CapacityBlocks,
		"block_size":           o.cfg.BlockSize,
		"seed":                 o.cfg.Seed,
		"kv_delay_ms":          ms(o.cfg.KVEventDelay),
	}
	if r.Decisions != nil {
		rec["decisions"] = r.Decisions
	}
	if len(o.cfg.Slowdown) > 0 {
		rec["slowdown"] = o.cfg.Slowdown
	}
	// Per replica, the requests served, the busy time the imbalance is
	// computed from and the token hit rate, to see where a strategy piled up
	// and which caches held what their requests asked for.
	reqs, busy, hit := make([]int, len(r.Replicas)), make([]float64, len(r.Replicas)), make([]float64, len(r.Replicas))
	for i, s := range r.Replicas {
		reqs[i], busy[i] = s.Requests, s.Busy.Seconds()
		if s.PromptTokens > 0 {
			hit[i] = float64(s.CachedTokens) / float64(s.PromptTokens)
		}
	}
	rec["replica_requests"], rec["replica_busy_s"], rec["replica_hit_rate"] = reqs, busy, hit
	return rec
}

func (o *options) printTable(out io.Writer, w *sim.Workload, results []sim.Result, unbounded, oracle float64) {
	fmt.Fprintf(out, "workload %s: %d requests; %d replicas x %d blocks of %d tokens; max batch %d; %d prox%s%s; seed %d; KV events after %v\n",
		w.Name, w.Requests(), o.cfg.Replicas, o.cfg.CapacityBlocks, o.cfg.BlockSize, o.cfg.MaxBatch,
		o.cfg.Proxies, plural(o.cfg.Proxies, "y", "ies"), shareNote(o.cfg), o.cfg.Seed, kvDelay(o.cfg.KVEventDelay))
	fmt.Fprintf(out, "reference lines: unbounded single-cache hit rate %.1f%%; clairvoyant greedy oracle %.1f%%\n\n", 100*unbounded, 100*oracle)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\thit %\t/unbounded\t/clairvoyant\timbalance\tinflight imb\tTTFT mean ms\tp50 ms\tp99 ms\treq/s\t")
	for _, r := range results {
		name := r.Strategy
		if name == sim.Clairvoyant {
			name += " (reference)"
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t%.2f\t\n",
			name, 100*r.HitRate, ratio(r.HitRate, unbounded), ratio(r.HitRate, oracle), r.LoadImbalance, r.InflightImbalance,
			ms(r.TTFTMean), ms(r.TTFTP50), ms(r.TTFTP99), r.Throughput)
	}
	tw.Flush()
	for _, r := range results {
		if len(r.Decisions) > 0 {
			fmt.Fprintf(out, "decisions %s: %s\n", r.Strategy, formatDecisions(r.Decisions))
		}
	}
}

func kvDelay(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.String()
}

// formatDecisions prints the non-zero decision outcomes: the known ones in
// a fixed order, then any other (predicted_ttft's precise and approximate)
// sorted, so that no strategy's outcomes go unprinted.
func formatDecisions(d map[string]uint64) string {
	order := []string{"affinity_hit", "load_spill", "least_load", "least_warmed", "cold", "predicted", "unpredicted", "scored", "neutral"}
	for _, k := range slices.Sorted(maps.Keys(d)) {
		if !slices.Contains(order, k) {
			order = append(order, k)
		}
	}
	var parts []string
	for _, k := range order {
		if v := d[k]; v > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, v))
		}
	}
	return strings.Join(parts, " ")
}

// progress draws a bar on stderr.
type progress struct {
	w     io.Writer
	on    bool
	total int
	done  int
	label string
	last  time.Time
	drawn bool
	width int
}

func newProgress(w io.Writer, on bool, total int) *progress {
	return &progress{w: w, on: on, total: max(total, 1), width: 30}
}

func (p *progress) step() {
	p.done++
	if !p.on {
		return
	}
	if now := time.Now(); now.Sub(p.last) >= 100*time.Millisecond || p.done == p.total {
		p.last = now
		filled := p.done * p.width / p.total
		fmt.Fprintf(p.w, "\r[%s%s] %3d%% %-40s", strings.Repeat("=", filled), strings.Repeat(" ", p.width-filled),
			100*p.done/p.total, p.label)
		p.drawn = true
	}
}

func (p *progress) clear() {
	if p.drawn {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width+50))
		p.drawn = false
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
