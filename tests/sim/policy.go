package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"rolter.dev/pkg/routing"
	"rolter.dev/tests/vllmsim"
)

// Flight is one request in flight through a simulated proxy.
type Flight struct {
	// Req is the request; Ctx its routing context.
	Req *Request
	Ctx routing.Context
	// Proxy is the proxy that routed it, Target the replica it chose.
	Proxy, Target int
	// Issued, Started, FirstToken and Done are virtual times: sent by the
	// client, admitted to a batch slot, first token, completion.
	Issued, Started, FirstToken, Done time.Duration
	// Depth is the proxy's in-flight count of Target read for the pick.
	Depth int
	// Cached is the number of prompt tokens the replica served from cache.
	Cached int

	lease *vllmsim.Lease
	sess  *sessionState
}

// View is what a policy may look at when it picks. Rolter's balancers get
// only Loads (precise_cache_aware also its proxy's index of the replicas' KV
// events); the peers' policies get what their systems read (SGLang,
// Dynamo, AIBrix: router-tracked in-flight = Loads; llm-d's queue and
// kv-cache-utilization scorers: the scraped Waiting and KVUsage); the
// clairvoyant oracle reads the replicas' caches and queues.
type View struct {
	Now time.Duration
	// Loads is the proxy's own in-flight count per replica (incremented at
	// dispatch, decremented at completion): what a proxy can count.
	Loads []int
	// Waiting is each replica's true number of requests waiting for a batch
	// slot (vLLM's num_requests_waiting).
	Waiting []int
	// Running is each replica's true number of requests holding a batch
	// slot (vLLM's num_requests_running).
	Running []int
	// KVUsage is each replica's vllm:kv_cache_usage_perc: cache blocks held
	// by running requests over capacity, in [0, 1].
	KVUsage []float64
	// ScrapedWaiting and ScrapedKVUsage are Waiting and KVUsage as of the
	// last metrics scrape, when a policy reads scraped metrics
	// (metricsScraper); nil otherwise.
	ScrapedWaiting []int
	ScrapedKVUsage []float64
	// ScrapedRunning is Running as of the last metrics scrape (nil when
	// no policy scrapes), and ScrapedAt when that scrape was.
	ScrapedRunning []int
	ScrapedAt      time.Duration
	// Caches are the replicas' prefix caches (clairvoyant only).
	Caches []*vllmsim.Cache
	// Queued counts, per replica, the block hashes of the requests waiting
	// in its queue (clairvoyant only: nil unless a policy is a queueReader).
	Queued []map[uint64]int
	// BlockSize is the replicas' cache block size.
	BlockSize int
}

// Policy chooses a replica for a request.
type Policy interface {
	// Pick returns a replica index in [0, n).
	Pick(f *Flight, v *View) int
	// Observe is called right after Pick with its result, before dispatch.
	Observe(target int, f *Flight, v *View)
}

// metricsScraper is a policy that reads the replicas' metrics as a
// scraper refreshes them: the run copies Waiting and KVUsage into
// View.ScrapedWaiting/ScrapedKVUsage every scrapeInterval.
type metricsScraper interface {
	scrapeInterval() time.Duration
}

// queueReader is a policy that reads View.Queued.
type queueReader interface {
	readsQueues()
}

// holder is a policy whose router holds requests back instead of picking
// a replica while holds reports true (Dynamo's router queue): the run keeps
// them, oldest first, and dispatches them once it reports false, checked
// at every first token and completion. Their TTFT includes the wait.
type holder interface {
	holds() bool
}

// lifecycle is implemented by policies that track requests after dispatch.
type lifecycle interface {
	FirstToken(f *Flight, now time.Duration)
	Done(f *Flight, now time.Duration)
}

// Env is what a policy is built with.
type Env struct {
	Replicas  int
	BlockSize int
	// CapacityBlocks is each replica's cache size in blocks, as the engine
	// reports it in its metrics (llm-d's autoTune reads it).
	CapacityBlocks int
	// Seed seeds the policy's own randomness (tie breaks), so the peers'
	// policies are reproducible.
	Seed uint64
	// Share, when set, is the proxy's fleet route's Record (Config.Share):
	// rolter's balancers publish their prefix observations through it.
	Share func(target int, prompt string)
	// Now is the run's virtual clock, for the balancers' own timers
	// (routing.Spec.Now: the pipeline's session TTL).
	Now func() time.Duration
	// FleetNow is the proxy's wall clock, which predicted_ttft's turns
	// draw their order from (routing.Spec.FleetNow): Now plus the proxy's
	// clock offset (Config.ClockSkew); nil: Now.
	FleetNow func() time.Duration
	// Proxy is the proxy's index among the run's (0 to Config.Proxies-1).
	Proxy int
}

// Strategy names a policy and builds one instance per proxy.
type Strategy struct {
	// Name is the strategy as written on the command line, parameters
	// included ("cache_aware:threshold=0.3:balance_abs=8").
	Name string
	// Base is the strategy name without parameters.
	Base string
	// TokenIDs: the client sends the prompt's token ids
	// (x-rolter-vllm-token-ids), which the proxy puts in the routing
	// context (precise_cache_aware).
	TokenIDs bool
	// New builds one instance.
	New func(env Env) (Policy, error)
}

// Names of the strategies implemented in the simulator.
const (
	SGLang          = "sglang"
	LLMDApprox      = "llmd_approx"
	LLMDApproxBench = "llmd_approx_bench"
	LLMDPrecise     = "llmd_precise"
	Dynamo          = "dynamo"
	DynamoApprox    = "dynamo_approx"
	AIBrix          = "aibrix"
	// Clairvoyant is the clairvoyant greedy oracle, a reference line.
	Clairvoyant = "clairvoyant"
)

// RolterStrategies are pkg/routing's strategies the simulator runs.
var RolterStrategies = []string{
	routing.RoundRobin, routing.Random, routing.Weighted, routing.PowerOfTwo, routing.LeastLoad,
	routing.ConsistentHash, routing.CacheAware, routing.Pipeline, routing.PredictedLatency,
	routing.PreciseCacheAware, routing.PredictedTTFT,
}

// PeerStrategies are the peers' shipped policies, their named variants and
// the clairvoyant oracle.
var PeerStrategies = []string{SGLang, LLMDApprox, LLMDApproxBench, LLMDPrecise, Dynamo, DynamoApprox, AIBrix, Clairvoyant}

// AllStrategies lists every strategy name.
func AllStrategies() []string { return append(slices.Clone(RolterStrategies), PeerStrategies...) }

// ParseStrategy reads "name" or "name:key=value:key=value". For pkg/routing
// strategies the keys are Spec fields: threshold, balance_abs, balance_rel,
// max_trie_nodes, signal_weight and load_weight (precise_cache_aware), and
// pipeline scorer weights by scorer name (prefix_cache, least_load,
// session_affinity, static_weight); precise_cache_aware also takes
// speculate_ms, Spec.SpeculativeTTL in milliseconds (default 5 s; 0 turns
// speculation off). The peers run with their shipped defaults and take no
// parameters, except the llm-d strategies (their scorer weights prefix,
// kv_cache, queue, active, and for llmd_precise speculate_ms) and dynamo and
// dynamo_approx (queue_tokens, the router queue of newer Dynamo releases).
func ParseStrategy(s string) (Strategy, error) {
	s = strings.TrimSpace(s)
	base, params, _ := strings.Cut(s, ":")
	st := Strategy{Name: s, Base: base}
	if base == LLMDPrecise || base == LLMDApprox || base == LLMDApproxBench {
		return parseLLMD(st, params)
	}
	if (base == Dynamo || base == DynamoApprox) && params != "" {
		return parseDynamo(st, params)
	}
	if slices.Contains(PeerStrategies, base) {
		if params != "" {
			return st, fmt.Errorf("strategy %q: %s takes no parameters", s, base)
		}
		st.New = peerFactory(base)
		return st, nil
	}
	if !slices.Contains(RolterStrategies, base) {
		return st, fmt.Errorf("unknown strategy %q (want one of %s)", base, strings.Join(AllStrategies(), ", "))
	}
	spec := routing.Spec{Strategy: base}
	ttft := ttftOptions{events: true, engine: true, turns: true, stream: 1, inherit: true}
	if params != "" {
		for kv := range strings.SplitSeq(params, ":") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return st, fmt.Errorf("strategy %q: parameter %q is not key=value", s, kv)
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return st, fmt.Errorf("strategy %q: %s: %w", s, k, err)
			}
			switch k {
			case "threshold":
				spec.Threshold = f
			case "balance_abs":
				spec.BalanceAbs = int(f)
			case "balance_rel":
				spec.BalanceRel = f
			case "max_trie_nodes":
				spec.MaxTrieNodes = int(f)
			case "signal_weight":
				spec.SignalWeight = f
			case "load_weight":
				spec.LoadWeight = f
			case "kv_events", "engine", "turns", "inherit", "restart_one":
				if base != routing.PredictedTTFT || (f != 0 && f != 1) {
					return st, fmt.Errorf("strategy %q: %s: want 0 or 1 on %s", s, k, routing.PredictedTTFT)
				}
				switch k {
				case "kv_events":
					ttft.events = f == 1
				case "engine":
					ttft.engine = f == 1
				case "inherit":
					ttft.inherit = f == 1
				case "restart_one":
					ttft.restartOne = f == 1
				default:
					ttft.turns = f == 1
				}
			case "stream":
				if base != routing.PredictedTTFT || f < 0 || f > 1 {
					return st, fmt.Errorf("strategy %q: stream: want a share from 0 to 1 on %s", s, routing.PredictedTTFT)
				}
				ttft.stream = f
			case "scale_s", "drain_s", "restart_s":
				if base != routing.PredictedTTFT || !(f > 0) || f > 1e6 || ttft.scaleAt > 0 {
					return st, fmt.Errorf("strategy %q: %s: want seconds above 0 on %s, and one of scale_s, drain_s and restart_s", s, k, routing.PredictedTTFT)
				}
				ttft.scaleAt, ttft.drain, ttft.restart = time.Duration(f*float64(time.Second)), k == "drain_s", k == "restart_s"
			case "speculate_ms":
				if (base != routing.PreciseCacheAware && base != routing.PredictedTTFT) || f < 0 {
					return st, fmt.Errorf("strategy %q: speculate_ms: want a number >= 0 on %s or %s", s, routing.PreciseCacheAware, routing.PredictedTTFT)
				}
				spec.SpeculativeTTL = time.Duration(f * float64(time.Millisecond))
				if f == 0 {
					spec.SpeculativeTTL = routing.NoSpeculation
				}
			default:
				if spec.Scorers == nil {
					spec.Scorers = map[string]float64{}
				}
				spec.Scorers[k] = f
			}
		}
	}
	if ttft.restartOne && !ttft.restart {
		return st, fmt.Errorf("strategy %q: restart_one: only with restart_s", s)
	}
	// Validate once with a single target so errors surface at parse time.
	probe := spec
	probe.Weights = []int{1}
	if _, err := routing.New(probe); err != nil {
		return st, fmt.Errorf("strategy %q: %w", s, err)
	}
	st.TokenIDs = base == routing.PreciseCacheAware || (base == routing.PredictedTTFT && ttft.events)
	st.New = func(env Env) (Policy, error) {
		sp := spec
		sp.Share = env.Share
		sp.Now = env.Now
		sp.FleetNow = env.FleetNow
		// Seeded draws (random, power_of_two, tie breaks), so runs reproduce.
		sp.IntN = rand.New(rand.NewPCG(env.Seed, Key(uint64(len(base)), uint64(base[0])))).IntN
		sp.Weights = make([]int, env.Replicas)
		for i := range sp.Weights {
			sp.Weights[i] = 1
		}
		if base == routing.PreciseCacheAware {
			return newPrecise(sp, env)
		}
		if base == routing.PredictedTTFT {
			return newTTFTPolicy(sp, env, ttft)
		}
		b, err := routing.New(sp)
		if err != nil {
			return nil, err
		}
		return &balancer{b: b, all: routing.All(env.Replicas)}, nil
	}
	return st, nil
}

// ParseStrategies reads a comma-separated list of strategies (see
// ParseStrategy); the words "all", "rolter" and "peers" stand for
// AllStrategies, RolterStrategies and PeerStrategies.
func ParseStrategies(list string) ([]Strategy, error) {
	var out []Strategy
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' }) {
		var names []string
		switch f {
		case "all":
			names = AllStrategies()
		case "rolter":
			names = RolterStrategies
		case "peers":
			names = PeerStrategies
		default:
			names = []string{f}
		}
		for _, n := range names {
			st, err := ParseStrategy(n)
			if err != nil {
				return nil, err
			}
			out = append(out, st)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no strategy given")
	}
	return out, nil
}

// balancer runs one of pkg/routing's balancers, as the proxy does: Pick over
// every target with the proxy's in-flight counts, Observe right after, and
// Learn on success with the load read for the pick and the request's
// latency from dispatch to completion.
type balancer struct {
	b   routing.Balancer
	all routing.Set
}

// inner is the balancer a wrapping policy (precise, ttftPolicy) embeds.
func (p *balancer) inner() *balancer { return p }

func (p *balancer) Pick(f *Flight, v *View) int { return p.b.Pick(&f.Ctx, v.Loads, p.all) }

func (p *balancer) Observe(target int, f *Flight, _ *View) { p.b.Observe(target, &f.Ctx) }

func (p *balancer) FirstToken(*Flight, time.Duration) {}

func (p *balancer) Done(f *Flight, now time.Duration) { learn(p.b, f, now) }

// learn tells b, if it learns, that f completed at now.
func learn(b routing.Balancer, f *Flight, now time.Duration) {
	if l, ok := b.(routing.Learner); ok {
		l.Learn(f.Target, &f.Ctx, f.Depth, now-f.Issued)
	}
}

// Decisions returns the balancer's decision counts, if it keeps any.
func (p *balancer) Decisions() map[string]uint64 {
	if d, ok := p.b.(routing.DecisionCounter); ok {
		return d.Decisions()
	}
	return nil
}
