package sim

import (
	"container/list"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/prefixtree"
	"rolter.dev/pkg/routing"
)

// The peers' published routing policies, re-implemented from their sources
// with their published defaults (docs/routing.md cites each constant). They
// see what the peer would see, restricted to what the simulator models: the
// request text each of them extracts from a chat request, the token ids
// (Dynamo tokenizes), the router-tracked in-flight counts, and, for llm-d's
// queue scorer, the replicas' waiting queues (llmd_precise, in precise.go,
// also reads the replicas' KV cache usage and their KV events). Each
// instance draws its tie breaks from its own seeded generator, so runs are
// reproducible.

func peerFactory(name string) func(Env) (Policy, error) {
	return func(env Env) (Policy, error) {
		rng := rand.New(rand.NewPCG(env.Seed, Key(uint64(len(name)), uint64(name[0]))))
		switch name {
		case SGLang:
			return newSGLang(env.Replicas, rng), nil
		case LLMDApprox:
			return newLLMD(env.Replicas, rng), nil
		case Dynamo:
			return newDynamo(env.Replicas, env.BlockSize, rng), nil
		case AIBrix:
			return newAIBrix(env.Replicas, rng), nil
		case Oracle:
			return &oracle{n: env.Replicas, rng: rng, abs: oracleBalanceAbs, rel: oracleBalanceRel}, nil
		case OracleGreedy:
			return &oracle{n: env.Replicas, rng: rng, greedy: true}, nil
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

// SGLang's cache-aware router defaults (sgl-model-gateway router_args.py,
// SMG docs/reference/configuration.md).
const (
	sglangCacheThreshold = 0.3
	sglangBalanceAbs     = 64
	sglangBalanceRel     = 1.5
	sglangMaxTreeSize    = 1 << 26 // characters per worker
)

// sglang is SGLang's cache_aware policy: if (max-min) > 64 and max > 1.5*min
// over the router-tracked loads, the least-loaded worker; else the worker
// whose character radix tree shares the longest prefix with the request text
// when matched/len > 0.3, otherwise the least-loaded worker. The text is
// inserted into the chosen worker's tree either way.
//
// The request text is the messages' contents joined by spaces, as SGLang's
// router extracts it from a chat request.
//
// Simulation notes: the tree is pkg/prefixtree (a multi-tenant radix tree
// like SGLang's); its 2^26 ceiling per worker is never reached in these runs,
// so SGLang's periodic LRU eviction never fires either. It holds the first
// 32 KiB of the text; match_rate divides by the whole text's length, which
// is SGLang's value unless the match runs through the cut. Among workers tied
// on the longest match one is drawn at random (SGLang returns an arbitrary
// tenant of the deepest node).
type sglang struct {
	n     int
	tree  *prefixtree.Tree
	rng   *rand.Rand
	match []int
	text  string // the last picked request's text, for Observe
}

func newSGLang(n int, rng *rand.Rand) *sglang {
	return &sglang{n: n, tree: prefixtree.New(n, sglangMaxTreeSize), rng: rng, match: make([]int, n)}
}

func (s *sglang) Pick(f *Flight, v *View) int {
	text, whole := ContentText(f.Req.Messages, MaxPromptBytes)
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

// llm-d / GIE approximate prefix-cache scorer defaults
// (gateway-api-inference-extension prefix plugin, config-text.md) and the
// scheduler weights of llm-d's approximate-prefix profile.
const (
	llmdBlockChars     = 64
	llmdMaxBlocks      = 256
	llmdLRUPerServer   = 31250
	llmdWeightPrefix   = 2
	llmdWeightQueue    = 1
	llmdWeightActive   = 1
	llmdRequestTimeout = 2 * time.Minute // active-request scorer's stale-request timeout
)

// llmd is llm-d's scheduler with the approximate prefix-cache scorer, the
// queue scorer and the active-request scorer, max-score picker:
//
//	score = 2 * matched_blocks/request_blocks
//	      + 1 * (maxQ - q)/(maxQ - minQ)      (1 when all queues are equal)
//	      + 1 * (maxA - a)/maxA               (1 when a = 0 or maxA = 0)
//
// The prompt is cut into 64-character blocks (at most 256, a trailing
// partial block ignored) chained by hash; matched_blocks walks the blocks
// while any server holds the block, counting for each server the blocks it
// holds. After the pick the request's blocks join the chosen server's LRU of
// 31,250 blocks. q is the replica's waiting queue, a the scheduler's own
// count of its requests in flight (dropped after 2 minutes). Ties are broken
// at random.
//
// The text is the JSON of the chat messages, as the scorer hashes it, the
// model name seeding the chain.
//
// Simulation notes: autoTune (which would take the block size and LRU size
// from the servers' metrics) is off, so the published constants apply.
type llmd struct {
	n       int
	rng     *rand.Rand
	owners  map[uint64]routing.Set
	lrus    []*lruSet
	active  []map[*Flight]time.Duration
	hashes  []uint64
	scores  []float64
	matched []int
}

func newLLMD(n int, rng *rand.Rand) *llmd {
	l := &llmd{n: n, rng: rng, owners: map[uint64]routing.Set{}, scores: make([]float64, n), matched: make([]int, n)}
	for range n {
		l.lrus = append(l.lrus, newLRUSet(llmdLRUPerServer))
		l.active = append(l.active, map[*Flight]time.Duration{})
	}
	return l
}

// chainHashes hashes text in blocks of size bytes (full blocks only, at most
// maxBlocks), each block's hash covering its parent's.
func chainHashes(dst []uint64, text string, size, maxBlocks int, seed uint64) []uint64 {
	dst = dst[:0]
	prev := seed
	for i := 0; i+size <= len(text) && (maxBlocks <= 0 || len(dst) < maxBlocks); i += size {
		prev = xxh3.HashStringSeed(text[i:i+size], prev)
		dst = append(dst, prev)
	}
	return dst
}

func (l *llmd) Pick(f *Flight, v *View) int {
	text := MessagesJSON(f.Req.Messages, llmdBlockChars*llmdMaxBlocks)
	l.hashes = chainHashes(l.hashes, text, llmdBlockChars, llmdMaxBlocks, xxh3.HashString("sim"))
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
	minQ, maxQ := slices.Min(v.Waiting), slices.Max(v.Waiting)
	counts := make([]int, l.n)
	maxA := activeCounts(l.active, v.Now, counts)
	for i := range l.n {
		prefix := 0.0
		if len(l.hashes) > 0 {
			prefix = float64(l.matched[i]) / float64(len(l.hashes))
		}
		queue := 1.0
		if maxQ != minQ {
			queue = float64(maxQ-v.Waiting[i]) / float64(maxQ-minQ)
		}
		act := 1.0
		if counts[i] > 0 && maxA > 0 {
			act = float64(maxA-counts[i]) / float64(maxA)
		}
		l.scores[i] = -(llmdWeightPrefix*prefix + llmdWeightQueue*queue + llmdWeightActive*act)
	}
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
	l.active[target][f] = v.Now
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

func (l *llmd) FirstToken(*Flight, time.Duration) {}

func (l *llmd) Done(f *Flight, _ time.Duration) { delete(l.active[f.Target], f) }

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

// Dynamo KV router defaults (ai-dynamo/dynamo docs/router): overlap weight 1,
// temperature 0, and for the approximate indexer (--no-kv-events) a block TTL
// of 120 s, a tree of at most 2^20 blocks pruned to 80 %.
const (
	dynamoOverlapWeight = 1.0
	dynamoTTL           = 120 * time.Second
	dynamoMaxTreeSize   = 1 << 20
	dynamoPruneRatio    = 0.8
)

// dynamo is Dynamo's KV router in approximate mode: for every worker w
//
//	cost(w) = 1 * prefill_blocks(w) + decode_blocks(w)
//	prefill_blocks(w) = (prefill tokens of w's requests still before their
//	                     first token + isl - overlap(w)*block_size) / block_size
//	decode_blocks(w)  = distinct blocks of w's active requests plus the
//	                     request's blocks not among them
//
// and the lowest cost wins (temperature 0; ties at random). overlap(w) is
// the number of leading blocks of the request (token blocks of the engine's
// block size, hashed as the replica hashes them) that the router routed to w
// less than 120 s ago. After the pick the request's blocks are recorded for
// w; the prefill tokens are released at the first token, the blocks at
// completion.
type dynamo struct {
	n, bs   int
	rng     *rand.Rand
	tree    map[dynKey]*list.Element // (block, worker) -> entry in ttl
	ttl     *list.List               // dynEntry, oldest first
	prefill []int
	blocks  []map[uint64]int // worker -> active block -> refs
	pending map[*Flight]int  // prefill tokens counted for a flight
	overlap []int
	costs   []float64
}

type dynKey struct {
	block  uint64
	worker int
}

type dynEntry struct {
	key dynKey
	at  time.Duration
}

func newDynamo(n, bs int, rng *rand.Rand) *dynamo {
	d := &dynamo{n: n, bs: bs, rng: rng, tree: map[dynKey]*list.Element{}, ttl: list.New(),
		prefill: make([]int, n), pending: map[*Flight]int{}, overlap: make([]int, n), costs: make([]float64, n)}
	for range n {
		d.blocks = append(d.blocks, map[uint64]int{})
	}
	return d
}

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

func (d *dynamo) Pick(f *Flight, v *View) int {
	d.expire(v.Now)
	hashes := f.Req.BlockHashes(d.bs)
	isl := len(f.Req.Tokens())
	for w := range d.n {
		k := 0
		for k < len(hashes) {
			if _, ok := d.tree[dynKey{hashes[k], w}]; !ok {
				break
			}
			k++
		}
		d.overlap[w] = k
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
		k := dynKey{h, target}
		if e, ok := d.tree[k]; ok {
			d.ttl.Remove(e)
		}
		d.tree[k] = d.ttl.PushBack(dynEntry{k, v.Now})
		d.blocks[target][h]++
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

// AIBrix prefix-cache router defaults (vllm-project/aibrix
// pkg/plugins/gateway/algorithms/prefix_cache.go and
// pkg/utils/prefixcacheindexer/hash.go).
const (
	aibrixImbalanceFactor = 2.0
	aibrixImbalanceMinGap = 8
	aibrixStdDevFactor    = 1.0
	aibrixBlockSize       = 4 // tokens of the default "character" tokenizer: bytes
	aibrixBlockNumber     = 200_000
	aibrixEvictAfter      = 20 * time.Minute
)

// aibrix is AIBrix's prefix-cache routing with its local hash table:
//
//  1. counts = running requests per pod (router-tracked). If max > 2.0 *
//     (mean+1) and max - min >= 8, prefix matching is restricted to the pods
//     at min.
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
	if float64(hi) > aibrixImbalanceFactor*(mean+1) && hi-lo >= aibrixImbalanceMinGap {
		ready = routing.Set{}
		for i, c := range counts {
			if c == lo {
				ready.Add(i)
			}
		}
	}
	text, _ := ContentText(f.Req.Messages, 0)
	a.hashes = chainHashes(a.hashes, text, aibrixBlockSize, 0, 0x41494272)
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

// ---------------------------------------------------------------- oracle

// Oracle guard defaults: rolter's default balance margins.
const (
	oracleBalanceAbs = routing.DefaultBalanceAbs
	oracleBalanceRel = routing.DefaultBalanceRel
)

// oracle knows every replica's true cache: it picks the replica with the
// longest cached prefix of the request (what vllmsim's Cache.Lookup would
// report), ties among the longest and the all-zero case going to the least
// loaded (ties at random). Unless greedy, it applies a load guard: when the
// chosen replica's load is past both margins of the least-loaded one (more
// than abs ahead and more than rel times it; rolter's defaults 2 and 1.5),
// the least-loaded replica gets the request instead. The greedy variant is
// an upper bound only while one replica's cache can absorb whatever piles on
// it: a prefix every request shares (the Mooncake trace's first block, an
// agent fleet's tool definitions) sends it all to one replica.
type oracle struct {
	n      int
	rng    *rand.Rand
	greedy bool
	abs    int
	rel    float64
	costs  []float64
}

func (o *oracle) Pick(f *Flight, v *View) int {
	if o.costs == nil {
		o.costs = make([]float64, o.n)
	}
	hashes := f.Req.BlockHashes(v.BlockSize)
	eligible := 0
	if n := len(f.Req.Tokens()); n > 0 {
		eligible = (n - 1) / v.BlockSize
	}
	for r, c := range v.Caches {
		k := 0
		for k < eligible && c.Has(hashes[k]) {
			k++
		}
		// Longest match first, then the least load.
		o.costs[r] = -float64(k)*1e6 + float64(v.Loads[r])
	}
	best := argminRandom(o.costs, o.rng)
	if o.greedy {
		return best
	}
	lo := slices.Min(v.Loads)
	if l := v.Loads[best]; l > lo+o.abs && float64(l) > o.rel*float64(lo) {
		for r, l := range v.Loads {
			o.costs[r] = float64(l)
		}
		return argminRandom(o.costs, o.rng)
	}
	return best
}

func (o *oracle) Observe(int, *Flight, *View) {}
