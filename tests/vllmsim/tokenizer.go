package vllmsim

import (
	"hash/fnv"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxPieceRunes is the longest run of letters or digits that [Tokenize] maps
// to a single token; longer runs are cut into chunks of this many runes, so
// the token count grows with the text length as with a real BPE vocabulary.
const maxPieceRunes = 6

// Tokenize turns text into token ids with the simulator's tokenizer. It is a
// pure function of text, so a gateway or a test can reproduce the ids a
// simulated replica computes (and hashes into prefix-cache blocks).
//
// The text is cut into pieces: each maximal run of Unicode letters and digits
// (split into chunks of at most 6 runes), and each other rune that is not
// white space on its own. White space only separates pieces. Each piece maps
// to the 32-bit FNV-1a hash of its UTF-8 bytes with the top bit cleared, so
// every id is below 2^31. Invalid UTF-8 bytes count as U+FFFD.
//
// Because white space never belongs to a piece, Tokenize(a + " " + b) equals
// Tokenize(a) followed by Tokenize(b): concatenated turns of a conversation
// share the token prefix of the earlier turns.
//
// Tokenize is safe for concurrent use.
func Tokenize(text string) []uint32 {
	ids := make([]uint32, 0, len(text)/4+1)
	pieces(text, func(p string) { ids = append(ids, pieceID(p)) })
	return ids
}

// TokenStrings returns the piece of text each token of Tokenize(text)
// stands for (U+FFFD for an invalid byte), as vLLM's /tokenize returns with
// return_token_strs.
func TokenStrings(text string) []string {
	var out []string
	pieces(text, func(p string) { out = append(out, p) })
	return out
}

// pieces calls emit with each tokenizer piece of text, in order.
func pieces(text string, emit func(string)) {
	pieceSpans(text, func(p string, _ int) { emit(p) })
}

// pieceSpans calls emit with each tokenizer piece of text, in order, and
// the byte offset in text where the piece ends.
func pieceSpans(text string, emit func(piece string, end int)) {
	start, runes := -1, 0 // start of the current letter/digit run
	flush := func(end int) {
		if start >= 0 {
			emit(text[start:end], end)
			start, runes = -1, 0
		}
	}
	for i, r := range text {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			if runes == maxPieceRunes {
				flush(i)
			}
			if start < 0 {
				start = i
			}
			runes++
		case unicode.IsSpace(r):
			flush(i)
		default:
			flush(i)
			_, size := utf8.DecodeRuneInString(text[i:])
			if r == utf8.RuneError {
				emit(string(utf8.RuneError), i+size)
			} else {
				emit(text[i:i+size], i+size)
			}
		}
	}
	flush(len(text))
}

// tokenTexts returns the text each token of Tokenize(text) stands for, with
// the white space before it, as a BPE vocabulary's tokens carry their
// leading space: they concatenate to text but for its trailing white space.
// Completions with echo report the prompt's tokens so, and their
// text_offset adds up along the text.
func tokenTexts(text string) []string {
	var out []string
	prev := 0
	pieceSpans(text, func(_ string, end int) {
		out = append(out, text[prev:end])
		prev = end
	})
	return out
}

// knownPieces maps the id of every piece the simulator can name back to
// the piece: the output vocabulary ([outputWords]) and the printable ASCII
// characters.
var knownPieces = func() map[uint32]string {
	m := make(map[uint32]string, len(outputWords)+95)
	for c := byte('!'); c <= '~'; c++ {
		m[pieceID(string(c))] = string(c)
	}
	for _, w := range outputWords {
		m[pieceID(w)] = w
	}
	return m
}()

// detokenize is the simulator's inverse of [Tokenize], as far as one
// exists: Tokenize hashes its pieces and drops white space, so only the id
// of a known piece (knownPieces) names its text; any other id reads
// "token_id:<id>", the placeholder vLLM prints for a token it shows as its
// id (format_token_id_placeholder, vllm/entrypoints/generate/base/
// serving.py at 015d1c9b46ae). It returns each token's text, the second on preceded by a
// space, as tokenTexts does for a text: the prompt text of a token-id
// prompt is their concatenation.
func detokenize(ids []uint32) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		p, ok := knownPieces[id]
		if !ok {
			p = "token_id:" + strconv.FormatUint(uint64(id), 10)
		}
		if i > 0 {
			p = " " + p
		}
		out[i] = p
	}
	return out
}

// pieceID maps one tokenizer piece to its token id.
func pieceID(piece string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(piece))
	return h.Sum32() &^ (1 << 31)
}

// Message is one turn of a conversation, reduced to what the simulator's chat
// template reads: a role ("system", "user", "assistant", "tool", ...) and the
// plain text of its content.
type Message struct {
	// Role is the speaker of the turn.
	Role string
	// Content is the turn's text; multi-part content is joined with "\n".
	Content string
}

// ChatPrompt renders messages with the simulator's chat template and appends
// the generation prompt for the assistant's reply, as vLLM does by default
// for chat requests. It equals RenderChat(messages, true).
func ChatPrompt(messages []Message) string {
	return RenderChat(messages, true)
}

// RenderChat renders messages with the simulator's chat template: every turn
// becomes "<|role|>\ncontent\n". When addGenerationPrompt is true the opening
// of the assistant's turn, "<|assistant|>\n", follows. All API dialects
// (OpenAI chat, Anthropic messages, OpenAI responses) go through this one
// template, so the same conversation yields the same prompt tokens whatever
// the endpoint. It is a pure function and safe for concurrent use.
func RenderChat(messages []Message, addGenerationPrompt bool) string {
	return RenderChatTemplate(messages, ChatTemplate{AddGenerationPrompt: addGenerationPrompt})
}

// ChatTemplate holds the inputs of the chat template beyond the messages,
// named as vLLM's chat requests (and its /tokenize) name them.
type ChatTemplate struct {
	// AddGenerationPrompt appends the opening of the assistant's turn.
	AddGenerationPrompt bool
	// ContinueFinalMessage leaves the last turn open (no closing newline),
	// so the model continues it. vLLM refuses it together with
	// AddGenerationPrompt.
	ContinueFinalMessage bool
	// Tools is the request's tools array as compact JSON, or empty. A
	// non-empty one is rendered first, as "<|tools|>\n" + Tools + "\n", the
	// way real templates put the tool schemas before the conversation.
	Tools string
	// Kwargs is the template's other keyword arguments (vLLM's merged
	// chat_template_kwargs: a request's reasoning effort, enable_thinking,
	// documents, anything the client sets) as compact JSON with sorted
	// keys, or empty. A non-empty one is rendered first, as
	// "<|kwargs|>\n" + Kwargs + "\n", the way real templates put a
	// reasoning effort or a thinking switch in the prompt. Real templates
	// read only the variables they declare; this one renders them all, so
	// a prompt rendered with other arguments than its request's shows.
	Kwargs string
}

// RenderChatTemplate renders messages with the simulator's chat template
// and the options of t. RenderChat(m, g) equals RenderChatTemplate(m,
// ChatTemplate{AddGenerationPrompt: g}). Every endpoint that renders a
// conversation (chat completions, /tokenize, messages, responses) goes
// through it, so they agree on the prompt tokens.
func RenderChatTemplate(messages []Message, t ChatTemplate) string {
	var b strings.Builder
	if t.Kwargs != "" {
		writeTurn(&b, "kwargs", t.Kwargs)
	}
	if t.Tools != "" {
		writeTurn(&b, "tools", t.Tools)
	}
	for i, m := range messages {
		writeTurn(&b, m.Role, m.Content)
		if t.ContinueFinalMessage && i == len(messages)-1 {
			s := b.String()
			b.Reset()
			b.WriteString(s[:len(s)-1]) // open-ended: no closing newline
		}
	}
	if t.AddGenerationPrompt {
		b.WriteString("<|assistant|>\n")
	}
	return b.String()
}

func writeTurn(b *strings.Builder, role, content string) {
	b.WriteString("<|")
	b.WriteString(role)
	b.WriteString("|>\n")
	b.WriteString(content)
	b.WriteString("\n")
}
