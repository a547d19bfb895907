package kvevents

import (
	"encoding/binary"
	"encoding/hex"
	"strconv"
)

// HashForm is how a block hash was (or is to be) written on the wire.
type HashForm uint8

const (
	// HashUint is a non-negative msgpack int: vLLM's default since 0.10.2
	// (the low 64 bits of the digest) and the non-negative hashes before.
	HashUint HashForm = iota
	// HashInt is a negative msgpack int (Python's built-in hash() of older
	// vLLM versions can be negative).
	HashInt
	// HashBytes is a msgpack bin: the whole digest, sent when
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
	HashBytes
)

// Hash is an engine block hash as vLLM published it. It is comparable: two
// Hashes are == when they have the same form and the same wire value. Use
// [Hash.Uint64] as the identity key across forms. The zero Hash is the
// unsigned int 0.
type Hash struct {
	u    uint64 // the 64-bit key (see Uint64)
	b    string // the bytes of a HashBytes hash
	form HashForm
}

// UintHash returns the hash sent as the unsigned int u.
func UintHash(u uint64) Hash { return Hash{u: u} }

// IntHash returns the hash sent as the int i. A non-negative i is the same
// Hash as UintHash(uint64(i)), as msgspec writes non-negative ints with the
// unsigned codes.
func IntHash(i int64) Hash {
	if i >= 0 {
		return Hash{u: uint64(i)}
	}
	return Hash{u: uint64(i), form: HashInt}
}

// BytesHash returns the hash sent as the bytes b (a copy is kept).
func BytesHash(b []byte) Hash {
	return Hash{u: bytesKey(b), b: string(b), form: HashBytes}
}

// bytesKey folds a bytes hash to vLLM's int form: the last 8 bytes read
// big-endian, left-padded with zeros.
func bytesKey(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var buf [8]byte
	copy(buf[8-len(b):], b)
	return binary.BigEndian.Uint64(buf[:])
}

// Uint64 returns the hash's 64-bit key: an unsigned int is itself, a negative
// int is its two's-complement bits, and bytes are the last 8 bytes read
// big-endian (left-padded with zeros when shorter), which is the int vLLM
// sends for the same block when int hashes are on (its default).
func (h Hash) Uint64() uint64 { return h.u }

// Form returns how the hash is written on the wire.
func (h Hash) Form() HashForm { return h.form }

// Int64 returns the hash as a signed int: the value of a HashInt hash, and
// the key's bits reinterpreted for the other forms.
func (h Hash) Int64() int64 { return int64(h.u) }

// Bytes returns a copy of a HashBytes hash's bytes, or nil for int hashes.
func (h Hash) Bytes() []byte {
	if h.form != HashBytes {
		return nil
	}
	return []byte(h.b)
}

// String returns the hash as its wire value: decimal for ints, hex for
// bytes.
func (h Hash) String() string {
	switch h.form {
	case HashInt:
		return strconv.FormatInt(int64(h.u), 10)
	case HashBytes:
		return "0x" + hex.EncodeToString([]byte(h.b))
	default:
		return strconv.FormatUint(h.u, 10)
	}
}
