package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"rolter.dev/pkg/config"
)

// countTokensPath is Anthropic's token-counting endpoint.
const countTokensPath = "/v1/messages/count_tokens"

// serveCountTokens answers POST /v1/messages/count_tokens: forwarded to an
// anthropic target of the model (which counts exactly), else counted by an
// engine target's /tokenize on the messages rendered with its chat template
// (vLLM's tokenizer and template, the tokens the engine would see), else an
// error. Every answer is in Anthropic's shape.
func (p *Proxy) serveCountTokens(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	model, status := "", 0
	defer func() {
		p.metrics.Requests.WithLabelValues(countTokensPath, model, strconv.Itoa(status), "").Inc() // a count is no variant's answer
		p.log.LogAttrs(r.Context(), slog.LevelInfo, "request", slog.String("request_id", w.Header().Get("X-Request-Id")),
			slog.String("endpoint", countTokensPath), slog.String("model", model), slog.Int("status", status),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
	}()
	rt, cb := p.watchRequest(r, start)
	fail := func(e apiError, msg string) {
		status = e.status
		refuse(w, r, cb, dialectAnthropic, e, msg)
	}
	if e, msg := p.unavailable(rt); e != nil {
		fail(*e, msg)
		return
	}
	key, aerr, msg := p.authenticate(rt, r)
	if aerr != nil {
		fail(*aerr, msg)
		return
	}
	raw, berr, msg := readBody(w, r, cb, rt.snap.Server.MaxBodyBytes)
	if berr != nil {
		fail(*berr, msg)
		return
	}
	// The checks every endpoint makes (JSON object, one model string),
	// then the fields counted here.
	if _, perr, msg := parseRequest(raw); perr != nil {
		fail(*perr, msg)
		return
	}
	var req countTokensRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		msg := "request body is not a valid count_tokens request"
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			msg = fmt.Sprintf("%s: the field %s cannot be a JSON %s", msg, ute.Field, ute.Value)
		}
		fail(errInvalidRequest, msg)
		return
	}
	rte := rt.routes[req.Model]
	if rte == nil {
		fail(errModelNotFound, fmt.Sprintf("model %q does not exist", echoedName(req.Model)))
		return
	}
	model = req.Model
	if key != nil && !key.AllowsModel(req.Model) {
		p.metrics.AuthFailures.WithLabelValues("model_not_allowed").Inc()
		fail(errModelNotAllowed, fmt.Sprintf("this key may not use model %q", req.Model))
		return
	}
	var hosted, engines []*target
	// Every variant's targets, in config order: a count needs no split.
	for _, pl := range rte.pools {
		for i := range pl.targets {
			t := &pl.targets[i]
			if key != nil && !key.AllowsProvider(t.cfg.Provider.Name) {
				continue
			}
			switch t.cfg.Provider.Kind {
			case config.KindAnthropic:
				hosted = append(hosted, t)
			case config.KindOpenAICompatible:
				engines = append(engines, t)
			}
		}
	}
	if len(hosted) == 0 && len(engines) == 0 {
		fail(errUnsupported, fmt.Sprintf("no target of model %q can count tokens: that needs an anthropic provider or an engine serving /tokenize (openai_compatible)", req.Model))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(rt.snap.Timeouts.RequestSecs)*time.Second)
	defer cancel()
	ctx, stop := p.untilHalt(ctx)
	defer stop(nil)
	var lastErr string
	for _, t := range hosted {
		resp, err := p.countHosted(ctx, r, w.Header().Get("X-Request-Id"), t, raw)
		if err != nil {
			lastErr = err.Error()
			continue
		}
		status = resp.status
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(resp.body)))
		w.WriteHeader(resp.status)
		_, _ = w.Write(resp.body)
		return
	}
	if len(engines) > 0 && !halted(ctx) {
		msgs, err := req.chatMessages()
		if err != nil {
			fail(errInvalidRequest, err.Error())
			return
		}
		for _, t := range engines {
			n, err := p.countOnEngine(ctx, w.Header().Get("X-Request-Id"), t, msgs, req.Tools)
			if err != nil {
				lastErr = err.Error()
				continue
			}
			b, _ := json.Marshal(map[string]int{"input_tokens": n})
			status = http.StatusOK
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			_, _ = w.Write(b)
			return
		}
	}
	if halted(ctx) {
		// No target failed; the targets left were not asked (their calls
		// fail at once on the cancelled context).
		fail(errShuttingDown, msgShuttingDown)
		return
	}
	fail(errUpstream, fmt.Sprintf("no target of model %q could count the tokens (last: %s)", req.Model, lastErr))
}

// countTokensRequest is the part of Anthropic's count_tokens body read here.
type countTokensRequest struct {
	Model    string            `json:"model"`
	System   json.RawMessage   `json:"system"`
	Messages []json.RawMessage `json:"messages"`
	Tools    []anthropicTool   `json:"tools"`
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatMessages renders the Anthropic messages as the OpenAI chat messages an
// engine's chat template takes: the system prompt first, each message's text
// blocks joined, tool calls and results as their text. Blocks that have no
// text (images, documents) cannot be counted this way: an error says so.
func (req *countTokensRequest) chatMessages() ([]chatMessage, error) {
	var out []chatMessage
	if len(req.System) > 0 && string(req.System) != "null" {
		s, err := blocksText(req.System, false)
		if err != nil {
			return nil, fmt.Errorf("system: %w", err)
		}
		out = append(out, chatMessage{Role: "system", Content: s})
	}
	if len(req.Messages) == 0 {
		return nil, fmt.Errorf("messages: at least one message is required")
	}
	for i, m := range req.Messages {
		var msg struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(m, &msg); err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		if msg.Role != "user" && msg.Role != "assistant" {
			return nil, fmt.Errorf("messages[%d].role: must be \"user\" or \"assistant\", got %q", i, msg.Role)
		}
		s, err := blocksText(msg.Content, false)
		if err != nil {
			return nil, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		out = append(out, chatMessage{Role: msg.Role, Content: s})
	}
	return out, nil
}

// blocksText is the text of a string or of an array of content blocks;
// inResult tells that raw is a tool_result's content, which holds no tool
// blocks (as in Anthropic's API): one level of nesting at most, so a
// request is decoded in one pass however deep a hostile one nests.
func blocksText(raw json.RawMessage, inResult bool) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var blocks []struct {
		Type    string          `json:"type"`
		Text    string          `json:"text"`
		Name    string          `json:"name"`
		Input   json.RawMessage `json:"input"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", fmt.Errorf("must be a string or an array of content blocks")
	}
	var b strings.Builder
	for i, bl := range blocks {
		if i > 0 {
			b.WriteByte('\n')
		}
		if inResult && (bl.Type == "tool_use" || bl.Type == "tool_result") {
			return "", fmt.Errorf("a tool_result's content cannot hold a %q block", bl.Type)
		}
		switch bl.Type {
		case "text":
			b.WriteString(bl.Text)
		case "tool_use":
			b.WriteString(bl.Name)
			b.WriteByte(' ')
			b.Write(bl.Input)
		case "tool_result":
			if len(bl.Content) > 0 {
				t, err := blocksText(bl.Content, true)
				if err != nil {
					return "", err
				}
				b.WriteString(t)
			}
		default:
			return "", fmt.Errorf("a %q block cannot be counted by the engine's tokenizer (only text, tool_use and tool_result); route the model to an anthropic provider for exact counts", bl.Type)
		}
	}
	return b.String(), nil
}

type hostedAnswer struct {
	status int
	body   []byte
}

// countHosted forwards the request to an anthropic provider. A transport
// error or a 5xx is an error (the next target is tried); any other answer
// is the provider's and returned as it is.
func (p *Proxy) countHosted(ctx context.Context, r *http.Request, id string, t *target, raw []byte) (*hostedAnswer, error) {
	prov := t.cfg.Provider
	var body map[string]json.RawMessage
	if err := json.Unmarshal(raw, &body); err != nil {
		return nil, err
	}
	body["model"], _ = json.Marshal(t.cfg.Model)
	payload, _ := json.Marshal(body) // a map of raw messages that just parsed
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, upstreamURL(prov.APIBase, countTokensPath), bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	if prov.APIKey != "" {
		req.Header.Set("X-Api-Key", prov.APIKey)
	}
	v := r.Header.Get("Anthropic-Version")
	if v == "" {
		v = prov.AnthropicVersion
	}
	req.Header.Set("Anthropic-Version", v)
	if b := r.Header.Get("Anthropic-Beta"); b != "" {
		req.Header.Set("Anthropic-Beta", b)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", prov.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", prov.Name, err)
	}
	if resp.StatusCode >= 500 {
		return nil, fmt.Errorf("%s: status %d", prov.Name, resp.StatusCode)
	}
	return &hostedAnswer{status: resp.StatusCode, body: b}, nil
}

// countOnEngine asks an engine's /tokenize (vLLM: POST /tokenize at the
// server root, taking chat messages and rendering them with the model's
// chat template) how many tokens the messages are.
func (p *Proxy) countOnEngine(ctx context.Context, id string, t *target, msgs []chatMessage, tools []anthropicTool) (int, error) {
	prov := t.cfg.Provider
	body := map[string]any{"model": t.cfg.Model, "messages": msgs, "add_generation_prompt": true}
	if len(tools) > 0 {
		var ts []map[string]any
		for _, tl := range tools {
			ts = append(ts, map[string]any{"type": "function", "function": map[string]any{
				"name": tl.Name, "description": tl.Description, "parameters": tl.InputSchema}})
		}
		body["tools"] = ts
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	url := strings.TrimSuffix(strings.TrimSuffix(prov.APIBase, "/"), "/v1") + "/tokenize"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	if prov.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+prov.APIKey)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", prov.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: /tokenize answered %d", prov.Name, resp.StatusCode)
	}
	var out struct {
		Count *int `json:"count"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out); err != nil || out.Count == nil {
		return 0, fmt.Errorf("%s: /tokenize answer has no count", prov.Name)
	}
	return *out.Count, nil
}
