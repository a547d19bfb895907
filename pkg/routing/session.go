package routing

import (
	"strings"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
)

// Session affinity parameters of the pipeline's session_affinity scorer.
const (
	// SessionTTL is how long a session stays with the target that last
	// served it.
	SessionTTL = 300 * time.Second
	// SessionCap bounds the number of remembered sessions per balancer.
	SessionCap = 100_000
)

// sessionShards spreads the session map over independently locked shards, so
// picks and observes of different sessions rarely meet on a lock.
const sessionShards = 16

// sessionTable remembers, per session key, the target that last served it
// and when. At the cap, remembering a new key forgets an arbitrary one in its
// shard (Go's map iteration order), as the reference does.
type sessionTable struct {
	now      func() time.Duration // Spec.Now, or time since the table was built
	perShard int
	shards   [sessionShards]sessionShard
}

type sessionShard struct {
	mu sync.RWMutex
	m  map[string]sessionEntry
}

type sessionEntry struct {
	target int
	at     time.Duration // t.now() when recorded
}

func newSessionTable(now func() time.Duration) *sessionTable {
	if now == nil {
		epoch := time.Now()
		now = func() time.Duration { return time.Since(epoch) }
	}
	t := &sessionTable{now: now, perShard: SessionCap / sessionShards}
	for i := range t.shards {
		t.shards[i].m = make(map[string]sessionEntry)
	}
	return t
}

func (t *sessionTable) shard(key string) *sessionShard {
	return &t.shards[xxh3.HashString(key)%sessionShards]
}

// lookup returns the target that served key less than SessionTTL ago.
func (t *sessionTable) lookup(key string) (int, bool) {
	sh := t.shard(key)
	sh.mu.RLock()
	e, ok := sh.m[key]
	sh.mu.RUnlock()
	if !ok || t.now()-e.at >= SessionTTL {
		return -1, false
	}
	return e.target, true
}

// record remembers that target served key now.
func (t *sessionTable) record(key string, target int) {
	now := t.now()
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[key]; ok {
		sh.m[key] = sessionEntry{target: target, at: now}
		return
	}
	if len(sh.m) >= t.perShard {
		for k := range sh.m {
			delete(sh.m, k)
			break
		}
	}
	sh.m[strings.Clone(key)] = sessionEntry{target: target, at: now}
}
