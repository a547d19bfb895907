package vllmsim_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"rolter.dev/tests/vllmsim"
)

// echoedChat is a chat response with its message roles and prompt logprobs.
type echoedChat struct {
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage          openAIUsage     `json:"usage"`
	PromptLogprobs json.RawMessage `json:"prompt_logprobs"`
}

// Chat echo puts the last message before every choice's content, whole and
// streamed (in a chunk of its own after the role chunks), when the message
// has the response's role: the assistant's, or the last message's own
// without the generation prompt. The usage counts the generated tokens
// only.
func TestChatEcho(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	const path = "/v1/chat/completions"
	for _, tc := range []struct {
		name, msgs, extra, role, echoed string
	}{
		{"an assistant prefill", `[{"role":"user","content":"go on"},{"role":"assistant","content":"Once upon"}]`, ``, "assistant", "Once upon"},
		{"text parts joined", `[{"role":"user","content":"go on"},{"role":"assistant","content":[{"type":"text","text":"Once"},{"type":"text","text":"upon"}]}]`, ``, "assistant", "Once\nupon"},
		{"a user message: another role", `[{"role":"user","content":"go on"}]`, ``, "assistant", ""},
		{"no generation prompt: the last message's role", `[{"role":"system","content":"s"},{"role":"user","content":"go on"}]`, `,"add_generation_prompt":false`, "user", "go on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := func(extra string) string {
				return `{"messages":` + tc.msgs + `,"max_tokens":4,"n":2` + tc.extra + extra + `}`
			}
			plain := decode[echoedChat](t, post(t, ts, path, body(""), http.StatusOK))
			echo := decode[echoedChat](t, post(t, ts, path, body(`,"echo":true`), http.StatusOK))
			s := stream(t, ts, path, body(`,"echo":true,"stream":true`))
			for i, c := range echo.Choices {
				want := tc.echoed + plain.Choices[i].Message.Content
				if c.Message.Content != want || c.Message.Role != tc.role || plain.Choices[i].Message.Role != tc.role {
					t.Errorf("choice %d: %s %q (plain %s), want %s %q", i, c.Message.Role, c.Message.Content, plain.Choices[i].Message.Role, tc.role, want)
				}
				if s.text[i] != want {
					t.Errorf("choice %d streamed %q, want %q", i, s.text[i], want)
				}
				if first := ptr(s.chunks[i][0].Delta.Content); tc.echoed != "" && first != tc.echoed {
					t.Errorf("choice %d: first content chunk %q, want the echo alone", i, first)
				}
			}
			if u, p := echo.Usage, plain.Usage; u.PromptTokens != p.PromptTokens || u.CompletionTokens != p.CompletionTokens || u.TotalTokens != p.TotalTokens {
				t.Errorf("usage with echo %+v, without %+v", u, p)
			}
		})
	}
	// The role chunk carries the response's role.
	for _, e := range parseSSE(t, post(t, ts, path, `{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,"max_tokens":1,"stream":true}`, http.StatusOK))[:1] {
		if c := decode[sampledResponse](t, []byte(e.data)).Choices[0]; ptr(c.Delta.Role) != "user" {
			t.Errorf("role chunk %s, want role user", e.data)
		}
	}
}

// Chat echo asks for the prompt's logprobs, top_logprobs of them (0
// unless set, none for a null top_logprobs), unless prompt_logprobs says
// otherwise.
func TestChatEchoPromptLogprobs(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	msgs := []vllmsim.Message{{Role: "user", Content: "go on"}, {Role: "assistant", Content: "Once"}}
	rendered := vllmsim.ChatPrompt(msgs)
	body := `{"messages":[{"role":"user","content":"go on"},{"role":"assistant","content":"Once"}],"max_tokens":1,"echo":true`
	for _, tc := range []struct {
		extra string
		want  int // entries a position, 0 for null
	}{
		{``, 1},
		{`,"logprobs":true,"top_logprobs":3`, 3},
		{`,"logprobs":true,"top_logprobs":3,"prompt_logprobs":2`, 2},
		{`,"top_logprobs":null`, 0},
	} {
		resp := decode[echoedChat](t, post(t, ts, "/v1/chat/completions", body+tc.extra+`}`, http.StatusOK))
		if tc.want == 0 {
			if string(resp.PromptLogprobs) != "null" {
				t.Errorf("%s: prompt_logprobs %s, want null", tc.extra, resp.PromptLogprobs)
			}
			continue
		}
		checkPromptLogprobs(t, resp.PromptLogprobs, vllmsim.Tokenize(rendered), promptTexts(rendered), tc.want)
	}
}
