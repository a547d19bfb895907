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

// textShapes are the paths of every string requestTexts or responseTexts
// may choose ("#" for any array index); the members' props (an object's
// type and role) decide among them later. parseText records only these
// strings, and the objects and arrays on their way, so what a body costs
// beyond its own bytes is bounded by its texts, not by its size: a 32 MiB
// body of empty strings recorded whole took some 7 GiB.
var textShapes = newShapeTrie([]string{
	// responses
	"choices.#.message.content", "choices.#.text", "choices.#.message.content.#.text",
	"choices.#.message.reasoning_content", "choices.#.message.reasoning",
	"content.#.text", "content.#.thinking", "output.#.content.#.text", "output.#.summary.#.text",
	// the tool calls of responses (responseTextsAndCalls)
	"choices.#.message.tool_calls.#.function.arguments", "choices.#.message.function_call.arguments",
	"output.#.arguments",
	// requests
	"messages.#.content", "input.#.content", "messages.#.content.#.text", "input.#.content.#.text",
	"messages.#.content.#.content", "messages.#.content.#.content.#.text",
	"input.#.output", "input.#.output.#.text",
	"prompt", "prompt.#", "input", "input.#", "system", "instructions", "system.#.text",
},
	// An Anthropic tool_use's input is an object: recorded whole, as its
	// JSON text, for the tool_calls rules to scan.
	"content.#.input",
)

// The most text strings and containers on their paths parseText records;
// past either, the rest of the document is validated but not recorded
// (textDoc.truncated): its texts are neither scanned nor rewritten, as
// texts past guardrails.max_scan_bytes are not. Real requests have
// thousands (a long agent session: a few per message).
const (
	maxTextLeaves     = 1 << 16
	maxTextContainers = 1 << 18
)

// shapeTrie is a node of textShapes: its children by key ("#": an array
// element), whether a string here is a text, and whether an object or
// array here is recorded whole (raw).
type shapeTrie struct {
	kids map[string]*shapeTrie
	text bool
	raw  bool
}

// newShapeTrie returns the trie of the text paths and of the raw ones.
func newShapeTrie(texts []string, raws ...string) *shapeTrie {
	root := &shapeTrie{}
	add := func(path string) *shapeTrie {
		n := root
		for _, k := range strings.Split(path, ".") {
			if n.kids == nil {
				n.kids = map[string]*shapeTrie{}
			}
			if n.kids[k] == nil {
				n.kids[k] = &shapeTrie{}
			}
			n = n.kids[k]
		}
		return n
	}
	for _, p := range texts {
		add(p).text = true
	}
	for _, p := range raws {
		add(p).raw = true
	}
	return root
}

// child returns the node one step down, or nil when no text lies there.
func (n *shapeTrie) child(sg seg) *shapeTrie {
	if n == nil {
		return nil
	}
	if sg.idx >= 0 {
		return n.kids["#"]
	}
	return n.kids[sg.key]
}

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
	// raw: the leaf is an object or array recorded whole (value is its
	// JSON text), never rewritten.
	raw bool
}

// props are the members of an object that decide whether its text counts.
type props struct{ typ, role string }

// textDoc is a parsed JSON document reduced to the string leaves that may
// be texts (textShapes).
type textDoc struct {
	leaves []leaf
	conts  []props // by container id; arrays have zero props
	// truncated: the document held more than maxTextLeaves texts or
	// maxTextContainers containers on their paths; those past it were not
	// recorded.
	truncated bool
}

// maxNesting bounds the nesting of a document, as encoding/json does.
const maxNesting = 10000

var errSyntax = errors.New("delivery: invalid JSON")

// parseText validates body as exactly one JSON value (the grammar
// encoding/json accepts) and records every string value at a path of
// textShapes with its path and byte range, up to maxTextLeaves. It is a
// single pass that decodes only those strings, the type and role members
// of the containers on their paths, and the keys on those paths.
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
	owners []int        // container ids; -1 off textShapes' paths
	shapes []*shapeTrie // each container's textShapes node; nil off the paths
}

// shape returns the textShapes node of the value at depth, or nil.
func (s *jscan) shape(depth int) *shapeTrie {
	if depth == 0 {
		return textShapes
	}
	return s.shapes[depth-1].child(s.path[depth-1])
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
		id, sh := -1, s.shape(depth)
		raw := sh != nil && sh.raw && depth > 0
		if raw && len(s.d.leaves) >= maxTextLeaves {
			s.d.truncated, raw = true, false
		}
		if sh != nil && sh.kids == nil {
			sh = nil // no text below
		}
		if sh != nil {
			if len(s.d.conts) < maxTextContainers {
				id = len(s.d.conts)
				s.d.conts = append(s.d.conts, props{})
			} else {
				s.d.truncated, sh = true, nil
			}
		}
		start := s.i
		s.path = append(s.path, seg{idx: 0})
		s.owners = append(s.owners, id)
		s.shapes = append(s.shapes, sh)
		var err error
		if c == '{' {
			err = s.object(depth)
		} else {
			err = s.array(depth)
		}
		s.path, s.owners, s.shapes = s.path[:depth], s.owners[:depth], s.shapes[:depth]
		if raw && err == nil {
			s.d.leaves = append(s.d.leaves, leaf{
				path: slices.Clone(s.path), owners: slices.Clone(s.owners),
				start: start, end: s.i, value: string(s.b[start:s.i]), raw: true,
			})
		}
		return err
	case c == '"':
		start := s.i
		esc, err := s.str()
		if err != nil || depth == 0 {
			return err
		}
		owner, last := s.owners[depth-1], s.path[depth-1]
		prop := owner >= 0 && last.idx < 0 && (last.key == "type" || last.key == "role")
		text := s.shape(depth)
		if text == nil || !text.text {
			text = nil
		} else if len(s.d.leaves) >= maxTextLeaves {
			s.d.truncated, text = true, nil
		}
		if text == nil && !prop {
			return nil
		}
		v, err := s.decode(start, esc)
		if err != nil {
			return err
		}
		if text != nil {
			s.d.leaves = append(s.d.leaves, leaf{
				path: slices.Clone(s.path), owners: slices.Clone(s.owners),
				start: start, end: s.i, value: v,
			})
		}
		switch {
		case prop && last.key == "type":
			s.d.conts[owner].typ = v
		case prop:
			s.d.conts[owner].role = v
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
		if s.shapes[depth] != nil { // a container on textShapes' paths
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
// call's input, never rewritten (responseTextsAndCalls adds them for the
// rules with tool_calls to read). Embeddings and every other shape have
// none.
func (d *textDoc) responseTexts() []int {
	var out []int
	for i := range d.leaves {
		if d.isResponseText(&d.leaves[i]) {
			out = append(out, i)
		}
	}
	return out
}

// responseTextsAndCalls returns responseTexts and, among them in document
// order, the tool calls the response makes, with the kind of each: chat
// choices[].message.tool_calls[].function.arguments (and the older
// function_call.arguments), Responses function_call items' arguments,
// Anthropic tool_use blocks' input (the object's JSON text).
func (d *textDoc) responseTextsAndCalls() (idx []int, kinds []textKind) {
	for i := range d.leaves {
		l := &d.leaves[i]
		kind := conversation
		switch {
		case d.isResponseText(l):
		case l.is("choices", "#", "message", "tool_calls", "#", "function", "arguments"),
			l.is("choices", "#", "message", "function_call", "arguments"),
			l.is("output", "#", "arguments") && d.owner(l, 2).typ == "function_call",
			l.raw && l.is("content", "#", "input") && d.owner(l, 2).typ == "tool_use":
			kind = toolCall
		default:
			continue
		}
		idx, kinds = append(idx, i), append(kinds, kind)
	}
	return idx, kinds
}

// isResponseText reports whether a leaf is one of responseTexts.
func (d *textDoc) isResponseText(l *leaf) bool {
	switch {
	case l.raw:
		return false
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
		return true
	}
	return false
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
func (d *textDoc) requestTexts() (idx []int, kinds []textKind) {
	for i := range d.leaves {
		l := &d.leaves[i]
		ok, instr := false, false
		switch {
		case l.raw:
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
			kind := conversation
			if instr {
				kind = instruction
			}
			idx, kinds = append(idx, i), append(kinds, kind)
		}
	}
	return idx, kinds
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
