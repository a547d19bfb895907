// Package request reads the JSON body of a client request: it validates the
// document and finds the top-level fields the gateway acts on (model,
// stream, stream_options) without decoding the rest, and rewrites the model
// and the stream's usage option in place.
package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Errors returned by [Read] and [Parse]. The proxy maps them to its error
// catalogue (413 request_too_large, 400 invalid_json); a [FieldError] is its
// 400 invalid_request.
var (
	ErrTooLarge    = errors.New("request: body too large")
	ErrInvalidJSON = errors.New("request: invalid JSON")
	ErrNotObject   = errors.New("request: body is not a JSON object")
)

// FieldError is returned by [Parse] for a JSON object whose model or stream
// member an upstream could read otherwise than the gateway does, so that the
// gateway would route, authorize or apply its stream policy to one request
// and the upstream serve another:
//
//   - the member appears twice (decoders differ on which one wins), or under
//     a key that differs from its name only in case ("MODEL", "Stream",
//     "\u017ftream"), which Go's encoding/json, for one, matches to the
//     same struct field;
//   - stream is not a boolean (or null): lax decoders, vLLM's pydantic
//     models among them, read "true" or 1 as true.
//
// stream_options is held to the same rule: the gateway decides from it
// whether the client asked for a stream's usage.
type FieldError struct {
	Field  string // "model", "stream" or "stream_options"
	Reason string
}

func (e *FieldError) Error() string { return "request: " + e.Field + ": " + e.Reason }

// Read reads at most limit bytes of r. A longer body is ErrTooLarge.
func Read(r io.Reader, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("request: read body: %w", err)
	}
	if n > limit {
		return nil, ErrTooLarge
	}
	return buf.Bytes(), nil
}

// Body is a parsed request body. It refers into the bytes it was parsed
// from; those must not change while it is used.
type Body struct {
	Raw []byte
	// Model is the top-level "model" string; HasModel is false when the field
	// is absent or not a string.
	Model    string
	HasModel bool
	// Stream is the top-level "stream" boolean (false when absent).
	Stream bool
	// IncludeUsage is stream_options.include_usage: the client asked for
	// the usage chunk that ends an OpenAI stream.
	IncludeUsage bool
	// usageUnclear: stream_options or its include_usage has a type the
	// gateway does not interpret (a lax upstream might read "yes" as
	// true), so it leaves the option as the client sent it.
	usageUnclear bool
	// modelStart and modelEnd delimit the top-level model value of any type
	// (with its quotes); modelStart is -1 when there is none. optStart and
	// optEnd delimit stream_options' value the same way.
	modelStart, modelEnd int
	optStart, optEnd     int
}

// Parse validates body as a JSON object and reads its top-level model and
// stream fields. A model or stream member that an upstream could read
// otherwise is a [*FieldError].
func Parse(raw []byte) (*Body, error) {
	if !json.Valid(raw) {
		return nil, ErrInvalidJSON
	}
	b := &Body{Raw: raw, modelStart: -1, optStart: -1}
	s := scanner{buf: raw}
	s.space()
	if !s.consume('{') {
		return nil, ErrNotObject
	}
	s.space()
	if s.consume('}') {
		return b, nil
	}
	var seen [len(routedFields)]bool
	for {
		s.space()
		keyStart := s.pos
		if !s.skipString() {
			return nil, ErrInvalidJSON
		}
		key := raw[keyStart:s.pos]
		s.space()
		if !s.consume(':') {
			return nil, ErrInvalidJSON
		}
		s.space()
		valStart := s.pos
		if !s.skipValue() {
			return nil, ErrInvalidJSON
		}
		val := raw[valStart:s.pos]
		if f, exact := routedField(key); f >= 0 {
			name := routedFields[f]
			switch {
			case !exact:
				return nil, &FieldError{name, fmt.Sprintf("the key %s differs from %q only in case; spell it %q", key, name, name)}
			case seen[f]:
				return nil, &FieldError{name, "appears more than once"}
			}
			seen[f] = true
			switch f {
			case fieldModel:
				var m string
				b.modelStart, b.modelEnd = valStart, s.pos
				if val[0] == '"' && json.Unmarshal(val, &m) == nil {
					b.Model, b.HasModel = m, true
				}
			case fieldStream:
				switch string(val) {
				case "true":
					b.Stream = true
				case "false", "null":
				default:
					return nil, &FieldError{name, "must be a boolean"}
				}
			case fieldStreamOptions:
				b.optStart, b.optEnd = valStart, s.pos
				b.IncludeUsage, b.usageUnclear = includeUsage(val)
			}
		}
		s.space()
		if s.consume(',') {
			continue
		}
		if s.consume('}') {
			break
		}
		return nil, ErrInvalidJSON
	}
	return b, nil
}

// WithModel returns the body with its top-level model replaced. When the
// model is unchanged it returns Raw itself, without copying.
func (b *Body) WithModel(model string) []byte {
	if b.HasModel && b.Model == model {
		return b.Raw
	}
	quoted, _ := json.Marshal(model) // a string always marshals
	if b.modelStart < 0 {
		out, _ := insertFirst(b.Raw, "model", quoted)
		return out
	}
	return splice(b.Raw, b.modelStart, b.modelEnd, quoted)
}

// splice returns a copy of raw with raw[start:end] replaced by val.
func splice(raw []byte, start, end int, val []byte) []byte {
	out := make([]byte, 0, len(raw)-(end-start)+len(val))
	out = append(out, raw[:start]...)
	out = append(out, val...)
	return append(out, raw[end:]...)
}

// insertFirst returns a copy of the object raw with the member name: val
// inserted first, and how many bytes it added before the object's old
// members. Parse proved raw an object, so its first '{' opens it.
func insertFirst(raw []byte, name string, val []byte) ([]byte, int) {
	i := bytes.IndexByte(raw, '{')
	member := append(append(append([]byte{'"'}, name...), '"', ':'), val...)
	if rest := bytes.TrimLeft(raw[i+1:], " \t\r\n"); len(rest) > 0 && rest[0] != '}' {
		member = append(member, ',')
	}
	out := make([]byte, 0, len(raw)+len(member))
	out = append(out, raw[:i+1]...)
	out = append(out, member...)
	return append(out, raw[i+1:]...), len(member)
}

// includeUsage reads a stream_options value as OpenAI and vLLM do: usage
// only for include_usage true (vLLM's StreamOptions defaulted it to true
// once the object was present until vllm-project/vllm#36379, March 2026;
// an older engine would answer {} with usage that the client did not ask
// for as OpenAI reads it, and that the proxy then keeps from it). unclear
// reports a value of another type: not an object or null, or an
// include_usage that is not a boolean or null.
func includeUsage(val []byte) (asked, unclear bool) {
	if string(val) == "null" {
		return false, false
	}
	if val[0] != '{' {
		return false, true
	}
	var last []byte // the last of duplicates, as Python's json reads it
	eachMember(val, func(key, _, v []byte) {
		if string(key) == "include_usage" {
			last = v
		}
	})
	switch string(last) {
	case "true":
		return true, false
	case "", "false", "null":
		return false, false
	}
	return false, true
}

// eachMember calls fn with each member of a JSON object already proven
// valid: its key decoded, the member's bytes ("key": value) and the
// value's. Decoding is kept to escaped keys, so that an object of millions
// of members costs no memory beyond the document.
func eachMember(obj []byte, fn func(key, member, val []byte)) {
	sc := scanner{buf: obj}
	sc.space()
	sc.consume('{')
	for {
		sc.space()
		start := sc.pos
		if !sc.skipString() {
			return // '}' of an empty object
		}
		raw := obj[start:sc.pos]
		key := raw[1 : len(raw)-1]
		if bytes.IndexByte(raw, '\\') >= 0 {
			var k string
			_ = json.Unmarshal(raw, &k)
			key = []byte(k)
		}
		sc.space()
		sc.consume(':')
		sc.space()
		vs := sc.pos
		sc.skipValue()
		fn(key, obj[start:sc.pos], obj[vs:sc.pos])
		sc.space()
		if !sc.consume(',') {
			return
		}
	}
}

// CanAskUsage reports whether the gateway may ask the upstream for this
// stream's usage with [Body.WithStreamUsage]: a stream whose client did not
// ask for it, in a form the gateway understands.
func (b *Body) CanAskUsage() bool { return b.Stream && !b.IncludeUsage && !b.usageUnclear }

// WithStreamUsage returns the body with stream_options.include_usage set to
// true, so that an OpenAI-dialect upstream ends the stream with a usage
// chunk, and continuous_usage_stats removed (vLLM would otherwise put usage
// on every chunk); the option's other members are kept. The result refers
// to new bytes; b is unchanged. Call it only when [Body.CanAskUsage].
func (b *Body) WithStreamUsage() *Body {
	val := []byte{'{'}
	if b.optStart >= 0 && b.Raw[b.optStart] == '{' { // else null
		eachMember(b.Raw[b.optStart:b.optEnd], func(key, member, _ []byte) {
			if k := string(key); k != "include_usage" && k != "continuous_usage_stats" {
				val = append(append(val, member...), ',')
			}
		})
	}
	val = append(val, `"include_usage":true}`...)
	nb := *b
	nb.IncludeUsage = true
	if b.optStart >= 0 {
		nb.Raw = splice(b.Raw, b.optStart, b.optEnd, val)
		nb.optEnd = b.optStart + len(val)
		if b.modelStart > b.optStart {
			shift := len(val) - (b.optEnd - b.optStart)
			nb.modelStart, nb.modelEnd = b.modelStart+shift, b.modelEnd+shift
		}
		return &nb
	}
	var added int
	nb.Raw, added = insertFirst(b.Raw, "stream_options", val)
	nb.optStart = bytes.IndexByte(b.Raw, '{') + 1 + len(`"stream_options":`)
	nb.optEnd = nb.optStart + len(val)
	if b.modelStart >= 0 {
		nb.modelStart, nb.modelEnd = b.modelStart+added, b.modelEnd+added
	}
	return &nb
}

// routedFields are the members Parse reads, by index.
var routedFields = [...]string{fieldModel: "model", fieldStream: "stream", fieldStreamOptions: "stream_options"}

const (
	fieldModel = iota
	fieldStream
	fieldStreamOptions
)

// routedField returns the index in routedFields of the name a raw JSON key
// (with quotes) equals ignoring case, as encoding/json matches struct
// fields (Unicode simple folding: "\u017ftream" is stream), or -1; exact
// reports whether it is the name itself. Keys with escapes are decoded
// first, so "\u006dodel" is exactly model, as encoding/json reads it.
func routedField(raw []byte) (f int, exact bool) {
	inner := raw[1 : len(raw)-1]
	ascii := true
	for _, c := range inner {
		if c == '\\' || c >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		// The common case: no decoding, and only a same-length key can
		// equal a name ignoring ASCII case.
		for i, name := range routedFields {
			if len(inner) == len(name) && strings.EqualFold(string(inner), name) {
				return i, string(inner) == name
			}
		}
		return -1, false
	}
	var k string
	if json.Unmarshal(raw, &k) != nil {
		return -1, false
	}
	for i, name := range routedFields {
		if strings.EqualFold(k, name) {
			return i, k == name
		}
	}
	return -1, false
}

// scanner walks a document already known to be valid JSON.
type scanner struct {
	buf []byte
	pos int
}

func (s *scanner) space() {
	for s.pos < len(s.buf) {
		switch s.buf[s.pos] {
		case ' ', '\t', '\r', '\n':
			s.pos++
		default:
			return
		}
	}
}

func (s *scanner) consume(c byte) bool {
	if s.pos < len(s.buf) && s.buf[s.pos] == c {
		s.pos++
		return true
	}
	return false
}

func (s *scanner) skipString() bool {
	if !s.consume('"') {
		return false
	}
	for s.pos < len(s.buf) {
		switch s.buf[s.pos] {
		case '\\':
			s.pos += 2
		case '"':
			s.pos++
			return true
		default:
			s.pos++
		}
	}
	return false
}

func (s *scanner) skipValue() bool {
	if s.pos >= len(s.buf) {
		return false
	}
	switch s.buf[s.pos] {
	case '"':
		return s.skipString()
	case '{', '[':
		depth := 0
		for s.pos < len(s.buf) {
			switch s.buf[s.pos] {
			case '"':
				if !s.skipString() {
					return false
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.pos++
					return true
				}
			}
			s.pos++
		}
		return false
	default: // number, true, false, null
		start := s.pos
		for s.pos < len(s.buf) {
			switch s.buf[s.pos] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return s.pos > start
			}
			s.pos++
		}
		return s.pos > start
	}
}
