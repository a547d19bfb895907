// Package tokenize obtains a request's prompt token ids from the engine
// itself, for precise routing of clients that do not send them (every
// OpenAI or Anthropic SDK): it turns a chat, completions, Responses or
// Anthropic Messages body into vLLM's POST /tokenize request, asks one
// replica, decodes the answer, and caches it.
//
// # Exactly as the engine computes them
//
// vLLM's /tokenize (vllm/entrypoints/serve/tokenize/protocol.py) takes the
// two forms of its TokenizeRequest union: TokenizeCompletionRequest
// {"model","prompt","add_special_tokens"} and TokenizeChatRequest
// {"model","messages",...} with the chat template's inputs. A chat
// completion renders its prompt from the same inputs with the same
// defaults (add_generation_prompt true, continue_final_message false,
// add_special_tokens false), so [Build] copies exactly those fields from
// the client's body: messages, tools, chat_template, chat_template_kwargs,
// add_generation_prompt, continue_final_message, add_special_tokens, with
// the request's documents and reasoning_effort (and the enable_thinking it
// implies) added to chat_template_kwargs, where the chat completion puts
// them and the chat form has no field for them ([templateKwargs]). A
// completions body with a string prompt becomes the prompt form; one whose
// prompt already is token ids needs no call.
//
// vLLM renders a Responses request by converting it to chat messages and
// applying the chat template as for a chat completion (responses.go cites
// the source), so [Build] converts the subset it can reproduce exactly to
// the chat form: non-empty instructions become a leading system message, a
// string input a user message, and message items of role user, system or
// developer (string or input_text content) or assistant (a string or one
// output_text part, which vLLM reduces to its text) become those messages,
// every text copied as the client wrote it; with add_generation_prompt and
// add_special_tokens true, as the cited Responses code renders and
// tokenizes, and reasoning.effort as the template's reasoning_effort. Not
// tokenized: previous_response_id or any other stored state, any other
// item (function calls and their outputs, reasoning), images, files,
// tools, truncation "auto", a partial (in_progress, incomplete) message,
// which vLLM continues instead of answering.
//
// vLLM serves the Anthropic Messages API by converting each request to a
// chat completion (messages.go cites the source), so [Build] makes the
// same chat messages and tools: the system texts joined as one system
// message (less Claude Code's per-request billing header), text blocks as
// text parts, thinking as reasoning, tool uses as tool calls whose
// arguments Python's json.dumps prints, a user's tool results as tool
// messages before it, output_config.effort as a chat completion's
// reasoning_effort. Not tokenized: images, documents, tool references, a
// tool input with a non-integer number.
//
// Anything [Build] cannot reproduce faithfully (another endpoint, non-text
// message content that the engine would fetch and process, batched
// prompts, the Responses and Messages requests above) is not tokenized:
// the request routes on the approximate index. So is a request with a
// cache_salt, whose cached blocks no token ids identify ([CacheSalt]).
//
// # Bounded and cached
//
// A call is bounded by its context (the provider's
// kv_events.tokenize_timeout_ms); the caller degrades to the approximate
// index on any failure. Answers are cached by the 128-bit xxh3 digest of
// the /tokenize body, which holds the target model and exactly what is
// tokenized, so equal bodies get equal ids; the cache holds at most
// [CacheTokens] token ids, least recently used first out. An answer with
// no token ids is an error ([ErrNoTokens]) and is never cached: each entry
// holds at least one id, so no entry escapes the bound.
package tokenize

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
)

// Endpoint paths Build reads.
const (
	PathChatCompletions = "/v1/chat/completions"
	PathCompletions     = "/v1/completions"
	PathResponses       = "/v1/responses"
	PathMessages        = "/v1/messages"
)

// CacheTokens bounds the cache in units of a token id (4 bytes): 4 Mi, 16
// MiB, a few hundred long prompts or thousands of short ones. Each answer
// is charged its ids' array and entryOverhead for its bookkeeping, so that
// a flood of short answers is bounded in memory too.
const CacheTokens = 4 << 20

// entryOverhead is what an answer's bookkeeping costs besides its ids, in
// token ids (4 bytes): its list element, entry, map slot and slice header,
// about 130 bytes on 64-bit platforms.
const entryOverhead = 32

// MaxResponse bounds a /tokenize answer: 8 bytes a token for vLLM's
// largest context windows, with room to spare.
const MaxResponse = 16 << 20

// chatFields are the chat body's fields that decide the rendered prompt,
// copied verbatim into the /tokenize chat form (its TokenizeChatRequest
// has each, with the chat completion's defaults).
var chatFields = []string{"messages", "tools", "chat_template", "chat_template_kwargs",
	"add_generation_prompt", "continue_final_message", "add_special_tokens"}

// Build returns the /tokenize body for a request sent to path with body,
// for the engine's model name model, and the request's [Shape]. When the
// body's prompt already is token ids, ids holds them and tok is nil. ok is
// false when the request cannot be tokenized faithfully.
func Build(path string, body []byte, model string) (tok []byte, ids []uint32, shape Shape, ok bool) {
	if !json.Valid(body) || objectCount(body, maxObjects) > maxObjects {
		return nil, nil, 0, false
	}
	fields, ok := object(body) // read in place: see rawjson.go
	if !ok || !isNull(fields["cache_salt"]) || !isNull(fields["truncate_prompt_tokens"]) {
		// A salted request's blocks are keyed by its salt too (see
		// CacheSalt), which no token ids express. A request with
		// truncate_prompt_tokens may reach the engine cut to its last or
		// first N tokens (truncation_side, the tokenizer's by default),
		// which /tokenize of the whole prompt does not say: its ids would
		// be proven wrong and cost its endpoint's requests their ids.
		return nil, nil, 0, false
	}
	shape = shapeOf(fields) // before build, which may add template kwargs
	tok, ids, ok = build(path, fields, model)
	return tok, ids, shape, ok
}

// build is Build once the body's top-level fields are read.
func build(path string, fields map[string]json.RawMessage, model string) (tok []byte, ids []uint32, ok bool) {
	switch path {
	case PathChatCompletions:
		if !textOnly(fields["messages"]) {
			return nil, nil, false
		}
		kw, ok := templateKwargs(fields["chat_template_kwargs"], fields["documents"], fields["reasoning_effort"], true)
		if !ok {
			return nil, nil, false
		}
		if kw != nil {
			fields["chat_template_kwargs"] = kw // unchanged when nothing is added
		}
		return encode(model, fields, chatFields), nil, true
	case PathCompletions:
		p := bytes.TrimSpace(fields["prompt"])
		switch {
		case len(p) > 0 && p[0] == '"':
			return encode(model, fields, []string{"prompt", "add_special_tokens"}), nil, true
		case len(p) > 0 && p[0] == '[':
			var ids []uint32
			if err := json.Unmarshal(p, &ids); err == nil && len(ids) > 0 {
				return nil, ids, true
			}
			// A batch of one (LangChain's completions client sends its
			// prompt so) is that one prompt to vLLM; a larger batch is
			// several requests, which no one pick serves alone.
			var batch []json.RawMessage
			if json.Unmarshal(p, &batch) != nil || len(batch) != 1 {
				return nil, nil, false
			}
			one := bytes.TrimSpace(batch[0])
			if len(one) > 0 && one[0] == '"' {
				f := map[string]json.RawMessage{"prompt": one, "add_special_tokens": fields["add_special_tokens"]}
				if f["add_special_tokens"] == nil {
					delete(f, "add_special_tokens")
				}
				return encode(model, f, []string{"prompt", "add_special_tokens"}), nil, true
			}
			if err := json.Unmarshal(one, &ids); err != nil || len(ids) == 0 {
				return nil, nil, false // not token ids
			}
			return nil, ids, true
		}
	case PathMessages:
		if b, ok := messagesBody(model, fields); ok {
			return b, nil, true
		}
	case PathResponses:
		kw, ok := responsesKwargs(fields)
		if !ok {
			return nil, nil, false
		}
		tools, ok := responsesTools(fields["tools"], fields["tool_choice"])
		if !ok {
			return nil, nil, false
		}
		if msgs, ok := responsesMessages(fields); ok {
			// The template inputs of ResponsesRequest.build_chat_params
			// (no partial final message: add_generation_prompt true) and
			// the tokenizer's default add_special_tokens, which
			// ResponsesRequest.build_tok_params leaves at TokenizeParams'
			// True where a chat completion says False.
			m, _ := json.Marshal(model)
			b := append([]byte(`{"model":`), m...)
			b = append(append(b, `,"messages":`...), msgs...)
			if kw != nil {
				b = append(append(b, `,"chat_template_kwargs":`...), kw...)
			}
			if tools != nil {
				b = append(append(b, `,"tools":`...), tools...)
			}
			return append(b, `,"add_generation_prompt":true,"add_special_tokens":true}`...), nil, true
		}
	}
	return nil, nil, false
}

// CacheSalt returns a request body's cache_salt, vLLM's per-request salt
// of its prefix cache, or "" when it has none (or it is not a string, which
// vLLM refuses). vLLM hashes the salt into the prompt's first block (its
// extra_keys), so a salted request reuses only blocks of the same salt:
// its token ids alone would match blocks it cannot reuse, and the
// kvwatcher indexes no block with extra keys. body is a JSON document;
// one without the key costs a byte search.
func CacheSalt(body []byte) string {
	if !bytes.Contains(body, []byte(`"cache_salt"`)) {
		return ""
	}
	fields, ok := object(body)
	if !ok {
		return ""
	}
	s, _ := str(fields["cache_salt"])
	return s
}

// ReadsNoCache reports whether vLLM prefills a request to path with body
// whole, reading nothing from its prefix cache: a request with prompt log
// probabilities, which SamplingParams marks skip_reading_prefix_cache
// (vllm/sampling_params.py at 00388f6573cc; the scheduler then matches no
// cached block, vllm/v1/core/kv_cache_manager.py at 003df2961dd8).
// prompt_logprobs asks for them (a number; null does not); so does echo,
// which takes them from top_logprobs in a chat completion (0 when absent)
// and from logprobs in a completion (none when absent or null):
// ChatCompletionRequest.to_sampling_params and
// CompletionRequest.to_sampling_params (chat_completion/protocol.py and
// completion/protocol.py at 002032ee2b18). Evaluation harnesses score
// prompts so (echo and logprobs with max_tokens 0). body is a JSON
// document; one with neither key costs two byte searches.
func ReadsNoCache(path string, body []byte) bool {
	if path != PathChatCompletions && path != PathCompletions {
		return false
	}
	if !bytes.Contains(body, []byte(`"prompt_logprobs"`)) && !bytes.Contains(body, []byte(`"echo"`)) {
		return false
	}
	fields, ok := object(body)
	if !ok {
		return false
	}
	if !isNull(fields["prompt_logprobs"]) {
		return true
	}
	if string(bytes.TrimSpace(fields["echo"])) != "true" {
		return false
	}
	if path == PathChatCompletions {
		top, set := fields["top_logprobs"]
		return !set || !isNull(top)
	}
	return !isNull(fields["logprobs"])
}

// templateKwargs returns the chat template's keyword arguments a request
// renders with, for the /tokenize chat form, which has no fields for the
// last three: the client's chat_template_kwargs (an object or null) with
// documents and reasoning_effort added unless null, and enable_thinking
// (reasoning_effort other than "none") unless the client's set it, when
// thinking is true. ChatCompletionRequest.build_chat_params merges them so
// (vllm/entrypoints/openai/chat_completion/protocol.py at 002032ee2b18, in
// full 002032ee2b18ed1e2fca1d8c1da8d71cbb2cba2d; merge_kwargs in
// vllm/renderers/params.py), and every renderer passes the merged
// arguments to the template: Gemma's and Qwen's read enable_thinking,
// gpt-oss-style ones reasoning_effort. The added members follow the
// client's, so where a key repeats the request's field wins, as in the
// merge (a JSON reader keeps a repeated key's last value). kw is user as
// it is when nothing is added; false when the kwargs are not an object or
// the effort is not a string, which vLLM refuses.
func templateKwargs(user, documents, effort json.RawMessage, thinking bool) (kw json.RawMessage, ok bool) {
	var userKw map[string]json.RawMessage
	if !isNull(user) {
		if userKw, ok = object(user); !ok {
			return nil, false
		}
	}
	if isNull(documents) && isNull(effort) {
		return user, true
	}
	b := []byte{'{'}
	if userKw != nil {
		u := bytes.TrimSpace(user)
		b = append(b[:0], bytes.TrimSpace(u[:len(u)-1])...) // without its closing brace
	}
	add := func(key string, v []byte) {
		if b[len(b)-1] != '{' {
			b = append(b, ',')
		}
		b = append(append(append(append(b, '"'), key...), `":`...), v...)
	}
	if !isNull(documents) {
		add("documents", bytes.TrimSpace(documents))
	}
	if !isNull(effort) {
		e, ok := str(effort)
		if !ok {
			return nil, false
		}
		add("reasoning_effort", bytes.TrimSpace(effort))
		if _, set := userKw["enable_thinking"]; thinking && !set {
			add("enable_thinking", []byte(strconv.FormatBool(e != "none")))
		}
	}
	return append(b, '}'), true
}

// textOnly reports whether messages is a non-empty array of messages whose
// content is a string, null or an array of text parts only.
func textOnly(messages json.RawMessage) bool {
	msgs, ok := objects(messages)
	if !ok || len(msgs) == 0 {
		return false
	}
	for _, m := range msgs {
		c := bytes.TrimSpace(m["content"])
		if len(c) == 0 || c[0] != '[' {
			continue
		}
		parts, ok := objects(c)
		if !ok {
			return false
		}
		for _, p := range parts {
			if typ, _ := str(p["type"]); typ != "text" {
				return false
			}
		}
	}
	return true
}

// encode writes {"model":model, <names present in fields>...}.
func encode(model string, fields map[string]json.RawMessage, names []string) []byte {
	m, _ := json.Marshal(model)
	b := append([]byte(`{"model":`), m...)
	for _, n := range names {
		if v, ok := fields[n]; ok {
			b = append(b, ',', '"')
			b = append(b, n...)
			b = append(b, '"', ':')
			b = append(b, v...)
		}
	}
	return append(b, '}')
}

// ErrResponse is returned for a /tokenize answer that is not vLLM's
// TokenizeResponse.
var ErrResponse = errors.New("tokenize: malformed response")

// ErrNoTokens is returned by [Client.Tokenize] for an answer with no token
// ids. [Build] only asks for a prompt to render (a non-empty conversation,
// or a prompt string), so none is suspect, and it would give routing
// nothing to match: it is an error, and is not cached.
var ErrNoTokens = errors.New("tokenize: the answer has no token ids")

// ErrRejected is the error of a /tokenize the engine refused as a client
// error (4xx: an empty prompt, a conversation its chat template rejects):
// the request itself will be refused the same way, so it says nothing of
// the tokenizer's health.
var ErrRejected = errors.New("tokenize: the engine rejected the request")

// ErrUnavailable is returned when the engine did not answer /tokenize: the
// call failed to connect or broke off, or the answer was a 5xx, 408 or
// 429. Unlike a malformed answer it says the replica may not be serving
// (see Park).
var ErrUnavailable = errors.New("tokenize: the engine did not answer")

// Decode reads vLLM's TokenizeResponse {"count","max_model_len","tokens",
// "token_strs"}: the token ids, which must be unsigned 32-bit integers and
// as many as count says.
func Decode(b []byte) ([]uint32, error) {
	var r struct {
		Count  *int     `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrResponse, err)
	}
	if r.Tokens == nil || r.Count == nil || *r.Count != len(r.Tokens) {
		return nil, fmt.Errorf("%w: tokens missing or not count long", ErrResponse)
	}
	return r.Tokens, nil
}

// Client calls /tokenize and caches the answers. Safe for concurrent use.
type Client struct {
	http  *http.Client
	limit int // the cache's bound, in token ids: CacheTokens

	// parked holds, per /tokenize endpoint, until when it is not asked
	// (see Park).
	parkMu sync.Mutex
	parked map[string]time.Time

	// trust holds each model and endpoint's checks (trust.go).
	trustMu sync.Mutex
	trust   map[trustKey]*verdicts

	mu     sync.Mutex
	lru    list.List // of *entry, most recent first
	byKey  map[xxh3.Uint128]*list.Element
	tokens int // the cached token ids
	charge int // what the bound counts: see CacheTokens
}

type entry struct {
	key xxh3.Uint128
	ids []uint32
}

// New returns a client sending with hc.
func New(hc *http.Client) *Client {
	return &Client{http: hc, limit: CacheTokens, byKey: map[xxh3.Uint128]*list.Element{}, parked: map[string]time.Time{},
		trust: map[trustKey]*verdicts{}}
}

// Park marks base's /tokenize as not to be asked until until (see Parked):
// a call there timed out or was not answered. Asked again at once, a
// frozen or overloaded replica cost each request its whole timeout
// (rolter-outage, a replica frozen for 8 s: about 20 calls timed out;
// docs/operations.md).
func (c *Client) Park(base string, until time.Time) {
	c.parkMu.Lock()
	defer c.parkMu.Unlock()
	if k := Endpoint(base); until.After(c.parked[k]) {
		c.parked[k] = until
	}
}

// Parked reports whether base's /tokenize is parked at now.
func (c *Client) Parked(base string, now time.Time) bool {
	c.parkMu.Lock()
	defer c.parkMu.Unlock()
	k := Endpoint(base)
	until, ok := c.parked[k]
	if ok && !now.Before(until) {
		delete(c.parked, k)
		return false
	}
	return ok
}

// Cached returns the ids cached for the /tokenize body tok.
func (c *Client) Cached(tok []byte) ([]uint32, bool) {
	k := xxh3.Hash128(tok)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[k]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*entry).ids, true
	}
	return nil, false
}

// Tokenize POSTs tok to base's /tokenize (base is the provider's api_base,
// with or without its /v1) with the provider's key, decodes the answer and
// caches it. An answer with no token ids is ErrNoTokens, not cached. The
// returned ids are shared: callers must not modify them.
func (c *Client) Tokenize(ctx context.Context, base, apiKey string, tok []byte) ([]uint32, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, Endpoint(base), bytes.NewReader(tok))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests {
		return nil, fmt.Errorf("%w: status %d", ErrRejected, resp.StatusCode)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: status %d", ErrUnavailable, resp.StatusCode)
	}
	if len(b) > MaxResponse {
		return nil, fmt.Errorf("%w: over %d bytes", ErrResponse, MaxResponse)
	}
	ids, err := Decode(b)
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, ErrNoTokens
	}
	if cap(ids) > len(ids) {
		ids = append(make([]uint32, 0, len(ids)), ids...) // the decoder's spare capacity is not kept
	}
	c.store(xxh3.Hash128(tok), ids)
	return ids, nil
}

// store caches ids under k, charged cost(ids) against the bound. An answer
// with no ids is never stored (Tokenize refuses it first).
func (c *Client) store(k xxh3.Uint128, ids []uint32) {
	if len(ids) == 0 || cost(ids) > c.limit {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[k]; ok {
		return
	}
	c.byKey[k] = c.lru.PushFront(&entry{key: k, ids: ids})
	c.tokens += len(ids)
	c.charge += cost(ids)
	for c.charge > c.limit {
		last := c.lru.Back()
		e := last.Value.(*entry)
		c.lru.Remove(last)
		delete(c.byKey, e.key)
		c.tokens -= len(e.ids)
		c.charge -= cost(e.ids)
	}
}

// cost is what an answer holds in memory, in token ids: the ids' array (its
// capacity: a decoded slice may have grown past its length) and the
// bookkeeping.
func cost(ids []uint32) int { return cap(ids) + entryOverhead }

// Len returns the cached answers and their token ids.
func (c *Client) Len() (entries, tokens int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len(), c.tokens
}

// Endpoint is vLLM's /tokenize URL for a provider's api_base: vLLM serves
// it at its root, beside /v1.
func Endpoint(base string) string {
	for len(base) > 0 && base[len(base)-1] == '/' {
		base = base[:len(base)-1]
	}
	if n := len(base); n >= 3 && base[n-3:] == "/v1" {
		base = base[:n-3]
	}
	return base + "/tokenize"
}
