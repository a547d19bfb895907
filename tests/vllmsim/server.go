package vllmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of [Options]; a zero field takes these values.
const (
	// DefaultModel is the served model name when Options.Models is empty.
	DefaultModel = "sim-model"
	// DefaultBlockSize is the prefix cache's tokens per block.
	DefaultBlockSize = 16
	// DefaultCapacityBlocks is the prefix cache's capacity in blocks.
	DefaultCapacityBlocks = 4096
	// DefaultMaxTokens is the output length of a request that sets none.
	DefaultMaxTokens = 16
	// DefaultMaxModelLen is the context window (prompt plus output tokens).
	DefaultMaxModelLen = 32768
	// DefaultMaxBodyBytes is the largest request body accepted by default.
	DefaultMaxBodyBytes = 32 << 20
	// DefaultMaxLogprobs is vLLM's default --max-logprobs.
	DefaultMaxLogprobs = 20
)

// Options configures a [Server]. The zero value is usable: every zero field
// takes its documented default.
type Options struct {
	// Models are the served model names; requests for any other model get
	// 404. The first name labels the metrics. Default: [DefaultModel].
	Models []string
	// TTFT is the base time to first token.
	TTFT time.Duration
	// ITL is the time between two output tokens.
	ITL time.Duration
	// StepGrowth lengthens the engine's steps by this much for every other
	// request running (vLLM's steps grow with the batch, each reading every
	// running request's KV cache): it is added to the time to first token
	// once (the step that gives it) and to every later token's ITL, with
	// the running count of that moment. 0 means steps do not slow.
	StepGrowth time.Duration
	// PrefillTokensPerSecond adds uncached_prompt_tokens/PrefillTokensPerSecond
	// to the time to first token; 0 means prefill is free.
	PrefillTokensPerSecond float64
	// FailRate is the share of inference requests answered 503, drawn from
	// a random sequence seeded by Seed. 0 never fails, 1 always does.
	FailRate float64
	// BlockSize is the prefix cache's tokens per block. Default 16.
	BlockSize int
	// CapacityBlocks is the prefix cache's capacity in blocks. Default 4096.
	CapacityBlocks int
	// MaxTokensDefault is the output length, in tokens, of a request that
	// sets no maximum. Default 16.
	MaxTokensDefault int
	// MaxModelLen is the context window: a request whose prompt plus output
	// exceeds it gets 400, as in vLLM. Default 32768.
	MaxModelLen int
	// MaxNumSeqs caps the requests that run at once; more wait in a queue
	// (the waiting gauge). 0 means no cap.
	MaxNumSeqs int
	// MaxBodyBytes is the largest request body accepted; a larger one gets
	// 413. Default 32 MiB.
	MaxBodyBytes int64
	// MaxLogprobs is vLLM's --max-logprobs: the most log probabilities a
	// request may ask for each token (chat top_logprobs, completions
	// logprobs, prompt_logprobs); more get 400. Default 20.
	MaxLogprobs int
	// CacheOutput also caches the full blocks that generated tokens fill,
	// as vLLM does, so that the next turn of a conversation can hit on the
	// previous answer. Off by default: only prompt blocks are cached.
	CacheOutput bool
	// Seed seeds the fail-rate draws.
	Seed uint64
	// Listener, if not nil, receives the prefix cache's KV events (see
	// [Listener] for its contract).
	Listener Listener
	// Logger receives operational logs (never prompts or outputs). Default:
	// a logger that discards everything.
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	var names []string
	for _, m := range o.Models {
		for n := range strings.SplitSeq(m, ",") {
			if n = strings.TrimSpace(n); n != "" && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	if len(names) == 0 {
		names = []string{DefaultModel}
	}
	o.Models = names
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.CapacityBlocks == 0 {
		o.CapacityBlocks = DefaultCapacityBlocks
	}
	if o.MaxTokensDefault == 0 {
		o.MaxTokensDefault = DefaultMaxTokens
	}
	if o.MaxModelLen == 0 {
		o.MaxModelLen = DefaultMaxModelLen
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxLogprobs == 0 {
		o.MaxLogprobs = DefaultMaxLogprobs
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	var errs []error
	check := func(bad bool, field string, v any) {
		if bad {
			errs = append(errs, fmt.Errorf("vllmsim: options.%s: out of range, got %v", field, v))
		}
	}
	check(o.TTFT < 0, "ttft", o.TTFT)
	check(o.ITL < 0, "itl", o.ITL)
	check(o.PrefillTokensPerSecond < 0, "prefill_tokens_per_second", o.PrefillTokensPerSecond)
	check(!(o.FailRate >= 0 && o.FailRate <= 1), "fail_rate", o.FailRate)
	check(o.BlockSize < 1, "block_size", o.BlockSize)
	check(o.CapacityBlocks < 1, "capacity_blocks", o.CapacityBlocks)
	check(o.MaxTokensDefault < 1, "max_tokens_default", o.MaxTokensDefault)
	check(o.MaxModelLen < 2, "max_model_len", o.MaxModelLen)
	check(o.MaxNumSeqs < 0, "max_num_seqs", o.MaxNumSeqs)
	check(o.MaxBodyBytes < 1, "max_body_bytes", o.MaxBodyBytes)
	check(o.MaxLogprobs < 1, "max_logprobs", o.MaxLogprobs)
	return o, errors.Join(errs...)
}

// Server is a simulated vLLM replica: an [http.Handler] serving vLLM's
// OpenAI-compatible API (plus the Anthropic Messages API) with a simulated
// prefix cache and latency. Create it with [New]. All methods are safe for
// concurrent use.
type Server struct {
	opts    Options
	logger  *slog.Logger
	cache   *Cache
	created int64
	routes  map[string]route
	slots   chan struct{} // nil when MaxNumSeqs is 0

	running, waiting atomic.Int64

	mu            sync.Mutex // guards the fields below
	rng           *rand.Rand
	stats         counters
	responses     map[string]storedResponse // by response id
	responseOrder []string                  // response ids, oldest first
	tasks         map[*bgTask]struct{}      // running background generations
	taskByID      map[string]*bgTask        // the newest task of each response id
}

// route is one endpoint: its method and handler. A path of the routes
// table may hold {name} segments, FastAPI's path parameters: each matches
// one non-empty segment, which the handler reads as r.PathValue(name).
// Such patterns must not overlap.
type route struct {
	method  string
	handler http.HandlerFunc
}

// counters are the Server's cumulative counters, zeroed by Reset.
type counters struct {
	requests, failures, completed, cancelled uint64
	promptTokens, cachedTokens, genTokens    uint64
	finished                                 map[string]uint64 // by finish reason
	byEndpoint                               map[string]uint64
}

var _ http.Handler = (*Server)(nil)

// New returns a Server configured by opts, or an error naming every option
// that is out of range.
func New(opts Options) (*Server, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		opts:    opts,
		logger:  opts.Logger.With("component", "vllmsim"),
		cache:   NewCache(opts.BlockSize, opts.CapacityBlocks, opts.Listener),
		created: time.Now().Unix(),
		rng:     newRand(opts.Seed),
	}
	s.stats.reset()
	if opts.MaxNumSeqs > 0 {
		s.slots = make(chan struct{}, opts.MaxNumSeqs)
	}
	s.routes = map[string]route{
		"/v1/chat/completions": {http.MethodPost, s.handleChat},
		"/v1/completions":      {http.MethodPost, s.handleCompletions},
		"/v1/messages":         {http.MethodPost, s.handleMessages},
		"/v1/responses":        {http.MethodPost, s.handleResponses},
		"/v1/embeddings":       {http.MethodPost, s.handleEmbeddings},
		"/rerank":              {http.MethodPost, s.handleRerank},
		"/v1/rerank":           {http.MethodPost, s.handleRerank},
		"/v2/rerank":           {http.MethodPost, s.handleRerank},
		"/score":               {http.MethodPost, s.handleScore},
		"/v1/score":            {http.MethodPost, s.handleScore},
		"/tokenize":            {http.MethodPost, s.handleTokenize},
		"/v1/models":           {http.MethodGet, s.handleModels},
		"/health":              {http.MethodGet, s.handleHealth},
		"/ping":                {http.MethodGet, s.handleHealth},
		"/version":             {http.MethodGet, s.handleVersion},
		"/metrics":             {http.MethodGet, s.handleMetrics},
		"/sim/stats":           {http.MethodGet, s.handleStats},
		"/sim/reset":           {http.MethodPost, s.handleReset},

		"/v1/responses/{response_id}":        {http.MethodGet, s.handleRetrieveResponse},
		"/v1/responses/{response_id}/cancel": {http.MethodPost, s.handleCancelResponse},
	}
	return s, nil
}

func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x5eed5eed5eed5eed))
}

func (c *counters) reset() {
	*c = counters{finished: map[string]uint64{}, byEndpoint: map[string]uint64{}}
}

// Models returns the served model names, the first being the canonical one.
func (s *Server) Models() []string { return slices.Clone(s.opts.Models) }

// Cache returns the server's prefix cache.
func (s *Server) Cache() *Cache { return s.cache }

// ServeHTTP routes a request to its endpoint. Unknown paths get 404 and
// wrong methods 405, as OpenAI-style JSON errors.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt, ok := s.lookup(r)
	switch {
	case !ok:
		writeOpenAIError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("no route for %s", r.URL.Path))
	case r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead):
		w.Header().Set("Allow", rt.method)
		writeOpenAIError(w, http.StatusMethodNotAllowed, "MethodNotAllowedError", fmt.Sprintf("method %s not allowed", r.Method))
	default:
		rt.handler(w, r)
	}
}

// lookup returns the route of r's path: its entry in the routes table, or
// the pattern that matches it, whose parameters it sets as r's path values.
func (s *Server) lookup(r *http.Request) (route, bool) {
	path := r.URL.Path
	// A pattern's own text is a path like any other: "{response_id}" is an id.
	if rt, ok := s.routes[path]; ok && !strings.Contains(path, "{") {
		return rt, true
	}
	segs := strings.Split(path, "/")
	for pattern, rt := range s.routes {
		if !strings.Contains(pattern, "{") {
			continue
		}
		if params, ok := matchPattern(strings.Split(pattern, "/"), segs); ok {
			for i := 0; i < len(params); i += 2 {
				r.SetPathValue(params[i], params[i+1])
			}
			return rt, true
		}
	}
	return route{}, false
}

// matchPattern matches a path's segments against a pattern's, and returns
// the parameters as name, value pairs.
func matchPattern(pattern, segs []string) (params []string, ok bool) {
	if len(pattern) != len(segs) {
		return nil, false
	}
	for i, p := range pattern {
		name, isParam := strings.CutPrefix(p, "{")
		switch {
		case isParam && segs[i] != "":
			params = append(params, strings.TrimSuffix(name, "}"), segs[i])
		case isParam || p != segs[i]:
			return nil, false
		}
	}
	return params, true
}

// Stats is a snapshot of a [Server]'s counters and gauges, as served by
// GET /sim/stats.
type Stats struct {
	// Requests counts inference requests that passed validation (chat,
	// completions, messages, responses, embeddings, rerank, score),
	// failures included.
	Requests uint64 `json:"requests"`
	// ByEndpoint splits Requests by path.
	ByEndpoint map[string]uint64 `json:"by_endpoint"`
	// Failures counts requests answered 503 by the fail rate.
	Failures uint64 `json:"failures"`
	// Completed counts generations that ran to their end.
	Completed uint64 `json:"completed"`
	// Cancelled counts generations stopped before their end: by the client
	// going away, or, for a background response, by its cancel or by Reset.
	Cancelled uint64 `json:"cancelled"`
	// PromptTokens counts the prompt tokens of admitted requests.
	PromptTokens uint64 `json:"prompt_tokens"`
	// CachedPromptTokens counts the prompt tokens served from the prefix
	// cache.
	CachedPromptTokens uint64 `json:"cached_prompt_tokens"`
	// GenerationTokens counts output tokens produced.
	GenerationTokens uint64 `json:"generation_tokens"`
	// Evictions counts prefix-cache blocks evicted to make room.
	Evictions uint64 `json:"evictions"`
	// BlocksResident is the number of blocks in the prefix cache.
	BlocksResident int `json:"blocks_resident"`
	// BlocksInUse is the number of resident blocks held by running requests.
	BlocksInUse int `json:"blocks_in_use"`
	// CapacityBlocks is the prefix cache's capacity.
	CapacityBlocks int `json:"capacity_blocks"`
	// BlockSize is the prefix cache's tokens per block.
	BlockSize int `json:"block_size"`
	// Running is the number of requests being prefilled or decoded.
	Running int64 `json:"running"`
	// Waiting is the number of requests queued behind MaxNumSeqs.
	Waiting int64 `json:"waiting"`
}

// Stats returns a snapshot of the server's counters and gauges.
func (s *Server) Stats() Stats {
	cs := s.cache.Stats()
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{
		Requests:           s.stats.requests,
		ByEndpoint:         maps.Clone(s.stats.byEndpoint),
		Failures:           s.stats.failures,
		Completed:          s.stats.completed,
		Cancelled:          s.stats.cancelled,
		PromptTokens:       s.stats.promptTokens,
		CachedPromptTokens: s.stats.cachedTokens,
		GenerationTokens:   s.stats.genTokens,
		Evictions:          cs.Evictions,
		BlocksResident:     cs.Resident,
		BlocksInUse:        cs.Pinned,
		CapacityBlocks:     s.cache.Capacity(),
		BlockSize:          s.cache.BlockSize(),
		Running:            s.running.Load(),
		Waiting:            s.waiting.Load(),
	}
}

// Reset zeroes the counters, restarts the fail-rate draws from the seed,
// forgets stored responses and clears the prefix cache (reporting AllBlocksCleared to the listener). The
// running and waiting gauges describe live requests and are kept.
//
// The generations of background responses are stopped first, and Reset
// waits for them to end: their responses are forgotten, so nothing could
// retrieve or cancel them any more, and a generation that ran on would
// store its response again.
func (s *Server) Reset() {
	s.stopBackground()
	s.mu.Lock()
	s.stats.reset()
	s.rng = newRand(s.opts.Seed)
	s.responses, s.responseOrder = nil, nil
	s.mu.Unlock()
	s.cache.Clear()
	s.cache.ResetStats()
}

// accept counts a validated inference request and draws whether the fail
// rate rejects it.
func (s *Server) accept(endpoint string) (fail bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.requests++
	s.stats.byEndpoint[endpoint]++
	if s.opts.FailRate > 0 && s.rng.Float64() < s.opts.FailRate {
		s.stats.failures++
		return true
	}
	return false
}

// servedModel resolves a request's model field: empty means the canonical
// name, as vLLM allows.
func (s *Server) servedModel(name string) (string, bool) {
	if name == "" {
		return s.opts.Models[0], true
	}
	return name, slices.Contains(s.opts.Models, name)
}

// handleHealth answers GET /health (and /ping): 200 with an empty body.
func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleVersion(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": "vllmsim"})
}

func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Stats())
}

func (s *Server) handleReset(w http.ResponseWriter, _ *http.Request) {
	s.Reset()
	s.logger.Info("reset")
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// writeJSON writes v as a JSON response with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// readBody reads a request body of at most Options.MaxBodyBytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, errorf(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", s.opts.MaxBodyBytes)
		}
		return nil, errorf(http.StatusBadRequest, "read request body: %v", err)
	}
	return body, nil
}
