package vllmsim_test

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"rolter.dev/tests/vllmsim"
)

// Responses of chat completions and completions with the fields of n,
// logprobs, echo and stop.
type (
	sampledChoice struct {
		Index   int    `json:"index"`
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
		StopReason   *string         `json:"stop_reason"`
	}
	sampledResponse struct {
		Choices []sampledChoice `json:"choices"`
		Usage   *openAIUsage    `json:"usage"`
	}
	chatLogprob struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
		RawB    []int   `json:"bytes"`
	}
	chatLogprobs struct {
		Content []struct {
			chatLogprob
			TopLogprobs []chatLogprob `json:"top_logprobs"`
		} `json:"content"`
	}
	completionLogprobs struct {
		TextOffset    []int                `json:"text_offset"`
		TokenLogprobs []*float64           `json:"token_logprobs"`
		Tokens        []string             `json:"tokens"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	}
)

// text is a choice's output: a completion's text or a chat message's.
func (c sampledChoice) text() string { return c.Text + c.Message.Content }

// sampled sends a non-streaming request and decodes its choices.
func sampled(t *testing.T, ts *httptest.Server, path, body string) sampledResponse {
	t.Helper()
	return decode[sampledResponse](t, post(t, ts, path, body, http.StatusOK))
}

// streamed is a streamed response gathered by choice.
type streamed struct {
	text     map[int]string
	roles    map[int]int // role chunks, by choice
	finishes map[int]sampledChoice
	chunks   map[int][]sampledChoice // content chunks, by choice
	usage    *openAIUsage
}

// stream sends a streaming request and gathers its chunks, checking that
// each carries one choice, that nothing of a choice follows its finish,
// that the usage chunk comes last and the stream ends with [DONE].
func stream(t *testing.T, ts *httptest.Server, path, body string) streamed {
	t.Helper()
	events := parseSSE(t, post(t, ts, path, body, http.StatusOK))
	if events[len(events)-1].data != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]")
	}
	s := streamed{text: map[int]string{}, roles: map[int]int{}, finishes: map[int]sampledChoice{}, chunks: map[int][]sampledChoice{}}
	for _, e := range events[:len(events)-1] {
		if s.usage != nil {
			t.Fatalf("chunk after the usage chunk: %s", e.data)
		}
		c := decode[sampledResponse](t, []byte(e.data))
		if c.Usage != nil {
			if len(c.Choices) != 0 {
				t.Fatalf("usage chunk with choices: %s", e.data)
			}
			s.usage = c.Usage
			continue
		}
		if len(c.Choices) != 1 {
			t.Fatalf("chunk with %d choices: %s", len(c.Choices), e.data)
		}
		ch := c.Choices[0]
		if _, done := s.finishes[ch.Index]; done {
			t.Fatalf("choice %d chunk after its finish: %s", ch.Index, e.data)
		}
		switch {
		case ch.FinishReason != nil:
			s.finishes[ch.Index] = ch
		case ch.Delta.Role != nil:
			if len(s.chunks) > 0 {
				t.Fatalf("role chunk after content: %s", e.data)
			}
			s.roles[ch.Index]++
		default:
			s.text[ch.Index] += ch.Text
			if ch.Delta.Content != nil {
				s.text[ch.Index] += *ch.Delta.Content
			}
			s.chunks[ch.Index] = append(s.chunks[ch.Index], ch)
		}
	}
	return s
}

func tokens(s string) int { return len(vllmsim.Tokenize(s)) }

// n choices: indexes 0..n-1, each its own output of max_tokens tokens,
// the first one the n=1 output; the prompt counted (and prefilled) once,
// the completion tokens of all choices added up. Streamed, each choice
// has its role chunk (chat), its deltas adding up to its text and its
// own finish chunk, and the usage chunk comes once at the end.
func TestChoicesN(t *testing.T) {
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", chatBody("", "pick a number", `"max_tokens":5%s`)},
		{"/v1/completions", `{"prompt":"pick a number","max_tokens":5%s}`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			sim, ts := newServer(t, vllmsim.Options{})
			body := func(extra string) string { return strings.Replace(tc.body, "%s", extra, 1) }
			one := sampled(t, ts, tc.path, body(""))
			sim.Reset()
			resp := sampled(t, ts, tc.path, body(`,"n":3`))
			if len(resp.Choices) != 3 {
				t.Fatalf("%d choices, want 3", len(resp.Choices))
			}
			seen := map[string]bool{}
			for i, c := range resp.Choices {
				if c.Index != i || tokens(c.text()) != 5 || *c.FinishReason != "length" || c.StopReason != nil {
					t.Errorf("choice %d = %+v, want index %d, 5 tokens, length", i, c, i)
				}
				seen[c.text()] = true
			}
			if len(seen) != 3 {
				t.Errorf("choices are not distinct: %v", seen)
			}
			if resp.Choices[0].text() != one.Choices[0].text() {
				t.Errorf("first choice %q, n=1 output %q", resp.Choices[0].text(), one.Choices[0].text())
			}
			u := resp.Usage
			if u.PromptTokens != one.Usage.PromptTokens || u.CompletionTokens != 15 || u.TotalTokens != u.PromptTokens+15 {
				t.Errorf("usage = %+v, want prompt %d, completion 15", u, one.Usage.PromptTokens)
			}
			st := stats(t, ts)
			if st.PromptTokens != uint64(u.PromptTokens) || st.GenerationTokens != 15 || st.Completed != 1 {
				t.Errorf("stats = %+v, want the prompt once, 15 generated, 1 request", st)
			}

			s := stream(t, ts, tc.path, body(`,"n":3,"stream":true,"stream_options":{"include_usage":true}`))
			for i, c := range resp.Choices {
				if s.text[i] != c.text() {
					t.Errorf("choice %d streamed %q, whole %q", i, s.text[i], c.text())
				}
				if f := s.finishes[i]; f.FinishReason == nil || *f.FinishReason != "length" {
					t.Errorf("choice %d finish = %+v", i, f)
				}
				if wantRoles := map[bool]int{true: 1}[tc.path == "/v1/chat/completions"]; s.roles[i] != wantRoles {
					t.Errorf("choice %d: %d role chunks, want %d", i, s.roles[i], wantRoles)
				}
			}
			if len(s.finishes) != 3 || s.usage == nil || s.usage.CompletionTokens != 15 || s.usage.PromptTokens != u.PromptTokens {
				t.Errorf("finishes %d, usage %+v", len(s.finishes), s.usage)
			}
		})
	}
}

// vLLM refuses n below 1, and n above 1 with greedy sampling.
func TestChoicesNRefused(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := func(extra string) string {
			if path == "/v1/completions" {
				return `{"prompt":"hi",` + extra + `}`
			}
			return chatBody("", "hi", extra)
		}
		for _, tc := range []struct{ extra, want string }{
			{`"n":0`, "n must be at least 1, got 0."},
			{`"n":-2`, "n must be at least 1, got -2."},
			{`"n":2,"temperature":0`, "n must be 1 when using greedy sampling, got 2."},
		} {
			if e := apiErr(t, post(t, ts, path, body(tc.extra), http.StatusBadRequest)); e.Message != tc.want {
				t.Errorf("%s %s: %q, want %q", path, tc.extra, e.Message, tc.want)
			}
		}
		post(t, ts, path, body(`"n":1,"temperature":0`), http.StatusOK)
		post(t, ts, path, body(`"n":null`), http.StatusOK)
	}
}

// vllmsim holds a request's output in memory, so it refuses one whose
// choices and log probabilities would take more than its bound, which vLLM
// would queue: one client must not stop the replica.
func TestChoicesBounded(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	for _, tc := range []struct {
		extra string
		ok    bool
	}{
		{`"n":64,"max_tokens":32000`, true},
		{`"n":16384,"max_tokens":32000`, false},
		{`"n":4,"max_tokens":32000,"logprobs":true,"top_logprobs":20`, false},
	} {
		status := http.StatusBadRequest
		if tc.ok {
			status = http.StatusOK
		}
		b := post(t, ts, "/v1/chat/completions", chatBody("", "hi", tc.extra), status)
		if !tc.ok && !strings.Contains(apiErr(t, b).Message, "vllmsim holds a request's output in memory") {
			t.Errorf("%s: %s", tc.extra, b)
		}
	}
}

type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
}

func apiErr(t *testing.T, b []byte) openAIError {
	t.Helper()
	return decode[struct {
		Error openAIError `json:"error"`
	}](t, b).Error
}

// checkTop checks a top list: the token first, strictly decreasing
// logprobs, distinct tokens, probabilities summing below 1.
func checkTop(t *testing.T, token string, logprob float64, top []chatLogprob) {
	t.Helper()
	if top[0].Token != token || top[0].Logprob != logprob {
		t.Errorf("top list of %q starts with %+v", token, top[0])
	}
	seen, sum := map[string]bool{}, 0.0
	for i, e := range top {
		if e.Logprob >= 0 || (i > 0 && e.Logprob >= top[i-1].Logprob) || seen[e.Token] || string(intsToBytes(e.RawB)) != e.Token {
			t.Errorf("top entry %d of %q = %+v", i, token, e)
		}
		seen[e.Token] = true
		sum += math.Exp(e.Logprob)
	}
	if sum >= 1 {
		t.Errorf("top list of %q sums to %v", token, sum)
	}
}

func intsToBytes(v []int) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}

// Chat logprobs: one entry per generated token, the tokens spelling the
// content, each with its UTF-8 bytes and top_logprobs entries; the same
// entries streamed, one chunk's worth at a time; null without logprobs.
func TestChatLogprobs(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	for _, k := range []int{0, 3, 20} {
		extra := `"max_tokens":6,"n":2,"logprobs":true,"top_logprobs":` + mustJSON(t, k)
		resp := sampled(t, ts, "/v1/chat/completions", chatBody("", "log me", extra))
		whole := map[int]chatLogprobs{}
		for _, c := range resp.Choices {
			lp := decode[chatLogprobs](t, c.Logprobs)
			whole[c.Index] = lp
			var text strings.Builder
			for _, e := range lp.Content {
				text.WriteString(e.Token)
				if string(intsToBytes(e.RawB)) != e.Token || e.Logprob >= 0 || len(e.TopLogprobs) != k {
					t.Errorf("k=%d: entry %+v", k, e)
				}
				if k > 0 {
					checkTop(t, e.Token, e.Logprob, e.TopLogprobs)
				}
			}
			if len(lp.Content) != 6 || text.String() != c.text() {
				t.Errorf("k=%d: %d entries spelling %q, content %q", k, len(lp.Content), text.String(), c.text())
			}
		}
		s := stream(t, ts, "/v1/chat/completions", chatBody("", "log me", extra+`,"stream":true`))
		for i, chunks := range s.chunks {
			for pos, ch := range chunks {
				lp := decode[chatLogprobs](t, ch.Logprobs)
				if len(lp.Content) != 1 || lp.Content[0].Token != whole[i].Content[pos].Token || lp.Content[0].Logprob != whole[i].Content[pos].Logprob {
					t.Errorf("k=%d: choice %d chunk %d logprobs %s, want entry %+v", k, i, pos, ch.Logprobs, whole[i].Content[pos])
				}
			}
		}
	}
	plain := sampled(t, ts, "/v1/chat/completions", chatBody("", "log me", `"max_tokens":2,"logprobs":false`))
	if string(plain.Choices[0].Logprobs) != "null" {
		t.Errorf("logprobs without asking: %s", plain.Choices[0].Logprobs)
	}
}

// checkCompletionLogprobs checks completions logprobs against the text
// they cover from offset: tokens spelling it, text_offset adding up their
// lengths in characters, each token_logprob its token's in a top list of
// want entries where it is the most likely; a token without logprob has
// null in both.
func checkCompletionLogprobs(t *testing.T, lp completionLogprobs, text string, offset, want int) {
	t.Helper()
	n := len(lp.Tokens)
	if len(lp.TextOffset) != n || len(lp.TokenLogprobs) != n || len(lp.TopLogprobs) != n {
		t.Fatalf("ragged logprobs %+v", lp)
	}
	if strings.Join(lp.Tokens, "") != text {
		t.Errorf("tokens %q spell %q, text %q", lp.Tokens, strings.Join(lp.Tokens, ""), text)
	}
	for i, tok := range lp.Tokens {
		if lp.TextOffset[i] != offset {
			t.Errorf("text_offset[%d] = %d, want %d", i, lp.TextOffset[i], offset)
		}
		offset += utf8.RuneCountInString(tok)
		if lp.TokenLogprobs[i] == nil {
			if lp.TopLogprobs[i] != nil {
				t.Errorf("token %d has no logprob but a top list", i)
			}
			continue
		}
		top := lp.TopLogprobs[i]
		if len(top) != want || top[tok] != *lp.TokenLogprobs[i] {
			t.Errorf("token %q: logprob %v, top %v (want %d entries)", tok, *lp.TokenLogprobs[i], top, want)
		}
		for other, v := range top {
			if other != tok && v >= top[tok] {
				t.Errorf("token %q: %q is as likely in %v", tok, other, top)
			}
		}
	}
}

// Completions logprobs: the tokens spelling the text, offsets adding up,
// max(logprobs, 1) entries a top list, whole and streamed alike.
func TestCompletionLogprobs(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	for _, k := range []int{0, 1, 4} {
		body := `{"prompt":"count the ways","max_tokens":5,"n":2,"logprobs":` + mustJSON(t, k)
		resp := sampled(t, ts, "/v1/completions", body+`}`)
		for _, c := range resp.Choices {
			lp := decode[completionLogprobs](t, c.Logprobs)
			if len(lp.Tokens) != 5 {
				t.Errorf("k=%d: %d tokens", k, len(lp.Tokens))
			}
			checkCompletionLogprobs(t, lp, c.Text, 0, max(k, 1))
		}
		s := stream(t, ts, "/v1/completions", body+`,"stream":true}`)
		for i, chunks := range s.chunks {
			offset := 0
			for _, ch := range chunks {
				checkCompletionLogprobs(t, decode[completionLogprobs](t, ch.Logprobs), ch.Text, offset, max(k, 1))
				offset += utf8.RuneCountInString(ch.Text)
			}
			if s.text[i] != resp.Choices[i].Text {
				t.Errorf("k=%d: choice %d streamed %q, whole %q", k, i, s.text[i], resp.Choices[i].Text)
			}
		}
	}
	plain := sampled(t, ts, "/v1/completions", `{"prompt":"x","max_tokens":1,"logprobs":null}`)
	if string(plain.Choices[0].Logprobs) != "null" {
		t.Errorf("logprobs without asking: %s", plain.Choices[0].Logprobs)
	}
}

// vLLM's 400s for logprobs: top_logprobs without logprobs, a count out of
// range or above the server's max_logprobs (20 by default), and one that
// is no integer.
func TestLogprobsRefused(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	for _, tc := range []struct {
		path, body, param, want string
	}{
		{"/v1/chat/completions", chatBody("", "hi", `"top_logprobs":2`), "top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true."},
		{"/v1/chat/completions", chatBody("", "hi", `"logprobs":false,"top_logprobs":-1`), "top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true."},
		{"/v1/chat/completions", chatBody("", "hi", `"logprobs":true,"top_logprobs":21`), "logprobs", "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)"},
		{"/v1/chat/completions", chatBody("", "hi", `"logprobs":true,"top_logprobs":-2`), "top_logprobs", "`top_logprobs` must be a positive value or -1."},
		{"/v1/chat/completions", chatBody("", "hi", `"logprobs":true,"top_logprobs":"2"`), "top_logprobs", "`top_logprobs` must be an integer."},
		{"/v1/completions", `{"prompt":"hi","logprobs":21}`, "logprobs", "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)"},
		{"/v1/completions", `{"prompt":"hi","logprobs":-1}`, "logprobs", "Requested sample logprobs of 2147483648, which is greater than max allowed: 20 (parameter=logprobs, value=2147483648)"},
		{"/v1/completions", `{"prompt":"hi","logprobs":-5}`, "logprobs", "`logprobs` must be a positive value or -1."},
		{"/v1/completions", `{"prompt":"hi","logprobs":"all"}`, "logprobs", "`logprobs` must be an integer."},
	} {
		e := apiErr(t, post(t, ts, tc.path, tc.body, http.StatusBadRequest))
		if e.Message != tc.want || e.Param == nil || *e.Param != tc.param || e.Type != "BadRequestError" {
			t.Errorf("%s: error %+v, want %q on %s", tc.body, e, tc.want, tc.param)
		}
	}
	post(t, ts, "/v1/chat/completions", chatBody("", "hi", `"logprobs":true,"top_logprobs":20`), http.StatusOK)
	post(t, ts, "/v1/chat/completions", chatBody("", "hi", `"logprobs":false,"top_logprobs":0`), http.StatusOK)

	_, small := newServer(t, vllmsim.Options{MaxLogprobs: 5})
	post(t, small, "/v1/completions", `{"prompt":"hi","logprobs":5}`, http.StatusOK)
	post(t, small, "/v1/completions", `{"prompt":"hi","logprobs":6}`, http.StatusBadRequest)
}

// Echo: the text starts with the prompt (a string prompt's text, a
// token-id prompt detokenized), its tokens first in the logprobs with the
// first one's logprob null; streamed, the first chunk carries the prompt.
// With max_tokens 0 the prompt alone comes back, as vLLM scores prompts.
func TestCompletionEcho(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	ids := mustJSON(t, vllmsim.Tokenize("the cache, holds"))
	for _, tc := range []struct {
		name, prompt, want string
		promptTokens       int
	}{
		{"string prompt", `"Once upon  a time,"`, "Once upon  a time,", 5},
		{"array of strings: the first", `["Once upon  a time,","other"]`, "Once upon  a time,", 5},
		{"token ids, detokenized", ids, "the cache , holds", 4},
		{"unknown token ids", `[7,8]`, "token_id:7 token_id:8", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"prompt":` + tc.prompt + `,"max_tokens":3,"echo":true`
			plain := sampled(t, ts, "/v1/completions", `{"prompt":`+tc.prompt+`,"max_tokens":3}`)
			resp := sampled(t, ts, "/v1/completions", body+`,"logprobs":2}`)
			c := resp.Choices[0]
			if c.Text != tc.want+plain.Choices[0].Text {
				t.Errorf("text %q, want the prompt %q then %q", c.Text, tc.want, plain.Choices[0].Text)
			}
			lp := decode[completionLogprobs](t, c.Logprobs)
			if len(lp.Tokens) != tc.promptTokens+3 || lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil {
				t.Errorf("logprobs %+v, want %d prompt tokens first, the first without logprob", lp, tc.promptTokens)
			}
			checkCompletionLogprobs(t, lp, strings.TrimSpace(tc.want)+plain.Choices[0].Text, 0, 2)
			if resp.Usage.CompletionTokens != 3 || resp.Usage.PromptTokens != tc.promptTokens {
				t.Errorf("usage = %+v", resp.Usage)
			}

			s := stream(t, ts, "/v1/completions", body+`,"stream":true}`)
			if first := s.chunks[0][0].Text; !strings.HasPrefix(first, tc.want) || s.text[0] != c.Text {
				t.Errorf("streamed %q (first chunk %q), whole %q", s.text[0], first, c.Text)
			}

			only := sampled(t, ts, "/v1/completions", `{"prompt":`+tc.prompt+`,"max_tokens":0,"echo":true,"logprobs":0}`)
			oc := only.Choices[0]
			olp := decode[completionLogprobs](t, oc.Logprobs)
			if oc.Text != tc.want || len(olp.Tokens) != tc.promptTokens || *oc.FinishReason != "length" || only.Usage.CompletionTokens != 1 {
				t.Errorf("echo with max_tokens 0: %q, %d tokens, %v, usage %+v", oc.Text, len(olp.Tokens), *oc.FinishReason, only.Usage)
			}
		})
	}
	post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":0}`, http.StatusBadRequest)
}

// Stop strings end a choice at their first occurrence in its output,
// themselves left out (kept with include_stop_str_in_output), with
// finish_reason stop and stop_reason the string; the tokens up to the one
// that completed it are counted. Streamed, no part of the stop string is
// sent.
func TestStop(t *testing.T) {
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		t.Run(path, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{})
			body := func(extra string) string {
				if path == "/v1/completions" {
					return `{"prompt":"tell a story","max_tokens":12` + extra + `}`
				}
				return chatBody("", "tell a story", `"max_tokens":12`+extra)
			}
			full := sampled(t, ts, path, body("")).Choices[0].text()
			words := strings.Fields(full)
			// A stop string across two tokens: the end of word 4, the
			// space, the start of word 5.
			stop := words[4][len(words[4])-1:] + " " + words[5][:1]
			at := strings.Index(full, stop)
			wantTokens := tokens(full[:at+len(stop)])
			for _, tc := range []struct {
				name, extra, text, reason string
			}{
				{"a string", `,"stop":` + mustJSON(t, stop), full[:at], stop},
				{"a list, the first to complete wins", `,"stop":["zzz",` + mustJSON(t, stop) + `]`, full[:at], stop},
				{"kept with include_stop_str_in_output", `,"stop":` + mustJSON(t, stop) + `,"include_stop_str_in_output":true`, full[:at+len(stop)], stop},
			} {
				resp := sampled(t, ts, path, body(tc.extra))
				c := resp.Choices[0]
				if c.text() != tc.text || *c.FinishReason != "stop" || c.StopReason == nil || *c.StopReason != tc.reason {
					t.Errorf("%s: %q finish %v stop_reason %v, want %q stop %q", tc.name, c.text(), *c.FinishReason, c.StopReason, tc.text, tc.reason)
				}
				if resp.Usage.CompletionTokens != wantTokens {
					t.Errorf("%s: %d completion tokens, want %d", tc.name, resp.Usage.CompletionTokens, wantTokens)
				}
				s := stream(t, ts, path, body(tc.extra+`,"stream":true`))
				f := s.finishes[0]
				if s.text[0] != tc.text || *f.FinishReason != "stop" || f.StopReason == nil || *f.StopReason != tc.reason {
					t.Errorf("%s streamed: %q, finish %+v", tc.name, s.text[0], f)
				}
				for _, ch := range s.chunks[0] {
					if d := ch.text() + ptr(ch.Delta.Content); strings.Contains(d, stop) && tc.text == full[:at] {
						t.Errorf("%s: chunk %q carries the stop string", tc.name, d)
					}
				}
			}
			// A string not in the output changes nothing.
			none := sampled(t, ts, path, body(`,"stop":["zzz"]`)).Choices[0]
			if none.text() != full || *none.FinishReason != "length" || none.StopReason != nil {
				t.Errorf("absent stop string: %+v", none)
			}
		})
	}
}

func ptr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// min_tokens: no stop string counts before that many tokens, and the
// simulated EOS waits for them; ignore_eos runs past the EOS to vLLM's
// limit (the context window for chat, 16 tokens for completions).
func TestMinTokensAndIgnoreEOS(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{MaxTokensDefault: 4, MaxModelLen: 60})
	full := sampled(t, ts, "/v1/completions", `{"prompt":"tell a story","max_tokens":12}`).Choices[0].Text
	three := strings.Join(strings.SplitAfterN(full, " ", 4)[:3], "")
	three = three[:len(three)-1] // the text of the first 3 tokens
	// A letter of the first 3 tokens that comes again after them.
	i := strings.IndexFunc(three, func(r rune) bool { return r != ' ' && strings.ContainsRune(full[len(three):], r) })
	if i < 0 {
		t.Fatalf("output %q repeats no letter of its first 3 tokens", full)
	}
	stop := three[i : i+1]
	at := len(three) + strings.Index(full[len(three):], stop)
	c := sampled(t, ts, "/v1/completions", `{"prompt":"tell a story","max_tokens":12,"min_tokens":3,"stop":`+mustJSON(t, stop)+`}`).Choices[0]
	if c.Text != full[:at] || *c.StopReason != stop {
		t.Errorf("min_tokens 3, stop %q: %q, want %q", stop, c.Text, full[:at])
	}
	if c := sampled(t, ts, "/v1/completions", `{"prompt":"tell a story","max_tokens":12,"stop":`+mustJSON(t, stop)+`}`).Choices[0]; c.Text != full[:i] {
		t.Errorf("stop %q without min_tokens: %q, want %q", stop, c.Text, full[:i])
	}

	chatPrompt := len(promptTokens(vllmsim.Message{Role: "user", Content: "go on"}))
	for _, tc := range []struct {
		path, body, finish string
		tokens             int
	}{
		{"/v1/completions", `{"prompt":"go on"}`, "stop", 4},
		{"/v1/completions", `{"prompt":"go on","min_tokens":6}`, "stop", 6},
		{"/v1/completions", `{"prompt":"go on","ignore_eos":true}`, "length", 16},
		{"/v1/completions", `{"prompt":"go on","ignore_eos":true,"max_tokens":7}`, "length", 7},
		{"/v1/chat/completions", chatBody("", "go on", `"ignore_eos":true`), "length", 60 - chatPrompt},
		{"/v1/chat/completions", chatBody("", "go on", `"min_tokens":9`), "stop", 9},
	} {
		resp := sampled(t, ts, tc.path, tc.body)
		if c := resp.Choices[0]; *c.FinishReason != tc.finish || resp.Usage.CompletionTokens != tc.tokens || tokens(c.text()) != tc.tokens {
			t.Errorf("%s: %d tokens, finish %s; want %d, %s", tc.body, resp.Usage.CompletionTokens, *c.FinishReason, tc.tokens, tc.finish)
		}
	}
	for _, tc := range []struct{ body, want string }{
		{`{"prompt":"x","min_tokens":5,"max_tokens":2}`, "min_tokens must be less than or equal to max_tokens=2, got 5."},
		{`{"prompt":"x","min_tokens":17}`, "min_tokens must be less than or equal to max_tokens=16, got 17."},
		{`{"prompt":"x","min_tokens":-1}`, "min_tokens must be greater than or equal to 0, got -1."},
		{`{"prompt":"x","stop":["a",""]}`, "stop cannot contain an empty string."},
		{`{"prompt":"x","stop":["a","b","c","d","e"]}`, "List should have at most 4 items after validation, not 5"},
		{`{"prompt":"x","stop":7}`, "stop: must be a string or an array of strings"},
	} {
		if e := apiErr(t, post(t, ts, "/v1/completions", tc.body, http.StatusBadRequest)); e.Message != tc.want {
			t.Errorf("%s: %q, want %q", tc.body, e.Message, tc.want)
		}
	}
}

// The OpenAI SDK reads n choices with logprobs, streamed and not, and a
// completion with echo and logprobs.
func TestOpenAISDKSampling(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	client := sdkClient(ts)
	ctx := t.Context()
	params := openai.ChatCompletionNewParams{
		Model:               "sim-model",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("two ways")},
		MaxCompletionTokens: openai.Int(4),
		N:                   openai.Int(2),
		Logprobs:            openai.Bool(true),
		TopLogprobs:         openai.Int(2),
		Stop:                openai.ChatCompletionNewParamsStopUnion{OfStringArray: []string{"zzz"}},
	}
	resp, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if len(resp.Choices) != 2 || resp.Choices[1].Index != 1 || len(resp.Choices[1].Logprobs.Content) != 4 || len(resp.Choices[1].Logprobs.Content[0].TopLogprobs) != 2 {
		t.Errorf("response = %+v", resp)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	acc := accumulate(t, client.Chat.Completions.NewStreaming(ctx, params))
	if len(acc.Choices) != 2 || acc.Usage.CompletionTokens != 8 {
		t.Errorf("accumulated = %+v", acc.ChatCompletion)
	}
	for i, c := range acc.Choices {
		if c.Message.Content != resp.Choices[i].Message.Content || c.FinishReason != "length" {
			t.Errorf("streamed choice %d = %q %q, whole %q", i, c.Message.Content, c.FinishReason, resp.Choices[i].Message.Content)
		}
	}

	cmpl, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:     "sim-model",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("echo me")},
		MaxTokens: openai.Int(2),
		Echo:      openai.Bool(true),
		Logprobs:  openai.Int(1),
		N:         openai.Int(2),
	})
	if err != nil {
		t.Fatalf("Completions.New: %v", err)
	}
	if len(cmpl.Choices) != 2 || !strings.HasPrefix(cmpl.Choices[1].Text, "echo me") || len(cmpl.Choices[1].Logprobs.Tokens) != 4 {
		t.Errorf("completion = %+v", cmpl)
	}
}

// accumulate reads a chat stream of the official SDK to its end into the
// SDK's accumulator, failing the test on a chunk it rejects or an error.
func accumulate(t *testing.T, st *ssestream.Stream[openai.ChatCompletionChunk]) openai.ChatCompletionAccumulator {
	t.Helper()
	defer st.Close()
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		if !acc.AddChunk(st.Current()) {
			t.Fatalf("accumulator rejected chunk %s", st.Current().RawJSON())
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return acc
}
