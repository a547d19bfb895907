package respcache

import (
	"container/list"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// itemOverhead is what an item costs besides its key and value bytes (the
// map entry, the list element and the item itself), counted towards the cap.
const itemOverhead = 128

// Memory is an in-process [Backend]: a map of values with TTLs, capped in
// bytes (keys, values and a fixed overhead per item) and evicting the least
// recently used item first. Expired items are dropped when they are read or
// reach the LRU tail. It is safe for concurrent use; values are copied in
// and out, so callers may keep or modify what they pass or get.
type Memory struct {
	mu    sync.Mutex
	max   int64
	size  int64
	items map[string]*list.Element // of *memItem
	lru   *list.List               // front = most recently used
}

type memItem struct {
	key     string
	val     []byte   // a value
	ids     []string // or a semantic index list, newest first
	expires time.Time
}

func (it *memItem) cost() int64 {
	n := int64(len(it.key) + len(it.val) + itemOverhead)
	for _, id := range it.ids {
		n += int64(len(id)) + 16
	}
	return n
}

var _ Backend = (*Memory)(nil)

// NewMemory returns an empty Memory backend holding at most maxBytes.
func NewMemory(maxBytes int64) *Memory {
	return &Memory{max: maxBytes, items: make(map[string]*list.Element), lru: list.New()}
}

// Len returns the number of items held, expired ones included until they are
// dropped.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.items)
}

// Size returns the bytes counted against the cap.
func (m *Memory) Size() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.size
}

// get returns the live item at key, dropping it if it expired. m.mu is held.
func (m *Memory) get(key string, now time.Time) *memItem {
	el, ok := m.items[key]
	if !ok {
		return nil
	}
	it := el.Value.(*memItem)
	if !now.Before(it.expires) {
		m.remove(el)
		return nil
	}
	m.lru.MoveToFront(el)
	return it
}

func (m *Memory) remove(el *list.Element) {
	it := m.lru.Remove(el).(*memItem)
	delete(m.items, it.key)
	m.size -= it.cost()
}

// put stores it, replacing any item at its key, then evicts down to the cap.
// m.mu is held.
func (m *Memory) put(it *memItem, now time.Time) error {
	if c := it.cost(); c > m.max {
		return fmt.Errorf("respcache: memory: item of %d bytes exceeds the cap of %d", c, m.max)
	}
	if el, ok := m.items[it.key]; ok {
		m.remove(el)
	}
	m.items[it.key] = m.lru.PushFront(it)
	m.size += it.cost()
	m.evict(now)
	return nil
}

// evict drops expired items from the LRU tail, then least recently used
// items while over the cap. m.mu is held.
func (m *Memory) evict(now time.Time) {
	for el := m.lru.Back(); el != nil && !now.Before(el.Value.(*memItem).expires); el = m.lru.Back() {
		m.remove(el)
	}
	for m.size > m.max {
		m.remove(m.lru.Back())
	}
}

// Get implements [Store].
func (m *Memory) Get(_ context.Context, key string) ([]byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	it := m.get(key, time.Now())
	if it == nil || it.ids != nil {
		return nil, false, nil
	}
	return slices.Clone(it.val), true, nil
}

// Set implements [Store].
func (m *Memory) Set(_ context.Context, key string, val []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return nil
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.put(&memItem{key: key, val: nonNil(slices.Clone(val)), expires: now.Add(ttl)}, now)
}

// Push implements [Index].
func (m *Memory) Push(_ context.Context, index, id string, blob []byte, max int, ttl time.Duration) error {
	if ttl <= 0 || max <= 0 {
		return nil
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	entry := &memItem{key: EntryKey(index, id), val: nonNil(slices.Clone(blob)), expires: now.Add(ttl)}
	if err := m.put(entry, now); err != nil {
		return err
	}
	ids := []string{id}
	if old := m.get(index, now); old != nil && old.ids != nil {
		for _, o := range old.ids {
			if o != id && len(ids) < max {
				ids = append(ids, o)
			}
		}
	}
	if err := m.put(&memItem{key: index, ids: ids, expires: now.Add(ttl)}, now); err != nil {
		if el, ok := m.items[entry.key]; ok {
			m.remove(el) // all or nothing
		}
		return err
	}
	return nil
}

// Recent implements [Index].
func (m *Memory) Recent(_ context.Context, index string, max int) ([][]byte, error) {
	if max <= 0 {
		return nil, nil
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	list := m.get(index, now)
	if list == nil || list.ids == nil {
		return nil, nil
	}
	var out [][]byte
	for _, id := range list.ids[:min(max, len(list.ids))] {
		if it := m.get(EntryKey(index, id), now); it != nil && it.ids == nil {
			out = append(out, slices.Clone(it.val))
		}
	}
	return out, nil
}

// nonNil tells a stored empty value from a list (whose val is nil).
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
