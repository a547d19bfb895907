package vllmsim_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"rolter.dev/tests/vllmsim"
)

type responseObject struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	CreatedAt         int64  `json:"created_at"`
	Status            string `json:"status"`
	Model             string `json:"model"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Status  string `json:"status"`
		Role    string `json:"role"`
		Content []struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			Annotations []any  `json:"annotations"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		TotalTokens        int `json:"total_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokensDetails struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
	} `json:"usage"`
}

func (r responseObject) text() string {
	if len(r.Output) == 0 || len(r.Output[0].Content) == 0 {
		return ""
	}
	return r.Output[0].Content[0].Text
}

func TestResponses(t *testing.T) {
	sysUser := promptTokens(vllmsim.Message{Role: "system", Content: "be brief"}, vllmsim.Message{Role: "user", Content: "hello"})
	tests := []struct {
		name       string
		body       string
		wantStatus string
		wantInput  int
		wantOutput int
	}{
		{
			name:       "string input with instructions completes",
			body:       `{"model":"sim-model","instructions":"be brief","input":"hello"}`,
			wantStatus: "completed", wantInput: len(sysUser), wantOutput: vllmsim.DefaultMaxTokens,
		},
		{
			name: "input items give the same prompt",
			body: `{"model":"sim-model","input":[{"role":"system","content":"be brief"},
				{"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}]}]}`,
			wantStatus: "completed", wantInput: len(sysUser), wantOutput: vllmsim.DefaultMaxTokens,
		},
		{
			name:       "max_output_tokens reached is incomplete",
			body:       `{"model":"sim-model","instructions":"be brief","input":"hello","max_output_tokens":3}`,
			wantStatus: "incomplete", wantInput: len(sysUser), wantOutput: 3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{})
			r := decode[responseObject](t, post(t, ts, "/v1/responses", tc.body, http.StatusOK))
			if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.CreatedAt == 0 || r.Model != "sim-model" {
				t.Errorf("envelope = %+v", r)
			}
			if r.Status != tc.wantStatus {
				t.Errorf("status = %q, want %q", r.Status, tc.wantStatus)
			}
			if (tc.wantStatus == "incomplete") != (r.IncompleteDetails != nil && r.IncompleteDetails.Reason == "max_output_tokens") {
				t.Errorf("incomplete_details = %+v", r.IncompleteDetails)
			}
			if len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" ||
				!strings.HasPrefix(r.Output[0].ID, "msg_") || r.Output[0].Status != tc.wantStatus ||
				len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" || r.Output[0].Content[0].Annotations == nil {
				t.Fatalf("output = %+v", r.Output)
			}
			if got := len(vllmsim.Tokenize(r.text())); got != tc.wantOutput {
				t.Errorf("output has %d tokens, want %d", got, tc.wantOutput)
			}
			u := r.Usage
			if u == nil || u.InputTokens != tc.wantInput || u.OutputTokens != tc.wantOutput || u.TotalTokens != tc.wantInput+tc.wantOutput {
				t.Errorf("usage = %+v, want input %d output %d", u, tc.wantInput, tc.wantOutput)
			}
		})
	}
}

func TestResponsesStream(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	whole := decode[responseObject](t, post(t, ts, "/v1/responses", `{"model":"sim-model","input":"tell me","max_output_tokens":2}`, http.StatusOK))
	events := parseSSE(t, post(t, ts, "/v1/responses", `{"model":"sim-model","input":"tell me","max_output_tokens":2,"stream":true}`, http.StatusOK))
	var names []string
	var text strings.Builder
	var final responseObject
	for i, e := range events {
		names = append(names, e.name)
		data := decode[map[string]any](t, []byte(e.data))
		if data["type"] != e.name || data["sequence_number"] != float64(i) {
			t.Errorf("event %d %q: type %v sequence_number %v", i, e.name, data["type"], data["sequence_number"])
		}
		switch e.name {
		case "response.output_text.delta":
			text.WriteString(data["delta"].(string))
		case "response.incomplete", "response.completed":
			final = decode[struct {
				Response responseObject `json:"response"`
			}](t, []byte(e.data)).Response
		}
	}
	want := []string{
		"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.done",
		"response.content_part.done", "response.output_item.done", "response.incomplete",
	}
	if !slices.Equal(names, want) {
		t.Errorf("events = %v\nwant %v", names, want)
	}
	if text.String() != whole.text() || final.text() != whole.text() {
		t.Errorf("streamed %q, final %q, non-streamed %q", text.String(), final.text(), whole.text())
	}
	if final.Usage == nil || final.Usage.OutputTokens != 2 || final.Status != "incomplete" {
		t.Errorf("final response = %+v", final)
	}
}

func TestResponsesPreviousResponseID(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{BlockSize: 4})
	first := decode[responseObject](t, post(t, ts, "/v1/responses",
		`{"model":"sim-model","instructions":"be brief","input":"what is a prefix cache"}`, http.StatusOK))

	second := decode[responseObject](t, post(t, ts, "/v1/responses",
		`{"model":"sim-model","instructions":"be brief","previous_response_id":"`+first.ID+`","input":"and a block"}`, http.StatusOK))
	wantPrompt := promptTokens(
		vllmsim.Message{Role: "system", Content: "be brief"},
		vllmsim.Message{Role: "user", Content: "what is a prefix cache"},
		vllmsim.Message{Role: "assistant", Content: first.text()},
		vllmsim.Message{Role: "user", Content: "and a block"},
	)
	if second.Usage.InputTokens != len(wantPrompt) {
		t.Errorf("input_tokens = %d, want %d (the previous turn is part of the prompt)", second.Usage.InputTokens, len(wantPrompt))
	}
	if second.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Errorf("continuing a conversation hit no cached tokens")
	}

	status, b := do(t, ts, http.MethodPost, "/v1/responses", `{"model":"sim-model","previous_response_id":"resp_unknown","input":"x"}`)
	if status != http.StatusNotFound || !strings.Contains(string(b), "NotFoundError") {
		t.Errorf("unknown previous_response_id: %d %s", status, b)
	}
	_, other := newServer(t, vllmsim.Options{})
	status, _ = do(t, other, http.MethodPost, "/v1/responses", `{"model":"sim-model","previous_response_id":"`+first.ID+`","input":"x"}`)
	if status != http.StatusNotFound {
		t.Errorf("another replica knows response %s: status %d", first.ID, status)
	}
}

func TestResponsesSDK(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("unused"),
		option.WithHTTPClient(ts.Client()), option.WithMaxRetries(0))
	params := responses.ResponseNewParams{
		Model:        "sim-model",
		Instructions: openai.String("be brief"),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("hello sdk")},
	}
	resp, err := client.Responses.New(t.Context(), params)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if resp.Status != responses.ResponseStatusCompleted || len(vllmsim.Tokenize(resp.OutputText())) != vllmsim.DefaultMaxTokens {
		t.Errorf("response = status %s text %q", resp.Status, resp.OutputText())
	}
	if resp.Usage.OutputTokens != vllmsim.DefaultMaxTokens || resp.Usage.InputTokens == 0 {
		t.Errorf("usage = %+v", resp.Usage)
	}

	stream := client.Responses.NewStreaming(t.Context(), params)
	defer stream.Close()
	var deltas strings.Builder
	var completed *responses.Response
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.AsResponseOutputTextDelta().Delta)
		case "response.completed":
			r := ev.AsResponseCompleted().Response
			completed = &r
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if completed == nil {
		t.Fatalf("no response.completed event")
	}
	if deltas.String() != resp.OutputText() || completed.OutputText() != resp.OutputText() {
		t.Errorf("streamed %q, completed %q, non-streamed %q", deltas.String(), completed.OutputText(), resp.OutputText())
	}
	if completed.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Errorf("the repeated prompt hit no cached tokens: %+v", completed.Usage)
	}
}
