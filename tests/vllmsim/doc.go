// Package vllmsim simulates a vLLM replica for routing tests and benchmarks:
// an HTTP server that speaks vLLM's OpenAI-compatible API (and the Anthropic
// Messages API that vLLM also serves), with a vLLM-style prefix cache, a
// latency model and failure injection, but no model.
//
// # Overview
//
// [New] returns a [Server], an [http.Handler] that tests run under
// net/http/httptest and that cmd/vllmsim serves. It answers:
//
//   - POST /v1/chat/completions, /v1/completions, /v1/messages,
//     /v1/responses (each streaming or not) and /v1/embeddings;
//   - POST /rerank, /v1/rerank and /v2/rerank (vLLM's Jina/Cohere-style
//     RerankRequest) and /score and /v1/score (ScoreRequest: queries and
//     documents, queries and items, data_1 and data_2, or text_1 and
//     text_2), as a text-only cross-encoder would answer them: a pair's
//     prompt is the query's tokens then the document's, its score is
//     [PairScore] (higher for a document holding more of the query's
//     words), and rerank results come most relevant first, cut at top_n
//     (like embeddings, they skip the prefix cache, the latency model and
//     the MaxNumSeqs queue);
//   - GET /v1/responses/{response_id} and POST
//     /v1/responses/{response_id}/cancel, with responses stored as vLLM
//     stores them under VLLM_ENABLE_RESPONSES_API_STORE=1: in the replica's
//     memory (the last 4096), unless the request says "store": false, under
//     the request's request_id if it sets one; "background": true (without
//     streaming) answers the response queued at once and generates it on
//     the engine like any request, as vLLM does;
//   - GET /v1/models, /health, /ping, /version and /metrics (vLLM's metric
//     names, e.g. vllm:num_requests_running and vllm:prefix_cache_hits_total);
//   - POST /tokenize, as vLLM does;
//   - GET /sim/stats (the [Stats] as JSON) and POST /sim/reset ([Server.Reset]).
//
// Prompts are tokenized by [Tokenize], a pure function of the text, after
// chat turns are rendered by [ChatPrompt]; clients can reproduce the ids and
// the block hashes ([BlockHashes]) a replica computes, and the scores of
// /rerank and /score ([RelevanceScore]). The output text is
// made of words chosen deterministically from the prompt tokens, one token
// per word; its length is the request's max_tokens (finish reason "length")
// or Options.MaxTokensDefault (finish reason "stop"; not before
// min_tokens; with ignore_eos, vLLM's own limit instead, finish reason
// "length").
//
// Chat completions and completions take vLLM's sampling fields: n choices,
// each its own output (the first is the n=1 output), sharing the prompt,
// prefilled once, and decoding in the same engine steps; stop strings (and
// include_stop_str_in_output), which end a choice at their first
// occurrence after min_tokens tokens with finish reason "stop" and the
// string as stop_reason, held back while streaming as vLLM holds them;
// stop_token_ids, which end a choice at the first of them it generates,
// with finish reason "stop" and the token id as stop_reason, the token
// counted but its text left out unless include_stop_str_in_output (before
// min_tokens tokens the model generates other words instead);
// log probabilities (chat logprobs and top_logprobs, completions logprobs,
// up to Options.MaxLogprobs), synthetic and deterministic, the generated
// token always the most likely; prompt_logprobs, the prompt tokens' (null
// for the first), in the chat response or in every completion choice, not
// streamed, a request with them reading nothing from the prefix cache as
// in vLLM; and echo: for completions the prompt before each choice (a
// token-id prompt as far as the tokenizer can name its tokens), for chat
// the last message before each choice when it has the response's role.
// Their values are refused as vLLM refuses them; beyond that, a request
// whose choices' tokens and log probabilities, its prompt's counted as
// many times as the response carries them, would pass 2 M gets 400 (vLLM
// queues it; vllmsim holds a request's output in memory).
//
// The prefix [Cache] holds full blocks of Options.BlockSize tokens, addressed
// by chained hashes, up to Options.CapacityBlocks blocks with LRU eviction.
// A request's cached prompt tokens are those of its longest run of leading
// resident blocks; they are reported as usage.prompt_tokens_details.
// cached_tokens (OpenAI), cache_read_input_tokens (Anthropic) or
// usage.input_tokens_details.cached_tokens (Responses). A request's
// cache_salt (chat, completions, Responses) salts its chain as vLLM hashes
// it into the first block ([SaltedBlockHashes]), so it reuses only blocks
// of its own salt, and the first block's KV event carries the salt in its
// extra keys. Chat templates render a request's reasoning effort,
// documents and chat_template_kwargs as vLLM merges them. A [Listener]
// receives the cache's changes as vLLM-style KV events.
//
// Time to first token is Options.TTFT plus the uncached prompt tokens divided
// by Options.PrefillTokensPerSecond; every further token takes Options.ITL.
// With Options.StepGrowth both grow by it for every other request running
// (steps that slow with the batch, as vLLM's do).
// The server really sleeps, and stops a generation as soon as the client
// goes away.
//
// # Concurrency
//
// [Server] and [Cache] are safe for concurrent use. Each request runs on its
// handler goroutine, except a background response, which runs on a
// goroutine of its own until it ends, is cancelled or [Server.Reset] stops
// it; the server starts no other goroutine. A
// [Listener] is called synchronously under the cache's lock, so it must not
// block.
//
// # Lifecycle
//
// A Server needs no closing. Requests beyond Options.MaxNumSeqs wait in line
// (the waiting gauge) until a running one ends or their client goes away
// (or, for a background response, it is cancelled). [Server.Reset] stops
// the background responses, then clears the counters, the cache and the
// stored responses while other requests may still be running.
//
// Prompts and outputs are never logged.
package vllmsim
