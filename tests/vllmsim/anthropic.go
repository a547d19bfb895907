package vllmsim

import (
	"encoding/json"
	"net/http"
)

// This file holds the Anthropic Messages API endpoint, which vLLM also
// serves. Its errors use the Anthropic dialect.

// messagesRequest is the part of an Anthropic Messages request the
// simulator reads.
type messagesRequest struct {
	Model     string          `json:"model"`
	System    json.RawMessage `json:"system"` // a string or an array of text blocks
	Messages  []chatMessage   `json:"messages"`
	MaxTokens *int            `json:"max_tokens"`
	Stream    bool            `json:"stream"`
}

// parseMessagesRequest decodes and checks a Messages request body and
// returns it with its prompt tokens: the system prompt (if any) as a
// "system" turn, then the messages, through the shared chat template.
func parseMessagesRequest(body []byte) (*messagesRequest, []uint32, *apiError) {
	var req messagesRequest
	if aerr := decodeJSON(body, &req); aerr != nil {
		return nil, nil, aerr
	}
	if len(req.Messages) == 0 {
		return nil, nil, errorf(http.StatusBadRequest, "messages: must not be empty")
	}
	system, aerr := contentText(req.System, "system")
	if aerr != nil {
		return nil, nil, aerr
	}
	var msgs []Message
	if system != "" {
		msgs = append(msgs, Message{Role: "system", Content: system})
	}
	turns, aerr := chatMessages(req.Messages)
	if aerr != nil {
		return nil, nil, aerr
	}
	return &req, Tokenize(ChatPrompt(append(msgs, turns...))), nil
}

// anthropicUsage follows the Anthropic convention: input_tokens counts only
// the prompt tokens that were not read from the cache, and
// cache_read_input_tokens the ones that were.
type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

type anthropicMessage struct {
	ID           string           `json:"id"`
	Type         string           `json:"type"`
	Role         string           `json:"role"`
	Model        string           `json:"model"`
	Content      []anthropicBlock `json:"content"`
	StopReason   *string          `json:"stop_reason"`
	StopSequence *string          `json:"stop_sequence"`
	Usage        anthropicUsage   `json:"usage"`
}

type anthropicBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// stopReason is the Anthropic stop_reason of a completed generation.
func (g *generation) stopReason() string {
	if g.p.length {
		return "max_tokens"
	}
	return "end_turn"
}

func (g *generation) anthropicUsage() anthropicUsage {
	return anthropicUsage{
		InputTokens:          len(g.p.prompt) - g.cached,
		CacheReadInputTokens: g.cached,
		OutputTokens:         g.emitted,
	}
}

// Events of the Anthropic stream.
type (
	messageStartEvent struct {
		Type    string           `json:"type"`
		Message anthropicMessage `json:"message"`
	}
	contentBlockStartEvent struct {
		Type         string         `json:"type"`
		Index        int            `json:"index"`
		ContentBlock anthropicBlock `json:"content_block"`
	}
	contentBlockDeltaEvent struct {
		Type  string    `json:"type"`
		Index int       `json:"index"`
		Delta textDelta `json:"delta"`
	}
	textDelta struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	indexEvent struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}
	messageDeltaEvent struct {
		Type  string         `json:"type"`
		Delta stopDelta      `json:"delta"`
		Usage anthropicUsage `json:"usage"`
	}
	stopDelta struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	typeEvent struct {
		Type string `json:"type"`
	}
)

// handleMessages serves POST /v1/messages. max_tokens, required by
// Anthropic, falls back to MaxTokensDefault when absent.
func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.writeAnthropic(w)
		return
	}
	req, prompt, aerr := parseMessagesRequest(body)
	if aerr != nil {
		aerr.writeAnthropic(w)
		return
	}
	p, aerr := s.prepare(r.URL.Path, req.Model, prompt, req.MaxTokens)
	if aerr != nil {
		aerr.writeAnthropic(w)
		return
	}
	id := newID("msg_")
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
		reason := g.stopReason()
		writeJSON(w, http.StatusOK, anthropicMessage{
			ID: id, Type: "message", Role: "assistant", Model: p.model,
			Content:    []anthropicBlock{{Type: "text", Text: g.text()}},
			StopReason: &reason,
			Usage:      g.anthropicUsage(),
		})
		return
	}

	sse := startSSE(w)
	g, err := s.start(ctx, p)
	if err != nil {
		return
	}
	start := g.anthropicUsage()
	start.OutputTokens = 0
	err = sse.write("message_start", messageStartEvent{Type: "message_start", Message: anthropicMessage{
		ID: id, Type: "message", Role: "assistant", Model: p.model,
		Content: []anthropicBlock{}, Usage: start,
	}})
	if err == nil {
		err = sse.write("content_block_start", contentBlockStartEvent{
			Type: "content_block_start", ContentBlock: anthropicBlock{Type: "text"},
		})
	}
	if err == nil {
		err = sse.write("ping", typeEvent{Type: "ping"})
	}
	for err == nil {
		var piece string
		var ok bool
		if piece, ok, err = g.next(ctx); !ok || err != nil {
			break
		}
		err = sse.write("content_block_delta", contentBlockDeltaEvent{
			Type: "content_block_delta", Delta: textDelta{Type: "text_delta", Text: piece},
		})
	}
	if err == nil {
		err = sse.write("content_block_stop", indexEvent{Type: "content_block_stop"})
	}
	if err == nil {
		err = sse.write("message_delta", messageDeltaEvent{
			Type:  "message_delta",
			Delta: stopDelta{StopReason: g.stopReason()},
			Usage: g.anthropicUsage(),
		})
	}
	if err == nil {
		err = sse.write("message_stop", typeEvent{Type: "message_stop"})
	}
	g.close(err)
}
