package vllmsim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file holds what chat completions and completions ask of their
// choices beyond a length: how many (n), where they stop (stop,
// stop_token_ids, include_stop_str_in_output, min_tokens, ignore_eos), and
// how a choice ends and streams.

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
	StopTokenIDs           json.RawMessage `json:"stop_token_ids"`
	// PromptLogprobs is read by [samplingFields.promptLogprobsCount].
	PromptLogprobs json.RawMessage `json:"prompt_logprobs"`
}

// sampling is what a request asks of its generation beyond the length
// limit, validated by prepare with vLLM's SamplingParams checks.
type sampling struct {
	n           int      // choices, at least 1
	temperature *float64 // nil for the model's default (not greedy)
	stop        []string // stop strings, in the request's order
	includeStop bool     // include_stop_str_in_output
	ignoreEOS   bool     // the output runs past the simulated EOS
	minTokens   int      // no EOS, stop string or stop token before this many tokens
	// stopTokens are the stop_token_ids of the vocabulary, sorted and
	// unique; badStopTokens the others (negative, or past vocabSize), in
	// the request's order without repeats, which check refuses.
	stopTokens    []uint32
	badStopTokens []int64
	// logprobs is the count of top logprobs asked per token (chat
	// top_logprobs with logprobs true, completions logprobs), -1 for the
	// whole vocabulary, nil for none.
	logprobs *int
	// promptLogprobs is the count asked per prompt token (prompt_logprobs,
	// or what echo makes of the logprobs count), nil for none. A request
	// with them reads nothing from the prefix cache (SamplingParams.
	// skip_reading_prefix_cache, vllm/sampling_params.py at 00388f6573cc).
	promptLogprobs *int
	// promptCopies is how many times the response carries the prompt's
	// log probabilities: once for chat (a field of the response), once a
	// choice for completions, twice with echo and logprobs (the choice's
	// logprobs start with them too).
	promptCopies int
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
	var aerr *apiError
	if sp.stopTokens, sp.badStopTokens, aerr = stopTokenIDs(f.StopTokenIDs); aerr != nil {
		return sampling{}, aerr
	}
	return sp, nil
}

// stopTokenIDs decodes stop_token_ids as pydantic validates list[int] |
// None (each item a lax int: a boolean, an integral number, a numeric
// string) and splits them into the ids of the vocabulary, sorted and
// unique, and the others in order without repeats, as
// SamplingParams.__post_init__ dedupes them before
// _validate_stop_token_ids refuses them (vllm/sampling_params.py at
// 00388f6573cc). Items are decoded one at a time, so a long list costs
// its ids and no more.
func stopTokenIDs(raw json.RawMessage) ([]uint32, []int64, *apiError) {
	if isNull(raw) {
		return nil, nil, nil
	}
	if firstByte(raw) != '[' {
		return nil, nil, pydanticError("stop_token_ids", "Input should be a valid list")
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	_, _ = d.Token() // the '[' of a value decodeJSON has read whole
	var ids []uint32
	var bad []int64
	for i := 0; d.More(); i++ {
		var item json.RawMessage
		if err := d.Decode(&item); err != nil {
			return nil, nil, pydanticError("stop_token_ids", "Input should be a valid list")
		}
		v, _, aerr := intField(item, "stop_token_ids."+strconv.Itoa(i), false)
		if aerr != nil {
			return nil, nil, aerr
		}
		if v < 0 || v >= vocabSize {
			bad = append(bad, v)
			continue
		}
		ids = append(ids, uint32(v))
	}
	slices.Sort(ids)
	return slices.Compact(ids), firstOccurrences(bad), nil
}

// firstOccurrences returns ids without repeats, each where it first
// occurs, with no map: a sorted copy marks what was seen.
func firstOccurrences(ids []int64) []int64 {
	sorted := slices.Compact(slices.Sorted(slices.Values(ids)))
	seen := make([]bool, len(sorted))
	out := ids[:0:0]
	for _, id := range ids {
		if i, _ := slices.BinarySearch(sorted, id); !seen[i] {
			seen[i] = true
			out = append(out, id)
		}
	}
	return out
}

// pyList formats ids as Python prints a list of ints.
func pyList(ids []int64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	b.WriteByte(']')
	return b.String()
}

// promptLogprobsCount decodes prompt_logprobs, nil when absent or null,
// and refuses what check_logprobs refuses (chat_completion/protocol.py and
// completion/protocol.py at 002032ee2b18): a value that is no number, a
// count above 0 (or -1) when streaming, where no chunk has a place for
// them, and a negative count but -1.
func (f samplingFields) promptLogprobsCount(stream bool) (*int, *apiError) {
	k, aerr := logprobsCount(f.PromptLogprobs, "prompt_logprobs")
	switch {
	case aerr != nil || k == nil:
		return nil, aerr
	case stream && (*k > 0 || *k == -1):
		return nil, badParam("prompt_logprobs", "`prompt_logprobs` are not available when `stream=True`.")
	case *k < -1:
		return nil, badParam("prompt_logprobs", "`prompt_logprobs` must be a positive value or -1.")
	}
	return k, nil
}

// check applies vLLM's SamplingParams._verify_args and
// _verify_greedy_sampling (vllm/sampling_params.py at 00388f6573cc) and
// the engine's checks of SamplingParams.verify (same file): the
// max_logprobs limit of the output's and the prompt's logprobs
// (_validate_logprobs), then the vocabulary of stop_token_ids
// (_validate_stop_token_ids). maxTokens is the request's effective
// max_tokens.
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
	if aerr := overMaxLogprobs(sp.logprobs, "sample", "logprobs", maxLogprobs); aerr != nil {
		return aerr
	}
	if aerr := overMaxLogprobs(sp.promptLogprobs, "prompt", "prompt_logprobs", maxLogprobs); aerr != nil {
		return aerr
	}
	if len(sp.badStopTokens) > 0 {
		ids := pyList(sp.badStopTokens)
		return badParam("stop_token_ids", "token_id(s) %s in stop_token_ids contain out-of-vocab token ids. Vocabulary size: %d (parameter=stop_token_ids, value=%s)", ids, vocabSize, ids)
	}
	return nil
}

// overMaxLogprobs refuses a logprobs count (-1 for the whole vocabulary)
// above the server's max_logprobs, as _validate_logprobs does; what names
// the count in the message, param the field.
func overMaxLogprobs(k *int, what, param string, maxLogprobs int) *apiError {
	if k == nil || *k == 0 {
		return nil
	}
	n := *k
	if n == -1 {
		n = vocabSize
	}
	if n <= maxLogprobs {
		return nil
	}
	return badParam(param, "Requested %s logprobs of %d, which is greater than max allowed: %d (parameter=%s, value=%d)", what, n, maxLogprobs, param, n)
}

// maxGenerated bounds what one request may make vllmsim hold: its choices'
// tokens, each with its top log probabilities, and its prompt tokens with
// theirs when it asks for prompt_logprobs. vLLM queues n=16384 long
// outputs as 16384 requests, and keeps prompt log probabilities as compact
// tensors until it writes them; vllmsim, which holds a request's whole
// response in memory, would take gigabytes (a completion repeats the
// prompt's log probabilities in each of its n choices), so it refuses such
// a request (400) instead of letting a client's one request stop the
// replica.
const maxGenerated = 1 << 21

// fits refuses a request whose n choices of outLen tokens (each with its
// top log probabilities), with its promptLen prompt tokens and theirs as
// many times as the response carries them, exceed maxGenerated.
func (sp sampling) fits(outLen, promptLen int) *apiError {
	per := 1
	if sp.logprobs != nil && *sp.logprobs > 0 {
		per += *sp.logprobs
	}
	if sp.n > maxGenerated/per/max(outLen, 1) {
		return errorf(http.StatusBadRequest, "vllmsim holds a request's output in memory and generates at most %d tokens per request, log probabilities counted: n=%d choices of %d tokens (%d per token) ask for more", maxGenerated, sp.n, outLen, per)
	}
	if sp.promptLogprobs == nil {
		return nil
	}
	// In float64: the product of three counts may pass an int's range.
	perPrompt := 1 + max(*sp.promptLogprobs, 1)
	held := float64(sp.n)*float64(max(outLen, 1))*float64(per) +
		float64(max(sp.promptCopies, 1))*float64(promptLen)*float64(perPrompt)
	if held > maxGenerated {
		return errorf(http.StatusBadRequest, "vllmsim holds a request's output in memory and generates at most %d tokens per request, log probabilities counted: %d prompt tokens with prompt_logprobs (%d per token), %d times in the response, and n=%d choices of %d tokens (%d per token) ask for more", maxGenerated, promptLen, perPrompt, max(sp.promptCopies, 1), sp.n, outLen, per)
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
// text they leave once a stop string or a stop token has cut it.
type sequence struct {
	index  int
	pieces []string // one per token it produces, as the engine decodes them
	text   string   // its final text
	finish string   // finish_reason: "length" or "stop"
	// stop is its stop_reason: the stop string (a string) or the stop
	// token id (a uint32) that ended it, or nil.
	stop any
	// hold is the bytes of text held back while streaming, so that no
	// part of a stop string is sent before the string is complete.
	hold    int
	emitted int // tokens produced so far
	cum     int // bytes of pieces[:emitted]
	sent    int // bytes of text streamed so far
}

// newSequence ends choice index's pieces where its stop strings or stop
// tokens stop it, replacing in place the stop tokens min_tokens forbids;
// length says whether the pieces run to a limit rather than to the
// simulated EOS.
//
// vLLM's engine stops a sequence at a stop token id (check_stop, vllm/v1/
// core/sched/utils.py at 018d5dc78efa) and its detokenizer looks for stop
// strings in the text of the tokens before (detokenizer.py at
// e372329d90d7): a stop string that completes earlier wins; one that the
// stop token itself would complete is not looked for.
func newSequence(index int, pieces []string, length bool, sp sampling) *sequence {
	sp.avoidStopTokens(pieces)
	q := &sequence{index: index, pieces: pieces, finish: "stop"}
	if length {
		q.finish = "length"
	}
	at := sp.stopTokenAt(pieces)
	before := pieces
	if at >= 0 {
		before = pieces[:at]
	}
	n, text, stop := stopAt(before, sp.stop, sp.minTokens, sp.includeStop)
	switch {
	case stop != nil:
		q.pieces, q.text, q.finish, q.stop = pieces[:n], text, "stop", *stop
	case at >= 0:
		// The stop token counts as produced (usage, logprobs) but its
		// text is left out unless include_stop_str_in_output
		// (BaseIncrementalDetokenizer.update, detokenizer.py at
		// e372329d90d7); stop_reason is its id (check_stop).
		q.pieces, q.text, q.finish, q.stop = pieces[:at+1], text, "stop", pieceTokenID(pieces[at])
		if sp.includeStop {
			q.text += pieces[at]
		}
	default:
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

// pieceTokenID is the token id of an output piece: a word of outputWords,
// with a leading space in every piece but the first.
func pieceTokenID(piece string) uint32 { return pieceID(strings.TrimPrefix(piece, " ")) }

// isStopToken reports whether id is one of the request's stop_token_ids.
func (sp sampling) isStopToken(id uint32) bool {
	_, ok := slices.BinarySearch(sp.stopTokens, id)
	return ok
}

// stopTokenAt returns the index of the first piece whose token is a stop
// token id and may end the output, -1 for none: check_stop (vllm/v1/core/
// sched/utils.py at 018d5dc78efa) stops at one only once the output has
// min_tokens tokens, itself included.
func (sp sampling) stopTokenAt(pieces []string) int {
	if len(sp.stopTokens) == 0 {
		return -1
	}
	for i := max(sp.minTokens-1, 0); i < len(pieces); i++ {
		if sp.isStopToken(pieceTokenID(pieces[i])) {
			return i
		}
	}
	return -1
}

// avoidStopTokens replaces, in the first min_tokens pieces, each whose
// token is a stop token id by another word: vLLM's
// MinTokensLogitsProcessor sets the logits of the stop tokens to -inf
// until the output has min_tokens tokens (vllm/v1/sample/logits_processor/
// builtin.py at 0272a72cf31c), so the model samples another token there.
func (sp sampling) avoidStopTokens(pieces []string) {
	if len(sp.stopTokens) == 0 {
		return
	}
	for i := range min(sp.minTokens, len(pieces)) {
		if sp.isStopToken(pieceTokenID(pieces[i])) {
			pieces[i] = sp.otherWord(pieces[i])
		}
	}
}

// otherWord returns the first word of outputWords, from a place the piece
// picks, that is no stop token, with the piece's leading space; the piece
// itself when every word is one.
func (sp sampling) otherWord(piece string) string {
	word := strings.TrimPrefix(piece, " ")
	lead := piece[:len(piece)-len(word)]
	start := int(pieceID(word) % uint32(len(outputWords)))
	for k := range len(outputWords) {
		w := outputWords[(start+k)%len(outputWords)]
		if w != word && !sp.isStopToken(pieceID(w)) {
			return lead + w
		}
	}
	return piece
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
