package sim

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/affinity"
	"rolter.dev/pkg/chunkindex"
	"rolter.dev/pkg/routing"
	"rolter.dev/tests/vllmsim"
)

// Prompt text is made of words drawn from a fixed vocabulary of short
// lowercase words, each of which vllmsim.Tokenize maps to exactly one token.
// A Segment names a deterministic stream of such words by a 64-bit key, so a
// workload describes a prompt of a million tokens in a few bytes, two
// segments with the same key and length are the same text, and a shorter
// segment with a key is a prefix of a longer one with the same key (the
// trace's partial last blocks rely on this).

const (
	vocabBits = 12
	vocabSize = 1 << vocabBits
)

// vocabulary holds the words and their token ids (vllmsim.Tokenize of the
// word, a single id each).
var vocabulary = func() (v struct {
	words [vocabSize]string
	ids   [vocabSize]uint32
}) {
	rng := rand.New(rand.NewPCG(0x726f6c746572, 0x73696d))
	seen := make(map[string]bool, vocabSize)
	var b [6]byte
	for i := 0; i < vocabSize; {
		n := 2 + rng.IntN(5) // 2..6 letters: one tokenizer piece
		for j := range n {
			b[j] = byte('a' + rng.IntN(26))
		}
		w := string(b[:n])
		if seen[w] {
			continue
		}
		ids := vllmsim.Tokenize(w)
		if len(ids) != 1 {
			panic("sim: vocabulary word " + w + " is not one token")
		}
		seen[w] = true
		v.words[i], v.ids[i] = w, ids[0]
		i++
	}
	return v
}()

// mix64 is the splitmix64 finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Key derives a segment key from its parts (a seed, a kind, indexes).
func Key(parts ...uint64) uint64 {
	h := uint64(0x9e3779b97f4a7c15)
	for _, p := range parts {
		h = mix64(h ^ mix64(p+0x632be59bd9b4e019))
	}
	return h
}

// Segment kinds, the second part of a workload's segment keys.
const (
	kindGSPSystem = iota + 1
	kindGSPQuestion
	kindMTSystem
	kindMTUser
	kindMTAnswer
	kindAgentSystem
	kindAgentTask
	kindAgentCall
	kindAgentResult
	kindUnique
	kindTraceBlock
	kindMTThink // not a segment: the stream of multiturn's random think times
	kindStream  // not a segment: whether a session streams (predicted_ttft:stream=P)
)

// Segment is N words (N tokens) of the word stream named by Key.
type Segment struct {
	Key uint64
	N   int
}

// word returns the vocabulary index of the i-th word of the stream key.
func word(key uint64, i int) int {
	return int(mix64(key+uint64(i)*0x9e3779b97f4a7c15) & (vocabSize - 1))
}

// Message is one turn of a conversation: a role and its content, the
// segments' words joined by single spaces.
type Message struct {
	Role    string
	Content []Segment
}

// Tokens returns the number of content tokens.
func (m Message) Tokens() int {
	n := 0
	for _, s := range m.Content {
		n += s.N
	}
	return n
}

// appendContent appends the message content (words separated by spaces).
func appendContent(b *strings.Builder, m Message) {
	first := true
	for _, s := range m.Content {
		for i := range s.N {
			if !first {
				b.WriteByte(' ')
			}
			first = false
			b.WriteString(vocabulary.words[word(s.Key, i)])
		}
	}
}

// Text returns a message's content text.
func (m Message) Text() string {
	var b strings.Builder
	appendContent(&b, m)
	return b.String()
}

// RouteText is the conversation text a gateway routes on, in the form
// pkg/affinity gives chat messages: "role: content\n" per turn.
func RouteText(msgs []Message) string {
	var b strings.Builder
	n := 0
	for _, m := range msgs {
		n += len(m.Role) + 3 + 6*m.Tokens()
	}
	b.Grow(n)
	for _, m := range msgs {
		b.WriteString(m.Role)
		b.WriteString(": ")
		appendContent(&b, m)
		b.WriteByte('\n')
	}
	return b.String()
}

// limitedText accumulates text up to a byte limit (≤ 0: none) and keeps
// counting the length past it.
type limitedText struct {
	b     strings.Builder
	limit int
	n     int
	h     *xxh3.Hasher // when set, hashes the whole text
}

func (t *limitedText) write(s string) {
	t.n += len(s)
	if t.h != nil {
		_, _ = t.h.WriteString(s)
	}
	if t.limit > 0 && t.b.Len() >= t.limit {
		return
	}
	t.b.WriteString(s)
}

func (t *limitedText) content(m Message, sep string) {
	first := true
	for _, s := range m.Content {
		for i := range s.N {
			if !first {
				t.write(sep)
			}
			first = false
			t.write(vocabulary.words[word(s.Key, i)])
		}
	}
}

// text returns the accumulated text cut to the limit.
func (t *limitedText) text() string {
	if t.limit > 0 {
		return cut(t.b.String(), t.limit)
	}
	return t.b.String()
}

// ContentText joins the messages' contents with single spaces, without
// roles: how SGLang's router (extract_text_for_routing) and AIBrix's gateway
// (parseChatMessages) read a chat request. It returns at most limit bytes
// (limit ≤ 0: all) and the whole text's length.
func ContentText(msgs []Message, limit int) (string, int) {
	t := limitedText{limit: limit}
	for i, m := range msgs {
		if i > 0 {
			t.write(" ")
		}
		t.content(m, " ")
	}
	return t.text(), t.n
}

// RoleContentText is what llm-d's estimate token producer packs for a chat
// request: each message's role followed by its content, no separators (the
// request has no tools), at most limit bytes (limit ≤ 0: all).
func RoleContentText(msgs []Message, limit int) string {
	t := limitedText{limit: limit}
	for _, m := range msgs {
		t.write(m.Role)
		t.content(m, " ")
	}
	return t.text()
}

// VLLMMessages converts msgs to the vLLM simulator's chat messages.
func VLLMMessages(msgs []Message) []vllmsim.Message {
	out := make([]vllmsim.Message, len(msgs))
	for i, m := range msgs {
		out[i] = vllmsim.Message{Role: m.Role, Content: m.Text()}
	}
	return out
}

// roleTokens holds vllmsim.Tokenize("<|role|>") for the roles the workloads
// use; it is read-only after package initialisation.
var roleTokens = func() map[string][]uint32 {
	m := map[string][]uint32{}
	for _, r := range []string{"system", "user", "assistant", "tool"} {
		m[r] = vllmsim.Tokenize("<|" + r + "|>")
	}
	return m
}()

func headerTokens(role string) []uint32 {
	if t, ok := roleTokens[role]; ok {
		return t
	}
	return vllmsim.Tokenize("<|" + role + "|>")
}

// PromptTokens returns the token ids a vLLM simulator replica computes for a
// chat request with msgs: vllmsim.Tokenize(vllmsim.ChatPrompt(msgs)). It is
// built from the vocabulary ids without rendering or tokenizing the text
// (white space separates tokenizer pieces, so the tokens of the rendered
// prompt are the concatenation of each part's tokens).
func PromptTokens(msgs []Message) []uint32 {
	n := len(headerTokens("assistant"))
	for _, m := range msgs {
		n += len(headerTokens(m.Role)) + m.Tokens()
	}
	out := make([]uint32, 0, n)
	for _, m := range msgs {
		out = append(out, headerTokens(m.Role)...)
		for _, s := range m.Content {
			for i := range s.N {
				out = append(out, vocabulary.ids[word(s.Key, i)])
			}
		}
	}
	return append(out, headerTokens("assistant")...)
}

// MaxPromptBytes is the most prompt text a routing context carries (the
// value of pkg/affinity's MaxBytes).
const MaxPromptBytes = 32 << 10

// cut returns the longest prefix of s of at most limit bytes that ends on a
// UTF-8 character boundary.
func cut(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	i := limit
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

// Request is one request of a session: the conversation so far and the
// number of tokens to generate.
type Request struct {
	Session  *Session
	Turn     int
	Messages []Message
	Output   int

	tokens []uint32
	hashes []uint64
	hashBS int
}

// Tokens returns the prompt's token ids as a vLLM simulator replica
// computes them (memoized).
func (r *Request) Tokens() []uint32 {
	if r.tokens == nil {
		r.tokens = PromptTokens(r.Messages)
	}
	return r.tokens
}

// BlockHashes returns vllmsim.BlockHashes of the prompt tokens (memoized for
// one block size).
func (r *Request) BlockHashes(blockSize int) []uint64 {
	if r.hashes == nil || r.hashBS != blockSize {
		r.hashes, r.hashBS = vllmsim.BlockHashes(r.Tokens(), blockSize), blockSize
	}
	return r.hashes
}

// release drops the memoized tokens and hashes.
func (r *Request) release() { r.tokens, r.hashes = nil, nil }

// Header returns the HTTP headers the simulated client sends: x-session-id
// when session keys are on.
func (r *Request) Header(sessionKeys bool) http.Header {
	h := http.Header{}
	if sessionKeys && r.Session != nil && r.Session.Key != "" {
		h.Set("X-Session-Id", r.Session.Key)
	}
	return h
}

// ChatBody returns the request as an OpenAI chat completions JSON body.
func (r *Request) ChatBody() []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body := struct {
		Model     string `json:"model"`
		Messages  []msg  `json:"messages"`
		MaxTokens int    `json:"max_tokens"`
	}{Model: "sim", MaxTokens: r.Output}
	for _, m := range r.Messages {
		body.Messages = append(body.Messages, msg{m.Role, m.Text()})
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return b
}

// RouteContext builds the routing context a rolter proxy builds for r: the
// proxy's own pkg/affinity reads the request's chat completions body and
// headers. (directContext builds the same context without a JSON round trip;
// TestRouteContextIsAffinitys checks that they agree.)
func RouteContext(r *Request, sessionKeys bool) routing.Context {
	return affinity.Build(affinity.PathChatCompletions, r.ChatBody(), r.Header(sessionKeys))
}

// directContext builds, from the messages, the context affinity.Build reads
// from a chat body: Prompt = the first 32 KiB of RouteText cut on a character
// boundary, PromptLen = its whole length, PromptDigest = xxh3 of the whole
// text, PromptChain = the whole text's chunk fingerprint when Prompt is
// cut, SessionKey = the session's key when sessionKeys.
func directContext(r *Request, sessionKeys bool) routing.Context {
	// RouteText, kept to its first MaxPromptBytes, the rest only measured
	// and hashed.
	t := limitedText{limit: MaxPromptBytes, h: xxh3.New()}
	for _, m := range r.Messages {
		t.write(m.Role)
		t.write(": ")
		t.content(m, " ")
		t.write("\n")
	}
	ctx := routing.Context{
		Prompt:       t.text(),
		PromptLen:    t.n,
		PromptDigest: t.h.Sum64(),
		HasDigest:    true,
	}
	if len(ctx.Prompt) < t.n {
		// Past the cut only the whole text's fingerprint.
		whole := RouteText(r.Messages)
		ctx.PromptChain = chunkindex.Chain{Hashes: chunkindex.Hashes(nil, whole), Len: len(whole)}
	}
	if sessionKeys && r.Session != nil {
		ctx.SessionKey = r.Session.Key
	}
	return ctx
}
