package vllmsim

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// This file holds the log probabilities of chat completions (logprobs,
// top_logprobs) and completions (logprobs), and of both's prompts
// (prompt_logprobs): synthetic values, in vLLM's response shapes. A
// token's candidates are itself, always the most likely, then other words
// of the output vocabulary in decreasing order; their probabilities sum to
// less than 1. They are a pure function of the prompt, the choice and the
// position, so a streamed response and a whole one carry the same values.

// vocabSize is the size of the simulator's vocabulary: [Tokenize]'s ids
// are below 2^31. A logprobs count of -1 asks for all of it.
const vocabSize = 1 << 31

// candidate is one token of a position's top list with its log probability.
type candidate struct {
	token   string
	logprob float64
}

// logprobs makes the log probabilities of a request's tokens.
type logprobs struct {
	base uint64 // the prompt's seed (tokensSeed)
	k    int    // top logprobs asked per token
	// echoTop is the length of an echoed prompt token's top list.
	echoTop int
}

// newLogprobs returns the logprobs of a plan, nil when it asks for none.
//
// An echoed prompt token's top list is the first logprobs+1 entries of
// its prompt logprobs (_create_completion_logprobs, completion/serving.py
// at 030ea52effcb): max(logprobs, 1) when echo sets prompt_logprobs to
// logprobs, as an output token's, but more or fewer with a
// prompt_logprobs of its own.
func newLogprobs(p plan) *logprobs {
	if p.sampling.logprobs == nil {
		return nil
	}
	k := *p.sampling.logprobs
	l := &logprobs{base: tokensSeed(p.prompt), k: k, echoTop: max(k, 1)}
	if pk := p.sampling.promptLogprobs; pk != nil {
		l.echoTop = min(max(*pk, 1), k+1)
	}
	return l
}

// candidates returns the n >= 1 candidates of the token at pos of choice
// (-1 for the prompt): the token itself first, then n-1 other words with
// the token's leading white space.
func (l *logprobs) candidates(choice, pos int, token string, n int) []candidate {
	s := l.base ^ uint64(int64(choice+1))<<40 ^ uint64(pos)
	s = splitmix64(&s)
	p := 0.5 + 0.45*float64(splitmix64(&s)>>11)/(1<<53) // in [0.5, 0.95)
	out := make([]candidate, 1, n)
	out[0] = candidate{token, math.Log(p)}
	lead := token[:len(token)-len(strings.TrimLeftFunc(token, unicode.IsSpace))]
	start, stride := splitmix64(&s), 2*(splitmix64(&s)%32)+1 // odd: a permutation
	rest := 1 - p
	for j := range uint64(len(outputWords)) {
		if len(out) == n {
			break
		}
		w := lead + outputWords[(start+j*stride)%uint64(len(outputWords))]
		if w == token {
			continue
		}
		rest /= 2
		out = append(out, candidate{w, math.Log(rest)})
	}
	return out
}

// chatLogprobs is vLLM's ChatCompletionLogProbs
// (vllm/entrypoints/openai/chat_completion/protocol.py at 002032ee2b18).
type chatLogprobs struct {
	Content []chatLogprobEntry `json:"content"`
}

// chatLogprobEntry is ChatCompletionLogProbsContent: a generated token and
// its top list, top_logprobs of them, the token first
// (OpenAIServingChat._create_chat_logprobs, chat_completion/serving.py at
// 006c49d485f9).
type chatLogprobEntry struct {
	chatLogprob
	TopLogprobs []chatLogprob `json:"top_logprobs"`
}

// chatLogprob is ChatCompletionLogProb: bytes are the token's UTF-8.
type chatLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

func newChatLogprob(c candidate) chatLogprob {
	b := make([]int, len(c.token))
	for i := range len(c.token) {
		b[i] = int(c.token[i])
	}
	return chatLogprob{Token: c.token, Logprob: c.logprob, Bytes: b}
}

// chat returns the chat logprobs of choice q's tokens [from, to).
func (l *logprobs) chat(q *sequence, from, to int) *chatLogprobs {
	out := &chatLogprobs{Content: make([]chatLogprobEntry, 0, to-from)}
	for pos := from; pos < to; pos++ {
		cands := l.candidates(q.index, pos, q.pieces[pos], max(l.k, 1))
		e := chatLogprobEntry{chatLogprob: newChatLogprob(cands[0]), TopLogprobs: make([]chatLogprob, 0, l.k)}
		for _, c := range cands[:min(l.k, len(cands))] {
			e.TopLogprobs = append(e.TopLogprobs, newChatLogprob(c))
		}
		out.Content = append(out.Content, e)
	}
	return out
}

// completionLogprobs is vLLM's CompletionLogProbs
// (vllm/entrypoints/openai/completion/protocol.py at 002032ee2b18), built
// as OpenAIServingCompletion._create_completion_logprobs builds it
// (completion/serving.py at 030ea52effcb): a token's text_offset is the
// previous one's plus the previous token's length in characters, the
// first one's the characters streamed before; a token without a logprob
// (the first prompt token, echoed) has null in token_logprobs and
// top_logprobs; a top list is the token, the most likely, then the
// others, max(logprobs, 1) in all.
type completionLogprobs struct {
	TextOffset    []int         `json:"text_offset"`
	TokenLogprobs []*float64    `json:"token_logprobs"`
	Tokens        []string      `json:"tokens"`
	TopLogprobs   []topLogprobs `json:"top_logprobs"`
	next          int           // the next token's text offset
}

// topLogprobs is one position's top list, a JSON object from token to
// logprob in the list's order; nil is null.
type topLogprobs []candidate

func (t topLogprobs) MarshalJSON() ([]byte, error) {
	if t == nil {
		return []byte("null"), nil
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, c := range t {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(c.token)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.WriteString(strconv.FormatFloat(c.logprob, 'g', -1, 64))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// newCompletionLogprobs starts the logprobs of a completion or chunk whose
// first token is at text offset offset.
func newCompletionLogprobs(offset int) *completionLogprobs {
	return &completionLogprobs{TextOffset: []int{}, TokenLogprobs: []*float64{}, Tokens: []string{}, TopLogprobs: []topLogprobs{}, next: offset}
}

// add appends a token with its candidates, nil for a token without.
func (c *completionLogprobs) add(token string, cands []candidate) {
	c.TextOffset = append(c.TextOffset, c.next)
	c.next += utf8.RuneCountInString(token)
	c.Tokens = append(c.Tokens, token)
	if cands == nil {
		c.TokenLogprobs = append(c.TokenLogprobs, nil)
		c.TopLogprobs = append(c.TopLogprobs, nil)
		return
	}
	lp := cands[0].logprob
	c.TokenLogprobs = append(c.TokenLogprobs, &lp)
	c.TopLogprobs = append(c.TopLogprobs, cands)
}

// addPrompt appends the prompt's tokens, as echo puts them first: the
// first has no logprob, as no token comes before it.
func (l *logprobs) addPrompt(c *completionLogprobs, tokens []string) {
	for pos, t := range tokens {
		var cands []candidate
		if pos > 0 {
			cands = l.candidates(-1, pos, t, l.echoTop)
		}
		c.add(t, cands)
	}
}

// addOutput appends choice q's tokens [from, to).
func (l *logprobs) addOutput(c *completionLogprobs, q *sequence, from, to int) {
	for pos := from; pos < to; pos++ {
		c.add(q.pieces[pos], l.candidates(q.index, pos, q.pieces[pos], max(l.k, 1)))
	}
}

// promptLogprob is vLLM's Logprob (vllm/logprobs.py at 578b601cd1f4) as
// prompt_logprobs lists it, for the token id.
type promptLogprob struct {
	id           uint32
	Logprob      float64 `json:"logprob"`
	Rank         int     `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// promptPosition is one position of prompt_logprobs: a JSON object from
// token id (a string, as Python's json writes an int key) to its Logprob,
// in rank order; nil is null.
type promptPosition []promptLogprob

func (p promptPosition) MarshalJSON() ([]byte, error) {
	if p == nil {
		return []byte("null"), nil
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, e := range p {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(strconv.FormatUint(uint64(e.id), 10))
		b.WriteString(`":`)
		v, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// newPromptLogprobs returns the prompt_logprobs of a plan that asks for
// them; texts are its prompt tokens' texts, their decoded_token.
//
// vLLM's list has one entry per prompt token: null for the first, which
// no token precedes (create_prompt_logprobs), then the token with its
// rank and the top k (append_logprobs_for_next_position, vllm/logprobs.py
// at 578b601cd1f4). Here the token is always the most likely, so an entry
// holds it, rank 1, and the next max(k, 1)-1 candidates: k entries, or
// the token alone for k = 0.
func newPromptLogprobs(p plan, texts []string) []promptPosition {
	if len(texts) != len(p.prompt) {
		texts = detokenize(p.prompt)
	}
	k := *p.sampling.promptLogprobs
	l := &logprobs{base: tokensSeed(p.prompt), k: k}
	out := make([]promptPosition, len(p.prompt))
	for pos := 1; pos < len(out); pos++ {
		out[pos] = l.promptPosition(p.prompt[pos], pos, texts[pos])
	}
	return out
}

// promptPosition returns the entry of prompt token id at pos, whose text
// is text. A candidate whose id is the token's is left out: a JSON key
// appears once.
func (l *logprobs) promptPosition(id uint32, pos int, text string) promptPosition {
	cands := l.candidates(-1, pos, text, max(l.k, 1))
	out := make(promptPosition, 0, len(cands))
	for rank, c := range cands {
		cid := id
		if rank > 0 {
			if cid = pieceID(strings.TrimLeftFunc(c.token, unicode.IsSpace)); cid == id {
				continue
			}
		}
		out = append(out, promptLogprob{id: cid, Logprob: c.logprob, Rank: rank + 1, DecodedToken: c.token})
	}
	return out
}
