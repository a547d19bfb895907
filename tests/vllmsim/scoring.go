package vllmsim

import (
	"bytes"
	"cmp"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file holds vLLM's scoring endpoints, served by its ServingScores
// (vllm/frontend/entrypoints/pooling/scoring/ at 055e47c28003; protocol.py,
// utils.py and typing.py are the same at b59bccae8c4e): POST /rerank,
// /v1/rerank and /v2/rerank (RerankRequest, Jina/Cohere-compatible) and
// POST /score and /v1/score (ScoreRequest). The simulated model is a
// text-only cross-encoder: a pair's prompt is the query's tokens followed
// by the document's (the tokenizer has no special tokens, so no [CLS] or
// [SEP]), and its score is [PairScore]. Like embeddings, scoring skips the
// prefix cache, the latency model and the MaxNumSeqs queue.

// scoreArchitecture is the model architecture named by vLLM's refusal of
// multimodal score inputs on a text-only model.
const scoreArchitecture = "VllmSimForSequenceClassification"

// PairScore is the relevance score the simulator gives a (query, document)
// pair of token sequences, in [0, 1): with n distinct query tokens of which
// m occur in the document, it is (m + h) / (n + 1), h in [0, 1) a hash of
// both sequences. A document holding more of the query's distinct tokens
// always scores higher; ties are broken deterministically. /rerank and
// /score return it for every pair (as its logit when use_activation is
// false), computed on the tokens left after truncation.
func PairScore(query, document []uint32) float64 {
	inDoc := make(map[uint32]bool, len(document))
	for _, t := range document {
		inDoc[t] = true
	}
	seen := make(map[uint32]bool, len(query))
	var n, m int
	for _, t := range query {
		if seen[t] {
			continue
		}
		seen[t] = true
		n++
		if inDoc[t] {
			m++
		}
	}
	// Token ids are below 2^31, so the separator cannot be one of them.
	seq := make([]uint32, 0, len(query)+1+len(document))
	seq = append(append(append(seq, query...), math.MaxUint32), document...)
	state := tokensSeed(seq)
	h := float64(splitmix64(&state)>>11) / (1 << 53)
	return (float64(m) + h) / float64(n+1)
}

// RelevanceScore is [PairScore] of two texts: Tokenize(query) and
// Tokenize(document), the score /rerank and /score return for them when
// no truncation applies.
func RelevanceScore(query, document string) float64 {
	return PairScore(Tokenize(query), Tokenize(document))
}

// scoringFields are the fields RerankRequest and every ScoreRequest share
// (ScoringRequestMixin over PoolingBasicRequestMixin and
// ClassifyRequestMixin: scoring/protocol.py and base/protocol.py at
// 055e47c28003). Fields that only steer a chat template (instruction,
// chat_template_kwargs), LoRA, multimodal processing or scheduling are
// type-checked and otherwise ignored.
type scoringFields struct {
	Model                string          `json:"model"`
	UseActivation        json.RawMessage `json:"use_activation"`
	User                 json.RawMessage `json:"user"`
	TruncatePromptTokens json.RawMessage `json:"truncate_prompt_tokens"`
	Padding              json.RawMessage `json:"padding"`
	TruncationSide       json.RawMessage `json:"truncation_side"`
	RequestID            json.RawMessage `json:"request_id"`
	Priority             json.RawMessage `json:"priority"`
	MMProcessorKwargs    json.RawMessage `json:"mm_processor_kwargs"`
	CacheSalt            json.RawMessage `json:"cache_salt"`
	MaxTokensPerQuery    json.RawMessage `json:"max_tokens_per_query"`
	MaxTokensPerDoc      json.RawMessage `json:"max_tokens_per_doc"`
	Instruction          json.RawMessage `json:"instruction"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
}

// scoringParams are the validated scoringFields the simulation uses.
type scoringParams struct {
	raw            bool   // use_activation false: logits instead of probabilities
	truncate       *int64 // truncate_prompt_tokens; -1 means max_model_len
	padMax         bool   // padding "max_length"
	truncationSide string // "", "left" or "right"
	maxQuery       int64  // max_tokens_per_query, 0 for none
	maxDoc         int64  // max_tokens_per_doc, 0 for none
}

// absent reports whether a field was left out of the body.
func absent(raw json.RawMessage) bool { return len(raw) == 0 }

// isNull reports whether a field is absent or null.
func isNull(raw json.RawMessage) bool { return absent(raw) || string(bytes.TrimSpace(raw)) == "null" }

// pydanticError is the 400 of a field that fails pydantic's validation:
// param is its location, as vLLM's validation handler reports the first
// error's (handlers/validation.py at 055e47c28003).
func pydanticError(field, msg string) *apiError {
	return badParam("body."+field, "%s: %s", field, msg)
}

// intField validates a pydantic int field in lax mode: a JSON number
// without a fractional part, a boolean, or a string holding an integer
// (trailing ".0" allowed), within int64. null is accepted when nullable
// (reported as not set).
func intField(raw json.RawMessage, field string, nullable bool) (v int64, set bool, aerr *apiError) {
	if absent(raw) || (nullable && isNull(raw)) {
		return 0, false, nil
	}
	invalid := pydanticError(field, "Input should be a valid integer")
	var text string
	switch c := firstByte(raw); {
	case c == 't' || c == 'f':
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return 0, false, invalid
		}
		if b {
			return 1, true, nil
		}
		return 0, true, nil
	case c == '"':
		if json.Unmarshal(raw, &text) != nil {
			return 0, false, invalid
		}
		text = strings.TrimSpace(text)
		if i := strings.IndexByte(text, '.'); i > 0 && strings.Trim(text[i+1:], "0") == "" {
			text = text[:i]
		}
		i, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return 0, false, pydanticError(field, "Input should be a valid integer, unable to parse string as an integer")
		}
		return i, true, nil
	case c == '-' || (c >= '0' && c <= '9'):
		var n json.Number
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		if d.Decode(&n) != nil {
			return 0, false, invalid
		}
		text = n.String()
	default:
		return 0, false, invalid
	}
	if i, err := strconv.ParseInt(text, 10, 64); err == nil {
		return i, true, nil
	}
	x, err := strconv.ParseFloat(text, 64)
	switch {
	case err == nil && x != math.Trunc(x):
		return 0, false, pydanticError(field, "Input should be a valid integer, got a number with a fractional part")
	case err != nil || x < math.MinInt64 || x >= math.MaxInt64:
		return 0, false, pydanticError(field, "Input should be a valid integer, got a number out of range")
	}
	return int64(x), true, nil
}

// boolField validates a pydantic bool | None field in lax mode: a JSON
// boolean, 0 or 1, or one of the strings pydantic reads as a boolean.
func boolField(raw json.RawMessage, field string) (v, set bool, aerr *apiError) {
	if isNull(raw) {
		return false, false, nil
	}
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		return b, true, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch strings.ToLower(strings.TrimSpace(s)) {
		case "0", "off", "f", "false", "n", "no":
			return false, true, nil
		case "1", "on", "t", "true", "y", "yes":
			return true, true, nil
		}
	}
	switch string(bytes.TrimSpace(raw)) {
	case "0", "0.0":
		return false, true, nil
	case "1", "1.0":
		return true, true, nil
	}
	return false, false, pydanticError(field, "Input should be a valid boolean")
}

// stringField validates a pydantic str field (or str | None when
// nullable).
func stringField(raw json.RawMessage, field string, nullable bool) (string, bool, *apiError) {
	if absent(raw) || (nullable && isNull(raw)) {
		return "", false, nil
	}
	var s string
	if firstByte(raw) != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false, pydanticError(field, "Input should be a valid string")
	}
	return s, true, nil
}

// literalField validates a Literal[...] | None field.
func literalField(raw json.RawMessage, field, want string, values ...string) (string, *apiError) {
	s, set, aerr := stringField(raw, field, true)
	if aerr == nil && set && !slices.Contains(values, s) {
		aerr = pydanticError(field, "Input should be "+want)
	}
	return s, aerr
}

// params validates the shared fields in pydantic's field order (the
// reversed MRO: ClassifyRequestMixin, PoolingBasicRequestMixin, then
// ScoringRequestMixin's own).
func (f *scoringFields) params() (scoringParams, *apiError) {
	var p scoringParams
	activation, set, aerr := boolField(f.UseActivation, "use_activation")
	if aerr != nil {
		return p, aerr
	}
	p.raw = set && !activation
	if _, _, aerr := stringField(f.User, "user", true); aerr != nil {
		return p, aerr
	}
	if v, set, aerr := intField(f.TruncatePromptTokens, "truncate_prompt_tokens", true); aerr != nil {
		return p, aerr
	} else if set {
		if v < -1 {
			return p, pydanticError("truncate_prompt_tokens", "Input should be greater than or equal to -1")
		}
		p.truncate = &v
	}
	padding, aerr := literalField(f.Padding, "padding", "'max_length' or 'do_not_pad'", "max_length", "do_not_pad")
	if aerr != nil {
		return p, aerr
	}
	p.padMax = padding == "max_length"
	if p.truncationSide, aerr = literalField(f.TruncationSide, "truncation_side", "'left' or 'right'", "left", "right"); aerr != nil {
		return p, aerr
	}
	if _, _, aerr := stringField(f.RequestID, "request_id", false); aerr != nil {
		return p, aerr
	}
	if _, _, aerr := intField(f.Priority, "priority", false); aerr != nil {
		return p, aerr
	}
	if c := firstByte(f.MMProcessorKwargs); !isNull(f.MMProcessorKwargs) && c != '{' {
		return p, pydanticError("mm_processor_kwargs", "Input should be a valid dictionary")
	}
	if salt, set, aerr := stringField(f.CacheSalt, "cache_salt", true); aerr != nil {
		return p, aerr
	} else if n := len([]rune(salt)); set && n < 1 {
		return p, pydanticError("cache_salt", "String should have at least 1 character")
	} else if n > 1024 {
		return p, pydanticError("cache_salt", "String should have at most 1024 characters")
	}
	if p.maxQuery, _, aerr = intField(f.MaxTokensPerQuery, "max_tokens_per_query", false); aerr != nil {
		return p, aerr
	}
	if p.maxDoc, _, aerr = intField(f.MaxTokensPerDoc, "max_tokens_per_doc", false); aerr != nil {
		return p, aerr
	}
	if _, _, aerr := stringField(f.Instruction, "instruction", true); aerr != nil {
		return p, aerr
	}
	if !isNull(f.ChatTemplateKwargs) && firstByte(f.ChatTemplateKwargs) != '{' {
		return p, pydanticError("chat_template_kwargs", "Input should be a valid dictionary")
	}
	return p, nil
}

// scoreItem is one ScoreInput (scoring/typing.py at b59bccae8c4e): a text,
// or a ScoreMultiModalParam ({"content": [parts]}), which the simulated
// text-only model refuses after validation.
type scoreItem struct {
	text string
	mm   json.RawMessage // a ScoreMultiModalParam's content parts, nil for a text
}

// scoreInput decodes a ScoreInput field, or a ScoreInput |
// list[ScoreInput] one when list is true, into its items (one for a single
// input).
func scoreInput(raw json.RawMessage, field string, list bool) ([]scoreItem, *apiError) {
	if absent(raw) {
		return nil, pydanticError(field, "Field required")
	}
	invalid := pydanticError(field, "Input should be a valid string or a dictionary with a content list")
	if list {
		invalid = pydanticError(field, "Input should be a valid string, a dictionary with a content list, or a list of them")
	}
	one := func(raw json.RawMessage) (scoreItem, bool) {
		var it scoreItem
		switch firstByte(raw) {
		case '"':
			err := json.Unmarshal(raw, &it.text)
			return it, err == nil
		case '{':
			var obj struct {
				Content json.RawMessage `json:"content"`
			}
			if json.Unmarshal(raw, &obj) != nil || firstByte(obj.Content) != '[' {
				return it, false
			}
			it.mm = obj.Content
			return it, true
		}
		return it, false
	}
	if !list || firstByte(raw) != '[' {
		it, ok := one(raw)
		if !ok {
			return nil, invalid
		}
		return []scoreItem{it}, nil
	}
	var elems []json.RawMessage
	if json.Unmarshal(raw, &elems) != nil {
		return nil, invalid
	}
	items := make([]scoreItem, len(elems))
	for i, e := range elems {
		var ok bool
		if items[i], ok = one(e); !ok {
			return nil, invalid
		}
	}
	return items, nil
}

// rerankRequest is vLLM's RerankRequest (scoring/protocol.py at
// 055e47c28003). It has no return_documents: vLLM always returns each
// result's document, and ignores the field as it ignores any unknown one.
type rerankRequest struct {
	scoringFields
	Query     json.RawMessage `json:"query"`
	Documents json.RawMessage `json:"documents"`
	TopN      json.RawMessage `json:"top_n"`

	topN int64 // the validated top_n
}

// scoreRequest is vLLM's ScoreRequest, the union of
// ScoreQueriesDocumentsRequest, ScoreQueriesItemsRequest, ScoreDataRequest
// and ScoreTextRequest (scoring/protocol.py at 055e47c28003): the first
// and second inputs are queries and documents, queries and items, data_1
// and data_2, or text_1 and text_2.
type scoreRequest struct {
	scoringFields
	Queries   json.RawMessage `json:"queries"`
	Documents json.RawMessage `json:"documents"`
	Items     json.RawMessage `json:"items"`
	Data1     json.RawMessage `json:"data_1"`
	Data2     json.RawMessage `json:"data_2"`
	Text1     json.RawMessage `json:"text_1"`
	Text2     json.RawMessage `json:"text_2"`
}

// inputs resolves the union the way pydantic's smart mode does for these
// members (extra fields are allowed, so several may fit; here the first
// in the union's order wins): the first member whose two fields are
// present and valid. When none is, the error reported is the first
// member's, as vLLM's validation handler takes the param of the first
// error (queries, then documents).
func (r *scoreRequest) inputs() (data1, data2 []scoreItem, aerr *apiError) {
	type field struct {
		name string
		raw  json.RawMessage
	}
	members := [][2]field{
		{{"queries", r.Queries}, {"documents", r.Documents}},
		{{"queries", r.Queries}, {"items", r.Items}},
		{{"data_1", r.Data1}, {"data_2", r.Data2}},
		{{"text_1", r.Text1}, {"text_2", r.Text2}},
	}
	for i, m := range members {
		if i > 0 && (absent(m[0].raw) || absent(m[1].raw)) {
			continue
		}
		d1, err1 := scoreInput(m[0].raw, m[0].name, true)
		d2, err2 := scoreInput(m[1].raw, m[1].name, true)
		switch {
		case err1 == nil && err2 == nil:
			return d1, d2, nil
		case i == 0 && err1 != nil:
			aerr = err1
		case i == 0:
			aerr = err2
		}
	}
	return nil, nil, aerr
}

// validateScoreInput is vLLM's validate_score_input (scoring/utils.py at
// 055e47c28003): multimodal inputs are refused by a text-only model, then
// the lengths must pair 1:1, 1:N or N:N and neither side be empty.
func validateScoreInput(data1, data2 []scoreItem) *apiError {
	for _, it := range slices.Concat(data1, data2) {
		if it.mm != nil {
			return errorf(http.StatusBadRequest, "MultiModalParam is not supported for %s", scoreArchitecture)
		}
	}
	switch n1, n2 := len(data1), len(data2); {
	case n1 > 1 && n1 != n2:
		return errorf(http.StatusBadRequest, "Input lengths must be either 1:1, 1:N or N:N")
	case n1 == 0:
		return errorf(http.StatusBadRequest, "At least one text element must be given")
	case n2 == 0:
		return errorf(http.StatusBadRequest, "At least one text_pair element must be given")
	}
	return nil
}

// scoredPair is one (query, document) pair after tokenization and
// truncation.
type scoredPair struct {
	score float64
}

// scorePairs validates and scores the pairs of a scoring request, the way
// vLLM's ServingScores prepares them with its CrossEncoderIOProcessor
// (scoring/io_processor.py, base/serving.py at 055e47c28003), and returns
// them with their total prompt tokens.
func (s *Server) scorePairs(p scoringParams, data1, data2 []scoreItem) ([]scoredPair, int, *apiError) {
	maxLen := int64(s.opts.MaxModelLen)
	// PoolingBaseServing._validate_request.
	if p.truncate != nil && *p.truncate > maxLen {
		return nil, 0, errorf(http.StatusBadRequest, "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.")
	}
	if aerr := validateScoreInput(data1, data2); aerr != nil {
		return nil, 0, aerr
	}
	// ScoringIOProcessor._get_token_limits.
	for _, l := range []struct {
		name string
		v    int64
	}{{"max_tokens_per_query", p.maxQuery}, {"max_tokens_per_doc", p.maxDoc}} {
		switch {
		case l.v < 0:
			return nil, 0, errorf(http.StatusBadRequest, "%s must be a non-negative integer", l.name)
		case l.v >= maxLen:
			return nil, 0, errorf(http.StatusBadRequest, "%s (%d) must be less than max_model_len (%d).", l.name, l.v, maxLen)
		}
	}
	pairs := make([]scoredPair, len(data2))
	total := 0
	for i := range data2 {
		q := Tokenize(data1[min(i, len(data1)-1)].text)
		d := Tokenize(data2[i].text)
		// truncate_text_to_tokens keeps the first tokens of each side.
		if p.maxQuery > 0 && int64(len(q)) > p.maxQuery {
			q = q[:p.maxQuery]
		}
		if p.maxDoc > 0 && int64(len(d)) > p.maxDoc {
			d = d[:p.maxDoc]
		}
		q, d = truncatePair(q, d, p, s.opts.MaxModelLen)
		n := len(q) + len(d)
		if n > s.opts.MaxModelLen {
			// TokenizeParams._token_len_check (renderers/params.py at
			// 055e47c28003): the tokenizer cut the pair at max_model_len+1.
			over := s.opts.MaxModelLen + 1
			return nil, 0, badParam("input_tokens",
				"This model's maximum context length is %d tokens. However, you requested 0 output tokens and your prompt contains at least %d input tokens, for a total of at least %d tokens. Please reduce the length of the input prompt or the number of requested output tokens.",
				s.opts.MaxModelLen, over, over)
		}
		if p.padMax {
			n = s.opts.MaxModelLen // TokenizeParams._token_padding to max_input_tokens
		}
		score := PairScore(q, d)
		if p.raw {
			// use_activation false: the classifier's logit, not its sigmoid.
			c := min(max(score, 1e-9), 1-1e-9)
			score = math.Log(c / (1 - c))
		}
		pairs[i] = scoredPair{score: score}
		total += n
	}
	return pairs, total, nil
}

// truncatePair applies truncate_prompt_tokens to a pair as vLLM's
// TokenizeParams does (renderers/params.py at 055e47c28003): with a
// truncation_side, the pair's tokens are cut from that side; without one,
// the tokenizer truncates the pair "longest_first" (transformers'
// truncate_sequences: the longer side loses tokens first, then both
// evenly, from the right).
func truncatePair(q, d []uint32, p scoringParams, maxModelLen int) ([]uint32, []uint32) {
	if p.truncate == nil {
		return q, d
	}
	limit := int(*p.truncate)
	if limit < 0 {
		limit = maxModelLen
	}
	remove := len(q) + len(d) - limit
	if remove <= 0 {
		return q, d
	}
	switch p.truncationSide {
	case "right":
		keepQ := min(len(q), limit)
		return q[:keepQ], d[:limit-keepQ]
	case "left":
		keepD := min(len(d), limit)
		return q[len(q)-(limit-keepD):], d[len(d)-keepD:]
	}
	first := min(abs(len(q)-len(d)), remove)
	second := remove - first
	var fromQ, fromD int
	if len(q) > len(d) {
		fromQ, fromD = first+second/2, second-second/2
	} else {
		fromQ, fromD = second/2, first+second-second/2
	}
	return q[:len(q)-fromQ], d[:len(d)-fromD]
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// scoringID is the id of a scoring response: "score-" (ServingScores'
// request_id_prefix, for rerank too) and the X-Request-Id header, or a
// random id (BaseServing._base_request_id at b59bccae8c4e).
func scoringID(r *http.Request) string {
	if id, ok := r.Header[http.CanonicalHeaderKey("X-Request-Id")]; ok && len(id) > 0 {
		return "score-" + id[0]
	}
	return newID("score-")
}

// rerankDocument is vLLM's RerankDocument.
type rerankDocument struct {
	Text       *string         `json:"text"`
	MultiModal json.RawMessage `json:"multi_modal"`
}

type rerankResult struct {
	Index          int            `json:"index"`
	Document       rerankDocument `json:"document"`
	RelevanceScore float64        `json:"relevance_score"`
}

// rerankUsage is vLLM's RerankUsage.
type rerankUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// rerankResponse is vLLM's RerankResponse.
type rerankResponse struct {
	ID      string         `json:"id"`
	Model   string         `json:"model"`
	Usage   rerankUsage    `json:"usage"`
	Results []rerankResult `json:"results"`
}

type scoreData struct {
	Index  int     `json:"index"`
	Object string  `json:"object"`
	Score  float64 `json:"score"`
}

// scoreResponse is vLLM's ScoreResponse.
type scoreResponse struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Data    []scoreData `json:"data"`
	Usage   openAIUsage `json:"usage"`
}

// admitScoring checks the model, validates and scores the pairs, counts
// the request and draws the fail rate, in vLLM's order: pydantic's
// validation (done by the caller), the model (PoolingBaseServing._init_ctx's
// _maybe_get_adapters raises VLLMNotFoundError: base/serving.py at
// 055e47c28003), then the inputs.
func (s *Server) admitScoring(r *http.Request, model string, p scoringParams, data1, data2 []scoreItem) ([]scoredPair, int, *apiError) {
	if _, ok := s.servedModel(model); !ok {
		return nil, 0, errorf(http.StatusNotFound, "The model `%s` does not exist.", model)
	}
	pairs, total, aerr := s.scorePairs(p, data1, data2)
	if aerr != nil {
		return nil, 0, aerr
	}
	if s.accept(r.URL.Path) {
		return nil, 0, errInjected
	}
	s.mu.Lock()
	s.stats.promptTokens += uint64(total)
	s.mu.Unlock()
	return pairs, total, nil
}

// parseRerank decodes and validates a rerank request body in pydantic's
// field order: the shared fields, then query, documents and top_n.
func parseRerank(body []byte) (*rerankRequest, scoringParams, []scoreItem, []scoreItem, *apiError) {
	var req rerankRequest
	if aerr := decodeJSON(body, &req); aerr != nil {
		return nil, scoringParams{}, nil, nil, aerr
	}
	p, aerr := req.params()
	if aerr != nil {
		return nil, p, nil, nil, aerr
	}
	query, aerr := scoreInput(req.Query, "query", false)
	if aerr != nil {
		return nil, p, nil, nil, aerr
	}
	docs, aerr := scoreInput(req.Documents, "documents", true)
	if aerr != nil {
		return nil, p, nil, nil, aerr
	}
	topN, _, aerr := intField(req.TopN, "top_n", false)
	if aerr == nil && topN < 0 {
		aerr = pydanticError("top_n", "Input should be greater than or equal to 0")
	}
	if aerr != nil {
		return nil, p, nil, nil, aerr
	}
	req.topN = topN
	return &req, p, query, docs, nil
}

// handleRerank serves POST /rerank, /v1/rerank and /v2/rerank
// (scoring/api_router.py at 055e47c28003): the documents with their
// relevance to the query, most relevant first, cut at top_n (0: all).
// The response's model is the served model's canonical name, as vLLM's
// ServingScores._build_response takes self.models.model_name().
func (s *Server) handleRerank(w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	req, p, query, docs, aerr := parseRerank(body)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	pairs, total, aerr := s.admitScoring(r, req.Model, p, query, docs)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	results := make([]rerankResult, len(pairs))
	for i, pair := range pairs {
		results[i] = rerankResult{Index: i, Document: rerankDocument{Text: &docs[i].text}, RelevanceScore: pair.score}
	}
	// _request_output_to_rerank_response (serving.py at 055e47c28003): a
	// stable sort by score, descending, then the first top_n (0: all).
	slices.SortStableFunc(results, func(a, b rerankResult) int {
		return cmp.Compare(b.RelevanceScore, a.RelevanceScore)
	})
	if req.topN > 0 && req.topN < int64(len(results)) {
		results = results[:req.topN]
	}
	writeJSON(w, http.StatusOK, rerankResponse{
		ID: scoringID(r), Model: s.opts.Models[0],
		Usage:   rerankUsage{PromptTokens: total, TotalTokens: total},
		Results: results,
	})
}

// handleScore serves POST /score and /v1/score (scoring/api_router.py at
// 055e47c28003): one score per pair, the first input paired 1:1, 1:N or
// N:N with the second, in the order of the second. As for rerank, the
// model is the canonical name.
func (s *Server) handleScore(w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	var req scoreRequest
	if aerr := decodeJSON(body, &req); aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	p, aerr := req.params()
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	data1, data2, aerr := req.inputs()
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	pairs, total, aerr := s.admitScoring(r, req.Model, p, data1, data2)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	data := make([]scoreData, len(pairs))
	for i, pair := range pairs {
		data[i] = scoreData{Index: i, Object: "score", Score: pair.score}
	}
	writeJSON(w, http.StatusOK, scoreResponse{
		ID: scoringID(r), Object: "list", Created: time.Now().Unix(), Model: s.opts.Models[0],
		Data:  data,
		Usage: openAIUsage{PromptTokens: total, TotalTokens: total},
	})
}
