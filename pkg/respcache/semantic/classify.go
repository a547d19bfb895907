package semantic

import (
	"crypto/sha256"
	"slices"
	"strconv"
	"sync"
	"unicode"
	"unicode/utf8"

	"rolter.dev/pkg/respcache/canon"
)

// Dialect tags hashed into the partition, one per candidate path.
const (
	DialectChat        = "openai-chat"
	DialectMessages    = "anthropic-messages"
	DialectCompletions = "openai-completions"
)

// Dialect returns the dialect tag of a candidate path, or "" for a path the
// semantic cache never serves.
func Dialect(path string) string {
	switch path {
	case "/v1/chat/completions":
		return DialectChat
	case "/v1/messages":
		return DialectMessages
	case "/v1/completions":
		return DialectCompletions
	}
	return ""
}

// classifier holds the reusable buffers of one Classify call.
type classifier struct {
	doc   canon.Doc
	text  []byte // normalised conversation text
	instr []byte // canonical array of [index, system/developer message]
	buf   []byte // decoded strings, then the canonical fields
	sum   [sha256.Size]byte
}

var classifiers = sync.Pool{New: func() any { return new(classifier) }}

// maxPooledBuf keeps the buffers of huge bodies out of the pool.
const maxPooledBuf = 4 << 20

// Classify splits the request body sent to path into the conversation text
// to embed and the partition that a cached reply must match exactly (see the
// package documentation for the rules). ok is false when the request must
// bypass the semantic cache; text and partition are then empty. The body is
// read as forwarded upstream, after any rewriting by the gateway.
func Classify(path string, body []byte) (text string, partition [32]byte, ok bool) {
	dialect := Dialect(path)
	if dialect == "" {
		return "", partition, false
	}
	c := classifiers.Get().(*classifier)
	defer c.release()
	if !c.classify(dialect, body) {
		return "", partition, false
	}
	return string(c.text), c.sum, true
}

func (c *classifier) release() {
	c.doc.Reset()
	if cap(c.text) > maxPooledBuf || cap(c.buf) > maxPooledBuf || cap(c.instr) > maxPooledBuf {
		return
	}
	classifiers.Put(c)
}

func (c *classifier) classify(dialect string, body []byte) bool {
	if c.doc.Parse(body) != nil {
		return false
	}
	root := c.doc.Root()
	if root.Kind() != canon.Object {
		return false
	}
	c.text, c.instr = c.text[:0], append(c.instr[:0], '[')
	conversation := "messages"
	switch dialect {
	case DialectCompletions:
		conversation = "prompt"
		prompt, ok := root.Lookup("prompt")
		if !ok || prompt.Kind() != canon.String {
			return false // absent, a batch, or token ids
		}
		c.appendText(prompt)
	default:
		msgs, ok := root.Lookup("messages")
		if !ok || msgs.Kind() != canon.Array {
			return false
		}
		idx := 0
		for m := range msgs.Elements() {
			if !c.message(dialect, idx, m) {
				return false
			}
			idx++
		}
		if dialect == DialectMessages {
			if sys, ok := root.Lookup("system"); ok && !textParts(sys, nil) {
				return false // a non-text system block
			}
		}
	}
	if len(c.text) == 0 {
		return false
	}
	c.instr = append(c.instr, ']')

	// partition = sha256(dialect ‖ 0x1f ‖ instructions ‖ 0x1f ‖ fields)
	c.buf = append(c.buf[:0], dialect...)
	c.buf = append(c.buf, 0x1f)
	c.buf = append(c.buf, c.instr...)
	c.buf = append(c.buf, 0x1f)
	c.buf = root.AppendCanonicalFunc(c.buf, func(key []byte, val canon.Value) bool {
		switch string(key) {
		case conversation, "user", "metadata":
			return false
		case "stream":
			return val.Kind() != canon.False // false equals absent
		}
		return true
	})
	c.sum = sha256.Sum256(c.buf)
	return true
}

// message reads turn idx of the conversation: user and assistant turns add
// their role, name and text to the text; OpenAI system and developer turns
// go to the instructions with their position. It reports false for a turn
// the text would not capture.
func (c *classifier) message(dialect string, idx int, m canon.Value) bool {
	if m.Kind() != canon.Object {
		return false
	}
	for k := range m.Members() {
		if !k.TextEqual("role") && !k.TextEqual("content") && !k.TextEqual("name") {
			return false // tool_calls, tool_call_id, function_call, audio, refusal…
		}
	}
	role, ok := m.Lookup("role")
	if !ok || role.Kind() != canon.String {
		return false
	}
	content, ok := m.Lookup("content")
	if !ok || !textParts(content, nil) {
		return false
	}
	name, hasName := m.Lookup("name")
	if hasName && name.Kind() != canon.String {
		return false
	}
	switch {
	case role.TextEqual("user") || role.TextEqual("assistant"):
		c.appendText(role)
		if hasName {
			c.appendText(name)
		}
		textParts(content, c.appendText)
	case dialect == DialectChat && (role.TextEqual("system") || role.TextEqual("developer")):
		if len(c.instr) > 1 {
			c.instr = append(c.instr, ',')
		}
		c.instr = append(c.instr, '[')
		c.instr = strconv.AppendInt(c.instr, int64(idx), 10)
		c.instr = append(c.instr, ',')
		c.instr = m.AppendCanonical(c.instr)
		c.instr = append(c.instr, ']')
	default:
		return false // tool, function, or system inside Anthropic messages
	}
	return true
}

// textParts reports whether v is text only: a string, or an array of
// {"type":"text","text":"…"} parts (with an optional cache_control). It
// calls each (when not nil) with every piece of text.
func textParts(v canon.Value, each func(canon.Value)) bool {
	switch v.Kind() {
	case canon.String:
		if each != nil {
			each(v)
		}
		return true
	case canon.Array:
		for part := range v.Elements() {
			if part.Kind() != canon.Object {
				return false
			}
			for k := range part.Members() {
				if !k.TextEqual("type") && !k.TextEqual("text") && !k.TextEqual("cache_control") {
					return false
				}
			}
			typ, _ := part.Lookup("type")
			text, ok := part.Lookup("text")
			if !typ.TextEqual("text") || !ok || text.Kind() != canon.String {
				return false // image_url, input_audio, file, image, document, tool_use, tool_result…
			}
			if each != nil {
				each(text)
			}
		}
		return true
	}
	return false
}

// appendText appends the words of string v to the text, each preceded by a
// single space (but the first): whitespace runs of any kind collapse.
func (c *classifier) appendText(v canon.Value) {
	s := v.AppendText(c.buf[:0])
	// The output is at most one separator longer than s: write it by index.
	text := slices.Grow(c.text, len(s)+1)
	n := len(text)
	out := text[:n+len(s)+1]
	inWord := false
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if asciiSpace[b] {
				inWord = false
			} else {
				if !inWord && n > 0 {
					out[n] = ' '
					n++
				}
				inWord = true
				out[n] = b
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if unicode.IsSpace(r) {
			inWord = false
		} else {
			if !inWord && n > 0 {
				out[n] = ' '
				n++
			}
			inWord = true
			n += copy(out[n:], s[i:i+size])
		}
		i += size
	}
	c.buf, c.text = s, out[:n]
}

var asciiSpace = [utf8.RuneSelf]bool{' ': true, '\t': true, '\n': true, '\r': true, '\v': true, '\f': true}
