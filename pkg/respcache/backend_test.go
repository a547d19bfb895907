package respcache_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"rolter.dev/pkg/respcache"
)

// backendSuite is run against every Backend: Memory and a real Redis.
func backendSuite(t *testing.T, newBackend func(t *testing.T) respcache.Backend) {
	tests := []struct {
		name string
		run  func(t *testing.T, b respcache.Backend)
	}{
		{"get of a missing key misses", func(t *testing.T, b respcache.Backend) {
			mustMiss(t, b, "k:missing")
		}},
		{"set then get", func(t *testing.T, b respcache.Backend) {
			mustSet(t, b, "k:1", []byte("v1"), time.Minute)
			mustGet(t, b, "k:1", "v1")
		}},
		{"set overwrites", func(t *testing.T, b respcache.Backend) {
			mustSet(t, b, "k:1", []byte("v1"), time.Minute)
			mustSet(t, b, "k:1", []byte("v2"), time.Minute)
			mustGet(t, b, "k:1", "v2")
		}},
		{"empty value", func(t *testing.T, b respcache.Backend) {
			mustSet(t, b, "k:empty", []byte{}, time.Minute)
			mustGet(t, b, "k:empty", "")
		}},
		{"binary value", func(t *testing.T, b respcache.Backend) {
			v := []byte{0, 1, 0xff, '\r', '\n', 0x1f}
			mustSet(t, b, "k:bin", v, time.Minute)
			mustGet(t, b, "k:bin", string(v))
		}},
		{"ttl zero stores nothing", func(t *testing.T, b respcache.Backend) {
			mustSet(t, b, "k:0", []byte("v"), 0)
			mustSet(t, b, "k:neg", []byte("v"), -time.Second)
			mustMiss(t, b, "k:0")
			mustMiss(t, b, "k:neg")
		}},
		{"values expire", func(t *testing.T, b respcache.Backend) {
			mustSet(t, b, "k:short", []byte("v"), 30*time.Millisecond)
			mustSet(t, b, "k:long", []byte("v"), time.Minute)
			eventually(t, func() bool { _, ok, _ := b.Get(t.Context(), "k:short"); return !ok })
			mustGet(t, b, "k:long", "v")
		}},
		{"returned values are copies", func(t *testing.T, b respcache.Backend) {
			in := []byte("value")
			mustSet(t, b, "k:c", in, time.Minute)
			in[0] = 'X'
			got, _, _ := b.Get(t.Context(), "k:c")
			got[1] = 'Y'
			mustGet(t, b, "k:c", "value")
		}},
		{"recent of a missing index is empty", func(t *testing.T, b respcache.Backend) {
			mustRecent(t, b, "idx:none", 5)
		}},
		{"push then recent, newest first", func(t *testing.T, b respcache.Backend) {
			for _, id := range []string{"a", "b", "c"} {
				mustPush(t, b, "idx:1", id, "blob-"+id, 10, time.Minute)
			}
			mustRecent(t, b, "idx:1", 10, "blob-c", "blob-b", "blob-a")
			mustRecent(t, b, "idx:1", 2, "blob-c", "blob-b")
			mustRecent(t, b, "idx:1", 0)
			mustGet(t, b, respcache.EntryKey("idx:1", "a"), "blob-a")
		}},
		{"push of a known id moves it to the front, replacing its blob", func(t *testing.T, b respcache.Backend) {
			for _, id := range []string{"a", "b", "c"} {
				mustPush(t, b, "idx:2", id, "blob-"+id, 10, time.Minute)
			}
			mustPush(t, b, "idx:2", "a", "blob-a2", 10, time.Minute)
			mustRecent(t, b, "idx:2", 10, "blob-a2", "blob-c", "blob-b")
		}},
		{"push trims the index to max", func(t *testing.T, b respcache.Backend) {
			for i := range 6 {
				mustPush(t, b, "idx:3", fmt.Sprint(i), fmt.Sprint("blob-", i), 3, time.Minute)
			}
			mustRecent(t, b, "idx:3", 10, "blob-5", "blob-4", "blob-3")
		}},
		{"push with ttl or max zero stores nothing", func(t *testing.T, b respcache.Backend) {
			mustPush(t, b, "idx:4", "a", "blob-a", 10, 0)
			mustPush(t, b, "idx:4", "b", "blob-b", 0, time.Minute)
			mustRecent(t, b, "idx:4", 10)
			mustMiss(t, b, respcache.EntryKey("idx:4", "a"))
		}},
		{"recent skips expired entries", func(t *testing.T, b respcache.Backend) {
			mustPush(t, b, "idx:5", "a", "blob-a", 10, time.Minute)
			mustPush(t, b, "idx:5", "b", "blob-b", 10, time.Minute)
			mustSet(t, b, respcache.EntryKey("idx:5", "a"), []byte("short"), 30*time.Millisecond)
			eventually(t, func() bool { _, ok, _ := b.Get(t.Context(), respcache.EntryKey("idx:5", "a")); return !ok })
			mustRecent(t, b, "idx:5", 10, "blob-b")
		}},
		{"the index expires with its ttl", func(t *testing.T, b respcache.Backend) {
			mustPush(t, b, "idx:6", "a", "blob-a", 10, 30*time.Millisecond)
			eventually(t, func() bool { blobs, _ := b.Recent(t.Context(), "idx:6", 10); return len(blobs) == 0 })
		}},
		{"indexes are independent", func(t *testing.T, b respcache.Backend) {
			mustPush(t, b, "idx:7a", "a", "blob-7a", 10, time.Minute)
			mustPush(t, b, "idx:7b", "a", "blob-7b", 10, time.Minute)
			mustRecent(t, b, "idx:7a", 10, "blob-7a")
			mustRecent(t, b, "idx:7b", 10, "blob-7b")
		}},
		{"concurrent use", func(t *testing.T, b respcache.Backend) {
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for i := range 50 {
						k := fmt.Sprintf("k:conc:%d", i%10)
						if err := b.Set(t.Context(), k, []byte(k), time.Minute); err != nil {
							t.Error(err)
							return
						}
						if v, ok, err := b.Get(t.Context(), k); err != nil || !ok || string(v) != k {
							t.Errorf("Get(%s) = %q, %v, %v", k, v, ok, err)
							return
						}
						if err := b.Push(t.Context(), "idx:conc", fmt.Sprint(g, i), []byte("x"), 16, time.Minute); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			blobs, err := b.Recent(t.Context(), "idx:conc", 100)
			if err != nil || len(blobs) != 16 {
				t.Fatalf("Recent after concurrent pushes: %d blobs, %v", len(blobs), err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newBackend(t)) })
	}
}

func mustSet(t *testing.T, b respcache.Backend, key string, val []byte, ttl time.Duration) {
	t.Helper()
	if err := b.Set(t.Context(), key, val, ttl); err != nil {
		t.Fatalf("Set(%s): %v", key, err)
	}
}

func mustGet(t *testing.T, b respcache.Backend, key, want string) {
	t.Helper()
	got, ok, err := b.Get(t.Context(), key)
	if err != nil || !ok || string(got) != want {
		t.Fatalf("Get(%s) = %q, %v, %v; want %q", key, got, ok, err, want)
	}
}

func mustMiss(t *testing.T, b respcache.Backend, key string) {
	t.Helper()
	if got, ok, err := b.Get(t.Context(), key); err != nil || ok {
		t.Fatalf("Get(%s) = %q, %v, %v; want a miss", key, got, ok, err)
	}
}

func mustPush(t *testing.T, b respcache.Backend, index, id, blob string, max int, ttl time.Duration) {
	t.Helper()
	if err := b.Push(t.Context(), index, id, []byte(blob), max, ttl); err != nil {
		t.Fatalf("Push(%s, %s): %v", index, id, err)
	}
}

func mustRecent(t *testing.T, b respcache.Backend, index string, max int, want ...string) {
	t.Helper()
	blobs, err := b.Recent(t.Context(), index, max)
	if err != nil {
		t.Fatalf("Recent(%s): %v", index, err)
	}
	var got []string
	for _, bl := range blobs {
		got = append(got, string(bl))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || len(got) != len(want) {
		t.Fatalf("Recent(%s, %d) = %q, want %q", index, max, got, want)
	}
}

// eventually polls cond until it holds (at most 5 s): for server-side TTLs,
// which no fake clock reaches.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMemoryBackend(t *testing.T) {
	backendSuite(t, func(t *testing.T) respcache.Backend { return respcache.NewMemory(1 << 20) })
}

func TestRedisBackend(t *testing.T) {
	srv := startRedis(t)
	backendSuite(t, func(t *testing.T) respcache.Backend {
		srv.Do("FLUSHALL")
		r, err := respcache.NewRedis(srv.URL(), respcache.RedisOptions{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	})
}
