package respcache_test

import (
	"strings"
	"testing"
	"time"

	"rolter.dev/pkg/respcache"
)

// opBound is how long a failing operation may take with the 50 ms default
// timeout: the timeout plus scheduling slack on a loaded machine.
const opBound = 500 * time.Millisecond

func newRedis(t *testing.T, url string) *respcache.Redis {
	t.Helper()
	r, err := respcache.NewRedis(url, respcache.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestRedisOutage kills redis-server mid-test: operations fail fast (within
// the timeout) while it is down, and succeed again, on the same client,
// once it is back on the same port.
func TestRedisOutage(t *testing.T) {
	srv := startRedis(t)
	r := newRedis(t, srv.URL())
	ctx := t.Context()
	mustSet(t, r, "k", []byte("v"), time.Minute)
	mustGet(t, r, "k", "v")

	srv.Kill()
	ops := []struct {
		name string
		do   func() error
	}{
		{"get", func() error { _, _, err := r.Get(ctx, "k"); return err }},
		{"set", func() error { return r.Set(ctx, "k", []byte("v"), time.Minute) }},
		{"push", func() error { return r.Push(ctx, "idx", "a", []byte("b"), 5, time.Minute) }},
		{"recent", func() error { _, err := r.Recent(ctx, "idx", 5); return err }},
		{"ping", func() error { return r.Ping(ctx) }},
	}
	for range 3 { // pooled connections first, then new dials
		for _, op := range ops {
			start := time.Now()
			err := op.do()
			if err == nil {
				t.Fatalf("%s succeeded with redis down", op.name)
			}
			if d := time.Since(start); d > opBound {
				t.Fatalf("%s took %v with redis down, want < %v", op.name, d, opBound)
			}
		}
	}

	srv.Restart()
	eventually(t, func() bool { return r.Set(ctx, "k2", []byte("v2"), time.Minute) == nil })
	mustGet(t, r, "k2", "v2")
	mustMiss(t, r, "k") // a fresh server: the old data is gone
}

// TestRedisSlow pauses the server: an operation gives up after its timeout
// instead of waiting for the server.
func TestRedisSlow(t *testing.T) {
	srv := startRedis(t)
	r := newRedis(t, srv.URL())
	mustSet(t, r, "k", []byte("v"), time.Minute)
	if got := srv.Do("CLIENT", "PAUSE", "1000", "ALL"); got != "+OK" {
		t.Fatalf("CLIENT PAUSE: %s", got)
	}
	start := time.Now()
	if _, _, err := r.Get(t.Context(), "k"); err == nil {
		t.Fatal("Get succeeded on a paused server")
	}
	if d := time.Since(start); d > opBound {
		t.Fatalf("Get took %v on a paused server, want < %v", d, opBound)
	}
	srv.Do("CLIENT", "UNPAUSE")
	eventually(t, func() bool { v, ok, err := r.Get(t.Context(), "k"); return err == nil && ok && string(v) == "v" })
}

// TestRedisJunk: a key of another type is an error, not a hang or a panic.
func TestRedisJunk(t *testing.T) {
	srv := startRedis(t)
	r := newRedis(t, srv.URL())
	srv.Do("RPUSH", "list", "x")
	srv.Do("SET", "idx:str", "not a list")
	if _, _, err := r.Get(t.Context(), "list"); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Get of a list: %v", err)
	}
	if _, err := r.Recent(t.Context(), "idx:str", 5); err == nil {
		t.Fatal("Recent of a string succeeded")
	}
	if err := r.Push(t.Context(), "idx:str", "a", []byte("b"), 5, time.Minute); err == nil {
		t.Fatal("Push onto a string succeeded")
	}
}

func TestRedisUnixSocket(t *testing.T) {
	srv := startRedis(t)
	r := newRedis(t, "unix://"+srv.Socket()+"?db=2")
	mustSet(t, r, "k", []byte("v"), time.Minute)
	mustGet(t, r, "k", "v")
	if got := srv.Do("EXISTS", "k"); got != ":0" {
		t.Fatalf("key visible in db 0 (%s): the db parameter was ignored", got)
	}
}

func TestNewRedisErrors(t *testing.T) {
	tests := []struct {
		name, url string
	}{
		{"error: http scheme", "http://localhost:6379"},
		{"error: no scheme", "localhost:6379"},
		{"error: bad database", "redis://:s3cret@localhost:6379/x"},
		{"error: unparsable", "redis://:s3cret@local host:6379"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := respcache.NewRedis(tc.url, respcache.RedisOptions{})
			if err == nil {
				t.Fatal("NewRedis succeeded")
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error leaks the password: %v", err)
			}
		})
	}
}
