package vllmsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// This file holds the Anthropic Messages API endpoint, which vLLM also
// serves. Its errors use the Anthropic dialect.

// messagesRequest is the part of an Anthropic Messages request the
// simulator reads.
type messagesRequest struct {
	Model     string          `json:"model"`
	System    json.RawMessage `json:"system"` // a string or an array of blocks
	Messages  []chatMessage   `json:"messages"`
	Tools     []anthropicTool `json:"tools"`
	MaxTokens *int            `json:"max_tokens"`
	Stream    bool            `json:"stream"`
	// OutputConfig's effort is the chat completion's reasoning_effort.
	OutputConfig *struct {
		Effort *string `json:"effort"`
	} `json:"output_config"`
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
}

// anthropicTool is a tool definition of the Messages API.
type anthropicTool struct {
	Name         string          `json:"name"`
	Description  json.RawMessage `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	DeferLoading json.RawMessage `json:"defer_loading"`
}

// anthropicBlockIn is a content block of a Messages request: the fields
// vLLM's conversion reads.
type anthropicBlockIn struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Source    json.RawMessage `json:"source"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"` // a tool_result's
	ToolName  string          `json:"tool_name"`
	Name      string          `json:"name"`
}

// billingHeader starts the system text block Claude Code sends with a
// per-request hash; vLLM leaves it out of the prompt.
const billingHeader = "x-anthropic-billing-header"

// parseMessagesRequest decodes and checks a Messages request body and
// returns it with its prompt tokens. Like vLLM
// (vllm/entrypoints/anthropic/serving.py,
// _convert_anthropic_to_openai_request) it converts the request to chat
// messages and tools, then renders them as a chat completion with the same
// messages and tools would be: the system texts (the top-level system, then
// messages of role system) joined with "" as one system message; each other
// message with its text blocks as text parts, a user's tool results as tool
// messages before it (their text items joined with "\n"), an assistant's as
// "Tool result: " text; a user message left with no content dropped.
func parseMessagesRequest(body []byte) (*messagesRequest, []uint32, *apiError) {
	var req messagesRequest
	if aerr := decodeJSON(body, &req); aerr != nil {
		return nil, nil, aerr
	}
	if len(req.Messages) == 0 {
		return nil, nil, errorf(http.StatusBadRequest, "messages: must not be empty")
	}
	var system []string
	if aerr := systemTexts(req.System, "system", &system); aerr != nil {
		return nil, nil, aerr
	}
	for i, m := range req.Messages {
		if m.Role == "system" {
			if aerr := systemTexts(m.Content, fmt.Sprintf("messages[%d].content", i), &system); aerr != nil {
				return nil, nil, aerr
			}
		}
	}
	var chat []chatMessage
	if len(system) > 0 {
		chat = append(chat, textMessage("system", strings.Join(system, "")))
	}
	for i, m := range req.Messages {
		switch m.Role {
		case "system":
			continue
		case "user", "assistant":
		default:
			return nil, nil, errorf(http.StatusBadRequest, "messages[%d].role: must be user, assistant or system", i)
		}
		var aerr *apiError
		if chat, aerr = convertTurn(chat, m, fmt.Sprintf("messages[%d].content", i)); aerr != nil {
			return nil, nil, aerr
		}
	}
	msgs, aerr := chatMessages(chat)
	if aerr != nil {
		return nil, nil, aerr
	}
	tools, aerr := convertTools(req.Tools)
	if aerr != nil {
		return nil, nil, aerr
	}
	f := templateFields{Tools: tools, ChatTemplateKwargs: req.ChatTemplateKwargs}
	var effort *string
	if req.OutputConfig != nil {
		effort = req.OutputConfig.Effort
	}
	if aerr := f.addKwargs(nil, effort, true); aerr != nil {
		return nil, nil, aerr
	}
	tmpl, aerr := f.template()
	if aerr != nil {
		return nil, nil, aerr
	}
	return &req, Tokenize(RenderChatTemplate(msgs, tmpl)), nil
}

// textMessage is a chat message whose content is text.
func textMessage(role, text string) chatMessage {
	c, _ := json.Marshal(text)
	return chatMessage{Role: role, Content: c}
}

// systemTexts appends a system content's texts to dst: a string whole (the
// top-level one only when not empty), the non-empty text blocks of an
// array but the billing header's.
func systemTexts(raw json.RawMessage, field string, dst *[]string) *apiError {
	switch firstByte(raw) {
	case 0, 'n':
		return nil
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return errorf(http.StatusBadRequest, "%s: %v", field, err)
		}
		if s != "" || field != "system" {
			*dst = append(*dst, s)
		}
		return nil
	}
	var blocks []anthropicBlockIn
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return errorf(http.StatusBadRequest, "%s: %v", field, err)
	}
	for _, b := range blocks {
		if b.Type == "text" && b.Text != nil && *b.Text != "" && !strings.HasPrefix(*b.Text, billingHeader) {
			*dst = append(*dst, *b.Text)
		}
	}
	return nil
}

// convertTurn appends the chat messages of one user or assistant message.
func convertTurn(chat []chatMessage, m chatMessage, field string) ([]chatMessage, *apiError) {
	switch firstByte(m.Content) {
	case '"':
		return append(chat, m), nil
	case '[':
	default:
		return nil, errorf(http.StatusBadRequest, "%s: must be a string or an array of content blocks", field)
	}
	var blocks []anthropicBlockIn
	if err := json.Unmarshal(m.Content, &blocks); err != nil {
		return nil, errorf(http.StatusBadRequest, "%s: %v", field, err)
	}
	var parts []map[string]any
	for _, b := range blocks {
		switch b.Type {
		case "text":
			if b.Text != nil && *b.Text != "" {
				parts = append(parts, map[string]any{"type": "text", "text": *b.Text})
			}
		case "image":
			if len(b.Source) > 0 {
				parts = append(parts, map[string]any{"type": "image_url"})
			}
		case "tool_result":
			if m.Role != "user" {
				var s string
				if json.Unmarshal(b.Content, &s) != nil {
					s = string(b.Content) // Python prints a list as its repr; the simulator as JSON
				}
				parts = append(parts, map[string]any{"type": "text", "text": "Tool result: " + s})
				continue
			}
			var extra []chatMessage
			text := ""
			var items []anthropicBlockIn
			if json.Unmarshal(b.Content, &text) != nil && json.Unmarshal(b.Content, &items) == nil {
				var texts []string
				for _, it := range items {
					switch it.Type {
					case "text":
						texts = append(texts, deref(it.Text))
					case "image":
						extra = append(extra, chatMessage{Role: "user", Content: json.RawMessage(`[{"type":"image_url"}]`)})
					case "tool_reference":
						extra = append(extra, chatMessage{Role: "tool", Content: json.RawMessage(`[{"type":"tool_reference"}]`)})
					}
				}
				text = strings.Join(texts, "\n")
			}
			chat = append(append(chat, textMessage("tool", text)), extra...)
		}
		// thinking, tool_use and the rest: not in the simulator's template
	}
	switch {
	case len(parts) == 1 && parts[0]["type"] == "text":
		return append(chat, textMessage(m.Role, parts[0]["text"].(string))), nil
	case len(parts) > 0:
		c, _ := json.Marshal(parts)
		return append(chat, chatMessage{Role: m.Role, Content: c}), nil
	case m.Role == "user":
		return chat, nil
	}
	return append(chat, chatMessage{Role: m.Role}), nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// convertTools converts Anthropic tools to the chat form vLLM renders:
// {"type":"function","function":{"name","description","parameters",
// "defer_loading"}}, the schema given "type": "object" when it has none.
func convertTools(tools []anthropicTool) (json.RawMessage, *apiError) {
	if tools == nil {
		return nil, nil
	}
	out := make([]map[string]any, len(tools))
	for i, t := range tools {
		var schema map[string]any
		if err := json.Unmarshal(t.InputSchema, &schema); err != nil || schema == nil {
			return nil, errorf(http.StatusBadRequest, "tools[%d].input_schema: must be an object", i)
		}
		if _, ok := schema["type"]; !ok {
			schema["type"] = "object"
		}
		fn := map[string]any{"name": t.Name, "description": t.Description, "parameters": schema}
		if len(t.DeferLoading) > 0 && string(t.DeferLoading) != "null" {
			fn["defer_loading"] = t.DeferLoading
		}
		out[i] = map[string]any{"type": "function", "function": fn}
	}
	b, _ := json.Marshal(out)
	return b, nil
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
	p, aerr := s.prepare(r.URL.Path, req.Model, prompt, req.MaxTokens, "")
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
