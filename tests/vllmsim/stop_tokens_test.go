package vllmsim_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"rolter.dev/tests/vllmsim"
)

// ended is how the first choice of a response ended: its text, its
// finish_reason, its stop_reason as JSON (a string, a token id or null),
// and the response's completion tokens.
type ended struct {
	text, finish, stop string
	tokens             int
}

// endResponse is a chat or completion response, or one of its chunks,
// with stop_reason as JSON.
type endResponse struct {
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string         `json:"finish_reason"`
		StopReason   json.RawMessage `json:"stop_reason"`
	} `json:"choices"`
	Usage *openAIUsage `json:"usage"`
}

// wholeEnd sends a non-streaming request and returns how it ended.
func wholeEnd(t *testing.T, ts *httptest.Server, path, body string) ended {
	t.Helper()
	r := decode[endResponse](t, post(t, ts, path, body, http.StatusOK))
	c := r.Choices[0]
	return ended{text: c.Text + c.Message.Content, finish: ptr(c.FinishReason), stop: string(c.StopReason), tokens: r.Usage.CompletionTokens}
}

// streamEnd sends a streaming request, which must ask for the usage, and
// returns how it ended.
func streamEnd(t *testing.T, ts *httptest.Server, path, body string) ended {
	t.Helper()
	var e ended
	for _, ev := range parseSSE(t, post(t, ts, path, body, http.StatusOK)) {
		if ev.data == "[DONE]" {
			continue
		}
		r := decode[endResponse](t, []byte(ev.data))
		if r.Usage != nil {
			e.tokens = r.Usage.CompletionTokens
		}
		for _, c := range r.Choices {
			e.text += c.Text + ptr(c.Delta.Content)
			if c.FinishReason != nil {
				e.finish, e.stop = *c.FinishReason, string(c.StopReason)
			}
		}
	}
	return e
}

// firstNew returns the first index from i on of an id that no earlier id
// repeats.
func firstNew(t *testing.T, ids []uint32, i int) int {
	t.Helper()
	for ; i < len(ids); i++ {
		if !slices.Contains(ids[:i], ids[i]) {
			return i
		}
	}
	t.Fatalf("no new id from %d in %v", i, ids)
	return 0
}

// sampledBody returns a request body of path for prompt with extra
// fields (each after a comma).
func sampledBody(path, prompt, extra string) string {
	if path == "/v1/completions" {
		return `{"prompt":` + mustJSONString(prompt) + extra + `}`
	}
	return chatBody("", prompt, extra[min(1, len(extra)):])
}

func mustJSONString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// stop_token_ids: the choice ends at the first listed token it generates,
// with finish_reason stop and the id as stop_reason; the token counts in
// the usage but its text is left out unless include_stop_str_in_output.
// Ids are read as pydantic reads a list of ints, repeats and ids never
// generated change nothing. Streamed alike.
func TestStopTokenIDs(t *testing.T) {
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		t.Run(path, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{})
			body := func(extra string) string { return sampledBody(path, "tell a story", `,"max_tokens":12`+extra) }
			full := wholeEnd(t, ts, path, body(""))
			words, ids := strings.Fields(full.text), vllmsim.Tokenize(full.text)
			at := firstNew(t, ids, 3)
			stop := mustJSON(t, ids[at])
			before := strings.Join(words[:at], " ")
			for _, tc := range []struct{ name, extra, text string }{
				{"its text left out", `,"stop_token_ids":[` + stop + `]`, before},
				{"kept with include_stop_str_in_output", `,"stop_token_ids":[` + stop + `],"include_stop_str_in_output":true`, before + " " + words[at]},
				{"lax ids, repeats and absent ids", `,"stop_token_ids":[7,"` + stop + `",` + stop + `,true]`, before},
			} {
				want := ended{text: tc.text, finish: "stop", stop: stop, tokens: at + 1}
				if got := wholeEnd(t, ts, path, body(tc.extra)); got != want {
					t.Errorf("%s: %+v, want %+v", tc.name, got, want)
				}
				if got := streamEnd(t, ts, path, body(tc.extra+`,"stream":true,"stream_options":{"include_usage":true}`)); got != want {
					t.Errorf("%s streamed: %+v, want %+v", tc.name, got, want)
				}
			}
			for _, none := range []string{`,"stop_token_ids":null`, `,"stop_token_ids":[]`, `,"stop_token_ids":[7]`} {
				if got := wholeEnd(t, ts, path, body(none)); got != full || full.finish != "length" || full.stop != "null" {
					t.Errorf("%s: %+v, want %+v", none, got, full)
				}
			}
		})
	}
}

// Before min_tokens tokens a stop token is never generated (vLLM masks its
// logit): another word takes its place, and the first one generated after
// ends the choice.
func TestStopTokenIDsMinTokens(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	body := func(extra string) string { return `{"prompt":"tell a story","max_tokens":12` + extra + `}` }
	full := vllmsim.Tokenize(wholeEnd(t, ts, "/v1/completions", body("")).text)
	at := firstNew(t, full, 1)
	stop, minTokens := full[at], at+2
	got := wholeEnd(t, ts, "/v1/completions", body(`,"stop_token_ids":[`+mustJSON(t, stop)+`],"min_tokens":`+mustJSON(t, minTokens)))
	ids := vllmsim.Tokenize(got.text)
	if len(ids) < minTokens || !slices.Equal(ids[:at], full[:at]) || slices.Contains(ids[:minTokens], stop) {
		t.Fatalf("tokens %v, want %v up to %d, then no %d before %d tokens", ids, full, at, stop, minTokens)
	}
	// Past min_tokens the output is the plain one, up to its next stop
	// token, whose text is left out.
	want, shown := ended{finish: "length", stop: "null", tokens: 12}, 12
	if next := slices.Index(full[minTokens:], stop); next >= 0 {
		want = ended{finish: "stop", stop: mustJSON(t, stop), tokens: minTokens + next + 1}
		shown = minTokens + next
	}
	if got.finish != want.finish || got.stop != want.stop || got.tokens != want.tokens || !slices.Equal(ids[minTokens:], full[minTokens:shown]) {
		t.Errorf("min_tokens %d: %+v (tokens %v), want %+v after %v", minTokens, got, ids, want, full)
	}
}

// vLLM's 400s for stop_token_ids: an id out of the vocabulary (after
// removing repeats), and what pydantic refuses for a list of ints.
func TestStopTokenIDsRefused(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		for _, tc := range []struct{ ids, param, want string }{
			{`[-1]`, "stop_token_ids", "token_id(s) [-1] in stop_token_ids contain out-of-vocab token ids. Vocabulary size: 2147483648 (parameter=stop_token_ids, value=[-1])"},
			{`[5,-3,2147483648,-3,"-3"]`, "stop_token_ids", "token_id(s) [-3, 2147483648] in stop_token_ids contain out-of-vocab token ids. Vocabulary size: 2147483648 (parameter=stop_token_ids, value=[-3, 2147483648])"},
			{`[1,"x"]`, "body.stop_token_ids.1", "stop_token_ids.1: Input should be a valid integer, unable to parse string as an integer"},
			{`[1.5]`, "body.stop_token_ids.0", "stop_token_ids.0: Input should be a valid integer, got a number with a fractional part"},
			{`[null]`, "body.stop_token_ids.0", "stop_token_ids.0: Input should be a valid integer"},
			{`5`, "body.stop_token_ids", "stop_token_ids: Input should be a valid list"},
			{`"5"`, "body.stop_token_ids", "stop_token_ids: Input should be a valid list"},
		} {
			e := apiErr(t, post(t, ts, path, sampledBody(path, "hi", `,"stop_token_ids":`+tc.ids), http.StatusBadRequest))
			if e.Message != tc.want || e.Param == nil || *e.Param != tc.param {
				t.Errorf("%s %s: error %+v, want %q on %s", path, tc.ids, e, tc.want, tc.param)
			}
		}
	}
}
