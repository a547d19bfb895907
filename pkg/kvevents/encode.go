package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrInvalidBatch is wrapped by the errors of [Encode] and [AppendBatch].
var ErrInvalidBatch = errors.New("kvevents: cannot encode batch")

// maxArrayLen bounds Layout.StoredLen and RemovedLen (positions past the
// known fields are written as nil): an array16.
const maxArrayLen = math.MaxUint16

// Encode encodes b as a KVEventBatch payload in layout l, byte for byte as
// vLLM's encoder (msgspec) writes that generation:
//   - ints in their smallest msgpack form (non-negative ones with the
//     unsigned codes), floats as float64, strings and containers with the
//     smallest header;
//   - FormArray events as [tag, fields...] of exactly StoredLen or
//     RemovedLen elements, None written as nil;
//   - FormMap events as maps with "type" first and the fields in
//     declaration order, the fields that have a default (extra_keys and
//     everything declared after it, and group_idx and later on
//     BlockRemoved) left out when None, the others always present.
//
// The batch's own Layout is ignored; pass b.Layout to re-encode a decoded
// batch as it came.
func Encode(b *Batch, l Layout) ([]byte, error) { return AppendBatch(nil, b, l) }

// AppendBatch appends the encoding of b in layout l to dst (see [Encode]).
func AppendBatch(dst []byte, b *Batch, l Layout) ([]byte, error) {
	if err := l.check(len(b.Events) > 0); err != nil {
		return dst, err
	}
	start := len(dst)
	var err error
	if l.MapBatch {
		n := 2
		if b.DataParallelRank.Valid {
			n = 3
		}
		dst = appendMapHeader(dst, n)
		dst = appendStr(dst, "ts")
		dst = appendFloat64(dst, b.TS)
		dst = appendStr(dst, "events")
		if dst, err = appendEvents(dst, b.Events, l); err != nil {
			return dst[:start], err
		}
		if b.DataParallelRank.Valid {
			dst = appendStr(dst, "data_parallel_rank")
			dst = appendInt(dst, b.DataParallelRank.V)
		}
		return dst, nil
	}
	if l.NoRank {
		dst = appendArrayHeader(dst, 2)
	} else {
		dst = appendArrayHeader(dst, 3)
	}
	dst = appendFloat64(dst, b.TS)
	if dst, err = appendEvents(dst, b.Events, l); err != nil {
		return dst[:start], err
	}
	if !l.NoRank {
		dst = appendOptInt(dst, b.DataParallelRank)
	}
	return dst, nil
}

func (l Layout) check(events bool) error {
	switch l.Form {
	case FormArray, FormMap:
	case 0:
		if events {
			return fmt.Errorf("%w: layout has no form", ErrInvalidBatch)
		}
	default:
		return fmt.Errorf("%w: unknown form %d", ErrInvalidBatch, l.Form)
	}
	if l.StoredLen != 0 && (l.StoredLen < minStoredLen || l.StoredLen > maxArrayLen) {
		return fmt.Errorf("%w: StoredLen %d out of [%d, %d]", ErrInvalidBatch, l.StoredLen, minStoredLen, maxArrayLen)
	}
	if l.RemovedLen != 0 && (l.RemovedLen < minRemovedLen || l.RemovedLen > maxArrayLen) {
		return fmt.Errorf("%w: RemovedLen %d out of [%d, %d]", ErrInvalidBatch, l.RemovedLen, minRemovedLen, maxArrayLen)
	}
	return nil
}

func appendEvents(dst []byte, events []Event, l Layout) ([]byte, error) {
	dst = appendArrayHeader(dst, len(events))
	for i, ev := range events {
		switch ev := ev.(type) {
		case *BlockStored:
			if ev == nil {
				return dst, fmt.Errorf("%w: event %d is a nil *BlockStored", ErrInvalidBatch, i)
			}
			dst = appendStored(dst, ev, l)
		case *BlockRemoved:
			if ev == nil {
				return dst, fmt.Errorf("%w: event %d is a nil *BlockRemoved", ErrInvalidBatch, i)
			}
			dst = appendRemoved(dst, ev, l)
		case *AllBlocksCleared:
			if l.Form == FormMap {
				dst = appendMapHeader(dst, 1)
				dst = appendStr(dst, "type")
			} else {
				dst = appendArrayHeader(dst, 1)
			}
			dst = appendStr(dst, tagAllBlocksCleared)
		default:
			return dst, fmt.Errorf("%w: event %d has unknown type %T", ErrInvalidBatch, i, ev)
		}
	}
	return dst, nil
}

// storedSet reports which of a BlockStored's defaulted fields hold a
// non-default value (the ones a map-form event writes).
func storedSet(ev *BlockStored, f field) bool {
	switch f {
	case fExtraKeys:
		return ev.ExtraKeys != nil
	case fGroupIdx:
		return ev.GroupIdx.Valid
	case fSpecKind:
		return ev.KVCacheSpecKind.Valid
	case fSpecWindow:
		return ev.KVCacheSpecSlidingWindow.Valid
	case fLocality:
		return ev.Locality.Valid
	case fOwnership:
		return ev.Ownership.Valid
	case fSessionID:
		return ev.SessionID.Valid
	}
	return true // fields without a default are always written
}

func appendStored(dst []byte, ev *BlockStored, l Layout) []byte {
	if l.Form == FormMap {
		n := 1
		for _, f := range storedFields {
			if storedSet(ev, f) {
				n++
			}
		}
		dst = appendMapHeader(dst, n)
		dst = appendStr(dst, "type")
		dst = appendStr(dst, tagBlockStored)
		for _, f := range storedFields {
			if storedSet(ev, f) {
				dst = appendStr(dst, fieldNames[f])
				dst = appendStoredField(dst, ev, f)
			}
		}
		return dst
	}
	n := l.StoredLen
	if n == 0 {
		n = LayoutArray.StoredLen
	}
	dst = appendArrayHeader(dst, n)
	dst = appendStr(dst, tagBlockStored)
	for i := range n - 1 {
		if i < len(storedFields) {
			dst = appendStoredField(dst, ev, storedFields[i])
		} else {
			dst = append(dst, cNil)
		}
	}
	return dst
}

func appendStoredField(dst []byte, ev *BlockStored, f field) []byte {
	switch f {
	case fBlockHashes:
		return appendHashes(dst, ev.BlockHashes)
	case fParentBlockHash:
		if !ev.ParentBlockHash.Valid {
			return append(dst, cNil)
		}
		return appendHash(dst, ev.ParentBlockHash.V)
	case fTokenIDs:
		dst = appendArrayHeader(dst, len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			dst = appendUint(dst, uint64(t))
		}
		return dst
	case fBlockSize:
		return appendInt(dst, int64(ev.BlockSize))
	case fLoRAID:
		return appendOptInt(dst, ev.LoRAID)
	case fMedium:
		return appendOptStr(dst, ev.Medium)
	case fLoRAName:
		return appendOptStr(dst, ev.LoRAName)
	case fExtraKeys:
		if ev.ExtraKeys == nil {
			return append(dst, cNil)
		}
		dst = appendArrayHeader(dst, len(ev.ExtraKeys))
		for _, k := range ev.ExtraKeys {
			if k == nil {
				dst = append(dst, cNil)
			} else {
				dst = append(dst, k...)
			}
		}
		return dst
	case fGroupIdx:
		return appendOptInt(dst, ev.GroupIdx)
	case fSpecKind:
		return appendOptStr(dst, ev.KVCacheSpecKind)
	case fSpecWindow:
		return appendOptInt(dst, ev.KVCacheSpecSlidingWindow)
	case fLocality:
		return appendOptStr(dst, ev.Locality)
	case fOwnership:
		return appendOptStr(dst, ev.Ownership)
	case fSessionID:
		return appendOptStr(dst, ev.SessionID)
	}
	return append(dst, cNil)
}

func appendRemoved(dst []byte, ev *BlockRemoved, l Layout) []byte {
	// BlockRemoved's fields as a BlockStored, to share the field writers.
	s := BlockStored{BlockHashes: ev.BlockHashes, Medium: ev.Medium, GroupIdx: ev.GroupIdx, Locality: ev.Locality, Ownership: ev.Ownership}
	if l.Form == FormMap {
		n := 1
		for _, f := range removedFields {
			if storedSet(&s, f) {
				n++
			}
		}
		dst = appendMapHeader(dst, n)
		dst = appendStr(dst, "type")
		dst = appendStr(dst, tagBlockRemoved)
		for _, f := range removedFields {
			if storedSet(&s, f) {
				dst = appendStr(dst, fieldNames[f])
				dst = appendStoredField(dst, &s, f)
			}
		}
		return dst
	}
	n := l.RemovedLen
	if n == 0 {
		n = LayoutArray.RemovedLen
	}
	dst = appendArrayHeader(dst, n)
	dst = appendStr(dst, tagBlockRemoved)
	for i := range n - 1 {
		if i < len(removedFields) {
			dst = appendStoredField(dst, &s, removedFields[i])
		} else {
			dst = append(dst, cNil)
		}
	}
	return dst
}

func appendHashes(dst []byte, hs []Hash) []byte {
	dst = appendArrayHeader(dst, len(hs))
	for _, h := range hs {
		dst = appendHash(dst, h)
	}
	return dst
}

func appendHash(dst []byte, h Hash) []byte {
	switch h.form {
	case HashInt:
		return appendInt(dst, int64(h.u))
	case HashBytes:
		return appendBin(dst, h.b)
	default:
		return appendUint(dst, h.u)
	}
}

func appendOptInt(dst []byte, v Opt[int64]) []byte {
	if !v.Valid {
		return append(dst, cNil)
	}
	return appendInt(dst, v.V)
}

func appendOptStr(dst []byte, v Opt[string]) []byte {
	if !v.Valid {
		return append(dst, cNil)
	}
	return appendStr(dst, v.V)
}

// appendUint writes u in its smallest unsigned form, as msgspec does.
func appendUint(dst []byte, u uint64) []byte {
	switch {
	case u <= 0x7f:
		return append(dst, byte(u))
	case u <= math.MaxUint8:
		return append(dst, cUint8, byte(u))
	case u <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, cUint16), uint16(u))
	case u <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, cUint32), uint32(u))
	}
	return binary.BigEndian.AppendUint64(append(dst, cUint64), u)
}

// appendInt writes i as msgspec writes a Python int: non-negative values
// with the unsigned codes, negative ones in the smallest signed form.
func appendInt(dst []byte, i int64) []byte {
	switch {
	case i >= 0:
		return appendUint(dst, uint64(i))
	case i >= -32:
		return append(dst, byte(i))
	case i >= math.MinInt8:
		return append(dst, cInt8, byte(i))
	case i >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, cInt16), uint16(i))
	case i >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, cInt32), uint32(i))
	}
	return binary.BigEndian.AppendUint64(append(dst, cInt64), uint64(i))
}

func appendFloat64(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, cDouble), math.Float64bits(f))
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, cStr8, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, cStr16), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, cStr32), uint32(n))
	}
	return append(dst, s...)
}

func appendBin(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n <= math.MaxUint8:
		dst = append(dst, cBin8, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, cBin16), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, cBin32), uint32(n))
	}
	return append(dst, s...)
}

func appendArrayHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, cArray16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, cArray32), uint32(n))
}

// appendMapHeader writes a map header for n entries. msgspec sizes a
// struct's map header by its declared entry count and rewrites the count;
// every event type declares at most 15 entries (14 fields and the tag), so
// its header is a fixmap whatever n is.
func appendMapHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, cMap16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, cMap32), uint32(n))
}
