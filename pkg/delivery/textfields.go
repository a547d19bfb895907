package delivery

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"unicode/utf8"
)

// This file locates the conversational text inside a JSON request or
// response body, so that guardrails and the PII sanitizer can read it and
// rewrite exactly those string values in place: every other byte of the
// body is kept as it is.

// maxTextDepth bounds the paths recorded per string; every text field of
// interest is at most seven levels deep (an Anthropic tool result's text
// block: messages.#.content.#.content.#.text).
const maxTextDepth = 7

// seg is one step of a path: an object key, or an array index when key is
// empty and idx >= 0.
type seg struct {
	key string
	idx int
}

// leaf is one string value of a document.
type leaf struct {
	path       []seg
	owners     []int // owners[k] is the container id holding path[k]
	start, end int   // byte range of the string token, quotes included
	value      string
}

// props are the members of an object that decide whether its text counts.
type props struct{ typ, role string }

// textDoc is a parsed JSON document reduced to its shallow string leaves.
type textDoc struct {
	leaves []leaf
	conts  []props // by container id; arrays have zero props
}

// maxNesting bounds the nesting of a document, as encoding/json does.
const maxNesting = 10000

var errSyntax = errors.New("delivery: invalid JSON")

// parseText validates body as exactly one JSON value (the grammar
// encoding/json accepts) and records every string value at most
// maxTextDepth deep with its path and byte range. It is a single pass that
// decodes only those strings and the keys on their paths.
func parseText(body []byte) (*textDoc, error) {
	s := &jscan{b: body, d: &textDoc{}}
	s.ws()
	if err := s.value(0); err != nil {
		return nil, err
	}
	s.ws()
	if s.i != len(s.b) {
		return nil, errSyntax
	}
	return s.d, nil
}

// jscan is the state of parseText.
type jscan struct {
	b      []byte
	i      int
	d      *textDoc
	path   []seg
	owners []int // container ids; -1 past maxTextDepth
}

func (s *jscan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value parses the value at s.i, which sits depth containers deep.
func (s *jscan) value(depth int) error {
	if s.i >= len(s.b) {
		return errSyntax
	}
	switch c := s.b[s.i]; {
	case c == '{' || c == '[':
		if depth >= maxNesting {
			return errSyntax
		}
		id := -1
		if depth < maxTextDepth {
			id = len(s.d.conts)
			s.d.conts = append(s.d.conts, props{})
		}
		s.path = append(s.path, seg{idx: 0})
		s.owners = append(s.owners, id)
		var err error
		if c == '{' {
			err = s.object(depth)
		} else {
			err = s.array(depth)
		}
		s.path, s.owners = s.path[:depth], s.owners[:depth]
		return err
	case c == '"':
		start := s.i
		esc, err := s.str()
		if err != nil || depth == 0 || depth > maxTextDepth {
			return err
		}
		v, err := s.decode(start, esc)
		if err != nil {
			return err
		}
		s.d.leaves = append(s.d.leaves, leaf{
			path: slices.Clone(s.path), owners: slices.Clone(s.owners),
			start: start, end: s.i, value: v,
		})
		if last := s.path[depth-1]; last.idx < 0 {
			switch last.key {
			case "type":
				s.d.conts[s.owners[depth-1]].typ = v
			case "role":
				s.d.conts[s.owners[depth-1]].role = v
			}
		}
		return nil
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || isDigit(c):
		return s.number()
	}
	return errSyntax
}

// object parses the members of the object at s.i; its path entry is
// s.path[depth].
func (s *jscan) object(depth int) error {
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return errSyntax
		}
		start := s.i
		esc, err := s.str()
		if err != nil {
			return err
		}
		key := ""
		if depth < maxTextDepth {
			if key, err = s.decode(start, esc); err != nil {
				return err
			}
		}
		s.path[depth] = seg{key: key, idx: -1}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return errSyntax
		}
		s.i++
		s.ws()
		if err := s.value(depth + 1); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return errSyntax
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return errSyntax
		}
	}
}

// array parses the elements of the array at s.i; its path entry is
// s.path[depth].
func (s *jscan) array(depth int) error {
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return nil
	}
	for {
		s.ws()
		if err := s.value(depth + 1); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return errSyntax
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.path[depth].idx++
		case ']':
			s.i++
			return nil
		default:
			return errSyntax
		}
	}
}

// str skips the string token at s.i and reports whether it has escapes.
func (s *jscan) str() (escaped bool, err error) {
	s.i++
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return escaped, nil
		case c == '\\':
			escaped = true
			if s.i+1 >= len(s.b) {
				return false, errSyntax
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return false, errSyntax
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !isDigit(h) && (h|0x20 < 'a' || h|0x20 > 'f') {
						return false, errSyntax
					}
				}
				s.i += 6
			default:
				return false, errSyntax
			}
		case c < 0x20:
			return false, errSyntax
		default:
			s.i++
		}
	}
	return false, errSyntax
}

// decode returns the value of the string token at [start, s.i).
func (s *jscan) decode(start int, escaped bool) (string, error) {
	raw := s.b[start+1 : s.i-1]
	if !escaped && utf8.Valid(raw) {
		return string(raw), nil
	}
	// Escapes and invalid UTF-8 decode as encoding/json does.
	var v string
	if err := json.Unmarshal(s.b[start:s.i], &v); err != nil {
		return "", errSyntax
	}
	return v, nil
}

func (s *jscan) literal(word string) error {
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		return errSyntax
	}
	s.i += len(word)
	return nil
}

// number skips a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jscan) number() error {
	if s.b[s.i] == '-' {
		s.i++
	}
	digits := func() int {
		n := 0
		for s.i < len(s.b) && isDigit(s.b[s.i]) {
			s.i++
			n++
		}
		return n
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case digits() == 0:
		return errSyntax
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return errSyntax
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return errSyntax
		}
	}
	return nil
}

// is reports whether the leaf's path has the given shape: strings are keys
// and "#" matches any array index.
func (l *leaf) is(shape ...string) bool {
	if len(l.path) != len(shape) {
		return false
	}
	for i, s := range shape {
		p := l.path[i]
		if s == "#" {
			if p.idx < 0 || p.key != "" {
				return false
			}
		} else if p.idx >= 0 || p.key != s {
			return false
		}
	}
	return true
}

// owner returns the props of the object holding path[k].
func (d *textDoc) owner(l *leaf, k int) props { return d.conts[l.owners[k]] }

// responseTexts returns the indexes of the assistant text of a response,
// in document order: OpenAI chat choices[].message.content (a string or
// text parts), completions choices[].text, Anthropic content[].text of text
// blocks, Responses output[].content[].text of output_text parts; and the
// model's reasoning, which clients show as they show its answer: chat
// choices[].message.reasoning_content and .reasoning (vLLM's reasoning
// parsers; the older and the newer name), Anthropic content[].thinking of
// thinking blocks, Responses reasoning items' reasoning_text content and
// summary_text summaries. Tool-call arguments are not text: they are the
// call's input, passed on byte for byte. Embeddings and every other shape
// have none.
func (d *textDoc) responseTexts() []int {
	var out []int
	for i := range d.leaves {
		l := &d.leaves[i]
		switch {
		case l.is("choices", "#", "message", "content"),
			l.is("choices", "#", "text"),
			l.is("choices", "#", "message", "content", "#", "text") && d.owner(l, 5).typ == "text",
			l.is("choices", "#", "message", "reasoning_content"),
			l.is("choices", "#", "message", "reasoning"),
			l.is("content", "#", "text") && d.owner(l, 2).typ == "text",
			l.is("content", "#", "thinking") && d.owner(l, 2).typ == "thinking",
			l.is("output", "#", "content", "#", "text") && d.owner(l, 4).typ == "output_text",
			l.is("output", "#", "content", "#", "text") && d.owner(l, 4).typ == "reasoning_text",
			l.is("output", "#", "summary", "#", "text") && d.owner(l, 4).typ == "summary_text":
			out = append(out, i)
		}
	}
	return out
}

// isInstruction reports whether a message role carries instructions
// rather than conversation.
func isInstruction(role string) bool { return role == "system" || role == "developer" }

// isTextPart reports whether a content part type is plain text.
func isTextPart(typ string) bool {
	return typ == "text" || typ == "input_text" || typ == "output_text"
}

// requestTexts returns the indexes of the text of a request, in document
// order, and for each whether it is an instruction: chat and Anthropic
// messages[].content (a string or text parts), completions and embeddings
// prompt / input (a string or an array of strings), Responses input[]
// items; and the tool results an agent sends, where the files, pages and
// records it read enter the prompt: chat tool messages (their content, as
// above), Anthropic tool_result blocks' content (a string or text blocks),
// Responses function_call_output items' output (a string or input_text
// parts). System and developer messages, the Anthropic top-level system and
// the Responses instructions are instructions.
func (d *textDoc) requestTexts() (idx []int, instruction []bool) {
	for i := range d.leaves {
		l := &d.leaves[i]
		ok, instr := false, false
		switch {
		case l.is("messages", "#", "content"), l.is("input", "#", "content"):
			ok, instr = true, isInstruction(d.owner(l, 2).role)
		case l.is("messages", "#", "content", "#", "text"), l.is("input", "#", "content", "#", "text"):
			ok, instr = isTextPart(d.owner(l, 4).typ), isInstruction(d.owner(l, 2).role)
		case l.is("messages", "#", "content", "#", "content"):
			ok = d.owner(l, 4).typ == "tool_result"
		case l.is("messages", "#", "content", "#", "content", "#", "text"):
			ok = d.owner(l, 4).typ == "tool_result" && d.owner(l, 6).typ == "text"
		case l.is("input", "#", "output"):
			ok = d.owner(l, 2).typ == "function_call_output"
		case l.is("input", "#", "output", "#", "text"):
			ok = d.owner(l, 2).typ == "function_call_output" && isTextPart(d.owner(l, 4).typ)
		case l.is("prompt"), l.is("prompt", "#"), l.is("input"), l.is("input", "#"):
			ok = true
		case l.is("system"), l.is("instructions"):
			ok, instr = true, true
		case l.is("system", "#", "text"):
			ok, instr = d.owner(l, 2).typ == "text", true
		}
		if ok {
			idx = append(idx, i)
			instruction = append(instruction, instr)
		}
	}
	return idx, instruction
}

// edit replaces the string token at [start, end) with value.
type edit struct {
	start, end int
	value      string
}

// values returns the values of the leaves idx.
func (d *textDoc) values(idx []int) []string {
	out := make([]string, len(idx))
	for i, k := range idx {
		out[i] = d.leaves[k].value
	}
	return out
}

// spliceTexts writes every text of idx that differs from its leaf back
// into body.
func spliceTexts(body []byte, doc *textDoc, idx []int, texts []string) []byte {
	var edits []edit
	for i, k := range idx {
		if l := &doc.leaves[k]; texts[i] != l.value {
			edits = append(edits, edit{start: l.start, end: l.end, value: texts[i]})
		}
	}
	if len(edits) == 0 {
		return body
	}
	return splice(body, edits)
}

// splice returns a copy of body with each edit applied; edits must be in
// ascending, non-overlapping order. body itself is never modified.
func splice(body []byte, edits []edit) []byte {
	var b bytes.Buffer
	b.Grow(len(body) + 64*len(edits))
	last := 0
	for _, e := range edits {
		b.Write(body[last:e.start])
		writeJSONString(&b, e.value)
		last = e.end
	}
	b.Write(body[last:])
	return b.Bytes()
}

// writeJSONString writes s as a JSON string without HTML escaping.
func writeJSONString(b *bytes.Buffer, s string) {
	var tmp strings.Builder
	enc := json.NewEncoder(&tmp)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	b.WriteString(strings.TrimSuffix(tmp.String(), "\n"))
}
