package vllmsim_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"rolter.dev/tests/vllmsim"
)

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opts vllmsim.Options
		want string // substring of the error
	}{
		{name: "error: fail rate above 1", opts: vllmsim.Options{FailRate: 1.5}, want: "fail_rate"},
		{name: "error: negative block size", opts: vllmsim.Options{BlockSize: -1}, want: "block_size"},
		{name: "error: negative ttft", opts: vllmsim.Options{TTFT: -time.Second}, want: "ttft"},
		{name: "error: negative max num seqs", opts: vllmsim.Options{MaxNumSeqs: -2}, want: "max_num_seqs"},
		{name: "error: negative max logprobs", opts: vllmsim.Options{MaxLogprobs: -1}, want: "max_logprobs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := vllmsim.New(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	okChat := chatBody("sim-model", "hi", "")
	tests := []struct {
		name       string
		opts       vllmsim.Options
		method     string
		path       string
		body       string
		wantStatus int
		wantType   string // error.type
		anthropic  bool   // Anthropic error dialect
	}{
		{name: "bad JSON: chat", path: "/v1/chat/completions", body: `{"messages":`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "bad JSON: completions", path: "/v1/completions", body: `nope`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "bad JSON: responses", path: "/v1/responses", body: `[1]`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "bad JSON: embeddings", path: "/v1/embeddings", body: `{`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "bad JSON: tokenize", path: "/tokenize", body: `{`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "bad JSON: messages, Anthropic dialect", path: "/v1/messages", body: `{`, wantStatus: 400, wantType: "invalid_request_error", anthropic: true},
		{name: "unknown model: chat", path: "/v1/chat/completions", body: chatBody("gpt-x", "hi", ""), wantStatus: 404, wantType: "NotFoundError"},
		{name: "unknown model: completions", path: "/v1/completions", body: `{"model":"gpt-x","prompt":"hi"}`, wantStatus: 404, wantType: "NotFoundError"},
		{name: "unknown model: responses", path: "/v1/responses", body: `{"model":"gpt-x","input":"hi"}`, wantStatus: 404, wantType: "NotFoundError"},
		{name: "unknown model: embeddings", path: "/v1/embeddings", body: `{"model":"gpt-x","input":"hi"}`, wantStatus: 404, wantType: "NotFoundError"},
		{name: "unknown model: tokenize", path: "/tokenize", body: `{"model":"gpt-x","prompt":"hi"}`, wantStatus: 404, wantType: "NotFoundError"},
		{name: "unknown model: messages", path: "/v1/messages", body: `{"model":"gpt-x","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, wantStatus: 404, wantType: "not_found_error", anthropic: true},
		{name: "fail rate 1: chat", opts: vllmsim.Options{FailRate: 1}, path: "/v1/chat/completions", body: okChat, wantStatus: 503, wantType: "ServiceUnavailableError"},
		{name: "fail rate 1: completions", opts: vllmsim.Options{FailRate: 1}, path: "/v1/completions", body: `{"prompt":"hi"}`, wantStatus: 503, wantType: "ServiceUnavailableError"},
		{name: "fail rate 1: responses", opts: vllmsim.Options{FailRate: 1}, path: "/v1/responses", body: `{"input":"hi"}`, wantStatus: 503, wantType: "ServiceUnavailableError"},
		{name: "fail rate 1: embeddings", opts: vllmsim.Options{FailRate: 1}, path: "/v1/embeddings", body: `{"input":"hi"}`, wantStatus: 503, wantType: "ServiceUnavailableError"},
		{name: "fail rate 1: messages", opts: vllmsim.Options{FailRate: 1}, path: "/v1/messages", body: `{"messages":[{"role":"user","content":"hi"}]}`, wantStatus: 503, wantType: "overloaded_error", anthropic: true},
		{name: "empty messages", path: "/v1/chat/completions", body: `{"messages":[]}`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "message without role", path: "/v1/chat/completions", body: `{"messages":[{"content":"hi"}]}`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "content of the wrong type", path: "/v1/chat/completions", body: `{"messages":[{"role":"user","content":42}]}`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "max_tokens 0", path: "/v1/chat/completions", body: chatBody("", "hi", `"max_tokens":0`), wantStatus: 400, wantType: "BadRequestError"},
		{name: "max_tokens not a number", path: "/v1/chat/completions", body: chatBody("", "hi", `"max_tokens":"many"`), wantStatus: 400, wantType: "BadRequestError"},
		{name: "prompt beyond max model len", opts: vllmsim.Options{MaxModelLen: 8}, path: "/v1/chat/completions", body: chatBody("", "one two three four five", ""), wantStatus: 400, wantType: "BadRequestError"},
		{name: "output beyond max model len", opts: vllmsim.Options{MaxModelLen: 20}, path: "/v1/completions", body: `{"prompt":"hi","max_tokens":20}`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "empty prompt array", path: "/v1/completions", body: `{"prompt":[]}`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "missing prompt", path: "/v1/completions", body: `{}`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "negative token id", path: "/v1/completions", body: `{"prompt":[1,-2]}`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "unknown encoding format", path: "/v1/embeddings", body: `{"input":"x","encoding_format":"int8"}`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "tokenize needs a prompt or messages", path: "/tokenize", body: `{}`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "body too large", opts: vllmsim.Options{MaxBodyBytes: 64}, path: "/v1/chat/completions", body: chatBody("", strings.Repeat("word ", 40), ""), wantStatus: 413, wantType: "RequestEntityTooLargeError"},
		{name: "wrong method", method: http.MethodGet, path: "/v1/chat/completions", wantStatus: 405, wantType: "MethodNotAllowedError"},
		{name: "unknown path", method: http.MethodGet, path: "/v2/nothing", wantStatus: 404, wantType: "NotFoundError"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := errorCase(t, tc.opts, tc.method, tc.path, tc.body, tc.wantStatus)
			if tc.anthropic {
				e := decode[struct {
					Type  string `json:"type"`
					Error struct {
						Type    string `json:"type"`
						Message string `json:"message"`
					} `json:"error"`
				}](t, b)
				if e.Type != "error" || e.Error.Type != tc.wantType || e.Error.Message == "" {
					t.Errorf("error body = %s, want Anthropic type %s", b, tc.wantType)
				}
				return
			}
			e := decode[struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}](t, b)
			if e.Error.Type != tc.wantType || e.Error.Code != tc.wantStatus || e.Error.Message == "" {
				t.Errorf("error body = %s, want type %s code %d", b, tc.wantType, tc.wantStatus)
			}
		})
	}
}

func TestFailRateIsSeeded(t *testing.T) {
	statuses := func(ts *httptest.Server) []int {
		var out []int
		for range 24 {
			status, _ := do(t, ts, http.MethodPost, "/v1/completions", `{"prompt":"hi","max_tokens":1}`)
			out = append(out, status)
		}
		return out
	}
	opts := vllmsim.Options{FailRate: 0.5, Seed: 42}
	simA, a := newServer(t, opts)
	_, b := newServer(t, opts)
	first := statuses(a)
	if !slices.Contains(first, 200) || !slices.Contains(first, 503) {
		t.Fatalf("fail rate 0.5 gave %v", first)
	}
	if second := statuses(b); !slices.Equal(first, second) {
		t.Errorf("same seed, different draws:\n%v\n%v", first, second)
	}
	simA.Reset()
	if again := statuses(a); !slices.Equal(first, again) {
		t.Errorf("Reset does not restart the draws:\n%v\n%v", first, again)
	}
	failed := 0
	for _, st := range first {
		if st == http.StatusServiceUnavailable {
			failed++
		}
	}
	if st := simA.Stats(); st.Failures != uint64(failed) || st.Requests != 24 {
		t.Errorf("stats = %+v, want %d failures out of 24", st, failed)
	}
}

// TestCachedTokensAcrossDialects sends a long shared system prompt through
// every generation endpoint: the first request computes it, every later one
// reads it from the cache, whatever its dialect, because all dialects share
// one chat template.
func TestCachedTokensAcrossDialects(t *testing.T) {
	system := strings.Repeat("you are a careful assistant that answers in one line ", 4)
	type dialect struct {
		name   string
		path   string
		body   func(user string) string
		cached func(t *testing.T, b []byte) (cached, prompt int)
	}
	chatCached := func(t *testing.T, b []byte) (int, int) {
		r := decode[chatResponse](t, b)
		return r.Usage.PromptTokensDetails.CachedTokens, r.Usage.PromptTokens
	}
	dialects := []dialect{
		{
			name: "chat",
			path: "/v1/chat/completions",
			body: func(user string) string {
				return mustJSON(t, map[string]any{"max_tokens": 2, "messages": []map[string]string{
					{"role": "system", "content": system}, {"role": "user", "content": user}}})
			},
			cached: chatCached,
		},
		{
			name: "messages",
			path: "/v1/messages",
			body: func(user string) string {
				return mustJSON(t, map[string]any{"max_tokens": 2, "system": system,
					"messages": []map[string]string{{"role": "user", "content": user}}})
			},
			cached: func(t *testing.T, b []byte) (int, int) {
				r := decode[anthropicResponse](t, b)
				return r.Usage.CacheReadInputTokens, r.Usage.InputTokens + r.Usage.CacheReadInputTokens
			},
		},
		{
			name: "responses",
			path: "/v1/responses",
			body: func(user string) string {
				return mustJSON(t, map[string]any{"max_output_tokens": 2, "instructions": system, "input": user})
			},
			cached: func(t *testing.T, b []byte) (int, int) {
				r := decode[responseObject](t, b)
				return r.Usage.InputTokensDetails.CachedTokens, r.Usage.InputTokens
			},
		},
		{
			name: "completions",
			path: "/v1/completions",
			body: func(user string) string {
				return mustJSON(t, map[string]any{"max_tokens": 2, "prompt": vllmsim.ChatPrompt([]vllmsim.Message{
					{Role: "system", Content: system}, {Role: "user", Content: user}})})
			},
			cached: func(t *testing.T, b []byte) (int, int) {
				r := decode[completionResponse](t, b)
				return r.Usage.PromptTokensDetails.CachedTokens, r.Usage.PromptTokens
			},
		},
	}
	const blockSize = 8
	sim, ts := newServer(t, vllmsim.Options{BlockSize: blockSize})
	var seen [][]uint32
	var wantPrompt, wantCached uint64
	for i, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			user := "question number " + strings.Repeat("x", i+1)
			tokens := promptTokens(vllmsim.Message{Role: "system", Content: system}, vllmsim.Message{Role: "user", Content: user})
			want := expectedCached(tokens, seen, blockSize)
			seen = append(seen, tokens)
			sysTurn := vllmsim.Tokenize(vllmsim.RenderChat([]vllmsim.Message{{Role: "system", Content: system}}, false))
			if i > 0 && want < len(sysTurn)/blockSize*blockSize {
				t.Fatalf("test setup: the shared system prompt should be cached, want only %d", want)
			}
			cached, prompt := d.cached(t, post(t, ts, d.path, d.body(user), http.StatusOK))
			if prompt != len(tokens) {
				t.Errorf("prompt tokens = %d, want %d", prompt, len(tokens))
			}
			if cached != want {
				t.Errorf("cached = %d, want %d", cached, want)
			}
			wantPrompt += uint64(prompt)
			wantCached += uint64(cached)
		})
	}
	st := sim.Stats()
	if st.PromptTokens != wantPrompt || st.CachedPromptTokens != wantCached || st.Requests != uint64(len(dialects)) {
		t.Errorf("stats = %+v, want %d prompt and %d cached tokens", st, wantPrompt, wantCached)
	}
	for _, d := range dialects {
		if st.ByEndpoint[d.path] != 1 {
			t.Errorf("by_endpoint = %v", st.ByEndpoint)
		}
	}
}

// expectedCached is the number of cached tokens vLLM reports for tokens
// after the prompts in seen were cached (with no eviction): the longest run
// of leading full blocks some earlier prompt had, never the last token.
func expectedCached(tokens []uint32, seen [][]uint32, blockSize int) int {
	best := 0
	for _, prev := range seen {
		n := 0
		for n < len(prev) && n < len(tokens) && prev[n] == tokens[n] {
			n++
		}
		best = max(best, min(n, len(prev)/blockSize*blockSize))
	}
	return min(best, len(tokens)-1) / blockSize * blockSize
}

func TestCachedTokensGrowWithConversation(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{BlockSize: 4})
	msgs := []map[string]string{{"role": "user", "content": "tell me about prefix caches"}}
	prev := -1
	for turn := range 4 {
		r := decode[chatResponse](t, post(t, ts, "/v1/chat/completions", mustJSON(t, map[string]any{"max_tokens": 6, "messages": msgs}), http.StatusOK))
		cached := r.Usage.PromptTokensDetails.CachedTokens
		if cached <= prev {
			t.Errorf("turn %d: cached %d, not more than the previous turn's %d", turn, cached, prev)
		}
		prev = cached
		msgs = append(msgs,
			map[string]string{"role": "assistant", "content": r.Choices[0].Message.Content},
			map[string]string{"role": "user", "content": "go on"})
	}
}

func TestEvictionsWhenCacheIsSmall(t *testing.T) {
	m := &mirror{t: t, blockSize: 4, blocks: map[uint64]bool{}}
	sim, ts := newServer(t, vllmsim.Options{BlockSize: 4, CapacityBlocks: 6, Listener: m})
	for i := range 6 {
		post(t, ts, "/v1/completions", mustJSON(t, map[string]any{
			"max_tokens": 1, "prompt": strings.Repeat("topic"+strings.Repeat("z", i)+" ", 12)}), http.StatusOK)
	}
	st := stats(t, ts)
	if st.Evictions == 0 || st.BlocksResident != 6 || st.CapacityBlocks != 6 || st.BlockSize != 4 {
		t.Errorf("stats = %+v, want evictions and a full cache", st)
	}
	if uint64(m.removed) != st.Evictions {
		t.Errorf("listener saw %d removals, stats say %d evictions", m.removed, st.Evictions)
	}
	m.check(sim.Cache())
}

func TestResetClearsCountersAndCache(t *testing.T) {
	var mu sync.Mutex
	var kinds []vllmsim.KVEventKind
	listener := vllmsim.ListenerFunc(func(b []vllmsim.KVEvent) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range b {
			kinds = append(kinds, e.Kind)
		}
	})
	_, ts := newServer(t, vllmsim.Options{BlockSize: 4, Listener: listener})
	body := chatBody("", strings.Repeat("same prompt again ", 4), `"max_tokens":2`)
	post(t, ts, "/v1/chat/completions", body, http.StatusOK)
	r := decode[chatResponse](t, post(t, ts, "/v1/chat/completions", body, http.StatusOK))
	if r.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("repeat hit nothing")
	}
	if st := stats(t, ts); st.Requests != 2 || st.Completed != 2 || st.GenerationTokens != 4 || st.BlocksResident == 0 {
		t.Fatalf("stats before reset = %+v", st)
	}
	post(t, ts, "/sim/reset", "", http.StatusOK)
	st := stats(t, ts)
	if st.Requests != 0 || st.PromptTokens != 0 || st.CachedPromptTokens != 0 || st.Completed != 0 || st.BlocksResident != 0 || st.Evictions != 0 {
		t.Errorf("stats after reset = %+v", st)
	}
	mu.Lock()
	if kinds[len(kinds)-1] != vllmsim.AllBlocksCleared {
		t.Errorf("reset did not report AllBlocksCleared: %v", kinds)
	}
	mu.Unlock()
	r = decode[chatResponse](t, post(t, ts, "/v1/chat/completions", body, http.StatusOK))
	if r.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("after reset cached = %d, want 0", r.Usage.PromptTokensDetails.CachedTokens)
	}
}

func TestCacheOutputCachesAnswerBlocks(t *testing.T) {
	tests := []struct {
		name        string
		cacheOutput bool
	}{
		{name: "output not cached by default", cacheOutput: false},
		{name: "output cached with CacheOutput", cacheOutput: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{BlockSize: 4, CacheOutput: tc.cacheOutput})
			prompt := vllmsim.ChatPrompt([]vllmsim.Message{{Role: "user", Content: "hi"}})
			r := decode[completionResponse](t, post(t, ts, "/v1/completions", mustJSON(t, map[string]any{"prompt": prompt, "max_tokens": 12}), http.StatusOK))
			// The next request continues the previous answer.
			next := decode[completionResponse](t, post(t, ts, "/v1/completions",
				mustJSON(t, map[string]any{"prompt": prompt + r.Choices[0].Text + " more", "max_tokens": 1}), http.StatusOK))
			promptOnly := len(vllmsim.Tokenize(prompt)) / 4 * 4
			got := next.Usage.PromptTokensDetails.CachedTokens
			if tc.cacheOutput && got <= promptOnly {
				t.Errorf("cached = %d, want more than the prompt's %d", got, promptOnly)
			}
			if !tc.cacheOutput && got != promptOnly {
				t.Errorf("cached = %d, want the prompt's %d", got, promptOnly)
			}
		})
	}
}

func TestHealthAndVersion(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	for _, path := range []string{"/health", "/ping"} {
		status, b := do(t, ts, http.MethodGet, path, "")
		if status != http.StatusOK || len(b) != 0 {
			t.Errorf("GET %s = %d %q, want 200 and an empty body", path, status, b)
		}
	}
	if status, _ := do(t, ts, http.MethodGet, "/version", ""); status != http.StatusOK {
		t.Errorf("GET /version = %d", status)
	}
}

func TestMetrics(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{Models: []string{`odd"name`}, BlockSize: 4})
	body := mustJSON(t, map[string]any{"model": `odd"name`, "max_tokens": 3, "prompt": "the same prompt for metrics"})
	post(t, ts, "/v1/completions", body, http.StatusOK)
	post(t, ts, "/v1/completions", body, http.StatusOK)
	st := stats(t, ts)

	status, b := do(t, ts, http.MethodGet, "/metrics", "")
	if status != http.StatusOK {
		t.Fatalf("GET /metrics = %d", status)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("parse exposition: %v\n%s", err, b)
	}
	value := func(name string) float64 {
		f, ok := families[name]
		if !ok || len(f.GetMetric()) == 0 {
			t.Errorf("metric %s missing", name)
			return -1
		}
		m := f.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["model_name"] != `odd"name` {
			t.Errorf("%s model_name = %q", name, labels["model_name"])
		}
		if m.GetCounter() != nil {
			return m.GetCounter().GetValue()
		}
		return m.GetGauge().GetValue()
	}
	tests := []struct {
		name string
		want float64
	}{
		{name: "vllm:num_requests_running", want: 0},
		{name: "vllm:num_requests_waiting", want: 0},
		{name: "vllm:prefix_cache_queries_total", want: float64(st.PromptTokens)},
		{name: "vllm:prefix_cache_hits_total", want: float64(st.CachedPromptTokens)},
		{name: "vllm:prompt_tokens_total", want: float64(st.PromptTokens)},
		{name: "vllm:generation_tokens_total", want: 6},
		{name: "vllm:kv_cache_usage_perc", want: 0},
		{name: "vllmsim_requests_total", want: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := value(tc.name); got != tc.want {
				t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
			}
		})
	}
	if st.CachedPromptTokens == 0 {
		t.Errorf("the repeated prompt hit nothing")
	}
}

// serve runs one request through the handler directly (for synctest
// bubbles, which cannot use real sockets).
func serve(sim *vllmsim.Server, ctx context.Context, path, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, path, strings.NewReader(body))
	sim.ServeHTTP(rec, req)
	return rec
}

// TestLatencyModel checks the simulated time of a request in a synctest
// bubble, where time is virtual: no real sleeping, no flakiness.
func TestLatencyModel(t *testing.T) {
	tests := []struct {
		name   string
		stream bool
	}{
		{name: "non-streaming"},
		{name: "streaming", stream: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sim, err := vllmsim.New(vllmsim.Options{
					TTFT: 100 * time.Millisecond, ITL: 10 * time.Millisecond,
					PrefillTokensPerSecond: 1000, BlockSize: 4,
				})
				if err != nil {
					t.Fatal(err)
				}
				prompt := strings.Repeat("alpha beta gamma delta ", 25) // 100 tokens
				body := mustJSON(t, map[string]any{"prompt": prompt, "max_tokens": 5, "stream": tc.stream})
				for i, uncached := range []int{100, 100 - 96} { // the repeat reads 24 blocks from the cache
					start := time.Now()
					rec := serve(sim, t.Context(), "/v1/completions", body)
					if rec.Code != http.StatusOK {
						t.Fatalf("status %d: %s", rec.Code, rec.Body)
					}
					got := time.Since(start)
					want := 100*time.Millisecond + time.Duration(uncached)*time.Millisecond + 4*10*time.Millisecond
					if got != want {
						t.Errorf("request %d took %v of simulated time, want %v", i, got, want)
					}
				}
			})
		})
	}
}

func TestMaxNumSeqsQueuesRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim, err := vllmsim.New(vllmsim.Options{MaxNumSeqs: 1, ITL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := time.Now()
		for i := range 3 {
			wg.Go(func() {
				rec := serve(sim, t.Context(), "/v1/completions", mustJSON(t, map[string]any{"prompt": "q" + strings.Repeat("x", i), "max_tokens": 3}))
				if rec.Code != http.StatusOK {
					t.Errorf("status %d", rec.Code)
				}
			})
		}
		synctest.Wait()
		if st := sim.Stats(); st.Running != 1 || st.Waiting != 2 {
			t.Errorf("running %d waiting %d, want 1 and 2", st.Running, st.Waiting)
		}
		wg.Wait()
		if got := time.Since(start); got != 6*time.Second {
			t.Errorf("3 requests of 2s each, one at a time, took %v", got)
		}
		if st := sim.Stats(); st.Running != 0 || st.Waiting != 0 || st.Completed != 3 {
			t.Errorf("stats = %+v", st)
		}
	})
}

func TestCancelStopsGeneration(t *testing.T) {
	paths := []struct {
		path string
		body string
	}{
		{"/v1/chat/completions", chatBody("", "hi", `"max_tokens":5`)},
		{"/v1/chat/completions", chatBody("", "hi", `"max_tokens":5,"stream":true`)},
		{"/v1/completions", `{"prompt":"hi","max_tokens":5,"stream":true}`},
		{"/v1/messages", `{"max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{"max_output_tokens":5,"stream":true,"input":"hi"}`},
		{"/v1/responses", `{"max_output_tokens":5,"input":"hi"}`},
	}
	for _, p := range paths {
		t.Run(p.path+" "+p.body, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sim, err := vllmsim.New(vllmsim.Options{ITL: time.Hour, MaxNumSeqs: 1})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(t.Context())
				var wg sync.WaitGroup
				wg.Go(func() { serve(sim, ctx, p.path, p.body) })
				wg.Go(func() { serve(sim, ctx, p.path, p.body) }) // waits for the slot
				synctest.Wait()
				if st := sim.Stats(); st.Running != 1 || st.Waiting != 1 {
					t.Fatalf("before cancel: running %d waiting %d", st.Running, st.Waiting)
				}
				cancel()
				wg.Wait()
				st := sim.Stats()
				if st.Running != 0 || st.Waiting != 0 || st.Cancelled != 2 || st.Completed != 0 || st.BlocksInUse != 0 {
					t.Errorf("after cancel: %+v", st)
				}
			})
		})
	}
}

// TestClientDisconnectStopsGeneration closes a real streaming connection
// mid-stream: the server must notice and free the request's slot.
func TestClientDisconnectStopsGeneration(t *testing.T) {
	sim, ts := newServer(t, vllmsim.Options{ITL: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions",
		strings.NewReader(chatBody("", "hi", `"max_tokens":3,"stream":true`)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n') // the role chunk
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	if st := sim.Stats(); st.Running != 1 {
		t.Fatalf("running = %d during the stream", st.Running)
	}
	cancel()
	resp.Body.Close()
	// Wait (not a speed assertion) for the server to see the disconnect.
	deadline := time.Now().Add(10 * time.Second)
	for sim.Stats().Running != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("generation still running after the client left: %+v", sim.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := sim.Stats(); st.Cancelled != 1 {
		t.Errorf("cancelled = %d, want 1", st.Cancelled)
	}
}
