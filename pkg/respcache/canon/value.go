package canon

import "iter"

// Value is a value inside a parsed [Doc]. The zero Value has kind Invalid.
// A Value is valid until its Doc parses another text or is reset, and shares
// the Doc's lack of concurrency safety.
type Value struct {
	d *Doc
	i uint32
}

func (v Value) node() *node { return &v.d.nodes[v.i] }

// Kind returns the kind of v.
func (v Value) Kind() Kind {
	if v.d == nil {
		return Invalid
	}
	return v.node().kind
}

// Raw returns the bytes of v as written in the source (a string with its
// quotes). The slice aliases the source and must not be modified.
func (v Value) Raw() []byte {
	if v.d == nil {
		return nil
	}
	nd := v.node()
	return v.d.src[nd.start:nd.end]
}

// Len returns the number of members of an object (duplicates included) or
// elements of an array, and 0 for other kinds.
func (v Value) Len() int {
	if k := v.Kind(); k != Object && k != Array {
		return 0
	}
	return int(v.node().n)
}

// Members yields an object's members in source order, duplicates included;
// each key is a Value of kind String. It yields nothing for other kinds.
func (v Value) Members() iter.Seq2[Value, Value] {
	return func(yield func(Value, Value) bool) {
		if v.Kind() != Object {
			return
		}
		d := v.d
		for k := v.i + 1; k < d.nodes[v.i].next; k = d.nodes[k+1].next {
			if !yield(Value{d, k}, Value{d, k + 1}) {
				return
			}
		}
	}
}

// Elements yields an array's elements in order. It yields nothing for other
// kinds.
func (v Value) Elements() iter.Seq[Value] {
	return func(yield func(Value) bool) {
		if v.Kind() != Array {
			return
		}
		d := v.d
		for j := v.i + 1; j < d.nodes[v.i].next; j = d.nodes[j].next {
			if !yield(Value{d, j}) {
				return
			}
		}
	}
}

// Lookup returns the value of the last member of object v whose decoded key
// is key (the one encoding/json would keep), and whether there is one.
func (v Value) Lookup(key string) (Value, bool) {
	var found Value
	ok := false
	for k, val := range v.Members() {
		if k.TextEqual(key) {
			found, ok = val, true
		}
	}
	return found, ok
}

// TextEqual reports whether v is a string whose decoded text is s. It does
// not allocate.
func (v Value) TextEqual(s string) bool {
	if v.Kind() != String {
		return false
	}
	raw := v.d.content(v.i)
	if !v.node().esc {
		return string(raw) == s
	}
	if len(raw) < len(s) { // decoding never makes a string longer
		return false
	}
	v.d.tmp = decode(v.d.tmp[:0], raw)
	return string(v.d.tmp) == s
}

// AppendText appends the decoded text of string v to dst (lone surrogates
// become U+FFFD; bytes that are not UTF-8 are copied). Other kinds append
// nothing.
func (v Value) AppendText(dst []byte) []byte {
	if v.Kind() != String {
		return dst
	}
	raw := v.d.content(v.i)
	if !v.node().esc {
		return append(dst, raw...)
	}
	return decode(dst, raw)
}

// Text returns the decoded text of string v, and "" for other kinds.
func (v Value) Text() string { return string(v.AppendText(nil)) }

// AppendCanonical appends the canonical form of v to dst.
func (v Value) AppendCanonical(dst []byte) []byte {
	if v.d == nil {
		return dst
	}
	v.d.keys = v.d.keys[:0]
	e := emitter{d: v.d, buf: dst}
	e.value(v.i)
	return e.buf
}

// AppendCanonicalFunc appends the canonical form of object v to dst with
// only the members keep accepts. keep is called in key order, once per
// distinct key, with the decoded key (as encoding/json decodes it) and the
// member's last value; the key slice is valid only during
// the call. For other kinds it is [Value.AppendCanonical].
func (v Value) AppendCanonicalFunc(dst []byte, keep func(key []byte, val Value) bool) []byte {
	if v.Kind() != Object || keep == nil {
		return v.AppendCanonical(dst)
	}
	v.d.keys = v.d.keys[:0]
	e := emitter{d: v.d, buf: dst}
	e.object(v.i, keep)
	return e.buf
}
