// Package wire reads the compact binary forms rolter writes for its own
// later use (a balancer's learned state on disk, an index of prompt
// prefixes): varints, little-endian fixed-width values, length-prefixed
// bytes, each checked against what is left. A [Reader] keeps its first
// error and returns zeros after it, so a decoder reads a whole record and
// checks once; every count it reads is bounded by the caller, so a corrupt
// length never allocates more than the input could hold.
//
// encoding/binary's Append functions write the varints and fixed-width
// integers; AppendFloat64, AppendBool and AppendBytes the rest.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// ErrCorrupt is wrapped by every error a Reader returns.
var ErrCorrupt = errors.New("corrupt binary input")

// Reader reads b from the front. The zero value reads nothing.
type Reader struct {
	b   []byte
	err error
}

// NewReader returns a Reader of b.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// Err is the first error met, nil if none.
func (r *Reader) Err() error { return r.err }

// Len is the number of bytes left.
func (r *Reader) Len() int { return len(r.b) }

// Fail records an error (the first one is kept), wrapping ErrCorrupt: for
// the decoder's own invariants.
func (r *Reader) Fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
		r.b = nil
	}
}

// Done fails unless every byte was read, and returns Err.
func (r *Reader) Done() error {
	if r.err == nil && len(r.b) > 0 {
		r.Fail("%d bytes left over", len(r.b))
	}
	return r.err
}

// Magic consumes m, failing when the input does not start with it.
func (r *Reader) Magic(m string) {
	if r.err != nil {
		return
	}
	if len(r.b) < len(m) || string(r.b[:len(m)]) != m {
		r.Fail("not a %q record (or another version)", m)
		return
	}
	r.b = r.b[len(m):]
}

// Uvarint reads an unsigned varint.
func (r *Reader) Uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Uvarint(r.b)
	if k <= 0 || k != varintLen(v) {
		// Not minimal either: no writer of ours makes one, and a record
		// must read back as the bytes it was read from.
		r.Fail("%s: bad varint", what)
		return 0
	}
	r.b = r.b[k:]
	return v
}

// varintLen is the length of the minimal varint encoding of x.
func varintLen(x uint64) int { return max(1, (bits.Len64(x)+6)/7) }

// Varint reads a signed varint.
func (r *Reader) Varint(what string) int64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Varint(r.b)
	if k <= 0 || k != varintLen(uint64(v)<<1^uint64(v>>63)) { // zigzag, as binary.PutVarint
		r.Fail("%s: bad varint", what)
		return 0
	}
	r.b = r.b[k:]
	return v
}

// Count reads an unsigned varint of at most limit.
func (r *Reader) Count(what string, limit int) int {
	v := r.Uvarint(what)
	if r.err == nil && v > uint64(max(limit, 0)) {
		r.Fail("%s: %d, more than %d", what, v, limit)
		return 0
	}
	return int(v)
}

// Items reads a count of items each taking at least size bytes (size ≥ 1)
// and at most limit of them: a count the rest of the input cannot hold
// fails before anything is allocated for it.
func (r *Reader) Items(what string, size, limit int) int {
	n := r.Count(what, limit)
	if r.err == nil && n > len(r.b)/max(size, 1) {
		r.Fail("%s: %d of at least %d bytes each, %d bytes left", what, n, size, len(r.b))
		return 0
	}
	return n
}

// Uint64 reads 8 bytes, little-endian.
func (r *Reader) Uint64(what string) uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.Fail("%s: truncated", what)
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// Float64 reads a float64's 8 bytes, little-endian, failing on NaN or an
// infinity: what a decoder reads feeds arithmetic.
func (r *Reader) Float64(what string) float64 {
	v := math.Float64frombits(r.Uint64(what))
	if math.IsNaN(v) || math.IsInf(v, 0) {
		r.Fail("%s: not finite", what)
		return 0
	}
	return v
}

// Bool reads one byte, 0 or 1.
func (r *Reader) Bool(what string) bool {
	if r.err != nil {
		return false
	}
	if len(r.b) < 1 || r.b[0] > 1 {
		r.Fail("%s: not a bool", what)
		return false
	}
	v := r.b[0] == 1
	r.b = r.b[1:]
	return v
}

// Bytes reads a length-prefixed byte string of at most limit bytes. The
// result aliases the input.
func (r *Reader) Bytes(what string, limit int) []byte {
	n := r.Count(what, limit)
	if r.err == nil && n > len(r.b) {
		r.Fail("%s: %d bytes, %d left", what, n, len(r.b))
	}
	if r.err != nil {
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// AppendFloat64 appends v's 8 bytes, little-endian (Float64 reads them).
func AppendFloat64(dst []byte, v float64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(v))
}

// AppendBool appends v as one byte (Bool reads it).
func AppendBool(dst []byte, v bool) []byte {
	if v {
		return append(dst, 1)
	}
	return append(dst, 0)
}

// AppendBytes appends b with its length (Bytes reads it).
func AppendBytes(dst, b []byte) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(b))), b...)
}
