package respcache

import (
	"context"
	"time"
)

// Store is the key-value part of a [Backend].
type Store interface {
	// Get returns the value of key; ok is false when there is none (or it
	// expired).
	Get(ctx context.Context, key string) (val []byte, ok bool, err error)
	// Set stores val under key for ttl. A ttl <= 0 stores nothing.
	Set(ctx context.Context, key string, val []byte, ttl time.Duration) error
}

// Index is the semantic part of a [Backend]: per partition, a bounded list of
// recent entry ids, newest first, each with its entry stored under
// EntryKey(index, id).
type Index interface {
	// Push stores blob under EntryKey(index, id) for ttl and makes id the
	// newest id of the list at index, atomically: an older occurrence of id
	// is removed, the list is cut to its max newest ids, and the list's TTL
	// is set to ttl. A ttl <= 0 or max <= 0 stores nothing.
	Push(ctx context.Context, index, id string, blob []byte, max int, ttl time.Duration) error
	// Recent returns the blobs of the newest max entries of the list at
	// index, newest first, leaving out entries that expired or are missing.
	Recent(ctx context.Context, index string, max int) ([][]byte, error)
}

// Backend stores the response cache: [Memory] in process, or [Redis] shared
// by every proxy. Implementations are safe for concurrent use, honour ctx,
// and never hand out a slice they will modify later. Returned errors make
// the cache miss or skip a store (fail open); they never reach a client.
type Backend interface {
	Store
	Index
}
