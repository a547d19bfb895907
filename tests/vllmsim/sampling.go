package vllmsim

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"
)

// This file holds what chat completions and completions ask of their
// choices beyond a length: how many (n), where they stop (stop,
// include_stop_str_in_output, min_tokens, ignore_eos), and how a choice
// ends and streams.

// Limits vLLM puts on the sampling fields.
const (
	// maxNSequences is VLLM_MAX_N_SEQUENCES's default, the largest n.
	maxNSequences = 16384
	// maxStopStrings is VLLM_MAX_STOP_STRINGS's default, the longest stop
	// list (StopParam, vllm/entrypoints/generate/base/protocol.py at
	// 022e555dbb75); OpenAI's own limit is 4 too.
	maxStopStrings = 4
	// completionsDefaultMaxTokens is CompletionRequest.max_tokens's default
	// (vllm/entrypoints/openai/completion/protocol.py at 002032ee2b18).
	completionsDefaultMaxTokens = 16
	// samplingEps is vLLM's _SAMPLING_EPS: a temperature below it is
	// greedy sampling.
	samplingEps = 1e-5
)

// samplingFields are the request fields of chat completions and
// completions that shape their choices, named and defaulted as vLLM's
// ChatCompletionRequest and CompletionRequest name them.
type samplingFields struct {
	N *int `json:"n"`
	// Temperature is read only for vLLM's refusal of n > 1 under greedy
	// sampling; it does not change the output.
	Temperature            *float64        `json:"temperature"`
	Stop                   json.RawMessage `json:"stop"`
	IncludeStopStrInOutput bool            `json:"include_stop_str_in_output"`
	IgnoreEOS              bool            `json:"ignore_eos"`
	MinTokens              int             `json:"min_tokens"`
}

// sampling is what a request asks of its generation beyond the length
// limit, validated by prepare with vLLM's SamplingParams checks.
type sampling struct {
	n           int      // choices, at least 1
	temperature *float64 // nil for the model's default (not greedy)
	stop        []string // stop strings, in the request's order
	includeStop bool     // include_stop_str_in_output
	ignoreEOS   bool     // the output runs past the simulated EOS
	minTokens   int      // no EOS and no stop string before this many tokens
	// logprobs is the count of top logprobs asked per token (chat
	// top_logprobs with logprobs true, completions logprobs), -1 for the
	// whole vocabulary, nil for none.
	logprobs *int
	// defaultMax is vLLM's max_tokens for a request that sets none: 0 for
	// the rest of the context window (chat), 16 for completions.
	defaultMax int
}

// oneChoice is the sampling of the dialects that have none of these fields
// (Messages, Responses): one choice, no stop string.
var oneChoice = sampling{n: 1}

// sampling returns the request's sampling, logprobs aside, or vLLM's 400
// for a malformed stop (the request's own validation: a string or a list
// of at most 4).
func (f samplingFields) sampling() (sampling, *apiError) {
	sp := sampling{n: 1, temperature: f.Temperature, includeStop: f.IncludeStopStrInOutput,
		ignoreEOS: f.IgnoreEOS, minTokens: f.MinTokens}
	if f.N != nil {
		sp.n = *f.N
	}
	switch firstByte(f.Stop) {
	case 0, 'n':
	case '"':
		var s string
		if err := json.Unmarshal(f.Stop, &s); err != nil {
			return sampling{}, badParam("body.stop", "stop: %v", err)
		}
		sp.stop = []string{s}
	case '[':
		if err := json.Unmarshal(f.Stop, &sp.stop); err != nil {
			return sampling{}, badParam("body.stop", "stop: %v", err)
		}
		if len(sp.stop) > maxStopStrings {
			return sampling{}, badParam("body.stop", "List should have at most %d items after validation, not %d", maxStopStrings, len(sp.stop))
		}
	default:
		return sampling{}, badParam("body.stop", "stop: must be a string or an array of strings")
	}
	return sp, nil
}

// check applies vLLM's SamplingParams._verify_args and
// _verify_greedy_sampling (vllm/sampling_params.py at 00388f6573cc) and
// the engine's max_logprobs check (SamplingParams._validate_logprobs, same
// file): maxTokens is the request's effective max_tokens.
func (sp sampling) check(maxTokens, maxLogprobs int) *apiError {
	switch {
	case sp.n < 1:
		return errorf(http.StatusBadRequest, "n must be at least 1, got %d.", sp.n)
	case sp.n > maxNSequences:
		return errorf(http.StatusBadRequest, "n must be at most %d, got %d. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable.", maxNSequences, sp.n)
	case sp.minTokens < 0:
		return errorf(http.StatusBadRequest, "min_tokens must be greater than or equal to 0, got %d.", sp.minTokens)
	case sp.minTokens > maxTokens:
		return errorf(http.StatusBadRequest, "min_tokens must be less than or equal to max_tokens=%d, got %d.", maxTokens, sp.minTokens)
	case slices.Contains(sp.stop, ""):
		return errorf(http.StatusBadRequest, "stop cannot contain an empty string.")
	case sp.temperature != nil && *sp.temperature < samplingEps && sp.n > 1:
		return errorf(http.StatusBadRequest, "n must be 1 when using greedy sampling, got %d.", sp.n)
	}
	if sp.logprobs != nil && *sp.logprobs != 0 {
		k := *sp.logprobs
		if k == -1 {
			k = vocabSize
		}
		if k > maxLogprobs {
			return badParam("logprobs", "Requested sample logprobs of %d, which is greater than max allowed: %d (parameter=logprobs, value=%d)", k, maxLogprobs, k)
		}
	}
	return nil
}

// maxGenerated bounds what one request may make vllmsim hold: its choices'
// tokens, each with its top log probabilities. vLLM queues n=16384 long
// outputs as 16384 requests; vllmsim, which holds a request's whole output
// in memory, would take gigabytes, so it refuses such a request (400)
// instead of letting a client's one request stop the replica.
const maxGenerated = 1 << 21

// fits refuses a request whose n choices of outLen tokens (each with its
// top log probabilities) exceed maxGenerated.
func (sp sampling) fits(outLen int) *apiError {
	per := 1
	if sp.logprobs != nil && *sp.logprobs > 0 {
		per += *sp.logprobs
	}
	if sp.n > maxGenerated/per/max(outLen, 1) {
		return errorf(http.StatusBadRequest, "vllmsim holds a request's output in memory and generates at most %d tokens per request, log probabilities counted: n=%d choices of %d tokens (%d per token) ask for more", maxGenerated, sp.n, outLen, per)
	}
	return nil
}

// eos is where the simulated model ends an output by itself (finish reason
// "stop"): after Options.MaxTokensDefault tokens, but never before
// min_tokens, which forbids EOS until then.
func (sp sampling) eos(maxTokensDefault int) int {
	return max(maxTokensDefault, sp.minTokens)
}

// sequence is one choice of a generation: the tokens it produces and the
// text they leave once a stop string has cut it.
type sequence struct {
	index  int
	pieces []string // one per token it produces, as the engine decodes them
	text   string   // its final text
	finish string   // finish_reason: "length" or "stop"
	stop   *string  // stop_reason: the stop string that ended it, or nil
	// hold is the bytes of text held back while streaming, so that no
	// part of a stop string is sent before the string is complete.
	hold    int
	emitted int // tokens produced so far
	cum     int // bytes of pieces[:emitted]
	sent    int // bytes of text streamed so far
}

// newSequence ends choice index's pieces where its stop strings stop it;
// length says whether the pieces run to a limit rather than to the
// simulated EOS.
func newSequence(index int, pieces []string, length bool, sp sampling) *sequence {
	q := &sequence{index: index, pieces: pieces, finish: "stop"}
	if length {
		q.finish = "length"
	}
	if n, text, stop := stopAt(pieces, sp.stop, sp.minTokens, sp.includeStop); stop != nil {
		q.pieces, q.text, q.finish, q.stop = pieces[:n], text, "stop", stop
	} else {
		q.text = text
	}
	if len(sp.stop) > 0 && !sp.includeStop {
		// BaseIncrementalDetokenizer.stop_buffer_length: the longest
		// stop string less one character (the output is ASCII, so
		// characters are bytes).
		for _, s := range sp.stop {
			q.hold = max(q.hold, utf8.RuneCountInString(s)-1)
		}
	}
	return q
}

// stopAt finds where stop strings end an output, as vLLM's detokenizer
// does after each token (BaseIncrementalDetokenizer.update and
// check_stop_strings, vllm/v1/engine/detokenizer.py at e372329d90d7):
// after a token, a stop string is looked for in the text that token
// completes (from len(stop)-1 bytes before it), not before min_tokens
// tokens (tests/detokenizer/test_min_tokens.py at 11af6a587700); of
// several, the one that completes first, then the first listed, wins, as
// check_stop_strings picks it in vLLM versions newer than that commit
// (e372329d90d7's takes the first listed). It returns the tokens
// produced, the text they leave (cut before the stop string, or after it
// with includeStop) and the stop string, nil when none matched.
func stopAt(pieces, stops []string, minTokens int, includeStop bool) (int, string, *string) {
	var b strings.Builder
	for k, piece := range pieces {
		from := b.Len()
		b.WriteString(piece)
		if k+1 <= minTokens || len(stops) == 0 {
			continue
		}
		text := b.String()
		best, bestAt, bestEnd := -1, 0, 0
		for i, s := range stops {
			start := max(from+1-len(s), 0)
			at := strings.Index(text[start:], s)
			if at < 0 {
				continue
			}
			at += start
			if end := at + len(s); best < 0 || end < bestEnd {
				best, bestAt, bestEnd = i, at, end
			}
		}
		if best < 0 {
			continue
		}
		cut := bestAt
		if includeStop {
			cut = bestEnd
		}
		return k + 1, text[:cut], &stops[best]
	}
	return len(pieces), b.String(), nil
}

// advance produces the sequence's next token; false when it is complete.
func (q *sequence) advance() bool {
	if q.done() {
		return false
	}
	q.cum += len(q.pieces[q.emitted])
	q.emitted++
	return true
}

// done reports whether the sequence has produced all its tokens.
func (q *sequence) done() bool { return q.emitted == len(q.pieces) }

// delta returns the text to stream after the latest token: what is new,
// less the bytes held back for stop strings until the sequence is done
// (BaseIncrementalDetokenizer.get_next_output_text). It may be empty.
func (q *sequence) delta() string {
	end := len(q.text)
	if !q.done() {
		end = min(end, q.cum-q.hold)
	}
	if end <= q.sent {
		return ""
	}
	d := q.text[q.sent:end]
	q.sent = end
	return d
}

// sofar is the text of the tokens produced so far, cut by its stop string
// once the sequence is done.
func (q *sequence) sofar() string {
	if q.done() {
		return q.text
	}
	return strings.Join(q.pieces[:q.emitted], "")
}
