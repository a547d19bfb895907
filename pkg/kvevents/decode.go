package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
)

// Errors returned by [Decode]; every decoding error wraps ErrMalformed.
var (
	// ErrMalformed is wrapped by every error about a payload that is not
	// a KVEventBatch: truncated, not msgpack, wrong shape, trailing bytes.
	ErrMalformed = errors.New("kvevents: malformed payload")
	// ErrTooLarge reports a payload longer than the decoder's limit.
	ErrTooLarge = fmt.Errorf("%w: payload too large", ErrMalformed)
)

const (
	// DefaultMaxPayload is the largest payload [Decode] accepts: far above
	// any engine step's batch (128 requests of 32 k tokens at 5 bytes a
	// token are 20 MiB).
	DefaultMaxPayload = 64 << 20
	// maxDepth bounds the nesting of skipped or raw values (extra_keys
	// tuples, unknown fields), so that hostile input cannot exhaust the
	// stack.
	maxDepth = 32
	// maxHashBytes bounds a bytes hash (sha256 is 32 bytes).
	maxHashBytes = 64
)

// msgpack codes (msgpcode's are variables; these are constants).
const (
	cNil      = 0xc0
	cFalse    = 0xc2
	cTrue     = 0xc3
	cBin8     = 0xc4
	cBin16    = 0xc5
	cBin32    = 0xc6
	cExt8     = 0xc7
	cExt16    = 0xc8
	cExt32    = 0xc9
	cFloat    = 0xca
	cDouble   = 0xcb
	cUint8    = 0xcc
	cUint16   = 0xcd
	cUint32   = 0xce
	cUint64   = 0xcf
	cInt8     = 0xd0
	cInt16    = 0xd1
	cInt32    = 0xd2
	cInt64    = 0xd3
	cFixExt1  = 0xd4
	cFixExt2  = 0xd5
	cFixExt4  = 0xd6
	cFixExt8  = 0xd7
	cFixExt16 = 0xd8
	cStr8     = 0xd9
	cStr16    = 0xda
	cStr32    = 0xdb
	cArray16  = 0xdc
	cArray32  = 0xdd
	cMap16    = 0xde
	cMap32    = 0xdf
)

func isUintCode(c byte) bool { return c <= 0x7f || (c >= cUint8 && c <= cUint64) }
func isSintCode(c byte) bool { return c >= 0xe0 || (c >= cInt8 && c <= cInt64) }
func isIntCode(c byte) bool  { return isUintCode(c) || isSintCode(c) }
func isStrCode(c byte) bool  { return (c >= 0xa0 && c <= 0xbf) || (c >= cStr8 && c <= cStr32) }
func isBinCode(c byte) bool  { return c >= cBin8 && c <= cBin32 }
func isArrayCode(c byte) bool {
	return (c >= 0x90 && c <= 0x9f) || c == cArray16 || c == cArray32
}
func isMapCode(c byte) bool { return (c >= 0x80 && c <= 0x8f) || c == cMap16 || c == cMap32 }

// Decoder decodes KVEventBatch payloads by walking them once, without
// reflection: it drives a streaming github.com/vmihailenco/msgpack/v5
// Decoder over the payload and reads the hot forms (ints, fixstr, fixarray,
// fixmap) straight from the payload bytes, which more than doubles the rate
// on token lists. It keeps buffers between calls, so reusing one is cheaper
// than calling [Decode]; it is not safe for concurrent use. The zero value
// is not usable: call [NewDecoder].
type Decoder struct {
	// MaxPayload is the largest payload accepted, in bytes; 0 means
	// DefaultMaxPayload.
	MaxPayload int

	p []byte       // the payload being decoded
	r bytes.Reader // reads p; the msgpack decoder reads r directly
	d *msgpack.Decoder
	f mapFields // scratch for map-form events
	// room is the memory the payload may still decode to (see
	// maxDecodedPerByte).
	room int
}

// maxDecodedPerByte bounds what a payload decodes to, in bytes of events,
// hashes, token ids and extra keys per byte of payload (plus
// decodedSlack). A hash takes 32 bytes decoded and 9 on the wire as vLLM
// sends it (a 64-bit int), a token id 4 and 1 to 5, an event its struct
// and at least a dozen bytes of tag: real batches decode to about 4 times
// their size. A publisher's 60 MiB of one-byte hashes decoded to 1.9 GiB;
// now it is malformed.
const (
	maxDecodedPerByte = 8
	decodedSlack      = 64 << 10
)

var errAmplified = fmt.Errorf("%w: decodes to more than %d times its size", ErrMalformed, maxDecodedPerByte)

// charge takes n decoded items of size bytes from the payload's room.
func (dec *Decoder) charge(n int, size uintptr) error {
	if n > dec.room/int(size) {
		return errAmplified
	}
	dec.room -= n * int(size)
	return nil
}

// add appends an understood event to b, charged its struct and its slot.
func (dec *Decoder) add(b *Batch, ev Event) error {
	size := unsafe.Sizeof(ev)
	switch e := ev.(type) {
	case *BlockStored:
		size += unsafe.Sizeof(*e)
	case *BlockRemoved:
		size += unsafe.Sizeof(*e)
	case *AllBlocksCleared:
		size += unsafe.Sizeof(*e)
	}
	if err := dec.charge(1, size); err != nil {
		return err
	}
	b.Events = append(b.Events, ev)
	return nil
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	dec := &Decoder{}
	dec.d = msgpack.NewDecoder(&dec.r)
	return dec
}

var decoderPool = sync.Pool{New: func() any { return NewDecoder() }}

// Decode decodes one KVEventBatch payload of any generation (see the package
// documentation). Events it does not understand are skipped and counted in
// the Batch; an error (wrapping [ErrMalformed]) means the payload as a whole
// is not a batch. The Batch does not alias payload.
func Decode(payload []byte) (*Batch, error) {
	dec := decoderPool.Get().(*Decoder)
	b, err := dec.Decode(payload)
	dec.p = nil
	dec.r.Reset(nil)
	decoderPool.Put(dec)
	return b, err
}

// Decode decodes one payload; see the package-level [Decode].
func (dec *Decoder) Decode(payload []byte) (*Batch, error) {
	limit := dec.MaxPayload
	if limit <= 0 {
		limit = DefaultMaxPayload
	}
	if len(payload) > limit {
		return nil, fmt.Errorf("%w (%d bytes, limit %d)", ErrTooLarge, len(payload), limit)
	}
	dec.p = payload
	dec.r.Reset(payload)
	dec.d.Reset(&dec.r)
	dec.room = maxDecodedPerByte*len(payload) + decodedSlack
	b := &Batch{}
	if err := dec.batch(b); err != nil {
		return nil, malformed(err)
	}
	if n := dec.r.Len(); n > 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after the batch", ErrMalformed, n)
	}
	return b, nil
}

// malformed wraps a decoding error in ErrMalformed.
func malformed(err error) error {
	if errors.Is(err, ErrMalformed) {
		return err
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated", ErrMalformed)
	}
	return fmt.Errorf("%w: %v", ErrMalformed, err)
}

var (
	errTruncated = fmt.Errorf("%w: truncated", ErrMalformed)
	errTooDeep   = fmt.Errorf("%w: nesting deeper than %d", ErrMalformed, maxDepth)
)

// pos returns the offset of the next byte to read.
func (dec *Decoder) pos() int { return len(dec.p) - dec.r.Len() }

func (dec *Decoder) peek() (byte, error) {
	if dec.r.Len() == 0 {
		return 0, errTruncated
	}
	return dec.p[dec.pos()], nil
}

// advance skips n bytes.
func (dec *Decoder) advance(n int) error {
	if n < 0 || n > dec.r.Len() {
		return errTruncated
	}
	_, err := dec.r.Seek(int64(n), io.SeekCurrent)
	return err
}

// seek moves the reader to offset off of the payload.
func (dec *Decoder) seek(off int) error {
	if off < 0 || off > len(dec.p) {
		return errTruncated
	}
	_, err := dec.r.Seek(int64(off), io.SeekStart)
	return err
}

// The container and string helpers below read the fix forms (the common
// case: short strings, small arrays and maps) straight from the payload
// bytes and leave the other forms to the msgpack decoder: the generic
// reader's per-call overhead otherwise dominates the decode time.

// arrayLen reads an array header whose n elements must fit in what is left
// (each takes at least a byte).
func (dec *Decoder) arrayLen() (int, error) {
	var n int
	if c, err := dec.peek(); err != nil {
		return 0, err
	} else if c >= 0x90 && c <= 0x9f {
		n = int(c & 0x0f)
		_, _ = dec.r.ReadByte()
	} else if n, err = dec.d.DecodeArrayLen(); err != nil {
		return 0, err
	}
	if n < 0 || n > dec.r.Len() {
		return 0, errTruncated
	}
	return n, nil
}

// mapLen reads a map header whose n entries must fit in what is left.
func (dec *Decoder) mapLen() (int, error) {
	var n int
	if c, err := dec.peek(); err != nil {
		return 0, err
	} else if c >= 0x80 && c <= 0x8f {
		n = int(c & 0x0f)
		_, _ = dec.r.ReadByte()
	} else if n, err = dec.d.DecodeMapLen(); err != nil {
		return 0, err
	}
	if n < 0 || 2*n > dec.r.Len() {
		return 0, errTruncated
	}
	return n, nil
}

// rawBytes reads a str or bin value and returns a view of its bytes.
func (dec *Decoder) rawBytes() ([]byte, error) {
	var n int
	if c, err := dec.peek(); err != nil {
		return nil, err
	} else if c >= 0xa0 && c <= 0xbf {
		n = int(c & 0x1f)
		_, _ = dec.r.ReadByte()
	} else if n, err = dec.d.DecodeBytesLen(); err != nil {
		return nil, err
	}
	if n < 0 || n > dec.r.Len() {
		return nil, errTruncated
	}
	start := dec.pos()
	if err := dec.advance(n); err != nil {
		return nil, err
	}
	return dec.p[start : start+n : start+n], nil
}

// skip skips one value of any type, nested at most maxDepth deep.
func (dec *Decoder) skip(depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	c, err := dec.r.ReadByte()
	if err != nil {
		return errTruncated
	}
	switch {
	case c <= 0x7f || c >= 0xe0, c == cNil, c == cFalse, c == cTrue:
		return nil
	case c >= 0xa0 && c <= 0xbf:
		return dec.advance(int(c & 0x1f))
	case c >= 0x90 && c <= 0x9f:
		return dec.skipN(int(c&0x0f), depth)
	case c >= 0x80 && c <= 0x8f:
		return dec.skipN(2*int(c&0x0f), depth)
	}
	switch c {
	case cUint8, cInt8:
		return dec.advance(1)
	case cUint16, cInt16:
		return dec.advance(2)
	case cUint32, cInt32, cFloat:
		return dec.advance(4)
	case cUint64, cInt64, cDouble:
		return dec.advance(8)
	case cFixExt1:
		return dec.advance(2)
	case cFixExt2:
		return dec.advance(3)
	case cFixExt4:
		return dec.advance(5)
	case cFixExt8:
		return dec.advance(9)
	case cFixExt16:
		return dec.advance(17)
	case cStr8, cBin8, cExt8, cStr16, cBin16, cExt16, cStr32, cBin32, cExt32, cArray16, cArray32, cMap16, cMap32:
		n, err := dec.lenAfter(c)
		if err != nil {
			return err
		}
		switch c {
		case cExt8, cExt16, cExt32:
			return dec.advance(n + 1) // the ext type byte, then the data
		case cArray16, cArray32:
			return dec.skipN(n, depth)
		case cMap16, cMap32:
			return dec.skipN(2*n, depth)
		default:
			return dec.advance(n)
		}
	}
	return fmt.Errorf("%w: invalid msgpack code 0x%02x", ErrMalformed, c)
}

// lenAfter reads the big-endian length that follows a sized code.
func (dec *Decoder) lenAfter(c byte) (int, error) {
	var w int
	switch c {
	case cStr8, cBin8, cExt8:
		w = 1
	case cStr16, cBin16, cExt16, cArray16, cMap16:
		w = 2
	default:
		w = 4
	}
	if dec.r.Len() < w {
		return 0, errTruncated
	}
	p := dec.p[dec.pos():]
	n := 0
	for i := range w {
		n = n<<8 | int(p[i])
	}
	return n, dec.advance(w)
}

// skipN skips n values nested in a container at depth.
func (dec *Decoder) skipN(n, depth int) error {
	if n > dec.r.Len() {
		return errTruncated
	}
	for range n {
		if err := dec.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// batch decodes the outer KVEventBatch.
func (dec *Decoder) batch(b *Batch) error {
	c, err := dec.peek()
	if err != nil {
		return err
	}
	switch {
	case isArrayCode(c):
		n, err := dec.arrayLen()
		if err != nil {
			return err
		}
		if n < 2 {
			return fmt.Errorf("%w: batch has %d elements, want at least 2", ErrMalformed, n)
		}
		if b.TS, err = dec.ts(); err != nil {
			return err
		}
		if err := dec.events(b); err != nil {
			return err
		}
		b.Layout.NoRank = n == 2
		if n >= 3 {
			if b.DataParallelRank, err = dec.rank(); err != nil {
				return err
			}
		}
		for i := 3; i < n; i++ {
			if err := dec.skip(1); err != nil {
				return err
			}
			b.UnknownFields++
		}
		return nil
	case isMapCode(c):
		return dec.mapBatch(b)
	}
	return fmt.Errorf("%w: batch is not an array (code 0x%02x)", ErrMalformed, c)
}

// mapBatch decodes a batch written as a map {ts, events, data_parallel_rank}.
func (dec *Decoder) mapBatch(b *Batch) error {
	n, err := dec.mapLen()
	if err != nil {
		return err
	}
	b.Layout.MapBatch = true
	var sawTS, sawEvents bool
	for range n {
		key, ok, err := dec.key()
		if err != nil {
			return err
		}
		switch {
		case ok && string(key) == "ts":
			if b.TS, err = dec.ts(); err != nil {
				return err
			}
			sawTS = true
		case ok && string(key) == "events":
			if err := dec.events(b); err != nil {
				return err
			}
			sawEvents = true
		case ok && string(key) == "data_parallel_rank":
			if b.DataParallelRank, err = dec.rank(); err != nil {
				return err
			}
		default:
			if err := dec.skip(1); err != nil {
				return err
			}
			b.UnknownFields++
		}
	}
	if !sawTS || !sawEvents {
		return fmt.Errorf("%w: map batch without ts or events", ErrMalformed)
	}
	return nil
}

// key reads a map key; ok is false (and the key skipped) when it is not a
// string.
func (dec *Decoder) key() ([]byte, bool, error) {
	c, err := dec.peek()
	if err != nil {
		return nil, false, err
	}
	if !isStrCode(c) {
		return nil, false, dec.skip(1)
	}
	k, err := dec.rawBytes()
	return k, err == nil, err
}

func (dec *Decoder) ts() (float64, error) {
	c, err := dec.peek()
	if err != nil {
		return 0, err
	}
	if c != cFloat && c != cDouble && !isIntCode(c) {
		return 0, fmt.Errorf("%w: ts is not a number (code 0x%02x)", ErrMalformed, c)
	}
	return dec.d.DecodeFloat64()
}

func (dec *Decoder) rank() (Opt[int64], error) {
	v, ok, err := dec.optInt()
	if err != nil {
		return v, err
	}
	if !ok {
		return v, fmt.Errorf("%w: data_parallel_rank is not an int", ErrMalformed)
	}
	return v, nil
}

// events decodes the events array into b.
func (dec *Decoder) events(b *Batch) error {
	c, err := dec.peek()
	if err != nil {
		return err
	}
	if !isArrayCode(c) {
		return fmt.Errorf("%w: events is not an array (code 0x%02x)", ErrMalformed, c)
	}
	n, err := dec.arrayLen()
	if err != nil {
		return err
	}
	// Room for the events an array of this length can hold, grown as
	// they decode: its length alone is no promise.
	b.Events = make([]Event, 0, min(n, 64))
	for range n {
		if err := dec.event(b); err != nil {
			return err
		}
	}
	return nil
}

// event decodes one event, appending it to b.Events when understood.
func (dec *Decoder) event(b *Batch) error {
	c, err := dec.peek()
	if err != nil {
		return err
	}
	switch {
	case isArrayCode(c):
		return dec.arrayEvent(b)
	case isMapCode(c):
		return dec.mapEvent(b)
	}
	b.UnknownEvents++
	return dec.skip(1)
}

// setForm records the events' form in the layout (the first event's).
func setForm(b *Batch, f Form) {
	if b.Layout.Form == 0 {
		b.Layout.Form = f
	}
}

// arrayEvent decodes a positional event [tag, fields...].
func (dec *Decoder) arrayEvent(b *Batch) error {
	n, err := dec.arrayLen()
	if err != nil {
		return err
	}
	setForm(b, FormArray)
	if n == 0 {
		b.UnknownEvents++
		return nil
	}
	tag, ok, err := dec.str()
	if err != nil {
		return err
	}
	rest := n - 1
	if !ok {
		b.UnknownEvents++
		return dec.skipN(rest, 1)
	}
	switch string(tag) {
	case tagBlockStored:
		if n < minStoredLen {
			b.InvalidEvents++
			return dec.skipN(rest, 1)
		}
		if b.Layout.StoredLen == 0 {
			b.Layout.StoredLen = n
		}
		ev := &BlockStored{}
		valid := true
		for i := range rest {
			if i >= maxStoredLen-1 {
				if err := dec.skip(1); err != nil {
					return err
				}
				b.UnknownFields++
				continue
			}
			ok, err := dec.storedField(ev, storedFields[i])
			if err != nil {
				return err
			}
			valid = valid && ok
		}
		if !valid {
			b.InvalidEvents++
			return nil
		}
		return dec.add(b, ev)
	case tagBlockRemoved:
		if n < minRemovedLen {
			b.InvalidEvents++
			return dec.skipN(rest, 1)
		}
		if b.Layout.RemovedLen == 0 {
			b.Layout.RemovedLen = n
		}
		var f mapFields
		valid := true
		for i := range rest {
			if i >= maxRemovedLen-1 {
				if err := dec.skip(1); err != nil {
					return err
				}
				b.UnknownFields++
				continue
			}
			ok, err := dec.storedField(&f.BlockStored, removedFields[i])
			if err != nil {
				return err
			}
			valid = valid && ok
		}
		if !valid {
			b.InvalidEvents++
			return nil
		}
		return dec.add(b, f.removed())
	case tagAllBlocksCleared:
		b.UnknownFields += rest
		if err := dec.skipN(rest, 1); err != nil {
			return err
		}
		return dec.add(b, &AllBlocksCleared{})
	default:
		b.UnknownEvents++
		return dec.skipN(rest, 1)
	}
}

// field identifies a field of BlockStored or BlockRemoved.
type field uint8

const (
	fBlockHashes field = iota
	fParentBlockHash
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSpecWindow
	fLocality
	fOwnership
	fSessionID
	numFields
)

// storedFields and removedFields are the fields in declaration order (the
// array positions after the tag).
var (
	storedFields = [maxStoredLen - 1]field{
		fBlockHashes, fParentBlockHash, fTokenIDs, fBlockSize, fLoRAID,
		fMedium, fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fSpecWindow,
		fLocality, fOwnership, fSessionID,
	}
	removedFields = [maxRemovedLen - 1]field{fBlockHashes, fMedium, fGroupIdx, fLocality, fOwnership}
)

// fieldNames are the map keys of the fields.
var fieldNames = [numFields]string{
	fBlockHashes:     "block_hashes",
	fParentBlockHash: "parent_block_hash",
	fTokenIDs:        "token_ids",
	fBlockSize:       "block_size",
	fLoRAID:          "lora_id",
	fMedium:          "medium",
	fLoRAName:        "lora_name",
	fExtraKeys:       "extra_keys",
	fGroupIdx:        "group_idx",
	fSpecKind:        "kv_cache_spec_kind",
	fSpecWindow:      "kv_cache_spec_sliding_window",
	fLocality:        "locality",
	fOwnership:       "ownership",
	fSessionID:       "session_id",
}

// fieldByName maps a map key to its field.
func fieldByName(k []byte) (field, bool) {
	switch string(k) {
	case "block_hashes":
		return fBlockHashes, true
	case "parent_block_hash":
		return fParentBlockHash, true
	case "token_ids":
		return fTokenIDs, true
	case "block_size":
		return fBlockSize, true
	case "lora_id":
		return fLoRAID, true
	case "medium":
		return fMedium, true
	case "lora_name":
		return fLoRAName, true
	case "extra_keys":
		return fExtraKeys, true
	case "group_idx":
		return fGroupIdx, true
	case "kv_cache_spec_kind":
		return fSpecKind, true
	case "kv_cache_spec_sliding_window":
		return fSpecWindow, true
	case "locality":
		return fLocality, true
	case "ownership":
		return fOwnership, true
	case "session_id":
		return fSessionID, true
	}
	return 0, false
}

// removedField reports whether BlockRemoved has the field.
func removedField(f field) bool {
	switch f {
	case fBlockHashes, fMedium, fGroupIdx, fLocality, fOwnership:
		return true
	}
	return false
}

// mapFields collects the fields of a map-form event before its type is
// known (BlockRemoved's fields are a subset of BlockStored's, by name).
type mapFields struct {
	BlockStored
	seen uint32 // bit per field
}

func (f *mapFields) removed() *BlockRemoved {
	return &BlockRemoved{
		BlockHashes: f.BlockHashes,
		Medium:      f.Medium,
		GroupIdx:    f.GroupIdx,
		Locality:    f.Locality,
		Ownership:   f.Ownership,
	}
}

// mapEvent decodes an event written as a map with a "type" key.
func (dec *Decoder) mapEvent(b *Batch) error {
	n, err := dec.mapLen()
	if err != nil {
		return err
	}
	setForm(b, FormMap)
	f := &dec.f
	*f = mapFields{}
	var tag []byte
	var tagOK, valid = false, true
	unknown := 0
	for range n {
		k, ok, err := dec.key()
		if err != nil {
			return err
		}
		if !ok {
			if err := dec.skip(1); err != nil {
				return err
			}
			unknown++
			continue
		}
		if string(k) == "type" {
			if tag, tagOK, err = dec.str(); err != nil {
				return err
			}
			continue
		}
		fld, known := fieldByName(k)
		if !known {
			if err := dec.skip(1); err != nil {
				return err
			}
			unknown++
			continue
		}
		f.seen |= 1 << fld
		ok, err = dec.storedField(&f.BlockStored, fld)
		if err != nil {
			return err
		}
		valid = valid && ok
	}
	if !tagOK {
		b.UnknownEvents++
		return nil
	}
	switch string(tag) {
	case tagBlockStored:
		b.UnknownFields += unknown
		if !valid || f.seen&(1<<fBlockHashes) == 0 {
			b.InvalidEvents++
			return nil
		}
		ev := new(BlockStored)
		*ev = f.BlockStored
		return dec.add(b, ev)
	case tagBlockRemoved:
		for fld := range numFields {
			if f.seen&(1<<fld) != 0 && !removedField(fld) {
				unknown++
			}
		}
		b.UnknownFields += unknown
		if !valid || f.seen&(1<<fBlockHashes) == 0 {
			b.InvalidEvents++
			return nil
		}
		return dec.add(b, f.removed())
	case tagAllBlocksCleared:
		for fld := range numFields {
			if f.seen&(1<<fld) != 0 {
				unknown++
			}
		}
		b.UnknownFields += unknown
		return dec.add(b, &AllBlocksCleared{})
	default:
		b.UnknownEvents++
	}
	return nil
}

// str reads a string; ok is false (and the value skipped) for other types.
func (dec *Decoder) str() ([]byte, bool, error) {
	c, err := dec.peek()
	if err != nil {
		return nil, false, err
	}
	if !isStrCode(c) {
		return nil, false, dec.skip(1)
	}
	s, err := dec.rawBytes()
	return s, err == nil, err
}

// storedField decodes the value of field fld into ev. ok is false when the
// value had the wrong type (it is skipped, the event is invalid); err is a
// fatal decoding error.
func (dec *Decoder) storedField(ev *BlockStored, fld field) (ok bool, err error) {
	switch fld {
	case fBlockHashes:
		ev.BlockHashes, ok, err = dec.hashes()
	case fParentBlockHash:
		ev.ParentBlockHash, ok, err = dec.optHash()
	case fTokenIDs:
		ev.TokenIDs, ok, err = dec.tokens()
	case fBlockSize:
		var v Opt[int64]
		v, ok, err = dec.optInt()
		if ok && (!v.Valid || v.V < 0 || v.V > math.MaxInt32) {
			ok = false
		}
		ev.BlockSize = int(v.V)
	case fLoRAID:
		ev.LoRAID, ok, err = dec.optInt()
	case fMedium:
		ev.Medium, ok, err = dec.optStr()
	case fLoRAName:
		ev.LoRAName, ok, err = dec.optStr()
	case fExtraKeys:
		ev.ExtraKeys, ok, err = dec.extraKeys()
	case fGroupIdx:
		ev.GroupIdx, ok, err = dec.optInt()
	case fSpecKind:
		ev.KVCacheSpecKind, ok, err = dec.optStr()
	case fSpecWindow:
		ev.KVCacheSpecSlidingWindow, ok, err = dec.optInt()
	case fLocality:
		ev.Locality, ok, err = dec.optStr()
	case fOwnership:
		ev.Ownership, ok, err = dec.optStr()
	case fSessionID:
		ev.SessionID, ok, err = dec.optStr()
	default:
		return false, dec.skip(1)
	}
	return ok, err
}

// intValue reads an int of any width whose code c was peeked: u holds its
// bits, neg is true for a negative value.
func (dec *Decoder) intValue(c byte) (u uint64, neg bool, err error) {
	u, neg, n := intAt(dec.p, dec.pos())
	if n <= 0 {
		return 0, false, errTruncated // c is an int code: only truncation fails
	}
	return u, neg, dec.advance(n)
}

// intAt reads the msgpack int at p[off:] straight from the bytes: the hot
// loops (token ids, hashes) would spend most of their time in the generic
// decoder's reader calls otherwise. n is the number of bytes read, 0 when
// the value is truncated, -1 when it is not an int.
func intAt(p []byte, off int) (u uint64, neg bool, n int) {
	if off >= len(p) {
		return 0, false, 0
	}
	c := p[off]
	switch {
	case c <= 0x7f:
		return uint64(c), false, 1
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, 1
	}
	var w int
	switch c {
	case cUint8, cInt8:
		w = 1
	case cUint16, cInt16:
		w = 2
	case cUint32, cInt32:
		w = 4
	case cUint64, cInt64:
		w = 8
	default:
		return 0, false, -1
	}
	if len(p)-off-1 < w {
		return 0, false, 0
	}
	b := p[off+1 : off+1+w]
	switch c {
	case cUint8:
		u = uint64(b[0])
	case cUint16:
		u = uint64(binary.BigEndian.Uint16(b))
	case cUint32:
		u = uint64(binary.BigEndian.Uint32(b))
	case cUint64:
		u = binary.BigEndian.Uint64(b)
	case cInt8:
		u = uint64(int64(int8(b[0])))
	case cInt16:
		u = uint64(int64(int16(binary.BigEndian.Uint16(b))))
	case cInt32:
		u = uint64(int64(int32(binary.BigEndian.Uint32(b))))
	case cInt64:
		u = binary.BigEndian.Uint64(b)
	}
	return u, int64(u) < 0 && c >= cInt8, 1 + w
}

// optInt reads nil or an int that fits an int64.
func (dec *Decoder) optInt() (Opt[int64], bool, error) {
	c, err := dec.peek()
	if err != nil {
		return Opt[int64]{}, false, err
	}
	if c == cNil {
		_, err = dec.r.ReadByte()
		return Opt[int64]{}, true, err
	}
	if !isIntCode(c) {
		return Opt[int64]{}, false, dec.skip(1)
	}
	u, neg, err := dec.intValue(c)
	if err != nil {
		return Opt[int64]{}, false, err
	}
	if !neg && u > math.MaxInt64 {
		return Opt[int64]{}, false, nil
	}
	return Some(int64(u)), true, nil
}

// optStr reads nil or a string; common values are interned.
func (dec *Decoder) optStr() (Opt[string], bool, error) {
	c, err := dec.peek()
	if err != nil {
		return Opt[string]{}, false, err
	}
	if c == cNil {
		_, err = dec.r.ReadByte()
		return Opt[string]{}, true, err
	}
	s, ok, err := dec.str()
	if !ok || err != nil {
		return Opt[string]{}, false, err
	}
	return Some(intern(s)), true, nil
}

// intern returns s as a string, without allocating for the values vLLM
// sends most.
func intern(s []byte) string {
	switch string(s) {
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "STORAGE":
		return "STORAGE"
	case "FS":
		return "FS"
	case "OBJ":
		return "OBJ"
	case "LOCAL":
		return "LOCAL"
	case "REMOTE":
		return "REMOTE"
	case "full_attention":
		return "full_attention"
	case "mla_attention":
		return "mla_attention"
	case "sliding_window":
		return "sliding_window"
	case "sink_full_attention":
		return "sink_full_attention"
	}
	return string(s)
}

// hash reads one block hash: an int of any width or a bin.
func (dec *Decoder) hash(c byte) (Hash, bool, error) {
	switch {
	case isIntCode(c):
		u, neg, err := dec.intValue(c)
		if neg {
			return Hash{u: u, form: HashInt}, true, err
		}
		return Hash{u: u}, true, err
	case isBinCode(c):
		b, err := dec.rawBytes()
		if err != nil {
			return Hash{}, false, err
		}
		if len(b) > maxHashBytes {
			return Hash{}, false, nil
		}
		return BytesHash(b), true, nil
	}
	return Hash{}, false, dec.skip(1)
}

func (dec *Decoder) optHash() (Opt[Hash], bool, error) {
	c, err := dec.peek()
	if err != nil {
		return Opt[Hash]{}, false, err
	}
	if c == cNil {
		_, err = dec.r.ReadByte()
		return Opt[Hash]{}, true, err
	}
	h, ok, err := dec.hash(c)
	if !ok || err != nil {
		return Opt[Hash]{}, false, err
	}
	return Some(h), true, nil
}

// hashes reads a list of block hashes.
func (dec *Decoder) hashes() ([]Hash, bool, error) {
	c, err := dec.peek()
	if err != nil {
		return nil, false, err
	}
	if !isArrayCode(c) {
		return nil, false, dec.skip(1)
	}
	n, err := dec.arrayLen()
	if err != nil {
		return nil, false, err
	}
	if err := dec.charge(n, unsafe.Sizeof(Hash{})); err != nil {
		return nil, false, err
	}
	hs := make([]Hash, n)
	valid := true
	for i := range hs {
		c, err := dec.peek()
		if err != nil {
			return nil, false, err
		}
		h, ok, err := dec.hash(c)
		if err != nil {
			return nil, false, err
		}
		hs[i], valid = h, valid && ok
	}
	return hs, valid, nil
}

// tokens reads a list of token ids (ints in [0, 2^32)).
func (dec *Decoder) tokens() ([]uint32, bool, error) {
	c, err := dec.peek()
	if err != nil {
		return nil, false, err
	}
	if !isArrayCode(c) {
		return nil, false, dec.skip(1)
	}
	n, err := dec.arrayLen()
	if err != nil {
		return nil, false, err
	}
	if err := dec.charge(n, 4); err != nil {
		return nil, false, err
	}
	ts := make([]uint32, n)
	valid := true
	off := dec.pos()
	for i := range ts {
		u, neg, w := intAt(dec.p, off)
		if w > 0 && !neg {
			ts[i], off = uint32(u), off+w
			if u > math.MaxUint32 {
				valid = false
			}
			continue
		}
		// Not a non-negative int: skip the value with the generic reader.
		valid = false
		if err := dec.seek(off); err != nil {
			return nil, false, err
		}
		if err := dec.skip(1); err != nil {
			return nil, false, err
		}
		off = dec.pos()
	}
	if err := dec.seek(off); err != nil {
		return nil, false, err
	}
	return ts, valid, nil
}

// extraKeys reads nil or a list whose entries are kept as raw msgpack.
func (dec *Decoder) extraKeys() ([]ExtraKey, bool, error) {
	c, err := dec.peek()
	if err != nil {
		return nil, false, err
	}
	if c == cNil {
		_, err = dec.r.ReadByte()
		return nil, true, err
	}
	if !isArrayCode(c) {
		return nil, false, dec.skip(1)
	}
	n, err := dec.arrayLen()
	if err != nil {
		return nil, false, err
	}
	if err := dec.charge(n, unsafe.Sizeof(ExtraKey{})); err != nil {
		return nil, false, err
	}
	ks := make([]ExtraKey, n)
	for i := range ks {
		c, err := dec.peek()
		if err != nil {
			return nil, false, err
		}
		if c == cNil {
			_, _ = dec.r.ReadByte()
			continue
		}
		start := dec.pos()
		if err := dec.skip(2); err != nil {
			return nil, false, err
		}
		ks[i] = ExtraKey(bytes.Clone(dec.p[start:dec.pos()]))
	}
	return ks, true, nil
}
