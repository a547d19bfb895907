package sim

import (
	"container/list"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/prefixtree"
	"rolter.dev/pkg/routing"
)

// The peers' routing policies, re-implemented from their sources with the
// defaults their current releases ship (each constant cites its file and
// version; docs/routing.md lists them). They see what the peer would see,
// restricted to what the simulator models: the request text each of them
// extracts from a chat request, the token ids (Dynamo and llm-d's precise
// scorer tokenize), the router-tracked in-flight counts, the replicas' KV
// events (dynamo, llmd_precise), and for llm-d's load scorers the replicas'
// queues and KV usage as last scraped. Each instance draws its tie breaks
// from its own seeded generator, so runs are reproducible.

func peerFactory(name string) func(Env) (Policy, error) {
	return func(env Env) (Policy, error) {
		rng := rand.New(rand.NewPCG(env.Seed, Key(uint64(len(name)), uint64(name[0]))))
		switch name {
		case SGLang:
			return newSGLang(env.Replicas, rng), nil
		case Dynamo:
			return dynamoEvents{newDynamo(env.Replicas, env.BlockSize, true, rng)}, nil
		case DynamoApprox:
			return newDynamo(env.Replicas, env.BlockSize, false, rng), nil
		case AIBrix:
			return newAIBrix(env.Replicas, rng), nil
		case Clairvoyant:
			return &clairvoyant{n: env.Replicas, rng: rng}, nil
		}
		panic("sim: no peer " + name)
	}
}

// argminRandom returns an index with the least value, ties broken uniformly
// at random by rng.
func argminRandom(vals []float64, rng *rand.Rand) int {
	best, ties := -1, 0
	for i, v := range vals {
		switch {
		case best < 0 || v < vals[best]:
			best, ties = i, 1
		case v == vals[best]:
			ties++
			if rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// firstMin returns the first index with the least load.
func firstMin(loads []int) int {
	best := 0
	for i, l := range loads {
		if l < loads[best] {
			best = i
		}
	}
	return best
}

// ---------------------------------------------------------------- SGLang

// SGLang's cache-aware router defaults, as its launcher passes them
// (sgl-project/sglang sgl-model-gateway/bindings/python/src/sglang_router/
// router_args.py, read at commit 05e589ad: cache_threshold 0.3,
// balance_abs_threshold 64, balance_rel_threshold 1.5,
// eviction_interval_secs 60, max_tree_size 2**26; the older
// bindings/python/sglang_router/router_args.py this simulator read first
// had 120 s). The algorithm is sgl-model-gateway/src/policies/
// cache_aware.rs (read at commit 053b63ff), the tree src/policies/tree.rs
// (03744dbe).
const (
	sglangCacheThreshold = 0.3
	sglangBalanceAbs     = 64
	sglangBalanceRel     = 1.5
	sglangEvictInterval  = 60 * time.Second
	sglangMaxTreeSize    = 1 << 26 // characters per worker
)

// sglang is SGLang's cache_aware policy: if (max-min) > 64 and max > 1.5*min
// over the router-tracked loads, the least-loaded worker; else the worker
// whose character radix tree shares the longest prefix with the request text
// when matched/len > 0.3, otherwise the least-loaded worker. The text is
// inserted into the chosen worker's tree either way. The tree grows without
// bound between eviction passes; every 60 s each worker holding more than
// 2^26 characters loses its least recently used entries down to 2^26
// (cache_aware.rs's eviction thread, Tree::evict_tenant_by_size).
//
// The request text is the messages' contents joined by spaces, as SGLang's
// router extracts it from a chat request, all of it: the router stores and
// matches the whole text.
//
// Simulation notes: the tree is pkg/prefixtree (a multi-tenant radix tree
// like SGLang's, sized in bytes; the simulated text is ASCII, so bytes are
// characters); its eviction removes whole least recently used prompts where
// SGLang removes least recently used leaves, which differ only in how much
// of a shared path survives. Among workers tied on the longest match one is
// drawn at random (SGLang returns the deepest node's last tenant). The pass
// runs at the first pick after each 60 s tick of the virtual clock.
type sglang struct {
	n         int
	tree      *prefixtree.Tree
	rng       *rand.Rand
	match     []int
	text      string // the last picked request's text, for Observe
	maxSize   int
	interval  time.Duration
	nextEvict time.Duration
}

func newSGLang(n int, rng *rand.Rand) *sglang {
	return &sglang{n: n, tree: prefixtree.New(n, 0), rng: rng, match: make([]int, n),
		maxSize: sglangMaxTreeSize, interval: sglangEvictInterval, nextEvict: sglangEvictInterval}
}

// evict runs the eviction passes due by now.
func (s *sglang) evict(now time.Duration) {
	if now < s.nextEvict {
		return
	}
	for w := range s.n {
		s.tree.Trim(w, s.maxSize)
	}
	for s.nextEvict <= now {
		s.nextEvict += s.interval
	}
}

func (s *sglang) Pick(f *Flight, v *View) int {
	s.evict(v.Now)
	text, whole := ContentText(f.Req.Messages, 0)
	s.text = text
	lo, hi := slices.Min(v.Loads), slices.Max(v.Loads)
	if hi-lo > sglangBalanceAbs && float64(hi) > sglangBalanceRel*float64(lo) {
		return firstMin(v.Loads)
	}
	if text == "" {
		return firstMin(v.Loads)
	}
	s.tree.Match(text, s.match)
	best, ties := 0, 0
	for i, m := range s.match {
		switch {
		case m > s.match[best]:
			best, ties = i, 1
		case m == s.match[best]:
			ties++
			if s.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if float64(s.match[best])/float64(whole) > sglangCacheThreshold {
		return best
	}
	return firstMin(v.Loads)
}

func (s *sglang) Observe(target int, _ *Flight, _ *View) {
	if s.text != "" {
		s.tree.Insert(target, s.text)
	}
}

// ---------------------------------------------------------------- llm-d

// llm-d's scheduler as its current release ships it: llm-d-router v0.10.0
// (the endpoint picker moved there from gateway-api-inference-extension,
// whose v1.6.0 README points to it; llm-d-inference-scheduler was renamed
// llm-d-router after v0.8.0). The approximate prefix-cache producer
// (pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/
// types.go, plugin.go; prefixhash/hashing.go) hashes the request's token ids
// in blocks; with no tokenizer configured (the chart configures none) the
// auto-created `estimate` token producer (.../dataproducer/tokenizer/
// estimate.go) packs the request's bytes into pseudo-tokens of 4 bytes
// (zero-padded), a chat request's bytes being each message's role followed
// by its content, no separators. The block size is the engine's cache block
// size read from its metrics (autoTune, on by default), raised to
// minBlockSizeTokens (64): 256 bytes per block here. The last, partial block
// is hashed too. Matching stops at defaultMaxPrefixTokens (131,072) / block
// size blocks. Each server's LRU holds as many block entries as the engine
// reports GPU blocks (autoTune's CacheNumBlocks; 31,250 without it), so with
// 16-token engine blocks it remembers four times what the engine holds (at
// 4 bytes a token).
// Metrics are refreshed every 50 ms (--refresh-metrics-interval).
const (
	llmdCharsPerToken   = 4
	llmdMinBlockTokens  = 64
	llmdMaxPrefixTokens = 131072
	llmdRefreshInterval = 50 * time.Millisecond
	llmdRequestTimeout  = 2 * time.Minute // active-request scorer's stale-request timeout
	llmdChainSeed       = "sim"           // the model name seeds the chain
)

// llmdWeights are an llm-d scheduling profile's scorer weights (prefix:
// the prefix-cache scorer, approximate or precise) and the precise scorer's
// speculation TTL.
type llmdWeights struct {
	prefix, kvCache, queue, active float64
	specTTL                        time.Duration
	lruBlocks                      int // approximate: LRU entries per server; 0: autoTune
}

// shippedLLMDApproxWeights is the default profile of llm-d-router's chart
// (v0.10.0 config/charts/routerlib/templates/_config.yaml, with the latency
// predictor off as by default: queue-scorer 2, kv-cache-utilization-scorer
// 2, prefix-cache-scorer 3, the max-score picker added by default), the
// profile GIE's inferencepool chart shipped before the move (v1.5.0
// config/charts/epplib/templates/_config.yaml) and llm-d's
// inference-scheduling guide deploys (llm-d/llm-d
// guides/inference-scheduling/scheduler/inference-scheduling.values.yaml,
// commit 086f217d).
func shippedLLMDApproxWeights() llmdWeights {
	return llmdWeights{prefix: 3, kvCache: 2, queue: 2}
}

// benchLLMDApproxWeights is llmd_approx_bench: prefix 2, queue 1,
// active-request 1, the weights this simulator used before issue 12 (after
// llm-d-kv-cache-manager benchmarking/37-capacity/README.md, with the queue
// scorer in place of the kv-cache-utilization one). A weighting users only
// get by writing their own EndpointPickerConfig.
func benchLLMDApproxWeights() llmdWeights {
	return llmdWeights{prefix: 2, queue: 1, active: 1}
}

// llmdLoad scores the load half of an llm-d profile over the metrics the
// scheduler last scraped, max-score picker with ties at random:
//
//	kv-cache-utilization = 1 - kv_cache_usage
//	queue                = (maxQ - q)/(maxQ - minQ)   (1 when all equal)
//	active-request       = (maxA - a)/maxA            (1 when a = 0)
//
// kv_cache_usage and q are vLLM's kv_cache_usage_perc and
// num_requests_waiting as of the last scrape (View.Scraped*); a is the
// scheduler's own count of its requests in flight (dropped after 2 minutes).
type llmdLoad struct {
	w      llmdWeights
	active []map[*Flight]time.Duration
	counts []int
}

func newLLMDLoad(n int, w llmdWeights) llmdLoad {
	l := llmdLoad{w: w, counts: make([]int, n)}
	for range n {
		l.active = append(l.active, map[*Flight]time.Duration{})
	}
	return l
}

// score adds the load scorers' weighted sum to scores (which hold the
// negated prefix term) as negatives, so argminRandom finds the max score.
func (l *llmdLoad) score(v *View, scores []float64) {
	waiting, usage := v.ScrapedWaiting, v.ScrapedKVUsage
	if waiting == nil {
		waiting, usage = v.Waiting, v.KVUsage
	}
	minQ, maxQ := slices.Min(waiting), slices.Max(waiting)
	maxA := activeCounts(l.active, v.Now, l.counts)
	for i := range scores {
		kv := 1.0
		if usage != nil {
			kv = 1 - min(max(usage[i], 0), 1)
		}
		queue := 1.0
		if maxQ != minQ {
			queue = float64(maxQ-waiting[i]) / float64(maxQ-minQ)
		}
		act := 1.0
		if l.counts[i] > 0 && maxA > 0 {
			act = float64(maxA-l.counts[i]) / float64(maxA)
		}
		scores[i] -= l.w.kvCache*kv + l.w.queue*queue + l.w.active*act
	}
}

func (l *llmdLoad) dispatched(target int, f *Flight, now time.Duration) { l.active[target][f] = now }

// scrapeInterval implements metricsScraper: llm-d reads scraped metrics.
func (l *llmdLoad) scrapeInterval() time.Duration { return llmdRefreshInterval }

func (l *llmdLoad) FirstToken(*Flight, time.Duration) {}

func (l *llmdLoad) Done(f *Flight, _ time.Duration) { delete(l.active[f.Target], f) }

// llmd is llm-d's scheduler with the approximate prefix-cache producer and
// scorer and the profile's load scorers (llmdLoad):
//
//	score = prefix * matched_blocks/request_blocks + llmdLoad
//
// The prompt (each message's role and content, as the estimate token
// producer packs them, the model name seeding the chain) is cut into blocks
// of 4 bytes per pseudo-token times max(engine block size, 64) tokens, the
// last partial block included, at most 131,072 tokens' worth, chained by
// hash; matched_blocks walks the blocks while any server holds the block,
// counting for each server the blocks it holds. After the pick the
// request's blocks join the chosen server's LRU, as many entries as the
// engine has blocks.
type llmd struct {
	llmdLoad
	n          int
	rng        *rand.Rand
	blockChars int
	maxBlocks  int
	owners     map[uint64]routing.Set
	lrus       []*lruSet
	hashes     []uint64
	scores     []float64
	matched    []int
}

func newLLMD(env Env, w llmdWeights, rng *rand.Rand) *llmd {
	n := env.Replicas
	blockTokens := max(env.BlockSize, llmdMinBlockTokens)
	l := &llmd{llmdLoad: newLLMDLoad(n, w), n: n, rng: rng, blockChars: blockTokens * llmdCharsPerToken,
		maxBlocks: llmdMaxPrefixTokens / blockTokens,
		owners:    map[uint64]routing.Set{}, scores: make([]float64, n), matched: make([]int, n)}
	lru := env.CapacityBlocks // autoTune: the engine's cache in blocks
	if w.lruBlocks > 0 {
		lru = w.lruBlocks
	}
	for range n {
		l.lrus = append(l.lrus, newLRUSet(max(lru, 1)))
	}
	return l
}

// chainHashes hashes text in blocks of size bytes (at most maxBlocks, ≤ 0:
// all), each block's hash covering its parent's; a trailing partial block
// is hashed only when partial is set.
func chainHashes(dst []uint64, text string, size, maxBlocks int, partial bool, seed uint64) []uint64 {
	dst = dst[:0]
	prev := seed
	for i := 0; i < len(text) && (maxBlocks <= 0 || len(dst) < maxBlocks); i += size {
		end := i + size
		if end > len(text) {
			if !partial {
				break
			}
			end = len(text)
		}
		prev = xxh3.HashStringSeed(text[i:end], prev)
		dst = append(dst, prev)
	}
	return dst
}

func (l *llmd) Pick(f *Flight, v *View) int {
	text := RoleContentText(f.Req.Messages, l.blockChars*l.maxBlocks)
	l.hashes = chainHashes(l.hashes, text, l.blockChars, l.maxBlocks, true, xxh3.HashString(llmdChainSeed))
	clear(l.matched)
	for _, h := range l.hashes {
		owners := l.owners[h]
		if owners.Empty() {
			break
		}
		for i := range l.n {
			if owners.Has(i) {
				l.matched[i]++
			}
		}
	}
	for i := range l.n {
		prefix := 0.0
		if len(l.hashes) > 0 {
			prefix = float64(l.matched[i]) / float64(len(l.hashes))
		}
		l.scores[i] = -l.w.prefix * prefix
	}
	l.score(v, l.scores)
	return argminRandom(l.scores, l.rng)
}

// activeCounts sets counts[i] to the requests the active-request scorer
// tracks for pod i, dropping those older than its 2-minute timeout, and
// returns the largest count.
func activeCounts(active []map[*Flight]time.Duration, now time.Duration, counts []int) int {
	maxA := 0
	for i, m := range active {
		counts[i] = 0
		for fl, at := range m {
			if now-at < llmdRequestTimeout {
				counts[i]++
			} else {
				delete(m, fl)
			}
		}
		maxA = max(maxA, counts[i])
	}
	return maxA
}

func (l *llmd) Observe(target int, f *Flight, v *View) {
	l.dispatched(target, f, v.Now)
	for _, h := range l.hashes {
		if evicted, ok := l.lrus[target].add(h); ok {
			s := l.owners[evicted]
			s.Remove(target)
			if s.Empty() {
				delete(l.owners, evicted)
			} else {
				l.owners[evicted] = s
			}
		}
		s := l.owners[h]
		s.Add(target)
		l.owners[h] = s
	}
}

// lruSet is a bounded set of keys with least-recently-added eviction.
type lruSet struct {
	cap int
	ll  *list.List
	m   map[uint64]*list.Element
}

func newLRUSet(capacity int) *lruSet {
	return &lruSet{cap: capacity, ll: list.New(), m: map[uint64]*list.Element{}}
}

// add inserts or refreshes k and returns the key it evicted, if any.
func (s *lruSet) add(k uint64) (uint64, bool) {
	if e, ok := s.m[k]; ok {
		s.ll.MoveToFront(e)
		return 0, false
	}
	s.m[k] = s.ll.PushFront(k)
	if s.ll.Len() <= s.cap {
		return 0, false
	}
	e := s.ll.Back()
	s.ll.Remove(e)
	old := e.Value.(uint64)
	delete(s.m, old)
	return old, true
}

// ---------------------------------------------------------------- Dynamo

// Dynamo KV router defaults (ai-dynamo/dynamo lib/kv-router/src/config.rs,
// KvRouterConfig::default, read at commit 870abbd1): overlap_score_weight
// 1.0, router_temperature 0.0, use_kv_events true; for the approximate
// indexer (use_kv_events false, --no-kv-events) router_ttl_secs 120,
// router_max_tree_size 2^20, router_prune_target_ratio 0.8. The block size
// is the engine's (the worker registers its kv_cache_block_size).
//
// Re-read in the router's newer layout (docs/routing.md, the peers' current
// releases): lib/kv-router/src/scheduling/selector/default.rs at 07a6c9ce
// (worker_logit: prefill_load_scale * max(0, active prefill + prompt blocks
// - overlap_score_credit * device overlap) + decode blocks +
// decode_active_request_weight * active requests; minimum_cost_index ties at
// random), scheduling/config.rs at 0243c51b (credit 1.0, scale 1.0,
// temperature 0, prompt-side tracking on, router_ttl_secs 120) and approx.rs
// at 209c9e83 (PruneConfig 120 s, 2^20, 0.8), the active-request weight 0
// by default (its routing-concepts.md): the same cost at the defaults.
// What differs between releases is the router queue's threshold, which the
// queue_tokens variant models.
const (
	dynamoOverlapWeight = 1.0
	dynamoTTL           = 120 * time.Second
	dynamoMaxTreeSize   = 1 << 20
	dynamoPruneRatio    = 0.8
)

// dynamo is Dynamo's KV router: for every worker w
//
//	cost(w) = 1 * prefill_blocks(w) + decode_blocks(w)
//	prefill_blocks(w) = (prefill tokens of w's requests still before their
//	                     first token + isl - overlap(w)*block_size) / block_size
//	decode_blocks(w)  = distinct blocks of w's active requests plus the
//	                     request's blocks not among them
//
// and the lowest cost wins (temperature 0; ties at random). overlap(w) is
// the number of leading blocks of the request that w holds. By default
// (dynamo) the indexer learns them from the engines' KV events, so it sees
// each replica's true cache as of the event delay, evictions included. In
// approximate mode (dynamo_approx) it records the blocks of the requests it
// routed to w, each for 120 s. The prefill tokens are released at the
// first token, the active blocks at completion.
type dynamo struct {
	n, bs   int
	rng     *rand.Rand
	events  bool
	ix      *eventIndex              // events mode
	memo    identities               // events mode: the request's identities
	tree    map[dynKey]*list.Element // approximate mode: (block, worker) -> entry in ttl
	ttl     *list.List               // dynEntry, oldest first
	prefill []int
	// queueTokens, when > 0 (the queue_tokens variant), holds requests at
	// the router while every worker has more pending prefill tokens than
	// this (see holds).
	queueTokens int
	blocks      []map[uint64]int // worker -> active block -> refs
	pending     map[*Flight]int  // prefill tokens counted for a flight
	overlap     []int
	costs       []float64
}

type dynKey struct {
	block  uint64
	worker int
}

type dynEntry struct {
	key dynKey
	at  time.Duration
}

func newDynamo(n, bs int, events bool, rng *rand.Rand) *dynamo {
	d := &dynamo{n: n, bs: bs, rng: rng, events: events, tree: map[dynKey]*list.Element{}, ttl: list.New(),
		prefill: make([]int, n), pending: map[*Flight]int{}, overlap: make([]int, n), costs: make([]float64, n)}
	if events {
		d.ix = newEventIndex(n)
		d.memo = identities{bs: bs}
	}
	for range n {
		d.blocks = append(d.blocks, map[uint64]int{})
	}
	return d
}

// holds implements holder: the variant dynamo:queue_tokens=N models the
// router queue of Dynamo's newer releases (--router-queue-threshold: off
// at 870abbd1, then 2.0, 4.0 and 16.0 by default (scheduling/config.rs at
// 0243c51b), off again in the newest configuration docs: requests wait in
// the router, first come first served, while every worker's active
// prompt-side prefill exceeds the threshold times its
// max_num_batched_tokens, here N tokens, and are routed when one drops
// below). Without it Dynamo dispatches at once.
func (d *dynamo) holds() bool {
	if d.queueTokens <= 0 {
		return false
	}
	for _, p := range d.prefill {
		if p <= d.queueTokens {
			return false
		}
	}
	return true
}

// parseDynamo reads dynamo's and dynamo_approx's one parameter,
// queue_tokens (see holds).
func parseDynamo(st Strategy, params string) (Strategy, error) {
	tokens := 0
	for kv := range strings.SplitSeq(params, ":") {
		k, v, _ := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if k != "queue_tokens" || err != nil || n < 1 {
			return st, fmt.Errorf("strategy %q: %s: want queue_tokens=N, N >= 1 (the only %s parameter)", st.Name, kv, st.Base)
		}
		tokens = n
	}
	base := peerFactory(st.Base)
	st.New = func(env Env) (Policy, error) {
		p, err := base(env)
		if err != nil {
			return nil, err
		}
		switch d := p.(type) {
		case dynamoEvents:
			d.queueTokens = tokens
		case *dynamo:
			d.queueTokens = tokens
		}
		return p, nil
	}
	return st, nil
}

// dynamoEvents is the events-mode router: a kvConsumer.
type dynamoEvents struct{ *dynamo }

func (d dynamoEvents) applyKV(replica int, ops []kvdelta.Op) { d.ix.apply(replica, ops) }

func (d *dynamo) expire(now time.Duration) {
	for e := d.ttl.Front(); e != nil; e = d.ttl.Front() {
		en := e.Value.(dynEntry)
		if now-en.at < dynamoTTL {
			break
		}
		d.ttl.Remove(e)
		delete(d.tree, en.key)
	}
}

// overlaps sets d.overlap from the indexer.
func (d *dynamo) overlaps(f *Flight, now time.Duration, hashes []uint64) {
	if d.events {
		d.memo.forget()
		ids := d.memo.get(f.Req.Tokens())
		for w := range d.n {
			d.overlap[w] = d.ix.prefixMatch(w, ids, now)
		}
		return
	}
	d.expire(now)
	for w := range d.n {
		k := 0
		for k < len(hashes) {
			if _, ok := d.tree[dynKey{hashes[k], w}]; !ok {
				break
			}
			k++
		}
		d.overlap[w] = k
	}
}

func (d *dynamo) Pick(f *Flight, v *View) int {
	hashes := f.Req.BlockHashes(d.bs)
	isl := len(f.Req.Tokens())
	d.overlaps(f, v.Now, hashes)
	for w := range d.n {
		k := d.overlap[w]
		newBlocks := 0
		for _, h := range hashes {
			if d.blocks[w][h] == 0 {
				newBlocks++
			}
		}
		if rem := isl - len(hashes)*d.bs; rem > 0 {
			newBlocks++ // the partial last block
		}
		prefill := float64(d.prefill[w]+isl-k*d.bs) / float64(d.bs)
		decode := float64(len(d.blocks[w]) + newBlocks)
		d.costs[w] = dynamoOverlapWeight*prefill + decode
	}
	return argminRandom(d.costs, d.rng)
}

func (d *dynamo) Observe(target int, f *Flight, v *View) {
	hashes := f.Req.BlockHashes(d.bs)
	for _, h := range hashes {
		d.blocks[target][h]++
		if d.events {
			continue
		}
		k := dynKey{h, target}
		if e, ok := d.tree[k]; ok {
			d.ttl.Remove(e)
		}
		d.tree[k] = d.ttl.PushBack(dynEntry{k, v.Now})
	}
	if len(d.tree) > dynamoMaxTreeSize {
		for float64(len(d.tree)) > dynamoPruneRatio*dynamoMaxTreeSize {
			e := d.ttl.Front()
			d.ttl.Remove(e)
			delete(d.tree, e.Value.(dynEntry).key)
		}
	}
	p := len(f.Req.Tokens()) - d.overlap[target]*d.bs
	d.pending[f] = p
	d.prefill[target] += p
}

func (d *dynamo) FirstToken(f *Flight, _ time.Duration) {
	if p, ok := d.pending[f]; ok {
		d.prefill[f.Target] -= p
		delete(d.pending, f)
	}
}

func (d *dynamo) Done(f *Flight, now time.Duration) {
	d.FirstToken(f, now)
	m := d.blocks[f.Target]
	for _, h := range f.Req.BlockHashes(d.bs) {
		if m[h]--; m[h] <= 0 {
			delete(m, h)
		}
	}
}

// ---------------------------------------------------------------- AIBrix

// AIBrix prefix-cache router defaults (vllm-project/aibrix v0.7.0, its
// newest release: pkg/plugins/gateway/algorithms/prefix_cache.go
// (defaultPodRunningRequestImbalanceAbsCount 8, defaultStandardDeviationFactor
// 1, getTargetPodListOnLoadImbalance, getTargetPodFromMatchedPods),
// least_request.go (selectTargetPodWithLeastRequestCount),
// pkg/utils/prefixcacheindexer/hash.go (block size 4, 200,000 blocks,
// 20-minute eviction, full blocks only), pkg/plugins/gateway/util.go
// (parseChatMessages)). The imbalance test has been max - min > 8 since
// v0.3.0; this simulator's earlier model also required max > 2 (mean + 1),
// which no release has.
const (
	aibrixImbalanceAbsCount = 8
	aibrixStdDevFactor      = 1.0
	aibrixBlockSize         = 4 // tokens of the default "character" tokenizer: bytes
	aibrixBlockNumber       = 200_000
	aibrixEvictAfter        = 20 * time.Minute
)

// aibrix is AIBrix's prefix-cache routing with its local hash table:
//
//  1. counts = running requests per pod (router-tracked). If max - min > 8,
//     prefix matching is restricted to the pods at min.
//  2. The message text (the contents joined by spaces, as the gateway reads a
//     chat request; the default "character" tokenizer makes its bytes the
//     tokens) is cut into 4-byte blocks
//     chained by hash; walking them, the matching pods are those that hold
//     every block so far, each with match% = (i+1)*100/blocks at the last
//     block it held.
//  3. Matching pods are shuffled, sorted by match% descending then count
//     ascending, and the first with count <= mean + 1*stddev (over all pods)
//     wins; with none, the pod with the fewest requests (ties at random).
//  4. The request's blocks are recorded for the chosen pod in one table of at
//     most 200,000 blocks (LRU), entries idle for 20 minutes expire.
type aibrix struct {
	n      int
	rng    *rand.Rand
	lru    *list.List // aibrixBlock, most recently used at the front
	table  map[uint64]*list.Element
	hashes []uint64
	pct    []int
}

type aibrixBlock struct {
	hash uint64
	pods routing.Set
	at   time.Duration
}

func newAIBrix(n int, rng *rand.Rand) *aibrix {
	return &aibrix{n: n, rng: rng, lru: list.New(), table: map[uint64]*list.Element{}, pct: make([]int, n)}
}

func (a *aibrix) expire(now time.Duration) {
	for e := a.lru.Back(); e != nil; e = a.lru.Back() {
		b := e.Value.(*aibrixBlock)
		if now-b.at <= aibrixEvictAfter {
			break
		}
		a.lru.Remove(e)
		delete(a.table, b.hash)
	}
}

func (a *aibrix) Pick(f *Flight, v *View) int {
	a.expire(v.Now)
	counts := v.Loads
	lo, hi, sum := counts[0], counts[0], 0
	for _, c := range counts {
		lo, hi, sum = min(lo, c), max(hi, c), sum+c
	}
	mean := float64(sum) / float64(a.n)
	ready := routing.All(a.n)
	if hi-lo > aibrixImbalanceAbsCount {
		ready = routing.Set{}
		for i, c := range counts {
			if c == lo {
				ready.Add(i)
			}
		}
	}
	text, _ := ContentText(f.Req.Messages, 0)
	a.hashes = chainHashes(a.hashes, text, aibrixBlockSize, 0, false, 0x41494272)
	clear(a.pct)
	var has routing.Set
	for i, h := range a.hashes {
		e, ok := a.table[h]
		if !ok {
			break
		}
		b := e.Value.(*aibrixBlock)
		a.lru.MoveToFront(e)
		b.at = v.Now
		next := routing.Set{}
		for p := range a.n {
			if ready.Has(p) && b.pods.Has(p) {
				next.Add(p)
				has.Add(p)
				a.pct[p] = (i + 1) * 100 / len(a.hashes)
			}
		}
		if next.Empty() {
			break
		}
		ready = next
	}
	var matched []int
	for p := range a.n {
		if has.Has(p) {
			matched = append(matched, p)
		}
	}
	if len(matched) > 0 {
		sd := 0.0
		for _, c := range counts {
			sd += (float64(c) - mean) * (float64(c) - mean)
		}
		sd = math.Sqrt(sd / float64(a.n))
		a.rng.Shuffle(len(matched), func(i, j int) { matched[i], matched[j] = matched[j], matched[i] })
		slices.SortStableFunc(matched, func(x, y int) int {
			if a.pct[x] != a.pct[y] {
				return a.pct[y] - a.pct[x]
			}
			return counts[x] - counts[y]
		})
		for _, p := range matched {
			if float64(counts[p]) <= mean+aibrixStdDevFactor*sd {
				return p
			}
		}
	}
	vals := make([]float64, a.n)
	for i, c := range counts {
		vals[i] = float64(c)
	}
	return argminRandom(vals, a.rng)
}

func (a *aibrix) Observe(target int, _ *Flight, v *View) {
	for _, h := range a.hashes {
		if e, ok := a.table[h]; ok {
			b := e.Value.(*aibrixBlock)
			b.pods.Add(target)
			b.at = v.Now
			a.lru.MoveToFront(e)
			continue
		}
		b := &aibrixBlock{hash: h, at: v.Now}
		b.pods.Add(target)
		a.table[h] = a.lru.PushFront(b)
		if a.lru.Len() > aibrixBlockNumber {
			e := a.lru.Back()
			a.lru.Remove(e)
			delete(a.table, e.Value.(*aibrixBlock).hash)
		}
	}
}

// ---------------------------------------------------------------- clairvoyant

// clairvoyant is the clairvoyant greedy oracle, a reference line rather
// than a policy anyone can run: it sees every replica's true cache plus the
// blocks the requests waiting in its queue will write when admitted, and
// sends the request to the replica with the longest such prefix (ties, and
// the all-zero case, to the least loaded; ties at random). It applies no
// load guard, so it is not an upper bound either: a prefix every request
// shares (the Mooncake trace's first block, an agent fleet's tool
// definitions) sends everything to one replica, which docs/routing.md shows
// where it happens. The ceiling of the workload is unbounded_hit_rate (one
// infinite cache).
type clairvoyant struct {
	n     int
	rng   *rand.Rand
	costs []float64
}

// readsQueues implements queueReader: the run tracks the queued blocks.
func (o *clairvoyant) readsQueues() {}

func (o *clairvoyant) Pick(f *Flight, v *View) int {
	if o.costs == nil {
		o.costs = make([]float64, o.n)
	}
	hashes := f.Req.BlockHashes(v.BlockSize)
	eligible := 0
	if n := len(f.Req.Tokens()); n > 0 {
		eligible = (n - 1) / v.BlockSize
	}
	for r, c := range v.Caches {
		var queued map[uint64]int
		if v.Queued != nil {
			queued = v.Queued[r]
		}
		k := 0
		for k < eligible && (c.Has(hashes[k]) || queued[hashes[k]] > 0) {
			k++
		}
		// Longest match first, then the least load.
		o.costs[r] = -float64(k)*1e6 + float64(v.Loads[r])
	}
	return argminRandom(o.costs, o.rng)
}

func (o *clairvoyant) Observe(int, *Flight, *View) {}
