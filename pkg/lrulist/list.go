// Package lrulist is a least-recently-used list kept in a slice: elements
// are addressed by int32 handles (slot indexes), links are indexes, and
// freed slots are reused, so the list allocates only when it outgrows its
// largest size and holds no pointer per element but the caller's value.
// The prefix tree (rolter.dev/pkg/prefixtree) and the shared prefix index
// (rolter.dev/pkg/chunkindex) keep one per target, with hundreds of
// thousands of elements each.
//
// A List is not safe for concurrent use. The zero value is an empty list.
package lrulist

import (
	"iter"
	"slices"
)

// List is an LRU list of values of type T, oldest first.
type List[T any] struct {
	slots []slot[T]
	// head, tail and free are slot index + 1, so that 0 means none and the
	// zero List is empty.
	head, tail, free int32
	n                int
}

type slot[T any] struct {
	val        T
	prev, next int32 // slot index + 1; 0: none (next also links the free list)
}

// PushNewest adds v as the newest element and returns its handle, valid
// until the element is removed.
func (l *List[T]) PushNewest(v T) int32 {
	var e int32
	if l.free != 0 {
		e = l.free - 1
		l.free = l.slots[e].next
		l.slots[e] = slot[T]{val: v}
	} else {
		e = int32(len(l.slots))
		l.slots = append(l.slots, slot[T]{val: v})
	}
	l.link(e)
	l.n++
	return e
}

// Grow makes room for n more elements without reallocating.
func (l *List[T]) Grow(n int) {
	if n > 0 {
		l.slots = slices.Grow(l.slots, n)
	}
}

// Touch makes element e the newest.
func (l *List[T]) Touch(e int32) {
	if l.tail == e+1 {
		return
	}
	l.unlink(e)
	l.link(e)
}

// Remove takes element e out of the list and frees its slot (and its
// value, for the garbage collector); e must not be used again.
func (l *List[T]) Remove(e int32) {
	l.unlink(e)
	l.slots[e] = slot[T]{next: l.free}
	l.free = e + 1
	l.n--
}

// Oldest returns the least recently pushed or touched element, and false
// when the list is empty.
func (l *List[T]) Oldest() (int32, bool) { return l.head - 1, l.head != 0 }

// At returns element e's value, to read or update in place.
func (l *List[T]) At(e int32) *T { return &l.slots[e].val }

// Len returns the number of elements.
func (l *List[T]) Len() int { return l.n }

// All yields the elements oldest first. The list must not change during
// the iteration.
func (l *List[T]) All() iter.Seq2[int32, *T] {
	return func(yield func(int32, *T) bool) {
		for i := l.head; i != 0; i = l.slots[i-1].next {
			if !yield(i-1, &l.slots[i-1].val) {
				return
			}
		}
	}
}

// link appends the unlinked element e at the young end.
func (l *List[T]) link(e int32) {
	s := &l.slots[e]
	s.prev, s.next = l.tail, 0
	if l.tail != 0 {
		l.slots[l.tail-1].next = e + 1
	} else {
		l.head = e + 1
	}
	l.tail = e + 1
}

// unlink takes element e out of the links, leaving its slot as it is.
func (l *List[T]) unlink(e int32) {
	p, n := l.slots[e].prev, l.slots[e].next
	if p != 0 {
		l.slots[p-1].next = n
	} else {
		l.head = n
	}
	if n != 0 {
		l.slots[n-1].prev = p
	} else {
		l.tail = p
	}
}
