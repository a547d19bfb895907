package vllmsim_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"rolter.dev/tests/vllmsim"
)

type openAIUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type chatResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage openAIUsage `json:"usage"`
}

type chatChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *openAIUsage `json:"usage"`
}

func TestChatCompletions(t *testing.T) {
	hello := promptTokens(vllmsim.Message{Role: "user", Content: "hello there"})
	tests := []struct {
		name         string
		body         string
		wantPrompt   int
		wantTokens   int
		wantFinish   string
		wantModelOut string
	}{
		{
			name:       "max_tokens sets the length and finish reason length",
			body:       chatBody("sim-model", "hello there", `"max_tokens":5`),
			wantPrompt: len(hello), wantTokens: 5, wantFinish: "length", wantModelOut: "sim-model",
		},
		{
			name:       "no max_tokens: default length and finish reason stop",
			body:       chatBody("sim-model", "hello there", ""),
			wantPrompt: len(hello), wantTokens: vllmsim.DefaultMaxTokens, wantFinish: "stop", wantModelOut: "sim-model",
		},
		{
			name:       "max_completion_tokens wins over max_tokens",
			body:       chatBody("sim-model", "hello there", `"max_tokens":9,"max_completion_tokens":3`),
			wantPrompt: len(hello), wantTokens: 3, wantFinish: "length", wantModelOut: "sim-model",
		},
		{
			name:       "omitted model means the served model",
			body:       `{"messages":[{"role":"user","content":"hello there"}],"max_tokens":2}`,
			wantPrompt: len(hello), wantTokens: 2, wantFinish: "length", wantModelOut: "sim-model",
		},
		{
			name: "text parts are joined with newlines, other parts ignored",
			body: `{"model":"sim-model","max_tokens":1,"messages":[{"role":"system","content":null},{"role":"user","content":[
				{"type":"text","text":"hello"},{"type":"image_url","image_url":{"url":"data:,"}},{"type":"text","text":"there"}]}]}`,
			wantPrompt: len(promptTokens(vllmsim.Message{Role: "system"}, vllmsim.Message{Role: "user", Content: "hello\nthere"})),
			wantTokens: 1, wantFinish: "length", wantModelOut: "sim-model",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{})
			resp := decode[chatResponse](t, post(t, ts, "/v1/chat/completions", tc.body, http.StatusOK))
			if !strings.HasPrefix(resp.ID, "chatcmpl-") || resp.Object != "chat.completion" || resp.Created == 0 || resp.Model != tc.wantModelOut {
				t.Errorf("envelope = id %q object %q created %d model %q", resp.ID, resp.Object, resp.Created, resp.Model)
			}
			if len(resp.Choices) != 1 {
				t.Fatalf("got %d choices", len(resp.Choices))
			}
			c := resp.Choices[0]
			if c.Message.Role != "assistant" || c.FinishReason != tc.wantFinish {
				t.Errorf("choice = role %q finish %q, want assistant %q", c.Message.Role, c.FinishReason, tc.wantFinish)
			}
			if got := len(vllmsim.Tokenize(c.Message.Content)); got != tc.wantTokens {
				t.Errorf("content %q has %d tokens, want %d", c.Message.Content, got, tc.wantTokens)
			}
			u := resp.Usage
			if u.PromptTokens != tc.wantPrompt || u.CompletionTokens != tc.wantTokens || u.TotalTokens != tc.wantPrompt+tc.wantTokens {
				t.Errorf("usage = %+v, want prompt %d completion %d", u, tc.wantPrompt, tc.wantTokens)
			}
			if u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens != 0 {
				t.Errorf("prompt_tokens_details = %+v, want cached_tokens 0", u.PromptTokensDetails)
			}
		})
	}
}

// TestStreamOptionsOnlyWhenStreaming: stream options on a request that does
// not stream are vLLM's 400, but for an empty object, which Python reads as
// false.
func TestStreamOptionsOnlyWhenStreaming(t *testing.T) {
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := func(opts string) string {
			if path == "/v1/completions" {
				return `{"model":"sim-model","prompt":"hi","max_tokens":2,"stream_options":` + opts + `}`
			}
			return `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream_options":` + opts + `}`
		}
		b := errorCase(t, vllmsim.Options{}, "", path, body(`{"include_usage":true}`), http.StatusBadRequest)
		if !strings.Contains(string(b), "Stream options can only be defined when `stream=True`.") {
			t.Errorf("%s: %s", path, b)
		}
		_, ts := newServer(t, vllmsim.Options{})
		post(t, ts, path, body(`{}`), http.StatusOK)
		post(t, ts, path, body(`null`), http.StatusOK)
	}
}

func TestChatCompletionsStream(t *testing.T) {
	tests := []struct {
		name       string
		extra      string
		wantUsage  bool
		continuous bool // every chunk carries the usage so far
	}{
		{name: "without usage", extra: `"stream":true,"max_tokens":4`},
		{name: "include_usage adds a last chunk with usage", extra: `"stream":true,"max_tokens":4,"stream_options":{"include_usage":true}`, wantUsage: true},
		// vLLM's StreamOptions: include_usage defaults to false (since
		// vllm-project/vllm#36379), and null is false.
		{name: "an empty stream_options does not ask for usage", extra: `"stream":true,"max_tokens":4,"stream_options":{}`},
		{name: "a null include_usage does not", extra: `"stream":true,"max_tokens":4,"stream_options":{"include_usage":null}`},
		{name: "continuous usage without usage is none", extra: `"stream":true,"max_tokens":4,"stream_options":{"include_usage":false,"continuous_usage_stats":true}`},
		{name: "continuous usage", extra: `"stream":true,"max_tokens":4,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`, wantUsage: true, continuous: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{})
			whole := decode[chatResponse](t, post(t, ts, "/v1/chat/completions", chatBody("", "stream me", `"max_tokens":4`), http.StatusOK))
			events := parseSSE(t, post(t, ts, "/v1/chat/completions", chatBody("", "stream me", tc.extra), http.StatusOK))
			if last := events[len(events)-1]; last.data != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", last.data)
			}
			var chunks []chatChunk
			for _, e := range events[:len(events)-1] {
				chunks = append(chunks, decode[chatChunk](t, []byte(e.data)))
			}
			want := 1 + 4 + 1 // role, 4 tokens, finish
			if tc.wantUsage {
				want++
			}
			if len(chunks) != want {
				t.Fatalf("got %d chunks, want %d", len(chunks), want)
			}
			var text strings.Builder
			id := chunks[0].ID
			for i, c := range chunks {
				if c.ID != id || c.Object != "chat.completion.chunk" || c.Model != "sim-model" {
					t.Errorf("chunk %d envelope = %q %q %q", i, c.ID, c.Object, c.Model)
				}
				if i < 6 && len(c.Choices) != 1 {
					t.Fatalf("chunk %d has %d choices", i, len(c.Choices))
				}
				switch {
				case i == 0:
					if c.Choices[0].Delta.Role != "assistant" {
						t.Errorf("first delta role = %q", c.Choices[0].Delta.Role)
					}
				case i <= 4:
					text.WriteString(*c.Choices[0].Delta.Content)
					if c.Choices[0].FinishReason != nil {
						t.Errorf("chunk %d has a finish reason", i)
					}
				case i == 5:
					if fr := c.Choices[0].FinishReason; fr == nil || *fr != "length" {
						t.Errorf("finish chunk finish_reason = %v", fr)
					}
				case i == 6:
					if len(c.Choices) != 0 || c.Usage == nil || c.Usage.CompletionTokens != 4 || c.Usage.PromptTokensDetails == nil {
						t.Errorf("usage chunk = %+v", c)
					}
				}
				if i < 6 && (c.Usage != nil) != tc.continuous {
					t.Errorf("chunk %d: usage %+v, continuous %v", i, c.Usage, tc.continuous)
				}
				if tc.continuous && i >= 1 && i <= 4 && c.Usage.CompletionTokens != i {
					t.Errorf("chunk %d: completion tokens so far %d", i, c.Usage.CompletionTokens)
				}
			}
			if got := text.String(); got != whole.Choices[0].Message.Content {
				t.Errorf("streamed text %q, non-streamed %q: same prompt must give same output", got, whole.Choices[0].Message.Content)
			}
		})
	}
}

type completionResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *openAIUsage `json:"usage"`
}

func TestCompletions(t *testing.T) {
	ids := vllmsim.Tokenize("once upon a time")
	idsJSON, _ := json.Marshal(ids)
	tests := []struct {
		name       string
		prompt     string
		wantPrompt int
	}{
		{name: "string prompt", prompt: `"once upon a time"`, wantPrompt: len(ids)},
		{name: "array of strings: the first is served", prompt: `["once upon a time","ignored"]`, wantPrompt: len(ids)},
		{name: "token ids", prompt: string(idsJSON), wantPrompt: len(ids)},
		{name: "array of token id arrays", prompt: "[" + string(idsJSON) + ",[1,2]]", wantPrompt: len(ids)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{})
			body := `{"model":"sim-model","max_tokens":3,"prompt":` + tc.prompt + `}`
			resp := decode[completionResponse](t, post(t, ts, "/v1/completions", body, http.StatusOK))
			if !strings.HasPrefix(resp.ID, "cmpl-") || resp.Object != "text_completion" || len(resp.Choices) != 1 {
				t.Fatalf("response = %+v", resp)
			}
			if fr := resp.Choices[0].FinishReason; fr == nil || *fr != "length" {
				t.Errorf("finish_reason = %v", fr)
			}
			if resp.Usage == nil || resp.Usage.PromptTokens != tc.wantPrompt || resp.Usage.CompletionTokens != 3 {
				t.Errorf("usage = %+v, want prompt %d completion 3", resp.Usage, tc.wantPrompt)
			}

			// The same prompt streamed gives the same text.
			streamBody := `{"model":"sim-model","max_tokens":3,"stream":true,"stream_options":{"include_usage":true},"prompt":` + tc.prompt + `}`
			events := parseSSE(t, post(t, ts, "/v1/completions", streamBody, http.StatusOK))
			if events[len(events)-1].data != "[DONE]" {
				t.Fatalf("stream does not end with [DONE]")
			}
			var text strings.Builder
			var usage *openAIUsage
			var finish string
			for _, e := range events[:len(events)-1] {
				c := decode[completionResponse](t, []byte(e.data))
				if c.Object != "text_completion" {
					t.Errorf("chunk object %q", c.Object)
				}
				for _, ch := range c.Choices {
					text.WriteString(ch.Text)
					if ch.FinishReason != nil {
						finish = *ch.FinishReason
					}
				}
				if c.Usage != nil {
					usage = c.Usage
				}
			}
			if text.String() != resp.Choices[0].Text || finish != "length" {
				t.Errorf("stream text %q finish %q, want %q length", text.String(), finish, resp.Choices[0].Text)
			}
			if usage == nil || usage.CompletionTokens != 3 || usage.PromptTokensDetails == nil {
				t.Errorf("stream usage = %+v", usage)
			}
		})
	}
}

type embeddingResponse struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Index     int             `json:"index"`
		Object    string          `json:"object"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage openAIUsage `json:"usage"`
}

func embeddings(t *testing.T, resp embeddingResponse) [][]float32 {
	t.Helper()
	out := make([][]float32, len(resp.Data))
	for i, d := range resp.Data {
		if d.Index != i || d.Object != "embedding" {
			t.Errorf("data[%d] = index %d object %q", i, d.Index, d.Object)
		}
		if d.Embedding[0] == '"' {
			raw, err := base64.StdEncoding.DecodeString(decode[string](t, d.Embedding))
			if err != nil {
				t.Fatalf("base64: %v", err)
			}
			for j := 0; j+4 <= len(raw); j += 4 {
				out[i] = append(out[i], math.Float32frombits(binary.LittleEndian.Uint32(raw[j:])))
			}
			continue
		}
		out[i] = decode[[]float32](t, d.Embedding)
	}
	return out
}

func TestEmbeddings(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	resp := decode[embeddingResponse](t, post(t, ts, "/v1/embeddings",
		`{"model":"sim-model","input":["the cat sat","the cat sat","a dog ran far"]}`, http.StatusOK))
	if resp.Object != "list" || resp.Model != "sim-model" || len(resp.Data) != 3 {
		t.Fatalf("response = %+v", resp)
	}
	wantTokens := 2*len(vllmsim.Tokenize("the cat sat")) + len(vllmsim.Tokenize("a dog ran far"))
	if resp.Usage.PromptTokens != wantTokens || resp.Usage.TotalTokens != wantTokens {
		t.Errorf("usage = %+v, want %d prompt tokens", resp.Usage, wantTokens)
	}
	vecs := embeddings(t, resp)
	for i, v := range vecs {
		var norm float64
		for _, x := range v {
			norm += float64(x) * float64(x)
		}
		if len(v) != 64 || math.Abs(norm-1) > 1e-5 {
			t.Errorf("vector %d: dim %d, squared norm %v; want 64 and 1", i, len(v), norm)
		}
	}
	if !slices.Equal(vecs[0], vecs[1]) {
		t.Errorf("equal texts got different vectors")
	}
	if slices.Equal(vecs[0], vecs[2]) {
		t.Errorf("different texts got equal vectors")
	}

	tests := []struct {
		name  string
		input string
		extra string
	}{
		{name: "string input", input: `"the cat sat"`},
		{name: "base64 encoding", input: `"the cat sat"`, extra: `,"encoding_format":"base64"`},
		{name: "token id input", input: mustJSON(t, vllmsim.Tokenize("the cat sat"))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := decode[embeddingResponse](t, post(t, ts, "/v1/embeddings", `{"model":"sim-model","input":`+tc.input+tc.extra+`}`, http.StatusOK))
			if got := embeddings(t, r); len(got) != 1 || !slices.Equal(got[0], vecs[0]) {
				t.Errorf("vector differs from the one of the same text")
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestModels(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{Models: []string{"llama-a,llama-b", "llama-c"}, MaxModelLen: 4096})
	status, b := do(t, ts, http.MethodGet, "/v1/models", "")
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	list := decode[struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			OwnedBy     string `json:"owned_by"`
			Root        string `json:"root"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}](t, b)
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
		if m.Object != "model" || m.OwnedBy != "vllm" || m.MaxModelLen != 4096 || m.Root != "llama-a" {
			t.Errorf("model card = %+v", m)
		}
	}
	if list.Object != "list" || !slices.Equal(ids, []string{"llama-a", "llama-b", "llama-c"}) {
		t.Errorf("models = %s %v", list.Object, ids)
	}
	// Every served name is accepted; the response echoes the name asked for.
	resp := decode[chatResponse](t, post(t, ts, "/v1/chat/completions", chatBody("llama-c", "hi", ""), http.StatusOK))
	if resp.Model != "llama-c" {
		t.Errorf("model = %q, want llama-c", resp.Model)
	}
}

func TestTokenizeEndpoint(t *testing.T) {
	msgs := []vllmsim.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi there"}}
	tests := []struct {
		name string
		body string
		want []uint32
	}{
		{name: "prompt", body: `{"model":"sim-model","prompt":"hello, world"}`, want: vllmsim.Tokenize("hello, world")},
		{name: "empty prompt", body: `{"prompt":""}`, want: []uint32{}},
		{
			name: "messages with the generation prompt by default",
			body: `{"model":"sim-model","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}]}`,
			want: vllmsim.Tokenize(vllmsim.ChatPrompt(msgs)),
		},
		{
			name: "messages without the generation prompt",
			body: `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}],"add_generation_prompt":false}`,
			want: vllmsim.Tokenize(vllmsim.RenderChat(msgs, false)),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{MaxModelLen: 1000})
			got := decode[struct {
				Tokens      []uint32 `json:"tokens"`
				Count       int      `json:"count"`
				MaxModelLen int      `json:"max_model_len"`
			}](t, post(t, ts, "/tokenize", tc.body, http.StatusOK))
			if !slices.Equal(got.Tokens, tc.want) || got.Count != len(tc.want) || got.MaxModelLen != 1000 {
				t.Errorf("got %+v, want tokens %v", got, tc.want)
			}
		})
	}
}

// TestTokenizeMatchesChatCompletion: /tokenize's chat form gives exactly the
// prompt tokens a chat completion of the same fields computes (its
// usage.prompt_tokens and cached tokens on a repeat), for vLLM's template
// fields: the default generation prompt, add_generation_prompt false,
// continue_final_message and tools. Both forms take vLLM's other fields.
func TestTokenizeMatchesChatCompletion(t *testing.T) {
	msgs := `[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi there"}]}]`
	tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
	for _, extra := range []string{
		``,
		`,"add_generation_prompt":false`,
		`,"continue_final_message":true,"add_generation_prompt":false`,
		`,"continue_final_message":true`,
		`,"tools":` + tools,
		`,"tools": [ ]`,
	} {
		t.Run(extra, func(t *testing.T) {
			sim, ts := newServer(t, vllmsim.Options{BlockSize: 1})
			tok := decode[struct {
				Tokens []uint32 `json:"tokens"`
			}](t, post(t, ts, "/tokenize", `{"model":"sim-model","messages":`+msgs+extra+`,"add_special_tokens":false}`, http.StatusOK))
			chat := `{"model":"sim-model","max_tokens":1,"messages":` + msgs + extra + `}`
			resp := decode[chatResponse](t, post(t, ts, "/v1/chat/completions", chat, http.StatusOK))
			// The chat's prompt blocks (one token each) are exactly the
			// tokenized ids, in order.
			resident := 0
			for _, h := range vllmsim.BlockHashes(tok.Tokens, 1) {
				if !sim.Cache().Has(h) {
					break
				}
				resident++
			}
			if resp.Usage.PromptTokens != len(tok.Tokens) || resident != len(tok.Tokens) {
				t.Errorf("chat prompt %d tokens, /tokenize %d, %d of them resident after the chat", resp.Usage.PromptTokens, len(tok.Tokens), resident)
			}
		})
	}
	_, ts := newServer(t, vllmsim.Options{})
	// Tools are rendered: a request with them has more prompt tokens.
	with := decode[struct{ Count int }](t, post(t, ts, "/tokenize", `{"messages":`+msgs+`,"tools":`+tools+`}`, http.StatusOK))
	without := decode[struct{ Count int }](t, post(t, ts, "/tokenize", `{"messages":`+msgs+`}`, http.StatusOK))
	if with.Count <= without.Count {
		t.Errorf("tools add no tokens: %d vs %d", with.Count, without.Count)
	}
	// vLLM refuses both continue_final_message and add_generation_prompt.
	for _, path := range []string{"/tokenize", "/v1/chat/completions"} {
		post(t, ts, path, `{"model":"sim-model","messages":`+msgs+`,"continue_final_message":true,"add_generation_prompt":true}`, http.StatusBadRequest)
	}
	// token_strs: null by default, the pieces with return_token_strs.
	var plain map[string]json.RawMessage
	if err := json.Unmarshal(post(t, ts, "/tokenize", `{"prompt":"hello, world"}`, http.StatusOK), &plain); err != nil || string(plain["token_strs"]) != "null" {
		t.Errorf("token_strs = %s (%v), want null", plain["token_strs"], err)
	}
	strs := decode[struct {
		Tokens    []uint32 `json:"tokens"`
		TokenStrs []string `json:"token_strs"`
	}](t, post(t, ts, "/tokenize", `{"prompt":"hello, world","add_special_tokens":true,"return_token_strs":true}`, http.StatusOK))
	if !slices.Equal(strs.TokenStrs, []string{"hello", ",", "world"}) || len(strs.Tokens) != 3 {
		t.Errorf("token_strs = %q, tokens %v", strs.TokenStrs, strs.Tokens)
	}
}

// TestTemplateKwargsAsVLLMMerges: a request's reasoning effort and
// documents reach the template as vLLM merges them into the chat
// template's keyword arguments, so /tokenize's chat form, which has no
// fields for them, gives the request's prompt exactly when its
// chat_template_kwargs hold the merge: for chat completions (with the
// enable_thinking the effort implies, unless the client set it), Messages
// (output_config.effort is the chat completion's effort) and Responses
// (reasoning.effort, no enable_thinking). Without them the prompt differs.
func TestTemplateKwargsAsVLLMMerges(t *testing.T) {
	msgs := `[{"role":"user","content":"hi there"}]`
	for _, tc := range []struct {
		path, fields, kwargs string
	}{
		{"/v1/chat/completions", `"messages":` + msgs + `,"reasoning_effort":"low"`, `{"reasoning_effort":"low","enable_thinking":true}`},
		{"/v1/chat/completions", `"messages":` + msgs + `,"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true,"reasoning_effort":"high","x":1}`,
			`{"x":1,"enable_thinking":true,"reasoning_effort":"none"}`},
		{"/v1/chat/completions", `"messages":` + msgs + `,"documents":[{"title":"t","text":"d"}],"chat_template_kwargs":{"x":[1]}`, `{"x":[1],"documents":[{"title":"t","text":"d"}]}`},
		{"/v1/messages", `"messages":` + msgs + `,"output_config":{"effort":"high"}`, `{"reasoning_effort":"high","enable_thinking":true}`},
		{"/v1/messages", `"messages":` + msgs + `,"chat_template_kwargs":{"y":"z"}`, `{"y":"z"}`},
		{"/v1/responses", `"input":` + msgs + `,"reasoning":{"effort":"medium"}`, `{"reasoning_effort":"medium"}`},
	} {
		t.Run(tc.path+" "+tc.kwargs, func(t *testing.T) {
			sim, ts := newServer(t, vllmsim.Options{BlockSize: 1})
			tok := decode[struct{ Tokens []uint32 }](t, post(t, ts, "/tokenize", `{"model":"sim-model","messages":`+msgs+`,"chat_template_kwargs":`+tc.kwargs+`}`, http.StatusOK))
			var u struct {
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
					InputTokens  int `json:"input_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(post(t, ts, tc.path, `{"model":"sim-model","max_tokens":1,"max_output_tokens":1,`+tc.fields+`}`, http.StatusOK), &u); err != nil {
				t.Fatal(err)
			}
			resident := 0
			for _, h := range vllmsim.BlockHashes(tok.Tokens, 1) {
				if sim.Cache().Has(h) {
					resident++
				}
			}
			prompt := u.Usage.PromptTokens + u.Usage.InputTokens
			if prompt != len(tok.Tokens) || resident != len(tok.Tokens) {
				t.Errorf("prompt %d tokens, /tokenize with the merged kwargs %d, %d of them resident", prompt, len(tok.Tokens), resident)
			}
			plain := decode[struct{ Count int }](t, post(t, ts, "/tokenize", `{"model":"sim-model","messages":`+msgs+`}`, http.StatusOK))
			if plain.Count == prompt {
				t.Errorf("the kwargs add no tokens: %d", plain.Count)
			}
		})
	}
}

// TestReasoningEffortValues: a chat completion's reasoning_effort is one
// of the values vLLM accepts, else a 400 naming them.
func TestReasoningEffortValues(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	for _, e := range []string{"none", "max"} {
		post(t, ts, "/v1/chat/completions", `{"model":"sim-model","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"reasoning_effort":"`+e+`"}`, http.StatusOK)
	}
	for _, e := range []string{`"auto"`, `""`, `5`} {
		body := post(t, ts, "/v1/chat/completions", `{"model":"sim-model","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"reasoning_effort":`+e+`}`, http.StatusBadRequest)
		if !strings.Contains(string(body), "reasoning_effort") {
			t.Errorf("%s: %s", e, body)
		}
	}
}

// TestCacheSaltKeepsPrefixesApart: a request's cache_salt salts its prefix
// cache, as vLLM hashes it into the prompt's first block: a repeat with the
// same salt reads the cached prefix, one with another salt or none reads
// nothing of it, on chat completions, completions and Responses alike; an
// empty salt is refused, as vLLM refuses it.
func TestCacheSaltKeepsPrefixesApart(t *testing.T) {
	long := strings.Repeat("a shared system prompt for every tenant ", 20)
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"sim-model","max_tokens":1,"messages":[{"role":"user","content":"` + long + `"}]%s}`},
		{"/v1/completions", `{"model":"sim-model","max_tokens":1,"prompt":"` + long + `"%s}`},
		{"/v1/responses", `{"model":"sim-model","max_output_tokens":1,"input":"` + long + `"%s}`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{BlockSize: 4})
			cached := func(salt string) int {
				var u struct {
					Usage struct {
						PromptTokensDetails *struct {
							CachedTokens int `json:"cached_tokens"`
						} `json:"prompt_tokens_details"`
						InputTokensDetails *struct {
							CachedTokens int `json:"cached_tokens"`
						} `json:"input_tokens_details"`
					} `json:"usage"`
				}
				if err := json.Unmarshal(post(t, ts, tc.path, fmt.Sprintf(tc.body, salt), http.StatusOK), &u); err != nil {
					t.Fatal(err)
				}
				if d := u.Usage.PromptTokensDetails; d != nil {
					return d.CachedTokens
				}
				if d := u.Usage.InputTokensDetails; d != nil {
					return d.CachedTokens
				}
				return -1
			}
			if n := cached(`,"cache_salt":"tenant-a"`); n != 0 {
				t.Fatalf("first request: %d cached", n)
			}
			for _, c := range []struct {
				salt string
				hit  bool
			}{{`,"cache_salt":"tenant-a"`, true}, {`,"cache_salt":"tenant-b"`, false}, {``, false}, {`,"cache_salt":null`, true}} {
				if n := cached(c.salt); (n > 0) != c.hit {
					t.Errorf("salt %q: %d tokens cached, want a hit %v", c.salt, n, c.hit)
				}
			}
			post(t, ts, tc.path, fmt.Sprintf(tc.body, `,"cache_salt":""`), http.StatusBadRequest)
		})
	}
}

func TestOpenAISDK(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	client := sdkClient(ts)
	ctx := t.Context()
	params := openai.ChatCompletionNewParams{
		Model:               "sim-model",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello sdk")},
		MaxCompletionTokens: openai.Int(6),
	}

	t.Run("chat", func(t *testing.T) {
		resp, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if resp.Choices[0].FinishReason != "length" || resp.Usage.CompletionTokens != 6 || resp.Choices[0].Message.Content == "" {
			t.Errorf("response = %+v", resp)
		}
	})

	t.Run("chat stream", func(t *testing.T) {
		p := params
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		acc := accumulate(t, client.Chat.Completions.NewStreaming(ctx, p))
		// The "chat" subtest sent the same prompt: its full blocks are cached.
		wantCached := int64((acc.Usage.PromptTokens - 1) / vllmsim.DefaultBlockSize * vllmsim.DefaultBlockSize)
		if acc.Usage.CompletionTokens != 6 || acc.Usage.PromptTokensDetails.CachedTokens != wantCached || len(vllmsim.Tokenize(acc.Choices[0].Message.Content)) != 6 {
			t.Errorf("accumulated = %+v", acc.ChatCompletion)
		}
	})

	t.Run("completions", func(t *testing.T) {
		resp, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     "sim-model",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("complete this")},
			MaxTokens: openai.Int(2),
		})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if resp.Usage.CompletionTokens != 2 || resp.Choices[0].Text == "" {
			t.Errorf("response = %+v", resp)
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		resp, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: "sim-model",
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"alpha", "beta"}},
		})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if len(resp.Data) != 2 || len(resp.Data[0].Embedding) != 64 {
			t.Errorf("response = %+v", resp)
		}
	})

	t.Run("unknown model is a 404 error", func(t *testing.T) {
		p := params
		p.Model = "nope"
		_, err := client.Chat.Completions.New(ctx, p)
		apiErr, ok := errors.AsType[*openai.Error](err)
		if !ok || apiErr.StatusCode != http.StatusNotFound || apiErr.Type != "NotFoundError" {
			t.Errorf("err = %v, want a 404 NotFoundError", err)
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(page.Data) != 1 || page.Data[0].ID != "sim-model" || page.Data[0].OwnedBy != "vllm" {
			t.Errorf("models = %+v", page.Data)
		}
	})
}

// sdkClient is the official OpenAI SDK pointed at the simulator ts, with
// no retries.
func sdkClient(ts *httptest.Server) openai.Client {
	return openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("unused"),
		option.WithHTTPClient(ts.Client()), option.WithMaxRetries(0))
}
