package respcache_test

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"rolter.dev/pkg/respcache"
)

func TestMemoryLRU(t *testing.T) {
	const itemCost = 128 + 2 + 100 // overhead + key + value
	m := respcache.NewMemory(3 * itemCost)
	val := []byte(strings.Repeat("v", 100))
	for _, k := range []string{"k1", "k2", "k3"} {
		mustSet(t, m, k, val, time.Minute)
	}
	if m.Len() != 3 || m.Size() != 3*itemCost {
		t.Fatalf("Len %d Size %d", m.Len(), m.Size())
	}
	mustGet(t, m, "k1", string(val)) // k1 is now the most recently used
	mustSet(t, m, "k4", val, time.Minute)
	mustMiss(t, m, "k2") // the least recently used went
	for _, k := range []string{"k1", "k3", "k4"} {
		mustGet(t, m, k, string(val))
	}
	mustSet(t, m, "k1", []byte("small"), time.Minute) // a replacement is re-counted
	if m.Size() != 2*itemCost+128+2+5 {
		t.Fatalf("Size %d after a replacement", m.Size())
	}
	if err := m.Set(t.Context(), "huge", make([]byte, 3*itemCost), time.Minute); err == nil {
		t.Fatal("an item over the whole cap was stored")
	}
	mustGet(t, m, "k3", string(val)) // and nothing was evicted for it
}

func TestMemoryPushOverCap(t *testing.T) {
	m := respcache.NewMemory(1 << 10)
	if err := m.Push(t.Context(), "idx", "a", make([]byte, 2<<10), 4, time.Minute); err == nil {
		t.Fatal("a blob over the cap was pushed")
	}
	if m.Len() != 0 {
		t.Fatalf("%d items left after a failed push", m.Len())
	}
}

// TestMemoryTTL runs on a fake clock.
func TestMemoryTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := respcache.NewMemory(1 << 20)
		mustSet(t, m, "short", []byte("v"), time.Second)
		mustSet(t, m, "long", []byte("v"), time.Hour)
		mustPush(t, m, "idx", "a", "blob-a", 4, 2*time.Second)
		time.Sleep(time.Second - time.Nanosecond)
		mustGet(t, m, "short", "v")
		time.Sleep(time.Nanosecond)
		mustMiss(t, m, "short") // expires exactly at its TTL
		mustRecent(t, m, "idx", 4, "blob-a")
		time.Sleep(time.Second)
		mustRecent(t, m, "idx", 4)
		mustGet(t, m, "long", "v")
	})
}

// TestMemoryDropsExpiredTail: expired items at the LRU tail are dropped on a
// write, so they do not hold memory until the cap forces them out.
func TestMemoryDropsExpiredTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := respcache.NewMemory(1 << 20)
		for i := range 10 {
			mustSet(t, m, fmt.Sprint("old", i), []byte("v"), time.Second)
		}
		time.Sleep(2 * time.Second)
		mustSet(t, m, "new", []byte("v"), time.Minute)
		if m.Len() != 1 {
			t.Fatalf("%d items held after the old ones expired", m.Len())
		}
	})
}
