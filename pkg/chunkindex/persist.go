package chunkindex

import (
	"encoding/binary"
	"fmt"

	"rolter.dev/pkg/wire"
)

// An index's binary form (AppendBinary, Decode): what a proxy writes to
// disk so that a restart keeps what each target holds. Integers are
// varints, hashes 8 bytes little-endian:
//
//	"rci" 1                  magic and version
//	capacity flags           the default capacity; flags: tail-first, forks tracked, stamped
//	targets, then per target:
//	  capacity inserts evictions
//	  entries × (hash, inserts − published, [age + 1, or 0 when unstamped])   oldest first
//	  [forks × (hash, successor)]   the forks known of its hashes
//
// Stamps are written as ages: the clock's origin differs after a restart.
const persistMagic = "rci\x01"

const (
	flagTailFirst = 1 << iota
	flagForks
	flagStamped
	flagsKnown = flagStamped<<1 - 1
)

// AppendBinary appends x's binary form to dst (encoding.BinaryAppender):
// every target's hashes in LRU order with their publication ages and
// stamps' ages, its capacity and counters, and the forks known of its
// hashes. As Remap, it reads one target at a time under the read lock.
func (x *Index) AppendBinary(dst []byte) ([]byte, error) {
	x.mu.RLock()
	var flags uint64
	if x.tailFirst {
		flags |= flagTailFirst
	}
	tracks := x.next != nil
	if tracks {
		flags |= flagForks
	}
	stamped := x.now != nil
	var now int64
	if stamped {
		flags |= flagStamped
		now = x.now()
	}
	n := len(x.targets)
	dst = append(dst, persistMagic...)
	dst = binary.AppendUvarint(dst, uint64(x.capacity))
	dst = binary.AppendUvarint(dst, flags)
	x.mu.RUnlock()
	dst = binary.AppendUvarint(dst, uint64(n))
	var c targetCopy
	for i := range n {
		x.copyTarget(i, tracks, &c)
		dst = binary.AppendUvarint(dst, uint64(c.capacity))
		dst = binary.AppendUvarint(dst, c.inserts)
		dst = binary.AppendUvarint(dst, c.evictions)
		dst = binary.AppendUvarint(dst, uint64(len(c.entries)))
		for _, e := range c.entries {
			dst = binary.LittleEndian.AppendUint64(dst, e.hash)
			dst = binary.AppendUvarint(dst, c.inserts-min(e.published, c.inserts))
			if stamped {
				var age uint64
				if e.at != 0 {
					age = uint64(max(now-e.at, 0)) + 1
				}
				dst = binary.AppendUvarint(dst, age)
			}
		}
		if tracks {
			dst = binary.AppendUvarint(dst, uint64(len(c.next)))
			for _, p := range c.next {
				dst = binary.LittleEndian.AppendUint64(dst, p[0])
				dst = binary.LittleEndian.AppendUint64(dst, p[1])
			}
		}
	}
	return dst, nil
}

// maxAge bounds a decoded age (ns, about 146 years), so that now less it
// cannot overflow.
const maxAge = 1 << 62

// Decode returns the index whose binary form (AppendBinary) is data, with
// now as its clock (nil: none, and no stamps). A hash's stamp is now()
// less its age when written: the time between the write and the decode
// is not counted (a replica behind one proxy turns nothing over while the
// proxy is down). The input is checked whole (every length against what
// is left, no hash twice in a target, no target over its capacity, forks
// only of hashes held): an error, wrapping wire.ErrCorrupt, returns no
// index.
func Decode(data []byte, now func() int64) (*Index, error) {
	r := wire.NewReader(data)
	r.Magic(persistMagic)
	capacity := r.Count("capacity", maxCapacity)
	flags := r.Uvarint("flags")
	if flags&^flagsKnown != 0 {
		r.Fail("unknown flags %#x", flags)
	}
	n := r.Count("targets", MaxTargets)
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("chunk index: %w", err)
	}
	x := New(n, capacity)
	x.tailFirst = flags&flagTailFirst != 0
	if flags&flagForks != 0 {
		x.next = make(map[uint64]uint64)
	}
	stamped := flags&flagStamped != 0
	x.now = now
	var base int64
	if now != nil {
		base = now()
	}
	entrySize := 9 // a hash and a one-byte publication age
	if stamped {
		entrySize++
	}
	for i := range x.targets {
		t := &x.targets[i]
		t.capacity = r.Count("target capacity", maxCapacity)
		t.inserts = r.Uvarint("inserts")
		t.evictions = r.Uvarint("evictions")
		entries := r.Items("entries", entrySize, maxCapacity)
		if r.Err() == nil && t.capacity > 0 && entries > t.capacity {
			r.Fail("target %d holds %d hashes, over its capacity %d", i, entries, t.capacity)
		}
		if r.Err() != nil {
			break
		}
		t.slots = make(map[uint64]int32, entries)
		t.lru.Grow(entries)
		for range entries {
			e := entry{hash: r.Uint64("hash")}
			if pub := r.Uvarint("publication age"); pub <= t.inserts {
				e.published = t.inserts - pub
			} else {
				r.Fail("target %d: a hash published %d insertions ago of %d", i, pub, t.inserts)
			}
			if stamped {
				age := r.Uvarint("age")
				if age > maxAge {
					r.Fail("target %d: a hash %d ns old", i, age)
				}
				if age > 0 && now != nil {
					e.at = base - int64(age-1)
				}
			}
			if r.Err() != nil {
				break
			}
			if _, dup := t.slots[e.hash]; dup {
				r.Fail("target %d holds hash %#x twice", i, e.hash)
				break
			}
			x.hold(i, t, e)
		}
		if x.next == nil {
			continue
		}
		forks := r.Items("forks", 16, maxCapacity)
		for range forks {
			h, succ := r.Uint64("fork"), r.Uint64("successor")
			if r.Err() != nil {
				break
			}
			if _, held := t.slots[h]; !held {
				r.Fail("target %d has a fork of hash %#x it does not hold", i, h)
				break
			}
			x.next[h] = succ
		}
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("chunk index: %w", err)
	}
	return x, nil
}

// maxCapacity bounds a decoded capacity or count (2³⁶ hashes: 4 TiB of
// prompt text per target), far above any replica's KV cache.
const maxCapacity = 1 << 36
