package vllmsim_test

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"rolter.dev/tests/vllmsim"
)

// promptLogprob is one entry of a prompt position in prompt_logprobs.
type promptLogprob struct {
	Logprob      float64 `json:"logprob"`
	Rank         int     `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// checkPromptLogprobs checks vLLM's prompt_logprobs of a prompt of ids
// whose tokens read texts: null for the first token, then for each the
// token first, rank 1, named by its id and text, and want entries in all
// of distinct ranks, each less likely than the one before.
func checkPromptLogprobs(t *testing.T, raw json.RawMessage, ids []uint32, texts []string, want int) {
	t.Helper()
	positions := decode[[]json.RawMessage](t, raw)
	if len(positions) != len(ids) || string(positions[0]) != "null" {
		t.Fatalf("prompt_logprobs %s, want %d positions, the first null", raw, len(ids))
	}
	for pos := 1; pos < len(ids); pos++ {
		key := strconv.FormatUint(uint64(ids[pos]), 10)
		if !strings.HasPrefix(string(positions[pos]), `{"`+key+`":`) {
			t.Fatalf("position %d = %s, want token %s first", pos, positions[pos], key)
		}
		entries := decode[map[string]promptLogprob](t, positions[pos])
		if tok := entries[key]; len(entries) != want || tok.Rank != 1 || tok.DecodedToken != texts[pos] {
			t.Fatalf("position %d = %s, want %d entries, %s (%q) ranked 1", pos, positions[pos], want, key, texts[pos])
		}
		byRank, sum := make([]promptLogprob, want+1), 0.0
		for id, e := range entries {
			if e.Rank < 1 || e.Rank > want || byRank[e.Rank].Rank != 0 || e.Logprob >= 0 || (id != key && id != strconv.FormatUint(uint64(vllmsim.Tokenize(e.DecodedToken)[0]), 10)) {
				t.Fatalf("position %d: entry %s %+v in %s", pos, id, e, positions[pos])
			}
			byRank[e.Rank] = e
			sum += math.Exp(e.Logprob)
		}
		for r := 2; r <= want; r++ {
			if byRank[r].Logprob >= byRank[r-1].Logprob {
				t.Errorf("position %d: rank %d as likely as rank %d in %s", pos, r, r-1, positions[pos])
			}
		}
		if sum >= 1 {
			t.Errorf("position %d: probabilities sum to %v", pos, sum)
		}
	}
}

// promptTexts returns the texts of text's tokens as decoded_token shows
// them: each with the white space before it.
func promptTexts(text string) []string {
	var out []string
	rest := text
	for _, piece := range vllmsim.TokenStrings(text) {
		at := strings.Index(rest, piece) + len(piece)
		out = append(out, rest[:at])
		rest = rest[at:]
	}
	return out
}

// prompt_logprobs: in every completion choice, and once in a chat
// response, one entry per prompt token, max(prompt_logprobs, 1) candidates
// a position; null (chat) or left out (completions) without them.
func TestPromptLogprobs(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	prompt := "count the ways, now"
	for _, k := range []int{0, 1, 3} {
		extra := `,"max_tokens":2,"n":2,"prompt_logprobs":` + mustJSON(t, k)
		cmpl := decode[struct {
			Choices []struct {
				PromptLogprobs json.RawMessage `json:"prompt_logprobs"`
			} `json:"choices"`
		}](t, post(t, ts, "/v1/completions", sampledBody("/v1/completions", prompt, extra), http.StatusOK))
		for _, c := range cmpl.Choices {
			checkPromptLogprobs(t, c.PromptLogprobs, vllmsim.Tokenize(prompt), []string{"count", " the", " ways", ",", " now"}, max(k, 1))
		}

		chat := decode[struct {
			PromptLogprobs json.RawMessage `json:"prompt_logprobs"`
			Usage          openAIUsage     `json:"usage"`
		}](t, post(t, ts, "/v1/chat/completions", sampledBody("/v1/chat/completions", prompt, extra), http.StatusOK))
		rendered := vllmsim.ChatPrompt([]vllmsim.Message{{Role: "user", Content: prompt}})
		if ids := vllmsim.Tokenize(rendered); chat.Usage.PromptTokens != len(ids) {
			t.Errorf("prompt_tokens %d, want %d", chat.Usage.PromptTokens, len(ids))
		}
		checkPromptLogprobs(t, chat.PromptLogprobs, vllmsim.Tokenize(rendered), promptTexts(rendered), max(k, 1))
	}

	plain := decode[map[string]json.RawMessage](t, post(t, ts, "/v1/chat/completions", chatBody("", prompt, `"max_tokens":1`), http.StatusOK))
	if string(plain["prompt_logprobs"]) != "null" {
		t.Errorf("chat prompt_logprobs without asking: %s", plain["prompt_logprobs"])
	}
	if b := post(t, ts, "/v1/completions", `{"prompt":"x","max_tokens":1,"prompt_logprobs":null}`, http.StatusOK); strings.Contains(string(b), "prompt_logprobs") {
		t.Errorf("completion with prompt_logprobs without asking: %s", b)
	}
	// A stream may ask for prompt_logprobs 0, and gets none.
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		if b := post(t, ts, path, sampledBody(path, prompt, `,"max_tokens":2,"stream":true,"prompt_logprobs":0`), http.StatusOK); strings.Contains(string(b), "prompt_logprobs") {
			t.Errorf("%s streamed prompt_logprobs: %s", path, b)
		}
	}
}

// vLLM's 400s for prompt_logprobs: above 0 with streaming, negative but
// -1, no number, above max_logprobs (-1 is the whole vocabulary).
func TestPromptLogprobsRefused(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		for _, tc := range []struct{ extra, want string }{
			{`,"prompt_logprobs":1,"stream":true`, "`prompt_logprobs` are not available when `stream=True`."},
			{`,"prompt_logprobs":-1,"stream":true`, "`prompt_logprobs` are not available when `stream=True`."},
			{`,"prompt_logprobs":-2`, "`prompt_logprobs` must be a positive value or -1."},
			{`,"prompt_logprobs":"2"`, "`prompt_logprobs` must be an integer."},
			{`,"prompt_logprobs":21`, "Requested prompt logprobs of 21, which is greater than max allowed: 20 (parameter=prompt_logprobs, value=21)"},
			{`,"prompt_logprobs":-1`, "Requested prompt logprobs of 2147483648, which is greater than max allowed: 20 (parameter=prompt_logprobs, value=2147483648)"},
		} {
			e := apiErr(t, post(t, ts, path, sampledBody(path, "hi", tc.extra), http.StatusBadRequest))
			if e.Message != tc.want || e.Param == nil || *e.Param != "prompt_logprobs" || e.Type != "BadRequestError" {
				t.Errorf("%s %s: error %+v, want %q", path, tc.extra, e, tc.want)
			}
		}
		post(t, ts, path, sampledBody(path, "hi", `,"prompt_logprobs":20`), http.StatusOK)
	}
}

// A request with prompt logprobs reads nothing from the prefix cache and
// counts no query, as vLLM skips the lookup for it, but its blocks are
// cached for the next request. With echo, completions and chat ask for
// them too.
func TestPromptLogprobsSkipPrefixCache(t *testing.T) {
	sim, ts := newServer(t, vllmsim.Options{BlockSize: 2})
	cached := func(path, body string) int {
		t.Helper()
		return decode[struct {
			Usage openAIUsage `json:"usage"`
		}](t, post(t, ts, path, body, http.StatusOK)).Usage.PromptTokensDetails.CachedTokens
	}
	for _, tc := range []struct{ path, extra string }{
		{"/v1/completions", `,"prompt_logprobs":0`},
		{"/v1/chat/completions", `,"prompt_logprobs":2`},
		{"/v1/completions", `,"echo":true,"logprobs":0`},
		{"/v1/chat/completions", `,"echo":true`},
	} {
		sim.Reset()
		body := func(extra string) string {
			return sampledBody(tc.path, "one two three four five six", `,"max_tokens":1`+extra)
		}
		if got := cached(tc.path, body(tc.extra)); got != 0 {
			t.Errorf("%s%s: first request cached %d", tc.path, tc.extra, got)
		}
		before := sim.Cache().Stats()
		if got := cached(tc.path, body(tc.extra)); got != 0 {
			t.Errorf("%s%s: %d cached tokens read, want none", tc.path, tc.extra, got)
		}
		if after := sim.Cache().Stats(); after.QueriedTokens != before.QueriedTokens || after.HitTokens != before.HitTokens {
			t.Errorf("%s%s: cache counted a query: %+v, then %+v", tc.path, tc.extra, before, after)
		}
		if got := cached(tc.path, body("")); got == 0 {
			t.Errorf("%s: the blocks of the requests with prompt logprobs are not cached", tc.path)
		}
	}
}

// Echo makes a completion's prompt logprobs from its logprobs count; the
// echoed prompt tokens' top lists are the first logprobs+1 entries of
// their prompt logprobs, the same values.
func TestPromptLogprobsWithEcho(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	prompt := "count the ways, now"
	texts := []string{"count", " the", " ways", ",", " now"}
	for _, tc := range []struct {
		extra           string
		promptK, echoed int // entries of prompt_logprobs, of an echoed prompt token's top list
	}{
		{`,"logprobs":2`, 2, 2},
		{`,"logprobs":0`, 1, 1},
		{`,"logprobs":1,"prompt_logprobs":3`, 3, 2},
		{`,"logprobs":3,"prompt_logprobs":0`, 1, 1},
	} {
		resp := decode[struct {
			Choices []struct {
				Logprobs       completionLogprobs `json:"logprobs"`
				PromptLogprobs json.RawMessage    `json:"prompt_logprobs"`
			} `json:"choices"`
		}](t, post(t, ts, "/v1/completions", `{"prompt":`+mustJSONString(prompt)+`,"echo":true,"max_tokens":2`+tc.extra+`}`, http.StatusOK))
		c := resp.Choices[0]
		checkPromptLogprobs(t, c.PromptLogprobs, vllmsim.Tokenize(prompt), texts, tc.promptK)
		positions := decode[[]map[string]promptLogprob](t, c.PromptLogprobs)
		for pos := 1; pos < len(texts); pos++ {
			top := c.Logprobs.TopLogprobs[pos]
			if len(top) != tc.echoed || *c.Logprobs.TokenLogprobs[pos] != positions[pos][strconv.FormatUint(uint64(vllmsim.Tokenize(texts[pos])[0]), 10)].Logprob {
				t.Errorf("%s: echoed token %d: %v, logprob %v; prompt logprobs %v", tc.extra, pos, top, *c.Logprobs.TokenLogprobs[pos], positions[pos])
			}
			for _, e := range positions[pos] {
				if v, ok := top[e.DecodedToken]; ok && v != e.Logprob {
					t.Errorf("%s: echoed token %d: %q is %v, prompt logprobs %v", tc.extra, pos, e.DecodedToken, v, e.Logprob)
				}
			}
		}
	}
	if b := post(t, ts, "/v1/completions", `{"prompt":"x","echo":true,"max_tokens":1}`, http.StatusOK); strings.Contains(string(b), "prompt_logprobs") {
		t.Errorf("echo without logprobs has prompt logprobs: %s", b)
	}
}

// vllmsim counts prompt log probabilities in its bound on what a request
// makes it hold, as many times as the response carries them: once in a
// chat response, in each of a completion's choices.
func TestPromptLogprobsBounded(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{MaxLogprobs: 1000})
	long := strings.Repeat("a ", 3000) // 3000 tokens
	for _, tc := range []struct {
		path, extra string
		ok          bool
	}{
		{"/v1/chat/completions", `,"prompt_logprobs":10`, true},
		{"/v1/chat/completions", `,"prompt_logprobs":1000`, false},
		{"/v1/completions", `,"prompt_logprobs":1`, true},
		{"/v1/completions", `,"prompt_logprobs":100,"n":8`, false},
		{"/v1/completions", `,"echo":true,"logprobs":50,"n":8`, false},
	} {
		status := http.StatusBadRequest
		if tc.ok {
			status = http.StatusOK
		}
		b := post(t, ts, tc.path, sampledBody(tc.path, long, `,"max_tokens":1`+tc.extra), status)
		if !tc.ok && !strings.Contains(apiErr(t, b).Message, "vllmsim holds a request's output in memory") {
			t.Errorf("%s %s: %s", tc.path, tc.extra, b)
		}
	}
}
