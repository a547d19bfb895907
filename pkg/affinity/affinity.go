package affinity

import (
	"encoding/hex"
	"net/http"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/chunkindex"
	"rolter.dev/pkg/routing"
)

// MaxBytes is the most prompt text a context carries. Prefix affinity is
// decided by the leading bytes, so the trie walk stays bounded and a long
// prompt is never copied whole; its length and digest still cover all of it.
const MaxBytes = 32 * 1024

// SessionHeader is the request header whose value becomes the session key.
const SessionHeader = "X-Session-Id"

// MaxSessionKey is the longest x-session-id used as the session key as it
// is. A longer one becomes "xxh3-128:" and its 128-bit digest in hex: the
// balancers that remember sessions (pipeline keeps up to
// routing.SessionCap) then hold a few dozen bytes per session, not up to the
// server's 1 MiB header limit, and a session still has one key.
const MaxSessionKey = 256

// SessionKey returns the session key of an x-session-id value.
func SessionKey(id string) string {
	if len(id) <= MaxSessionKey {
		return id
	}
	d := xxh3.HashString128(id).Bytes()
	return "xxh3-128:" + hex.EncodeToString(d[:])
}

// Endpoint paths whose bodies carry a readable prompt. Any other path gives
// the raw-body fallback.
const (
	// PathChatCompletions reads messages.
	PathChatCompletions = "/v1/chat/completions"
	// PathMessages (Anthropic) reads system, then messages.
	PathMessages = "/v1/messages"
	// PathResponses reads instructions, then input (a string or items).
	PathResponses = "/v1/responses"
	// PathCompletions reads prompt.
	PathCompletions = "/v1/completions"
	// PathEmbeddings reads input.
	PathEmbeddings = "/v1/embeddings"
)

// Affinity is the prompt read from a request body.
type Affinity struct {
	// Text is the leading part of the prompt, at most MaxBytes long and cut
	// on a UTF-8 character boundary. It is always a prefix of the whole text.
	Text string
	// Len is the byte length of the whole prompt text plus the measured tool
	// traffic (tool calls and tool results as read or as compact JSON).
	Len int
	// Digest is the xxh3-64 (seed 0) digest of everything read, in order:
	// the text, tool traffic and media.
	Digest uint64
	// Chain is the chunk fingerprint of the whole text when Text was cut
	// (zero otherwise: Text's own fingerprint is the same), so that an
	// approximate prefix index matches a prompt past the cut without the
	// text being kept.
	Chain chunkindex.Chain
}

// Build returns the routing context of a JSON request to path: the prompt
// read by [Parse] (or the raw body when Parse finds none), the session key
// from the x-session-id header and the token ids from the
// x-rolter-vllm-token-ids header. The proxy and the tests build every context
// with this function, so the balancer sees the same thing in both.
//
// body is not retained. Build never panics, whatever body holds.
func Build(path string, body []byte, h http.Header) routing.Context {
	return build(path, body, h, "")
}

// BuildSalted is [Build] for a request whose engine keys its cached blocks
// by salt as well as by tokens (vLLM's cache_salt, which enters the hash
// of a prompt's first block): the prompt is read as if a line naming the
// salt came first, so that an approximate prefix index matches it only
// with prompts of the same salt, as the engine's cache does. Its measured
// length is the prompt's alone. An empty salt is Build.
func BuildSalted(path string, body []byte, h http.Header, salt string) routing.Context {
	return build(path, body, h, salt)
}

func build(path string, body []byte, h http.Header, salt string) routing.Context {
	ctx := routing.Context{
		SessionKey: SessionKey(h.Get(SessionHeader)),
		TokenIDs:   routing.ParseTokenIDs(h.Get(routing.TokenIDsHeader)),
	}
	if a, ok := parse(path, body, salt); ok {
		ctx.Prompt = a.Text
		ctx.PromptLen = a.Len
		ctx.PromptDigest = a.Digest
		ctx.HasDigest = true
		ctx.PromptChain = a.Chain
	} else {
		ctx.Prompt = RawPrompt(body)
	}
	return ctx
}

// RawPrompt is the fallback prompt of a body with no readable prompt: its
// first MaxBytes cut on a character boundary when the whole body is valid
// UTF-8, else "".
func RawPrompt(body []byte) string {
	if !utf8.Valid(body) {
		return ""
	}
	return string(body[:cutPoint(body, MaxBytes)])
}

// Parse reads the prompt of a JSON body sent to path. It reports false when
// there is none to read: an unknown path, a body that is not valid JSON or
// not an object, a missing prompt field (messages, input or prompt), or a
// prompt of length zero (no turns, only media, or a token-id prompt).
func Parse(path string, body []byte) (Affinity, bool) {
	return parse(path, body, "")
}

// saltLine opens the text of a salted prompt (BuildSalted): a line no
// conversation's text starts with, NUL-delimited.
const saltLine = "\x00cache_salt\x00"

func parse(path string, body []byte, salt string) (Affinity, bool) {
	ep := endpointOf(path)
	if ep == epNone {
		return Affinity{}, false
	}
	b := pool.Get().(*builder)
	b.reset(body, ep, false)
	b.salt(salt)
	ok := b.document()
	if !ok && b.failed == failConflict {
		// The fields contradict the speculative plan (duplicate keys, a turn
		// with both content and output…): read again, delimiting first.
		b.reset(body, ep, true)
		b.salt(salt)
		ok = b.document()
	}
	var a Affinity
	if ok && b.n > 0 { // a salt alone is no prompt
		b.flush()
		a = Affinity{Text: string(b.text), Len: b.n, Digest: b.h.Sum64()}
		if b.full {
			if c := b.chain.Chain(); cap(c.Hashes) > maxPooledChain {
				// Too large to keep pooled (see recycle): handed over, not copied.
				a.Chain, b.chain = c, chunkindex.Chainer{}
			} else {
				a.Chain = chunkindex.Chain{Hashes: slices.Clone(c.Hashes), Len: c.Len}
			}
		}
	} else {
		ok = false
	}
	b.recycle()
	return a, ok
}

// maxPooledChain is the most chunk hashes a pooled builder's fingerprint
// buffer keeps room for: 8 bytes each, so at most the size of its kept text
// buffer (MaxBytes), the fingerprint of 256 KiB of prompt. A larger one,
// grown by one very long prompt, is dropped rather than held by the pool
// for every later request (a 4 MiB prompt's is 512 KiB).
const maxPooledChain = MaxBytes / 8

// recycle returns b to the pool, without the body it read and without a
// fingerprint buffer grown past maxPooledChain.
func (b *builder) recycle() {
	b.body = nil
	b.chain.Trim(maxPooledChain)
	pool.Put(b)
}

type endpoint uint8

const (
	epNone endpoint = iota
	epChat
	epMessages
	epResponses
	epCompletions
	epEmbeddings
)

func endpointOf(path string) endpoint {
	switch path {
	case PathChatCompletions:
		return epChat
	case PathMessages:
		return epMessages
	case PathResponses:
		return epResponses
	case PathCompletions:
		return epCompletions
	case PathEmbeddings:
		return epEmbeddings
	}
	return epNone
}

// cutPoint returns the largest UTF-8 character boundary of p that is at most
// limit bytes in. Bytes that are not valid UTF-8 never occur here.
func cutPoint(p []byte, limit int) int {
	if len(p) <= limit {
		return len(p)
	}
	for limit > 0 && !utf8.RuneStart(p[limit]) {
		limit--
	}
	return limit
}

type failure uint8

const (
	failNone     failure = iota
	failInvalid          // the body is not valid JSON
	failConflict         // the speculative plan was wrong; retry carefully
)

// maxDepth is encoding/json's nesting limit: a deeper body is invalid there,
// so it is here too.
const maxDepth = 10000

// builder is the state of one Parse. It is pooled: its text buffer, staging
// buffer and hasher are reused, so a Parse allocates only its result.
type builder struct {
	body    []byte
	ep      endpoint
	careful bool    // no speculation: delimit every field, then read in order
	failed  failure // why document returned false

	text  []byte             // the kept text, cap MaxBytes
	full  bool               // text was cut; nothing more is appended
	chain chunkindex.Chainer // once full: the whole text's fingerprint
	n     int                // measured length of the whole prompt

	measured bool // absorbed bytes count towards n

	h   xxh3.Hasher
	hn  int                     // bytes staged in hs
	hs  [1024]byte              // small writes are staged here before hashing
	rb  [8]byte                 // one encoded rune
	kb  [64]byte                // a decoded short string (keys, types)
	st  [maxDepth/64 + 1]uint64 // container kinds of the generic walker (1 = object)
	lc  [64]laxEnd              // ends of long strings found by laxStr
	gen uint64                  // tells this Parse's lc entries from older ones
}

var pool = sync.Pool{New: func() any {
	return &builder{text: make([]byte, 0, MaxBytes)}
}}

func (b *builder) reset(body []byte, ep endpoint, careful bool) {
	b.body = body
	b.ep = ep
	b.careful = careful
	b.failed = failNone
	b.text = b.text[:0]
	b.full = false
	b.n = 0
	b.measured = false
	b.hn = 0
	b.h.Reset()
	b.gen++
}

func (b *builder) fast() bool { return !b.careful }

// invalid records that the body is not valid JSON and returns errPos.
func (b *builder) invalid() int {
	if b.failed == failNone {
		b.failed = failInvalid
	}
	return errPos
}

// conflict records that the speculative plan failed and returns errPos.
func (b *builder) conflict() int {
	if b.failed == failNone {
		b.failed = failConflict
	}
	return errPos
}

// hash stages p for the hasher; large pieces go straight through.
func (b *builder) hash(p []byte) {
	if b.hn+len(p) <= len(b.hs) {
		b.hn += copy(b.hs[b.hn:], p)
		return
	}
	b.flush()
	if len(p) >= len(b.hs)/2 {
		b.h.Write(p)
		return
	}
	b.hn = copy(b.hs[:], p)
}

func (b *builder) flush() {
	if b.hn > 0 {
		b.h.Write(b.hs[:b.hn])
		b.hn = 0
	}
}

// cbyte writes one byte of compact JSON.
func (b *builder) cbyte(c byte) {
	if b.hn == len(b.hs) {
		b.flush()
	}
	b.hs[b.hn] = c
	b.hn++
	if b.measured {
		b.n++
	}
}

// appendText keeps as much of p as the text has room for. p is valid UTF-8
// and starts on a character boundary; a piece that does not fit is cut on
// the last boundary that does, and the text is then full.
func (b *builder) appendText(p []byte) {
	if b.full {
		b.chain.Write(p)
		return
	}
	room := MaxBytes - len(b.text)
	if len(p) <= room {
		b.text = append(b.text, p...)
		return
	}
	cut := cutPoint(p, room)
	b.text = append(b.text, p[:cut]...)
	b.full = true
	// Past the cut only the fingerprint grows (8 bytes per 64 of text),
	// sized at once for a text as long as the body.
	b.chain.Reset()
	b.chain.Grow(len(b.body)/chunkindex.ChunkBytes + 1)
	b.chain.Write(b.text)
	b.chain.Write(p[cut:])
}

// salt starts the text and the digest with salt's line, not counted in
// the prompt's length (see BuildSalted); nothing for an empty salt.
func (b *builder) salt(salt string) {
	if salt == "" {
		return
	}
	for _, p := range []string{saltLine, salt, "\n"} {
		b.hash([]byte(p))
		b.appendText([]byte(p))
	}
}

// push adds a literal piece of text (a role, ": ", "\n").
func (b *builder) push(p []byte) {
	b.n += len(p)
	b.hash(p)
	b.appendText(p)
}

// Modes of the string and value readers.
const (
	mSkip    uint8 = iota // validate only
	mPush                 // decoded text: text, length, digest
	mAbsorb               // decoded string: digest, length when measured
	mCompact              // compact JSON: digest, length when measured
)

var (
	litSystem  = []byte("system")
	litUser    = []byte("user")
	litItem    = []byte("item")
	litColon   = []byte(": ")
	litNewline = []byte("\n")
	replChar   = []byte("\uFFFD")
)
