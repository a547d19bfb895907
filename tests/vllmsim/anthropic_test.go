package vllmsim_test

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"rolter.dev/tests/vllmsim"
)

type anthropicResponse struct {
	ID           string  `json:"id"`
	Type         string  `json:"type"`
	Role         string  `json:"role"`
	Model        string  `json:"model"`
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Content      []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	Usage struct {
		InputTokens          int `json:"input_tokens"`
		OutputTokens         int `json:"output_tokens"`
		CacheReadInputTokens int `json:"cache_read_input_tokens"`
	} `json:"usage"`
}

func TestMessages(t *testing.T) {
	withSystem := promptTokens(vllmsim.Message{Role: "system", Content: "be brief"}, vllmsim.Message{Role: "user", Content: "hello"})
	tests := []struct {
		name       string
		body       string
		wantInput  int
		wantOutput int
		wantStop   string
	}{
		{
			name:      "system string, max_tokens reached",
			body:      `{"model":"sim-model","max_tokens":4,"system":"be brief","messages":[{"role":"user","content":"hello"}]}`,
			wantInput: len(withSystem), wantOutput: 4, wantStop: "max_tokens",
		},
		{
			name:      "system as text blocks gives the same prompt",
			body:      `{"model":"sim-model","max_tokens":4,"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}`,
			wantInput: len(withSystem), wantOutput: 4, wantStop: "max_tokens",
		},
		{
			name:      "no max_tokens: default length, end_turn",
			body:      `{"model":"sim-model","messages":[{"role":"user","content":"hello"}]}`,
			wantInput: len(promptTokens(vllmsim.Message{Role: "user", Content: "hello"})), wantOutput: vllmsim.DefaultMaxTokens, wantStop: "end_turn",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{})
			resp := decode[anthropicResponse](t, post(t, ts, "/v1/messages", tc.body, http.StatusOK))
			if !strings.HasPrefix(resp.ID, "msg_") || resp.Type != "message" || resp.Role != "assistant" || resp.Model != "sim-model" {
				t.Errorf("envelope = %+v", resp)
			}
			if resp.StopReason != tc.wantStop || resp.StopSequence != nil {
				t.Errorf("stop_reason = %q, want %q", resp.StopReason, tc.wantStop)
			}
			if len(resp.Content) != 1 || resp.Content[0].Type != "text" || len(vllmsim.Tokenize(resp.Content[0].Text)) != tc.wantOutput {
				t.Errorf("content = %+v, want one text block of %d tokens", resp.Content, tc.wantOutput)
			}
			u := resp.Usage
			if u.InputTokens+u.CacheReadInputTokens != tc.wantInput || u.OutputTokens != tc.wantOutput {
				t.Errorf("usage = %+v, want %d input, %d output", u, tc.wantInput, tc.wantOutput)
			}
		})
	}
}

func TestMessagesStream(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	body := `{"model":"sim-model","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"stream please"}]}`
	events := parseSSE(t, post(t, ts, "/v1/messages", body, http.StatusOK))
	var names []string
	var text strings.Builder
	for _, e := range events {
		names = append(names, e.name)
		data := decode[map[string]any](t, []byte(e.data))
		if data["type"] != e.name {
			t.Errorf("event %q carries type %v", e.name, data["type"])
		}
		if e.name == "content_block_delta" {
			delta := data["delta"].(map[string]any)
			if delta["type"] != "text_delta" {
				t.Errorf("delta type %v", delta["type"])
			}
			text.WriteString(delta["text"].(string))
		}
		if e.name == "message_delta" {
			if d := data["delta"].(map[string]any); d["stop_reason"] != "max_tokens" {
				t.Errorf("message_delta stop_reason = %v", d["stop_reason"])
			}
			if u := data["usage"].(map[string]any); u["output_tokens"] != float64(3) {
				t.Errorf("message_delta usage = %v", u)
			}
		}
	}
	want := []string{"message_start", "content_block_start", "ping",
		"content_block_delta", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}
	if !slices.Equal(names, want) {
		t.Errorf("events = %v, want %v", names, want)
	}
	if got := len(vllmsim.Tokenize(text.String())); got != 3 {
		t.Errorf("streamed text %q has %d tokens, want 3", text.String(), got)
	}
}

func TestAnthropicSDK(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{BlockSize: 4})
	client := anthropic.NewClient(option.WithBaseURL(ts.URL), option.WithAPIKey("unused"),
		option.WithHTTPClient(ts.Client()), option.WithMaxRetries(0))
	params := anthropic.MessageNewParams{
		Model:     "sim-model",
		MaxTokens: 5,
		System:    []anthropic.TextBlockParam{{Text: "you are a terse assistant for tests"}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("say something"))},
	}
	msg, err := client.Messages.New(t.Context(), params)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if msg.StopReason != anthropic.StopReasonMaxTokens || msg.Usage.OutputTokens != 5 || msg.Content[0].Text == "" {
		t.Errorf("message = %+v", msg)
	}
	if msg.Usage.CacheReadInputTokens != 0 {
		t.Errorf("first request read %d cached tokens", msg.Usage.CacheReadInputTokens)
	}

	stream := client.Messages.NewStreaming(t.Context(), params)
	defer stream.Close()
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatalf("Accumulate: %v", err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if acc.Content[0].Text != msg.Content[0].Text || acc.StopReason != anthropic.StopReasonMaxTokens {
		t.Errorf("streamed %q (%s), non-streamed %q", acc.Content[0].Text, acc.StopReason, msg.Content[0].Text)
	}
	total := msg.Usage.InputTokens + msg.Usage.CacheReadInputTokens
	if acc.Usage.CacheReadInputTokens == 0 || acc.Usage.InputTokens+acc.Usage.CacheReadInputTokens != total {
		t.Errorf("second request usage = %+v, want a cache read out of %d input tokens", acc.Usage, total)
	}

	_, err = client.Messages.New(t.Context(), anthropic.MessageNewParams{
		Model: "nope", MaxTokens: 1,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))},
	})
	if apiErr, ok := errors.AsType[*anthropic.Error](err); !ok || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: err = %v, want a 404", err)
	}
}
