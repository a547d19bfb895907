package respcache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// DefaultTimeout bounds each backend operation when [RedisOptions] leave
// Timeout zero: the longest the cache may hold up a request.
const DefaultTimeout = 50 * time.Millisecond

// RedisOptions tune a [Redis] backend. The zero value is usable.
type RedisOptions struct {
	// Timeout bounds every operation, connecting included (the earlier of
	// it and the ctx deadline applies); 0 means DefaultTimeout.
	Timeout time.Duration
	// PoolSize is the connection pool size; 0 means go-redis's default
	// (10 per GOMAXPROCS).
	PoolSize int
}

// Redis is a [Backend] on a Redis server, shared by every proxy that points
// at it. Each operation is bounded by the configured timeout, so an
// unreachable or slow server costs a request at most that long, and errors
// (which the cache turns into misses) are returned quickly. The client
// reconnects by itself once the server is back. Redis is safe for
// concurrent use; Close releases its connections.
//
// Layout: an exact entry is a string with a TTL; a semantic index is a list
// of entry ids, newest first, with the TTL of its newest entry; a semantic
// entry is a string at EntryKey(index, id). A push is one MULTI/EXEC
// transaction. Keys carry no hash tags, so a Redis Cluster is not supported.
type Redis struct {
	client  *redis.Client
	timeout time.Duration
}

var _ Backend = (*Redis)(nil)

// NewRedis returns a Redis backend for a redis://, rediss:// (TLS) or
// unix:// URL, e.g. "redis://:password@host:6379/0" or
// "unix:///run/redis.sock?db=1". It does not connect: the first operation
// does. The error never quotes the URL, which may hold a password.
func NewRedis(rawURL string, opts RedisOptions) (*Redis, error) {
	o, err := redis.ParseURL(rawURL)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // url.Error quotes the URL
		}
		return nil, fmt.Errorf("respcache: redis_url: %w", err)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	o.ContextTimeoutEnabled = true
	o.DialTimeout = timeout
	o.ReadTimeout = timeout
	o.WriteTimeout = timeout
	o.PoolTimeout = timeout
	o.DialerRetries = 1 // a retried dial would outlast the timeout
	o.MaxRetries = 1    // one retry on a pooled connection the server closed
	o.MinRetryBackoff = -1
	o.PoolSize = opts.PoolSize
	o.DisableIdentity = true // no CLIENT SETINFO round trip on connect
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return &Redis{client: redis.NewClient(o), timeout: timeout}, nil
}

// Close closes the client's connections. Operations after Close fail.
func (r *Redis) Close() error { return r.client.Close() }

// Ping checks that the server answers within the timeout.
func (r *Redis) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	if err := r.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("respcache: redis ping: %w", err)
	}
	return nil
}

// Get implements [Store].
func (r *Redis) Get(ctx context.Context, key string) ([]byte, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	val, err := r.client.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("respcache: redis get: %w", err)
	}
	return val, true, nil
}

// Set implements [Store].
func (r *Redis) Set(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	if err := r.client.Set(ctx, key, val, ttl).Err(); err != nil {
		return fmt.Errorf("respcache: redis set: %w", err)
	}
	return nil
}

// Push implements [Index] with one MULTI/EXEC: SET entry PX ttl, LREM index
// 0 id, LPUSH index id, LTRIM index 0 max-1, PEXPIRE index ttl.
func (r *Redis) Push(ctx context.Context, index, id string, blob []byte, max int, ttl time.Duration) error {
	if ttl <= 0 || max <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	_, err := r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, EntryKey(index, id), blob, ttl)
		p.LRem(ctx, index, 0, id)
		p.LPush(ctx, index, id)
		p.LTrim(ctx, index, 0, int64(max-1))
		p.PExpire(ctx, index, ttl)
		return nil
	})
	if err != nil {
		return fmt.Errorf("respcache: redis push: %w", err)
	}
	return nil
}

// Recent implements [Index] with LRANGE then MGET, both within one timeout.
func (r *Redis) Recent(ctx context.Context, index string, max int) ([][]byte, error) {
	if max <= 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	ids, err := r.client.LRange(ctx, index, 0, int64(max-1)).Result()
	if err != nil {
		return nil, fmt.Errorf("respcache: redis lrange: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = EntryKey(index, id)
	}
	vals, err := r.client.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("respcache: redis mget: %w", err)
	}
	out := make([][]byte, 0, len(vals))
	for _, v := range vals {
		if s, ok := v.(string); ok {
			out = append(out, []byte(s))
		}
	}
	return out, nil
}

// SetRedisLogger sends go-redis's own log lines (a failed dial is logged on
// every attempt while the server is down) to l at Debug level instead of
// stderr. go-redis has one logger per process: call it once, from main.
func SetRedisLogger(l *slog.Logger) { redis.SetLogger(redisLogger{l}) }

type redisLogger struct{ l *slog.Logger }

// Printf implements go-redis's logging interface.
func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if r.l.Enabled(ctx, slog.LevelDebug) {
		r.l.LogAttrs(ctx, slog.LevelDebug, fmt.Sprintf(format, v...), slog.String("library", "go-redis"))
	}
}
