package vllmsim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// This file holds vLLM's OpenAI-compatible endpoints: chat completions,
// completions, embeddings, models and tokenize.

// decodeJSON decodes a request body into v; any failure is a 400.
func decodeJSON(body []byte, v any) *apiError {
	if err := json.Unmarshal(body, v); err != nil {
		return errorf(http.StatusBadRequest, "Invalid JSON body: %v", err)
	}
	return nil
}

// firstByte returns the first non-space byte of raw, or 0.
func firstByte(raw json.RawMessage) byte {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) == 0 {
		return 0
	}
	return t[0]
}

// contentPart is one element of an array-valued message content, in any
// dialect: OpenAI ("text"), Anthropic ("text") or Responses ("input_text",
// "output_text").
type contentPart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

// contentText flattens a message content, a string or an array of parts,
// into plain text: the text parts joined with "\n". Parts without text
// (images, tool calls) add nothing. null is the empty string.
func contentText(raw json.RawMessage, field string) (string, *apiError) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || string(t) == "null" {
		return "", nil
	}
	switch t[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", errorf(http.StatusBadRequest, "%s: %v", field, err)
		}
		return s, nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", errorf(http.StatusBadRequest, "%s: %v", field, err)
		}
		texts := make([]string, 0, len(parts))
		for _, p := range parts {
			if p.Text != nil {
				texts = append(texts, *p.Text)
			}
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", errorf(http.StatusBadRequest, "%s: must be a string or an array of content parts", field)
}

// tokenInputs decodes an OpenAI prompt or input field into token id
// sequences: a string, an array of strings, an array of token ids, or an
// array of arrays of token ids.
func tokenInputs(raw json.RawMessage, field string) ([][]uint32, *apiError) {
	bad := func(err error) *apiError { return errorf(http.StatusBadRequest, "%s: %v", field, err) }
	switch firstByte(raw) {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, bad(err)
		}
		return [][]uint32{Tokenize(s)}, nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, bad(err)
		}
		if len(items) == 0 {
			return nil, errorf(http.StatusBadRequest, "%s: must not be an empty array", field)
		}
		switch firstByte(items[0]) {
		case '"':
			var ss []string
			if err := json.Unmarshal(raw, &ss); err != nil {
				return nil, bad(err)
			}
			out := make([][]uint32, len(ss))
			for i, s := range ss {
				out[i] = Tokenize(s)
			}
			return out, nil
		case '[':
			var ids [][]uint32
			if err := json.Unmarshal(raw, &ids); err != nil {
				return nil, bad(err)
			}
			return ids, nil
		default:
			var ids []uint32
			if err := json.Unmarshal(raw, &ids); err != nil {
				return nil, bad(err)
			}
			return [][]uint32{ids}, nil
		}
	case 0:
		return nil, errorf(http.StatusBadRequest, "%s: required", field)
	}
	return nil, errorf(http.StatusBadRequest, "%s: must be a string, an array of strings or an array of token ids", field)
}

// streamOptions is OpenAI's stream_options, as vLLM reads it
// (StreamOptions in entrypoints/openai/engine/protocol.py: include_usage
// defaults to false, since vllm-project/vllm#36379; before it, to true once
// the object was present).
type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats *bool `json:"continuous_usage_stats"`
	members              int   // how many members the object has
}

func (o *streamOptions) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	type plain streamOptions
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*o = streamOptions(p)
	o.members = len(m)
	return nil
}

// check refuses stream options on a request that does not stream, as
// validate_stream_options does (chat_completion/protocol.py and
// completion/protocol.py at 002032ee2b18): any object but an empty one,
// which Python reads as false.
func (o *streamOptions) check(stream bool) *apiError {
	if o == nil || stream || o.members == 0 {
		return nil
	}
	return badParam("stream_options", "Stream options can only be defined when `stream=True`.")
}

// usage is vLLM's should_include_usage (serve/utils/api_utils.py at
// 00a5fdd20935): whether the stream ends with a usage chunk, and whether
// every chunk carries the usage so far.
func (o *streamOptions) usage() (final, continuous bool) {
	if o == nil {
		return false, false
	}
	final = o.IncludeUsage != nil && *o.IncludeUsage
	return final, final && o.ContinuousUsageStats != nil && *o.ContinuousUsageStats
}

// openAIUsage is the usage object of chat and completion responses.
type openAIUsage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func (g *generation) openAIUsage() *openAIUsage {
	return &openAIUsage{
		PromptTokens:        len(g.p.prompt),
		CompletionTokens:    g.emitted,
		TotalTokens:         len(g.p.prompt) + g.emitted,
		PromptTokensDetails: &promptTokensDetails{CachedTokens: g.cached},
	}
}

// cacheSaltField is vLLM's cache_salt (chat completions, completions,
// Responses): a non-empty string that salts the request's prefix cache
// ([SaltedBlockHashes]), so that it reuses only blocks of its own salt.
type cacheSaltField struct {
	CacheSalt *string `json:"cache_salt"`
}

// salt returns the request's salt, "" for none, and vLLM's 400 for an
// empty one.
func (f cacheSaltField) salt() (string, *apiError) {
	if f.CacheSalt == nil {
		return "", nil
	}
	if *f.CacheSalt == "" {
		return "", errorf(http.StatusBadRequest, "Parameter 'cache_salt' must be a non-empty string if provided.")
	}
	return *f.CacheSalt, nil
}

// chatMessage is a request message of the chat API.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// chatRequest is the part of a chat completion request the simulator reads.
type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	// Documents and ReasoningEffort reach the template as keyword
	// arguments ([templateFields.addKwargs]).
	Documents       json.RawMessage `json:"documents"`
	ReasoningEffort *string         `json:"reasoning_effort"`
	// Logprobs and TopLogprobs ask for the generated tokens' log
	// probabilities ([chatRequest.chatSampling]).
	Logprobs    *bool           `json:"logprobs"`
	TopLogprobs json.RawMessage `json:"top_logprobs"`
	// Echo puts the last message before every choice's content when it
	// has the response's role ([chatRequest.echoed]).
	Echo bool `json:"echo"`
	templateFields
	cacheSaltField
	samplingFields

	conversation []Message // the messages, as the template reads them
	rendered     string    // the prompt, rendered by the chat template
}

// templateFields are the chat-template inputs that vLLM's chat completions
// and its /tokenize chat form share (vllm/entrypoints/serve/tokenize/
// protocol.py TokenizeChatRequest; ChatCompletionRequest has the same
// fields and defaults).
type templateFields struct {
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	Tools                json.RawMessage `json:"tools"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
}

// addKwargs adds a request's documents and reasoning effort to its
// chat_template_kwargs as vLLM's ChatCompletionRequest.build_chat_params
// merges them (vllm/entrypoints/openai/chat_completion/protocol.py at
// 002032ee2b18): each unless null, over the client's own keys, and with
// thinking, enable_thinking (an effort other than "none") unless the client
// set it. A Messages request's output_config.effort is its chat
// completion's reasoning_effort; a Responses request's reasoning.effort is
// added without enable_thinking.
func (f *templateFields) addKwargs(documents json.RawMessage, effort *string, thinking bool) *apiError {
	kw, aerr := f.kwargs()
	if aerr != nil {
		return aerr
	}
	if firstByte(documents) != 0 && firstByte(documents) != 'n' {
		kw["documents"] = documents
	}
	if effort != nil {
		kw["reasoning_effort"] = *effort
		if _, set := kw["enable_thinking"]; thinking && !set {
			kw["enable_thinking"] = *effort != "none"
		}
	}
	if len(kw) > 0 {
		f.ChatTemplateKwargs, _ = json.Marshal(kw)
	}
	return nil
}

// kwargs decodes chat_template_kwargs: an object, or nothing.
func (f templateFields) kwargs() (map[string]any, *apiError) {
	kw := map[string]any{}
	switch firstByte(f.ChatTemplateKwargs) {
	case 0, 'n':
		return kw, nil
	case '{':
		d := json.NewDecoder(bytes.NewReader(f.ChatTemplateKwargs))
		d.UseNumber()
		if err := d.Decode(&kw); err != nil {
			return nil, errorf(http.StatusBadRequest, "chat_template_kwargs: %v", err)
		}
		return kw, nil
	}
	return nil, errorf(http.StatusBadRequest, "chat_template_kwargs: must be an object")
}

// template returns the [ChatTemplate] the fields ask for: the generation
// prompt unless add_generation_prompt is false, and 400 for both it and
// continue_final_message, as vLLM answers.
func (f templateFields) template() (ChatTemplate, *apiError) {
	addGen := f.AddGenerationPrompt == nil || *f.AddGenerationPrompt
	if f.ContinueFinalMessage && f.AddGenerationPrompt != nil && *f.AddGenerationPrompt {
		return ChatTemplate{}, errorf(http.StatusBadRequest, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	if f.ContinueFinalMessage {
		addGen = false
	}
	t := ChatTemplate{AddGenerationPrompt: addGen, ContinueFinalMessage: f.ContinueFinalMessage}
	kw, aerr := f.kwargs()
	if aerr != nil {
		return ChatTemplate{}, aerr
	}
	// The request's own fields decide these, over any kwarg of the name.
	delete(kw, "add_generation_prompt")
	delete(kw, "continue_final_message")
	if len(kw) > 0 {
		b, _ := json.Marshal(kw)
		t.Kwargs = string(b)
	}
	if raw := bytes.TrimSpace(f.Tools); len(raw) > 0 && string(raw) != "null" {
		if raw[0] != '[' {
			return ChatTemplate{}, errorf(http.StatusBadRequest, "tools: must be an array")
		}
		tools, aerr := canonicalTools(raw)
		if aerr != nil {
			return ChatTemplate{}, aerr
		}
		if tools != "[]" {
			t.Tools = tools
		}
	}
	return t, nil
}

// canonicalTools is a tools array as the template sees it, whatever the
// request's spelling: vLLM reads each tool into its pydantic model and
// renders the model's dump, where a function's absent description is null
// and a null defer_loading is left out (FunctionDefinition). Here: keys
// sorted, numbers as written.
func canonicalTools(raw json.RawMessage) (string, *apiError) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var tools []any
	if err := d.Decode(&tools); err != nil {
		return "", errorf(http.StatusBadRequest, "tools: %v", err)
	}
	for _, t := range tools {
		tool, _ := t.(map[string]any)
		if fn, ok := tool["function"].(map[string]any); ok {
			if _, ok := fn["description"]; !ok {
				fn["description"] = nil
			}
			if v, ok := fn["defer_loading"]; ok && v == nil {
				delete(fn, "defer_loading")
			}
		}
	}
	b, _ := json.Marshal(tools)
	return string(b), nil
}

// chatMessages converts request messages to the template's [Message]s.
func chatMessages(msgs []chatMessage) ([]Message, *apiError) {
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, errorf(http.StatusBadRequest, "messages[%d].role: required", i)
		}
		text, aerr := contentText(m.Content, fmt.Sprintf("messages[%d].content", i))
		if aerr != nil {
			return nil, aerr
		}
		out[i] = Message{Role: m.Role, Content: text}
	}
	return out, nil
}

// reasoningEfforts are the values vLLM's ChatCompletionRequest accepts
// for reasoning_effort (vllm/entrypoints/openai/chat_completion/
// protocol.py at 002032ee2b18); any other is a 400.
var reasoningEfforts = []string{"none", "minimal", "low", "medium", "high", "xhigh", "max"}

// parseChatRequest decodes and checks a chat completion request body and
// returns it with its prompt tokens.
func parseChatRequest(body []byte) (*chatRequest, []uint32, *apiError) {
	var req chatRequest
	if aerr := decodeJSON(body, &req); aerr != nil {
		return nil, nil, aerr
	}
	if len(req.Messages) == 0 {
		return nil, nil, errorf(http.StatusBadRequest, "messages: must not be empty")
	}
	msgs, aerr := chatMessages(req.Messages)
	if aerr != nil {
		return nil, nil, aerr
	}
	if e := req.ReasoningEffort; e != nil && !slices.Contains(reasoningEfforts, *e) {
		return nil, nil, errorf(http.StatusBadRequest, "reasoning_effort: must be one of %s, got %q", strings.Join(reasoningEfforts, ", "), *e)
	}
	if aerr := req.addKwargs(req.Documents, req.ReasoningEffort, true); aerr != nil {
		return nil, nil, aerr
	}
	tmpl, aerr := req.template()
	if aerr != nil {
		return nil, nil, aerr
	}
	req.conversation, req.rendered = msgs, RenderChatTemplate(msgs, tmpl)
	return &req, Tokenize(req.rendered), nil
}

// role is the role of the response's message, as
// OpenAIServingChat.get_chat_request_role gives it (chat_completion/
// serving.py at 006c49d485f9): the assistant's, or, when the request sets
// add_generation_prompt false, its last message's.
func (r *chatRequest) role() string {
	if r.AddGenerationPrompt != nil && !*r.AddGenerationPrompt {
		return r.conversation[len(r.conversation)-1].Role
	}
	return "assistant"
}

// echoed is what echo puts before every choice's content, whole or
// streamed (chat_completion_full_generator and
// chat_completion_stream_generator, chat_completion/serving.py at
// 006c49d485f9): the last message's content when that message has the
// response's role, else nothing.
func (r *chatRequest) echoed() string {
	last := r.conversation[len(r.conversation)-1]
	if !r.Echo || last.Role != r.role() {
		return ""
	}
	return last.Content
}

// chatSampling returns the request's sampling with its logprobs: the
// top_logprobs count when logprobs is true. It refuses top_logprobs (other
// than 0) without logprobs, as ChatCompletionRequest.check_logprobs does
// (vllm/entrypoints/openai/chat_completion/protocol.py at 002032ee2b18).
// Its prompt logprobs are prompt_logprobs or, with echo, the top_logprobs
// count (ChatCompletionRequest.to_sampling_params, same file): null
// top_logprobs asks for none, absent for 0.
func (r *chatRequest) chatSampling() (sampling, *apiError) {
	if aerr := r.StreamOptions.check(r.Stream); aerr != nil {
		return sampling{}, aerr
	}
	sp, aerr := r.sampling()
	if aerr != nil {
		return sampling{}, aerr
	}
	if sp.promptLogprobs, aerr = r.promptLogprobsCount(r.Stream); aerr != nil {
		return sampling{}, aerr
	}
	top, aerr := logprobsCount(r.TopLogprobs, "top_logprobs")
	if aerr != nil {
		return sampling{}, aerr
	}
	k := 0
	if top != nil {
		k = *top
	}
	on := r.Logprobs != nil && *r.Logprobs
	switch {
	case k < -1:
		return sampling{}, badParam("top_logprobs", "`top_logprobs` must be a positive value or -1.")
	case k != 0 && !on:
		return sampling{}, badParam("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.")
	case on:
		sp.logprobs = &k
	}
	if sp.promptLogprobs == nil && r.Echo && (top != nil || absent(r.TopLogprobs)) {
		sp.promptLogprobs = &k
	}
	sp.promptCopies = 1
	return sp, nil
}

// logprobsCount decodes a logprobs count (chat top_logprobs, completions
// logprobs): null or absent is nil; a value that is no number (nor a
// boolean, which Python counts as one) is vLLM's 400 from check_logprobs,
// which runs before pydantic's own int validation ([intField]). A count
// beyond int32 is kept as one beyond the vocabulary: vLLM refuses it above
// max_logprobs.
func logprobsCount(raw json.RawMessage, field string) (*int, *apiError) {
	if c := firstByte(raw); c != 0 && c != 'n' && c != 't' && c != 'f' && c != '-' && (c < '0' || c > '9') {
		return nil, badParam(field, "`%s` must be an integer.", field)
	}
	v, set, aerr := intField(raw, field, true)
	if aerr != nil || !set {
		return nil, aerr
	}
	k := int(max(min(v, vocabSize+1), math.MinInt32))
	return &k, nil
}

// stopReason is a choice's stop_reason: its stop string, its stop token
// id, or null.
func stopReason(q *sequence) any { return q.stop }

type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	ServiceTier       *string      `json:"service_tier"`
	SystemFingerprint *string      `json:"system_fingerprint"`
	Usage             *openAIUsage `json:"usage"`
	PromptLogprobs    any          `json:"prompt_logprobs"`
	KVTransferParams  any          `json:"kv_transfer_params"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      chatRespMessage `json:"message"`
	Logprobs     any             `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
	StopReason   any             `json:"stop_reason"`
}

type chatRespMessage struct {
	Role             string `json:"role"`
	Content          string `json:"content"`
	Refusal          any    `json:"refusal"`
	Annotations      any    `json:"annotations"`
	Audio            any    `json:"audio"`
	FunctionCall     any    `json:"function_call"`
	ToolCalls        []any  `json:"tool_calls"`
	ReasoningContent any    `json:"reasoning_content"`
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   *openAIUsage      `json:"usage,omitempty"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     any       `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	// StopReason is set on a choice's last chunk only, as vLLM sets it
	// (and dumps the chunk with exclude_unset).
	StopReason json.RawMessage `json:"stop_reason,omitempty"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// handleChat serves POST /v1/chat/completions: n choices (index 0..n-1),
// each with its logprobs when asked, cut by the stop strings and stop
// tokens, after the last message with echo; the prompt's logprobs when
// asked.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	req, prompt, aerr := parseChatRequest(body)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	sp, aerr := req.chatSampling()
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	maxTokens := req.MaxCompletionTokens
	if maxTokens == nil {
		maxTokens = req.MaxTokens
	}
	salt, aerr := req.salt()
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	p, aerr := s.prepareSampled(r.URL.Path, req.Model, prompt, maxTokens, salt, sp)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	id, created := newID("chatcmpl-"), time.Now().Unix()
	lp := newLogprobs(p)
	role, echoed := req.role(), req.echoed()
	ctx := r.Context()
	if !req.Stream {
		g, err := s.start(ctx, p)
		if err != nil {
			return // the client is gone
		}
		err = g.drain(ctx)
		g.close(err)
		if err != nil {
			return
		}
		choices := make([]chatChoice, len(g.seqs))
		for i, q := range g.seqs {
			choices[i] = chatChoice{
				Index:        i,
				Message:      chatRespMessage{Role: role, Content: echoed + q.text, ToolCalls: []any{}},
				FinishReason: q.finish,
				StopReason:   stopReason(q),
			}
			if lp != nil {
				choices[i].Logprobs = lp.chat(q, 0, len(q.pieces))
			}
		}
		resp := chatCompletion{
			ID: id, Object: "chat.completion", Created: created, Model: p.model,
			Choices: choices, Usage: g.openAIUsage(),
		}
		if p.sampling.promptLogprobs != nil {
			resp.PromptLogprobs = newPromptLogprobs(p, tokenTexts(req.rendered))
		}
		writeJSON(w, http.StatusOK, resp)
		return
	}

	sse := startSSE(w)
	g, err := s.start(ctx, p)
	if err != nil {
		return
	}
	finalUsage, continuous := req.StreamOptions.usage()
	send := func(c chatChunkChoice) {
		if err == nil {
			ch := chatChunk{
				ID: id, Object: "chat.completion.chunk", Created: created, Model: p.model,
				Choices: []chatChunkChoice{c},
			}
			if continuous {
				ch.Usage = g.openAIUsage()
			}
			err = sse.write("", ch)
		}
	}
	// chat_completion_stream_generator (chat_completion/serving.py at
	// 006c49d485f9): each choice's role chunk first, then with echo each
	// choice's echoed message, then every step's tokens choice by choice,
	// a choice's finish right after its last token. No chunk carries the
	// prompt's logprobs.
	empty := ""
	for i := range g.seqs {
		send(chatChunkChoice{Index: i, Delta: chatDelta{Role: role, Content: &empty}})
	}
	if echoed != "" {
		for i := range g.seqs {
			send(chatChunkChoice{Index: i, Delta: chatDelta{Content: &echoed}})
		}
	}
	for err == nil {
		var moved []*sequence
		if moved, err = g.step(ctx); len(moved) == 0 || err != nil {
			break
		}
		for _, q := range moved {
			d := q.delta()
			c := chatChunkChoice{Index: q.index, Delta: chatDelta{Content: &d}}
			if lp != nil {
				c.Logprobs = lp.chat(q, q.emitted-1, q.emitted)
			}
			send(c)
			if q.done() {
				reason := q.finish
				stop, _ := json.Marshal(stopReason(q))
				send(chatChunkChoice{Index: q.index, FinishReason: &reason, StopReason: stop})
			}
		}
	}
	if err == nil && finalUsage {
		err = sse.write("", chatChunk{
			ID: id, Object: "chat.completion.chunk", Created: created, Model: p.model,
			Choices: []chatChunkChoice{}, Usage: g.openAIUsage(),
		})
	}
	if err == nil {
		err = sse.raw("data: [DONE]\n\n")
	}
	g.close(err)
}

// completionRequest is the part of a completion request the simulator
// reads.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	// Echo puts the prompt before each choice's text (and its tokens
	// before the logprobs'); Logprobs is the top logprobs count.
	Echo     bool            `json:"echo"`
	Logprobs json.RawMessage `json:"logprobs"`
	cacheSaltField
	samplingFields
}

// completionSampling returns the request's sampling with its logprobs,
// refusing a negative count other than -1 as CompletionRequest.
// check_logprobs does (vllm/entrypoints/openai/completion/protocol.py at
// 002032ee2b18). Its prompt logprobs are prompt_logprobs or, with echo,
// the logprobs count (CompletionRequest.to_sampling_params, same file),
// which every choice carries.
func (r *completionRequest) completionSampling() (sampling, *apiError) {
	if aerr := r.StreamOptions.check(r.Stream); aerr != nil {
		return sampling{}, aerr
	}
	sp, aerr := r.sampling()
	if aerr != nil {
		return sampling{}, aerr
	}
	sp.defaultMax = completionsDefaultMaxTokens
	if sp.promptLogprobs, aerr = r.promptLogprobsCount(r.Stream); aerr != nil {
		return sampling{}, aerr
	}
	if sp.logprobs, aerr = logprobsCount(r.Logprobs, "logprobs"); aerr != nil {
		return sampling{}, aerr
	}
	if k := sp.logprobs; k != nil && *k < -1 {
		return sampling{}, badParam("logprobs", "`logprobs` must be a positive value or -1.")
	}
	if sp.promptLogprobs == nil && r.Echo {
		sp.promptLogprobs = sp.logprobs
	}
	sp.promptCopies = sp.n
	if r.Echo && sp.logprobs != nil {
		sp.promptCopies *= 2
	}
	return sp, nil
}

// promptEcho is what a completion with echo puts before each choice: the
// prompt's text and its tokens' texts.
type promptEcho struct {
	text   string
	tokens []string
	// only is echo with max_tokens 0: the prompt alone, without the one
	// token vLLM still generates (and counts) for it.
	only bool
}

// newPromptEcho returns the echo of a completion's served prompt: a text
// prompt's (first) string, with its tokens as tokenTexts cuts them, or a
// token-id prompt detokenized.
func newPromptEcho(raw json.RawMessage, ids []uint32) *promptEcho {
	if text, ok := promptText(raw); ok {
		return &promptEcho{text: text, tokens: tokenTexts(text)}
	}
	tokens := detokenize(ids)
	return &promptEcho{text: strings.Join(tokens, ""), tokens: tokens}
}

// promptTokenTexts returns the texts of a completion's served prompt's
// tokens, as echo shows them.
func promptTokenTexts(raw json.RawMessage, ids []uint32) []string {
	return newPromptEcho(raw, ids).tokens
}

// promptText returns the first string of a string or string-array prompt.
func promptText(raw json.RawMessage) (string, bool) {
	var items []json.RawMessage
	switch firstByte(raw) {
	case '"':
		items = []json.RawMessage{raw}
	case '[':
		if json.Unmarshal(raw, &items) != nil || len(items) == 0 {
			return "", false
		}
	}
	var text string
	return text, len(items) > 0 && json.Unmarshal(items[0], &text) == nil
}

// completionOutput builds a completion's choices: their text after the
// echoed prompt, and their logprobs.
type completionOutput struct {
	echo *promptEcho // nil without echo
	lp   *logprobs   // nil without logprobs
}

// whole returns choice q's text and logprobs once it is done
// (request_output_to_completion_response, completion/serving.py at
// 030ea52effcb).
func (o completionOutput) whole(q *sequence) (string, *completionLogprobs) {
	if o.echo == nil {
		return q.text, o.logprobs(q, 0, false, 0, len(q.pieces))
	}
	if o.echo.only {
		return o.echo.text, o.logprobs(q, 0, true, 0, 0)
	}
	return o.echo.text + q.text, o.logprobs(q, 0, true, 0, len(q.pieces))
}

// chunk returns the text and logprobs of choice q's chunk for its latest
// token, the prompt first in its first chunk
// (completion_stream_generator); offset is the characters of the choice
// streamed so far.
func (o completionOutput) chunk(q *sequence, offset int) (string, *completionLogprobs) {
	text, from, to := q.delta(), q.emitted-1, q.emitted
	if o.echo == nil || q.emitted > 1 {
		return text, o.logprobs(q, offset, false, from, to)
	}
	if o.echo.only {
		return o.echo.text, o.logprobs(q, offset, true, 0, 0)
	}
	return o.echo.text + text, o.logprobs(q, offset, true, from, to)
}

// logprobs returns the logprobs of choice q's tokens [from, to), after
// the prompt's with prompt; nil without logprobs.
func (o completionOutput) logprobs(q *sequence, offset int, prompt bool, from, to int) *completionLogprobs {
	if o.lp == nil {
		return nil
	}
	c := newCompletionLogprobs(offset)
	if prompt {
		o.lp.addPrompt(c, o.echo.tokens)
	}
	o.lp.addOutput(c, q, from, to)
	return c
}

type completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	Choices           []completionChoice `json:"choices"`
	ServiceTier       *string            `json:"service_tier,omitempty"`
	SystemFingerprint *string            `json:"system_fingerprint,omitempty"`
	Usage             *openAIUsage       `json:"usage,omitempty"`
	KVTransferParams  any                `json:"kv_transfer_params,omitempty"`
}

type completionChoice struct {
	Index          int     `json:"index"`
	Text           string  `json:"text"`
	Logprobs       any     `json:"logprobs"`
	FinishReason   *string `json:"finish_reason"`
	StopReason     any     `json:"stop_reason"`
	PromptLogprobs any     `json:"prompt_logprobs,omitempty"`
}

// handleCompletions serves POST /v1/completions: n choices, each with its
// logprobs when asked, after the prompt with echo, cut by the stop
// strings and stop tokens, each with the prompt's logprobs when asked. Of
// several prompts only the first is served.
func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	var req completionRequest
	if aerr := decodeJSON(body, &req); aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	prompts, aerr := tokenInputs(req.Prompt, "prompt")
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	if len(prompts[0]) == 0 {
		errorf(http.StatusBadRequest, "prompt: must not be empty").writeOpenAI(w)
		return
	}
	sp, aerr := req.completionSampling()
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	salt, aerr := req.salt()
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	var out completionOutput
	maxTokens := req.MaxTokens
	if req.Echo {
		out.echo = newPromptEcho(req.Prompt, prompts[0])
		if maxTokens != nil && *maxTokens == 0 {
			// CompletionRequest.to_sampling_params: echo without
			// generation samples one token all the same.
			out.echo.only, maxTokens = true, new(1)
		}
	}
	p, aerr := s.prepareSampled(r.URL.Path, req.Model, prompts[0], maxTokens, salt, sp)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	out.lp = newLogprobs(p)
	var plp []promptPosition
	if p.sampling.promptLogprobs != nil && !req.Stream {
		plp = newPromptLogprobs(p, promptTokenTexts(req.Prompt, prompts[0]))
	}
	id, created := newID("cmpl-"), time.Now().Unix()
	ctx := r.Context()
	if !req.Stream {
		g, err := s.start(ctx, p)
		if err != nil {
			return
		}
		err = g.drain(ctx)
		g.close(err)
		if err != nil {
			return
		}
		choices := make([]completionChoice, len(g.seqs))
		for i, q := range g.seqs {
			text, lps := out.whole(q)
			choices[i] = completionChoice{Index: i, Text: text, FinishReason: &q.finish, StopReason: stopReason(q)}
			if lps != nil {
				choices[i].Logprobs = lps
			}
			if plp != nil {
				choices[i].PromptLogprobs = plp
			}
		}
		writeJSON(w, http.StatusOK, completion{
			ID: id, Object: "text_completion", Created: created, Model: p.model,
			Choices: choices, Usage: g.openAIUsage(),
		})
		return
	}

	sse := startSSE(w)
	g, err := s.start(ctx, p)
	if err != nil {
		return
	}
	finalUsage, continuous := req.StreamOptions.usage()
	send := func(c completionChoice) {
		if err == nil {
			ch := completion{
				ID: id, Object: "text_completion", Created: created, Model: p.model,
				Choices: []completionChoice{c},
			}
			if continuous {
				ch.Usage = g.openAIUsage()
			}
			err = sse.write("", ch)
		}
	}
	streamed := make([]int, len(g.seqs)) // characters sent, by choice
	for err == nil {
		var moved []*sequence
		if moved, err = g.step(ctx); len(moved) == 0 || err != nil {
			break
		}
		for _, q := range moved {
			text, lps := out.chunk(q, streamed[q.index])
			streamed[q.index] += utf8.RuneCountInString(text)
			c := completionChoice{Index: q.index, Text: text}
			if lps != nil {
				c.Logprobs = lps
			}
			send(c)
			if q.done() {
				send(completionChoice{Index: q.index, FinishReason: &q.finish, StopReason: stopReason(q)})
			}
		}
	}
	if err == nil && finalUsage {
		err = sse.write("", completion{
			ID: id, Object: "text_completion", Created: created, Model: p.model,
			Choices: []completionChoice{}, Usage: g.openAIUsage(),
		})
	}
	if err == nil {
		err = sse.raw("data: [DONE]\n\n")
	}
	g.close(err)
}

// embeddingRequest is the part of an embeddings request the simulator
// reads.
type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
}

type embeddingList struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Data    []embeddingData `json:"data"`
	Usage   openAIUsage     `json:"usage"`
}

type embeddingData struct {
	Index     int    `json:"index"`
	Object    string `json:"object"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

// handleEmbeddings serves POST /v1/embeddings with deterministic vectors
// (see embed). Embeddings skip the prefix cache and the latency model.
func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	var req embeddingRequest
	if aerr := decodeJSON(body, &req); aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	inputs, aerr := tokenInputs(req.Input, "input")
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		errorf(http.StatusBadRequest, "encoding_format: must be float or base64, got %q", req.EncodingFormat).writeOpenAI(w)
		return
	}
	model, ok := s.servedModel(req.Model)
	if !ok {
		errorf(http.StatusNotFound, "The model `%s` does not exist.", req.Model).writeOpenAI(w)
		return
	}
	total := 0
	for i, in := range inputs {
		if len(in) > s.opts.MaxModelLen {
			errorf(http.StatusBadRequest, "input[%d]: %d tokens exceed the maximum context length of %d tokens", i, len(in), s.opts.MaxModelLen).writeOpenAI(w)
			return
		}
		total += len(in)
	}
	if s.accept(r.URL.Path) {
		errInjected.writeOpenAI(w)
		return
	}
	s.mu.Lock()
	s.stats.promptTokens += uint64(total)
	s.mu.Unlock()
	resp := embeddingList{
		ID: newID("embd-"), Object: "list", Created: time.Now().Unix(), Model: model,
		Data:  make([]embeddingData, len(inputs)),
		Usage: openAIUsage{PromptTokens: total, TotalTokens: total},
	}
	for i, in := range inputs {
		vec := embed(in)
		var enc any = vec
		if req.EncodingFormat == "base64" {
			buf := make([]byte, 4*len(vec))
			for j, x := range vec {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(x))
			}
			enc = base64.StdEncoding.EncodeToString(buf)
		}
		resp.Data[i] = embeddingData{Index: i, Object: "embedding", Embedding: enc}
	}
	writeJSON(w, http.StatusOK, resp)
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen int               `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// handleModels serves GET /v1/models: one card per served name.
func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	list := modelList{Object: "list", Data: make([]modelCard, len(s.opts.Models))}
	for i, name := range s.opts.Models {
		list.Data[i] = modelCard{
			ID: name, Object: "model", Created: s.created, OwnedBy: "vllm",
			Root: s.opts.Models[0], MaxModelLen: s.opts.MaxModelLen,
			Permission: []modelPermission{{
				ID: "modelperm-" + name, Object: "model_permission", Created: s.created,
				AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
			}},
		}
	}
	writeJSON(w, http.StatusOK, list)
}

// tokenizeRequest is vLLM's /tokenize request, either form of its
// TokenizeRequest union (vllm/entrypoints/serve/tokenize/protocol.py): a
// prompt (TokenizeCompletionRequest) or chat messages rendered with the chat
// template (TokenizeChatRequest, with the template fields of a chat
// completion and their defaults). add_special_tokens is accepted and has no
// effect: the simulator's vocabulary has no special tokens (no BOS).
type tokenizeRequest struct {
	Model            string        `json:"model"`
	Prompt           *string       `json:"prompt"`
	Messages         []chatMessage `json:"messages"`
	AddSpecialTokens *bool         `json:"add_special_tokens"`
	ReturnTokenStrs  *bool         `json:"return_token_strs"`
	templateFields
}

// tokenizeResponse is vLLM's TokenizeResponse; token_strs is null unless
// return_token_strs is true.
type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// handleTokenize serves POST /tokenize: the token ids of a prompt, or of
// chat messages rendered exactly as a chat completion renders them.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	var req tokenizeRequest
	if aerr := decodeJSON(body, &req); aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	if _, ok := s.servedModel(req.Model); !ok {
		errorf(http.StatusNotFound, "The model `%s` does not exist.", req.Model).writeOpenAI(w)
		return
	}
	var text string
	switch {
	case req.Messages != nil:
		msgs, aerr := chatMessages(req.Messages)
		if aerr != nil {
			aerr.writeOpenAI(w)
			return
		}
		tmpl, aerr := req.template()
		if aerr != nil {
			aerr.writeOpenAI(w)
			return
		}
		text = RenderChatTemplate(msgs, tmpl)
	case req.Prompt != nil:
		text = *req.Prompt
	default:
		errorf(http.StatusBadRequest, "either prompt or messages is required").writeOpenAI(w)
		return
	}
	tokens := Tokenize(text)
	resp := tokenizeResponse{Count: len(tokens), MaxModelLen: s.opts.MaxModelLen, Tokens: tokens}
	if req.ReturnTokenStrs != nil && *req.ReturnTokenStrs {
		resp.TokenStrs = TokenStrings(text)
		if resp.TokenStrs == nil {
			resp.TokenStrs = []string{}
		}
	}
	writeJSON(w, http.StatusOK, resp)
}
