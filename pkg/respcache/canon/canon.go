package canon

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"sync"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of arrays and objects [Doc.Parse] accepts,
// the same limit as encoding/json.
const MaxDepth = 10000

// MaxValues is the most values (strings, numbers, literals, arrays and
// objects) [Doc.Parse] indexes, 24 bytes each with the object keys: a
// client's 32 MiB body of "0," would otherwise cost some 400 MiB of index,
// several such requests at once the proxy's memory. Real requests hold far
// fewer (a 128 K-token prompt given as token ids: 128 K); one with more is
// not cached (ErrTooMany).
const MaxValues = 1 << 20

// Errors returned by [Doc.Parse], [Append] and [Write]. A syntax error wraps
// [ErrSyntax] with the byte offset.
var (
	ErrSyntax   = errors.New("canon: invalid JSON")
	ErrTooDeep  = errors.New("canon: nesting deeper than MaxDepth")
	ErrTooLarge = errors.New("canon: document of 4 GiB or more")
	ErrTooMany  = errors.New("canon: more values than MaxValues")
)

// Kind is the kind of a JSON value.
type Kind uint8

// The kinds of JSON values. The zero Kind is Invalid: the kind of a zero
// [Value].
const (
	Invalid Kind = iota
	Null
	False
	True
	Number
	String
	Array
	Object
)

var kindNames = [...]string{"invalid", "null", "false", "true", "number", "string", "array", "object"}

// String returns the kind's name, e.g. "object".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// node is one token of a parsed document. Offsets are into Doc.src.
type node struct {
	start uint32 // first byte (the opening quote or bracket)
	end   uint32 // just past the last byte
	next  uint32 // index of the node after this value's subtree
	n     uint32 // members or elements of a container
	kind  Kind
	esc   bool // a string containing a backslash escape
}

// member is an object member during emission: its key in comparison form
// and the index of its key node (the value is the node after it).
type member struct {
	key []byte
	k   uint32
}

// Doc is a parsed JSON text: the source bytes and an index of their tokens.
// The zero Doc is ready for [Doc.Parse] and can be reused for many documents.
// A Doc refers to the source it parsed, which must not change while the Doc
// or its Values are used. A Doc is not safe for concurrent use.
type Doc struct {
	src    []byte
	nodes  []node
	values int // values indexed, against MaxValues

	members []member // emission stack of object members
	keys    []byte   // decoded keys that had escapes, for sorting
	tmp     []byte   // scratch for Value comparisons
}

// Parse validates src as one JSON value (surrounding whitespace allowed) and
// indexes it, replacing what d held before. On error d holds no document.
func (d *Doc) Parse(src []byte) error {
	d.Reset()
	if uint64(len(src)) >= math.MaxUint32 {
		return ErrTooLarge
	}
	d.src = src
	i, err := d.value(ws(src, 0), 0)
	if err == nil && ws(src, i) != len(src) {
		err = syntaxAt(ws(src, i))
	}
	if err != nil {
		d.Reset()
		return err
	}
	return nil
}

// Reset drops the document d holds (and its reference to the source) but
// keeps the allocated index for reuse.
func (d *Doc) Reset() {
	d.src = nil
	d.nodes, d.values = d.nodes[:0], 0
	d.members = d.members[:0]
	d.keys = d.keys[:0]
}

// Root returns the top-level value, or the zero Value when d holds no
// document.
func (d *Doc) Root() Value {
	if len(d.nodes) == 0 {
		return Value{}
	}
	return Value{d: d, i: 0}
}

func syntaxAt(off int) error { return fmt.Errorf("%w at offset %d", ErrSyntax, off) }

func ws(s []byte, i int) int {
	for i < len(s) {
		switch s[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

func (d *Doc) value(i, depth int) (int, error) {
	s := d.src
	if i >= len(s) {
		return 0, syntaxAt(i)
	}
	if d.values++; d.values > MaxValues {
		return 0, ErrTooMany
	}
	switch c := s[i]; {
	case c == '"':
		return d.str(i)
	case c == '{':
		return d.object(i, depth+1)
	case c == '[':
		return d.array(i, depth+1)
	case c == 't':
		return d.literal(i, "true", True)
	case c == 'f':
		return d.literal(i, "false", False)
	case c == 'n':
		return d.literal(i, "null", Null)
	case c == '-' || (c >= '0' && c <= '9'):
		return d.number(i)
	}
	return 0, syntaxAt(i)
}

func (d *Doc) leaf(kind Kind, start, end int, esc bool) {
	d.nodes = append(d.nodes, node{
		start: uint32(start), end: uint32(end), next: uint32(len(d.nodes) + 1), kind: kind, esc: esc,
	})
}

func (d *Doc) literal(i int, lit string, kind Kind) (int, error) {
	if !bytes.HasPrefix(d.src[i:], []byte(lit)) {
		return 0, syntaxAt(i)
	}
	d.leaf(kind, i, i+len(lit), false)
	return i + len(lit), nil
}

func digits(s []byte, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

func (d *Doc) number(i int) (int, error) {
	s, j := d.src, i
	if s[j] == '-' {
		j++
	}
	switch {
	case j < len(s) && s[j] == '0':
		j++
	case j < len(s) && s[j] >= '1' && s[j] <= '9':
		j = digits(s, j+1)
	default:
		return 0, syntaxAt(j)
	}
	if j < len(s) && s[j] == '.' {
		k := digits(s, j+1)
		if k == j+1 {
			return 0, syntaxAt(k)
		}
		j = k
	}
	if j < len(s) && (s[j] == 'e' || s[j] == 'E') {
		j++
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		k := digits(s, j)
		if k == j {
			return 0, syntaxAt(k)
		}
		j = k
	}
	d.leaf(Number, i, j, false)
	return j, nil
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// plain returns the length of the longest prefix of s with no '"', no '\\'
// and no control character: string bytes copied as they are. Bytes from 0x80
// up are plain (UTF-8 is copied, valid or not). Eight bytes at a time.
func plain(s []byte) int {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		v := binary.LittleEndian.Uint64(s[i:])
		q := v ^ (lsb * '"')
		e := v ^ (lsb * '\\')
		// A byte's high bit is set when it is '"' or '\\' (zero after the
		// xor) or below 0x20; borrows run upwards only, so the lowest flag
		// is exact.
		m := ((q - lsb) &^ q) | ((e - lsb) &^ e) | ((v - lsb*0x20) &^ v)
		if m &= msb; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			return i
		}
	}
	return i
}

func hexVal(c byte) rune {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0')
	case c >= 'a' && c <= 'f':
		return rune(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// hex4 decodes four hex digits, or returns -1.
func hex4(s []byte) rune {
	if len(s) < 4 {
		return -1
	}
	var r rune
	for _, c := range s[:4] {
		v := hexVal(c)
		if v < 0 {
			return -1
		}
		r = r<<4 | v
	}
	return r
}

func (d *Doc) str(i int) (int, error) {
	s := d.src
	j := i + 1
	esc := false
	for {
		j += plain(s[j:])
		if j >= len(s) {
			return 0, syntaxAt(j)
		}
		switch s[j] {
		case '"':
			d.leaf(String, i, j+1, esc)
			return j + 1, nil
		case '\\':
			esc = true
			if j+1 >= len(s) {
				return 0, syntaxAt(j)
			}
			switch s[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if hex4(s[j+2:]) < 0 {
					return 0, syntaxAt(j)
				}
				j += 6
			default:
				return 0, syntaxAt(j)
			}
		default: // a control character
			return 0, syntaxAt(j)
		}
	}
}

func (d *Doc) object(i, depth int) (int, error) {
	if depth > MaxDepth {
		return 0, ErrTooDeep
	}
	s := d.src
	idx := len(d.nodes)
	d.nodes = append(d.nodes, node{start: uint32(i), kind: Object})
	var n uint32
	j := ws(s, i+1)
	if j < len(s) && s[j] == '}' {
		j++
	} else {
		for {
			if j >= len(s) || s[j] != '"' {
				return 0, syntaxAt(j)
			}
			var err error
			if j, err = d.str(j); err != nil {
				return 0, err
			}
			if j = ws(s, j); j >= len(s) || s[j] != ':' {
				return 0, syntaxAt(j)
			}
			if j, err = d.value(ws(s, j+1), depth); err != nil {
				return 0, err
			}
			n++
			if j = ws(s, j); j >= len(s) {
				return 0, syntaxAt(j)
			}
			if s[j] == ',' {
				j = ws(s, j+1)
				continue
			}
			if s[j] != '}' {
				return 0, syntaxAt(j)
			}
			j++
			break
		}
	}
	nd := &d.nodes[idx]
	nd.end, nd.next, nd.n = uint32(j), uint32(len(d.nodes)), n
	return j, nil
}

func (d *Doc) array(i, depth int) (int, error) {
	if depth > MaxDepth {
		return 0, ErrTooDeep
	}
	s := d.src
	idx := len(d.nodes)
	d.nodes = append(d.nodes, node{start: uint32(i), kind: Array})
	var n uint32
	j := ws(s, i+1)
	if j < len(s) && s[j] == ']' {
		j++
	} else {
		for {
			var err error
			if j, err = d.value(j, depth); err != nil {
				return 0, err
			}
			n++
			if j = ws(s, j); j >= len(s) {
				return 0, syntaxAt(j)
			}
			if s[j] == ',' {
				j = ws(s, j+1)
				continue
			}
			if s[j] != ']' {
				return 0, syntaxAt(j)
			}
			j++
			break
		}
	}
	nd := &d.nodes[idx]
	nd.end, nd.next, nd.n = uint32(j), uint32(len(d.nodes)), n
	return j, nil
}

// content returns the bytes between a string node's quotes.
func (d *Doc) content(i uint32) []byte {
	nd := &d.nodes[i]
	return d.src[nd.start+1 : nd.end-1]
}

// keyBytes returns the comparison form of the key at node k: its text as
// encoding/json decodes it (lone surrogates and each byte that is not UTF-8
// become U+FFFD), so that keys encoding/json would merge are duplicates here.
func (d *Doc) keyBytes(k uint32) []byte {
	raw := d.content(k)
	if !d.nodes[k].esc && utf8.Valid(raw) {
		return raw
	}
	d.tmp = decode(d.tmp[:0], raw)
	start := len(d.keys)
	for s := d.tmp; len(s) > 0; {
		r, size := utf8.DecodeRune(s)
		if r == utf8.RuneError && size == 1 {
			d.keys = append(d.keys, "\uFFFD"...)
		} else {
			d.keys = append(d.keys, s[:size]...)
		}
		s = s[size:]
	}
	return d.keys[start:len(d.keys):len(d.keys)]
}

// decode appends the decoded content of a validated JSON string. Lone
// surrogates become U+FFFD; bytes that are not UTF-8 are copied as they are.
func decode(dst, raw []byte) []byte {
	for len(raw) > 0 {
		j := bytes.IndexByte(raw, '\\')
		if j < 0 {
			return append(dst, raw...)
		}
		dst = append(dst, raw[:j]...)
		raw = raw[j:]
		c := raw[1]
		if c != 'u' {
			dst = append(dst, unescape[c])
			raw = raw[2:]
			continue
		}
		r := hex4(raw[2:])
		raw = raw[6:]
		if r >= 0xD800 && r < 0xDC00 && len(raw) >= 6 && raw[0] == '\\' && raw[1] == 'u' {
			if r2 := hex4(raw[2:]); r2 >= 0xDC00 && r2 < 0xE000 {
				dst = appendRune(dst, 0x10000+(r-0xD800)<<10+(r2-0xDC00))
				raw = raw[6:]
				continue
			}
		}
		if r >= 0xD800 && r < 0xE000 {
			dst = append(dst, "\uFFFD"...)
			continue
		}
		dst = appendRune(dst, r)
	}
	return dst
}

var unescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// appendRune appends the UTF-8 encoding of a valid, non-surrogate rune.
func appendRune(dst []byte, r rune) []byte {
	switch {
	case r < 0x80:
		return append(dst, byte(r))
	case r < 0x800:
		return append(dst, 0xC0|byte(r>>6), 0x80|byte(r)&0x3F)
	case r < 0x10000:
		return append(dst, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
	}
	return append(dst, 0xF0|byte(r>>18), 0x80|byte(r>>12)&0x3F, 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
}

const hexDigits = "0123456789abcdef"

// appendCanonicalString appends the canonical encoding (with quotes) of the
// validated JSON string content raw; esc tells whether raw has escapes.
func appendCanonicalString(dst, raw []byte, esc bool) []byte {
	dst = append(dst, '"')
	if !esc {
		// Valid content without escapes holds no '"', '\\' or control
		// character: it is canonical as it is.
		dst = append(dst, raw...)
		return append(dst, '"')
	}
	for len(raw) > 0 {
		j := bytes.IndexByte(raw, '\\')
		if j < 0 {
			dst = append(dst, raw...)
			break
		}
		dst = append(dst, raw[:j]...)
		raw = raw[j:]
		switch c := raw[1]; c {
		case '"', '\\', 'b', 'f', 'n', 'r', 't':
			dst = append(dst, '\\', c)
			raw = raw[2:]
			continue
		case '/':
			dst = append(dst, '/')
			raw = raw[2:]
			continue
		}
		r := hex4(raw[2:])
		raw = raw[6:]
		if r >= 0xD800 && r < 0xDC00 && len(raw) >= 6 && raw[0] == '\\' && raw[1] == 'u' {
			if r2 := hex4(raw[2:]); r2 >= 0xDC00 && r2 < 0xE000 {
				dst = appendRune(dst, 0x10000+(r-0xD800)<<10+(r2-0xDC00))
				raw = raw[6:]
				continue
			}
		}
		switch {
		case r >= 0xD800 && r < 0xE000: // a lone surrogate stays escaped
			dst = append(dst, '\\', 'u', hexDigits[r>>12], hexDigits[r>>8&0xF], hexDigits[r>>4&0xF], hexDigits[r&0xF])
		case r == '"' || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r < 0x20:
			dst = appendControl(dst, byte(r))
		default:
			dst = appendRune(dst, r)
		}
	}
	return append(dst, '"')
}

func appendControl(dst []byte, c byte) []byte {
	switch c {
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	return append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
}

// flushAt is the buffer size at which an emitter with a writer flushes.
const flushAt = 32 << 10

// emitter writes the canonical form of a document's values into buf, and
// flushes buf to w (when set) as it fills.
type emitter struct {
	d   *Doc
	buf []byte
	w   io.Writer
	err error
}

func (e *emitter) maybeFlush() {
	if e.w != nil && len(e.buf) >= flushAt {
		e.flush()
	}
}

func (e *emitter) flush() {
	if e.err == nil && len(e.buf) > 0 {
		_, e.err = e.w.Write(e.buf)
	}
	e.buf = e.buf[:0]
}

func (e *emitter) value(i uint32) {
	d := e.d
	nd := &d.nodes[i]
	switch nd.kind {
	case String:
		e.buf = appendCanonicalString(e.buf, d.src[nd.start+1:nd.end-1], nd.esc)
	case Array:
		e.buf = append(e.buf, '[')
		for j := i + 1; j < nd.next; j = d.nodes[j].next {
			if j > i+1 {
				e.buf = append(e.buf, ',')
			}
			e.value(j)
		}
		e.buf = append(e.buf, ']')
	case Object:
		e.object(i, nil)
	default:
		e.buf = append(e.buf, d.src[nd.start:nd.end]...)
	}
	e.maybeFlush()
}

// object emits the object at node i, leaving out the members keep rejects
// (keep is called once per distinct key, with its last value).
func (e *emitter) object(i uint32, keep func(key []byte, val Value) bool) {
	d := e.d
	n := int(d.nodes[i].n)
	if n == 1 && keep == nil {
		e.buf = append(e.buf, '{')
		e.value(i + 1)
		e.buf = append(e.buf, ':')
		e.value(i + 2)
		e.buf = append(e.buf, '}')
		return
	}
	base := len(d.members)
	sorted := true
	for m, k := 0, i+1; m < n; m++ {
		key := d.keyBytes(k)
		if m > 0 && sorted && bytes.Compare(d.members[len(d.members)-1].key, key) >= 0 {
			sorted = false
		}
		d.members = append(d.members, member{key: key, k: k})
		k = d.nodes[k+1].next
	}
	if !sorted {
		slices.SortStableFunc(d.members[base:], func(a, b member) int { return bytes.Compare(a.key, b.key) })
	}
	e.buf = append(e.buf, '{')
	first := true
	for m := base; m < base+n; m++ {
		// Index rather than range: emitting a member value may grow (and
		// move) d.members above base+n.
		mb := d.members[m]
		if !sorted && m+1 < base+n && bytes.Equal(d.members[m+1].key, mb.key) {
			continue // a duplicate key: the last one wins
		}
		if keep != nil && !keep(mb.key, Value{d: d, i: mb.k + 1}) {
			continue
		}
		if !first {
			e.buf = append(e.buf, ',')
		}
		first = false
		e.value(mb.k)
		e.buf = append(e.buf, ':')
		e.value(mb.k + 1)
	}
	e.buf = append(e.buf, '}')
	d.members = d.members[:base]
}

var docPool = sync.Pool{New: func() any { return new(Doc) }}

// maxPooledNodes keeps the documents of huge bodies out of the pool.
const maxPooledNodes = 1 << 20

func getDoc() *Doc { return docPool.Get().(*Doc) }

func putDoc(d *Doc) {
	d.Reset()
	if cap(d.nodes) <= maxPooledNodes {
		docPool.Put(d)
	}
}

// Append appends the canonical form of the JSON text src to dst. It is safe
// for concurrent use. On error dst is returned unchanged.
func Append(dst, src []byte) ([]byte, error) {
	d := getDoc()
	defer putDoc(d)
	if err := d.Parse(src); err != nil {
		return dst, err
	}
	return d.Root().AppendCanonical(dst), nil
}

// Write writes the canonical form of the JSON text src to w, in chunks of a
// few tens of KiB, without materialising all of it: hashing a large body
// through Write needs no copy of its size. Nothing is written when src is not
// valid JSON. It is safe for concurrent use.
func Write(w io.Writer, src []byte) error {
	d := getDoc()
	defer putDoc(d)
	if err := d.Parse(src); err != nil {
		return err
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	e := emitter{d: d, buf: (*bp)[:0], w: w}
	d.keys = d.keys[:0]
	e.value(0)
	e.flush()
	*bp = e.buf
	return e.err
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 2*flushAt); return &b }}
