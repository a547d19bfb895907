package affinity

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"rolter.dev/pkg/jsonesc"
	"unicode/utf8"
)

// Positions returned by the readers: a non-negative value is the offset just
// past what was read.
const (
	errPos    = -1 // invalid JSON, or a failed speculation (see builder.failed)
	closedPos = -2 // an iterator reached the end of its container
)

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

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// plain returns the length of the longest prefix of s made of printable
// ASCII other than '"' and '\\': string bytes that need no attention. It
// looks at eight bytes at a time.
func plain(s []byte) int {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		if m := special(binary.LittleEndian.Uint64(s[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
			return i
		}
	}
	return i
}

// str reads the JSON string at s[i] == '"' and hands its content to mode's
// sink: decoded for mPush and mAbsorb, re-escaped canonically (with quotes)
// for mCompact, nowhere for mSkip. Invalid UTF-8 and lone surrogates decode
// to U+FFFD, as encoding/json does. It returns the offset after the string.
func (b *builder) str(i int, mode uint8) int {
	switch mode {
	case mSkip:
		return b.strSkip(i)
	case mCompact:
		return b.strCompact(i)
	}
	return b.strDecode(i, mode == mPush)
}

// nonASCII steps over the non-ASCII characters at s[i:], returning the
// offset of the first ASCII byte or invalid sequence, and whether it stopped
// at an invalid sequence.
func nonASCII(s []byte, i int) (int, bool) {
	for i < len(s) && s[i] >= 0x80 {
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			return i, true
		}
		i += size
	}
	return i, false
}

func (b *builder) strSkip(i int) int {
	s := b.body
	i++
	for {
		i += plain(s[i:])
		if i >= len(s) {
			return b.invalid()
		}
		switch c := s[i]; {
		case c == '"':
			return i + 1
		case c == '\\':
			if _, i = jsonesc.Decode(s, i); i < 0 {
				return b.invalid()
			}
		case c < 0x80:
			return b.invalid() // a raw control character
		default:
			var bad bool
			if i, bad = nonASCII(s, i); bad {
				i++
			}
		}
	}
}

// shortEscape marks the escapes written the same way in canonical compact
// JSON, so they can stay inside a raw run.
var shortEscape = [256]bool{'"': true, '\\': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}

func (b *builder) strCompact(i int) int {
	s := b.body
	b.cbyte('"')
	i++
	run := i
	for {
		i += plain(s[i:])
		if i >= len(s) {
			return b.invalid()
		}
		switch c := s[i]; {
		case c == '"':
			b.compactRun(s[run:i])
			b.cbyte('"')
			return i + 1
		case c == '\\':
			if i+1 < len(s) && shortEscape[s[i+1]] {
				i += 2 // canonical already
				continue
			}
			b.compactRun(s[run:i])
			r, j := jsonesc.Decode(s, i)
			if j < 0 {
				return b.invalid()
			}
			b.compactRune(r)
			i, run = j, j
		case c < 0x80:
			return b.invalid()
		default:
			var bad bool
			if i, bad = nonASCII(s, i); bad {
				b.compactRun(s[run:i])
				b.compactRun(replChar)
				i++
				run = i
			}
		}
	}
}

func (b *builder) compactRun(p []byte) {
	if b.measured {
		b.n += len(p)
	}
	b.hash(p)
}

// compactRune writes a decoded \u escape canonically: '"', '\\' and control
// characters escaped, everything else as UTF-8.
func (b *builder) compactRune(r rune) {
	p := b.rb[:0]
	switch {
	case r == '"' || r == '\\':
		p = append(p, '\\', byte(r))
	case r == '\b':
		p = append(p, '\\', 'b')
	case r == '\f':
		p = append(p, '\\', 'f')
	case r == '\n':
		p = append(p, '\\', 'n')
	case r == '\r':
		p = append(p, '\\', 'r')
	case r == '\t':
		p = append(p, '\\', 't')
	case r < 0x20:
		p = append(p, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&15])
	default:
		p = utf8.AppendRune(p, r)
	}
	b.compactRun(p)
}

// special flags (in the high bit of each byte) the bytes of v that a string
// cannot take as they are: '"', '\\', control characters and non-ASCII.
// Borrows only run upwards, so the lowest flag is exact.
func special(v uint64) uint64 {
	q := v ^ (lsb * '"')
	e := v ^ (lsb * '\\')
	return (((q - lsb) &^ q) | ((e - lsb) &^ e) | (v - lsb*0x20) | v) & msb
}

// strDecode decodes a string into the hash staging buffer, eight bytes at a
// time: each word is stored whole and the staging offset advances past its
// plain bytes, so plain text costs no call and no copy of its own. The
// string's bytes staged since mark are accounted for (counted, and for a
// push copied into the text) whenever the staging buffer is flushed and at
// the end. Characters are staged whole, so every such segment starts on a
// character boundary.
func (b *builder) strDecode(i int, push bool) int {
	s := b.body
	hs := b.hs[:]
	hn := b.hn
	mark := hn
	i++
	for {
		for i+8 <= len(s) && hn+8 <= len(hs) {
			v := binary.LittleEndian.Uint64(s[i:])
			binary.LittleEndian.PutUint64(hs[hn:], v)
			m := special(v)
			if m == 0 {
				i += 8
				hn += 8
				continue
			}
			k := bits.TrailingZeros64(m) >> 3
			i += k
			hn += k
			break
		}
		if hn+8 > len(hs) {
			// Keep eight bytes of room for the next word or character.
			b.hn = hn
			b.account(push, mark)
			b.flush()
			hn, mark = 0, 0
			continue
		}
		if i >= len(s) {
			b.hn = hn
			return b.invalid()
		}
		switch c := s[i]; {
		case c == '"':
			b.hn = hn
			b.account(push, mark)
			return i + 1
		case c == '\\':
			if i+1 < len(s) {
				if d := simpleEscape[s[i+1]]; d != 0 {
					hs[hn] = d
					hn++
					i += 2
					continue
				}
			}
			r, j := jsonesc.Decode(s, i)
			if j < 0 {
				b.hn = hn
				return b.invalid()
			}
			hn += utf8.EncodeRune(hs[hn:], r)
			i = j
		case c < 0x20:
			b.hn = hn
			return b.invalid() // a raw control character
		case c < 0x80:
			hs[hn] = c // a plain byte near the end of the body
			hn++
			i++
		case c < 0xE0 && c >= 0xC2 && i+1 < len(s) && s[i+1]&0xC0 == 0x80:
			hs[hn], hs[hn+1] = c, s[i+1] // a two-byte character
			hn += 2
			i += 2
		default:
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				hn += copy(hs[hn:], replChar) // invalid UTF-8
			} else {
				copy(hs[hn:hn+4], s[i:i+size])
				hn += size
			}
			i += size
		}
	}
}

// simpleEscape decodes the one-byte escapes.
var simpleEscape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// account counts the string bytes staged since mark and, for a push, keeps
// them in the text.
func (b *builder) account(push bool, mark int) {
	b.accountBytes(b.hs[mark:b.hn], push)
}

func (b *builder) accountBytes(p []byte, push bool) {
	if push {
		b.n += len(p)
		b.appendText(p)
	} else if b.measured {
		b.n += len(p)
	}
}

const hexDigits = "0123456789abcdef"

// number reads a JSON number at s[i]; mCompact hashes it as written.
func (b *builder) number(i int, mode uint8) int {
	s := b.body
	j := i
	if j < len(s) && s[j] == '-' {
		j++
	}
	switch {
	case j >= len(s):
		return b.invalid()
	case s[j] == '0':
		j++
	case s[j] >= '1' && s[j] <= '9':
		j = digits(s, j+1)
	default:
		return b.invalid()
	}
	if j < len(s) && s[j] == '.' {
		k := digits(s, j+1)
		if k == j+1 {
			return b.invalid()
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
			return b.invalid()
		}
		j = k
	}
	if mode == mCompact {
		b.compactRun(s[i:j])
	}
	return j
}

func digits(s []byte, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// literal reads true, false or null at s[i].
func (b *builder) literal(i int, mode uint8) int {
	s := b.body
	var lit string
	switch s[i] {
	case 't':
		lit = "true"
	case 'f':
		lit = "false"
	default:
		lit = "null"
	}
	j := i + len(lit)
	if j > len(s) || string(s[i:j]) != lit {
		return b.invalid()
	}
	if mode == mCompact {
		b.compactRun(s[i:j])
	}
	return j
}

// value reads the JSON value at s[i] (not whitespace) whose container is at
// depth d (0 for the document), validating it; mCompact streams its compact
// form into the hasher. It walks nested containers iteratively.
func (b *builder) value(i int, mode uint8, d int) int {
	s := b.body
	top := d
	for {
		// A value starts at i.
		if i >= len(s) {
			return b.invalid()
		}
		switch c := s[i]; c {
		case '"':
			i = b.str(i, mode)
		case 't', 'f', 'n':
			i = b.literal(i, mode)
		case '{', '[':
			d++
			if d > maxDepth {
				return b.invalid()
			}
			lvl := d - top - 1
			if c == '{' {
				b.st[lvl>>6] |= 1 << (lvl & 63)
			} else {
				b.st[lvl>>6] &^= 1 << (lvl & 63)
			}
			if mode == mCompact {
				b.cbyte(c)
			}
			i = ws(s, i+1)
			if i >= len(s) {
				return b.invalid()
			}
			if s[i] == c+2 { // '}' or ']'
				if mode == mCompact {
					b.cbyte(c + 2)
				}
				d--
				i++
				break
			}
			if c == '{' {
				i = b.key(i, mode)
				if i < 0 {
					return errPos
				}
			}
			continue
		default:
			i = b.number(i, mode)
		}
		if i < 0 {
			return errPos
		}
		// A value ended at i: close containers until one has a next member.
		for {
			if d == top {
				return i
			}
			i = ws(s, i)
			if i >= len(s) {
				return b.invalid()
			}
			lvl := d - top - 1
			obj := b.st[lvl>>6]&(1<<(lvl&63)) != 0
			c := s[i]
			if c == ',' {
				if mode == mCompact {
					b.cbyte(',')
				}
				i = ws(s, i+1)
				if obj {
					i = b.key(i, mode)
					if i < 0 {
						return errPos
					}
				}
				break
			}
			if (obj && c == '}') || (!obj && c == ']') {
				if mode == mCompact {
					b.cbyte(c)
				}
				d--
				i++
				continue
			}
			return b.invalid()
		}
	}
}

// key reads an object key at s[i], the colon and the whitespace after it,
// and returns the offset of the member's value.
func (b *builder) key(i int, mode uint8) int {
	s := b.body
	if i >= len(s) || s[i] != '"' {
		return b.invalid()
	}
	i = b.str(i, mode)
	if i < 0 {
		return errPos
	}
	i = ws(s, i)
	if i >= len(s) || s[i] != ':' {
		return b.invalid()
	}
	if mode == mCompact {
		b.cbyte(':')
	}
	i = ws(s, i+1)
	if i >= len(s) {
		return b.invalid()
	}
	return i
}

// lax delimits the value at s[i] without validating it: the value will be
// read (and validated) later, or validated on its own. On valid JSON it
// finds the exact end; on invalid JSON it returns some offset or errPos.
func (b *builder) lax(i int) int {
	s := b.body
	switch s[i] {
	case '"':
		return b.laxStr(i)
	case '{', '[':
		depth := 0
		for i < len(s) {
			switch s[i] {
			case '"':
				i = b.laxStr(i)
				if i < 0 {
					return errPos
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return b.invalid()
	default:
		for i < len(s) {
			switch s[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
			i++
		}
		return i
	}
}

// laxStr finds the end of the string at s[i] == '"'. The ends of long
// strings are remembered, so a string inside a field that is delimited at
// several levels (messages, then content, then a tool result's content) is
// scanned once.
func (b *builder) laxStr(i int) int {
	e := &b.lc[uint(i)/8%uint(len(b.lc))]
	if e.gen == b.gen && e.at == i {
		return e.end
	}
	s := b.body
	j := i + 1
	for {
		k := bytes.IndexByte(s[j:], '"')
		if k < 0 {
			return b.invalid()
		}
		q := j + k
		n := 0
		for p := q - 1; p > i && s[p] == '\\'; p-- {
			n++
		}
		if n&1 == 0 {
			if q-i >= laxCacheMin {
				*e = laxEnd{gen: b.gen, at: i, end: q + 1}
			}
			return q + 1
		}
		j = q + 1
	}
}

// laxCacheMin is the shortest string whose end laxStr remembers.
const laxCacheMin = 256

// laxEnd is a remembered string end; gen tells which Parse it belongs to.
type laxEnd struct {
	gen     uint64
	at, end int
}

// small returns the decoded content of the string s[at:end] when it is at
// most len(b.kb) bytes long (keys, type names), and whether it is a string
// at all. A longer string returns its first bytes and false for fits.
func (b *builder) small(at, end int) (v []byte, isStr, fits bool) {
	s := b.body
	if at >= len(s) || s[at] != '"' || end-1 <= at {
		return nil, false, false
	}
	raw := s[at+1 : end-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		// Bytes that are not valid UTF-8 would decode to U+FFFD; callers only
		// compare with ASCII names, which neither form can equal.
		return raw, true, true
	}
	p := b.kb[:0]
	for i := 0; i < len(raw); {
		var r rune
		if raw[i] == '\\' {
			var j int
			r, j = jsonesc.Decode(raw, i)
			if j < 0 {
				return p, true, false
			}
			i = j
		} else {
			var size int
			r, size = utf8.DecodeRune(raw[i:])
			i += size
		}
		if len(p)+utf8.RuneLen(r) > cap(p) {
			return p, true, false
		}
		p = utf8.AppendRune(p, r)
	}
	return p, true, true
}

// Keys the prompt readers look at.
type keyID uint8

const (
	kOther keyID = iota
	kMessages
	kSystem
	kInstructions
	kInput
	kPrompt
	kRole
	kContent
	kOutput
	kArguments
	kToolCalls
	kType
	kText
	kFunction
	kAux // not a key: a frame's extra span (a call's function arguments)
	kCount
)

func lookup(k []byte) keyID {
	switch string(k) {
	case "messages":
		return kMessages
	case "system":
		return kSystem
	case "instructions":
		return kInstructions
	case "input":
		return kInput
	case "prompt":
		return kPrompt
	case "role":
		return kRole
	case "content":
		return kContent
	case "output":
		return kOutput
	case "arguments":
		return kArguments
	case "tool_calls":
		return kToolCalls
	case "type":
		return kType
	case "text":
		return kText
	case "function":
		return kFunction
	}
	return kOther
}

// keyAt identifies the already validated key string s[at:end].
func (b *builder) keyAt(at, end int) keyID {
	k, _, fits := b.small(at, end)
	if !fits {
		return kOther
	}
	return lookup(k)
}

// member reads the key at s[i] (which must open a string), the colon and the
// whitespace after it; it returns the key and the offset of the value.
func (b *builder) member(i int) (keyID, int) {
	s := b.body
	if i >= len(s) || s[i] != '"' {
		return kOther, b.invalid()
	}
	a := i + 1
	j := a + plain(s[a:])
	var id keyID
	if j < len(s) && s[j] == '"' {
		id = lookup(s[a:j])
		j++
	} else {
		j = b.str(i, mSkip)
		if j < 0 {
			return kOther, errPos
		}
		id = b.keyAt(i, j)
	}
	j = ws(s, j)
	if j >= len(s) || s[j] != ':' {
		return kOther, b.invalid()
	}
	j = ws(s, j+1)
	if j >= len(s) {
		return kOther, b.invalid()
	}
	return id, j
}

// objIter walks the members of an object. i starts just after the '{' and
// the caller sets it past each member's value.
type objIter struct{ i, n int }

// next returns the next member's key and value offset, or closedPos (it.i is
// then past the '}'), or errPos.
func (b *builder) next(it *objIter) (keyID, int) {
	s := b.body
	i := ws(s, it.i)
	if i >= len(s) {
		return kOther, b.invalid()
	}
	if s[i] == '}' {
		it.i = i + 1
		return kOther, closedPos
	}
	if it.n > 0 {
		if s[i] != ',' {
			return kOther, b.invalid()
		}
		i = ws(s, i+1)
	}
	it.n++
	return b.member(i)
}

// arrIter walks the elements of an array, like objIter.
type arrIter struct{ i, n int }

// elem returns the next element's offset, or closedPos, or errPos.
func (b *builder) elem(it *arrIter) int {
	s := b.body
	i := ws(s, it.i)
	if i >= len(s) {
		return b.invalid()
	}
	if s[i] == ']' {
		it.i = i + 1
		return closedPos
	}
	if it.n > 0 {
		if s[i] != ',' {
			return b.invalid()
		}
		i = ws(s, i+1)
		if i >= len(s) {
			return b.invalid()
		}
	}
	it.n++
	return i
}
