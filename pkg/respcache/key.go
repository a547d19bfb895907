package respcache

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"rolter.dev/pkg/respcache/canon"
)

// SemanticLayoutVersion is part of every semantic index key. Bump it whenever
// the partition rules of package semantic change, so that entries classified
// under the old rules are never read again (they expire on their TTL).
const SemanticLayoutVersion = "v2"

const sep = 0x1f

// ExactKey returns the exact-cache key of a request:
//
//	namespace + ":" + lowercase hex sha-256(path ‖ 0x1f ‖ scope ‖ 0x1f ‖ canonical(body))
//
// where canonical is the canonical JSON form of package canon (sorted keys,
// no insignificant whitespace, canonical string escapes, numbers as
// written), so key order and formatting do not cost hits. scope is "" for a
// cache shared by all callers of the route, or the virtual key's id when the
// route caches per key. The error wraps canon.ErrSyntax (or ErrTooDeep)
// when body is not JSON; such a request is not cacheable.
func ExactKey(namespace, path, scope string, body []byte) (string, error) {
	return VariantExactKey(namespace, path, scope, "", body)
}

// variantMark starts the variant field of a key. Canonical JSON never
// starts with it, so a variant's key is never a plain route's.
const variantMark = 0x1e

// VariantExactKey is [ExactKey] for a request assigned to a route variant
// (routes[].variants): for a non-empty variant,
//
//	namespace + ":" + lowercase hex sha-256(path ‖ 0x1f ‖ scope ‖ 0x1f ‖ 0x1e ‖ variant ‖ 0x1f ‖ canonical(body))
//
// so an answer produced by one variant is never replayed to a request
// assigned to another. An empty variant gives ExactKey's key.
func VariantExactKey(namespace, path, scope, variant string, body []byte) (string, error) {
	h := sha256.New()
	h.Write([]byte(path))
	h.Write([]byte{sep})
	h.Write([]byte(scope))
	h.Write([]byte{sep})
	if variant != "" {
		h.Write([]byte{variantMark})
		h.Write([]byte(variant))
		h.Write([]byte{sep})
	}
	if err := canon.Write(h, body); err != nil {
		return "", fmt.Errorf("respcache: exact key: %w", err)
	}
	var sum [sha256.Size]byte
	return namespace + ":" + hex.EncodeToString(h.Sum(sum[:0])), nil
}

// IndexKey returns the key of the semantic index (the list of recent entry
// ids) of one partition:
//
//	namespace + ":semantic:" + SemanticLayoutVersion + ":" +
//	  lowercase hex sha-256(path ‖ 0x1f ‖ scope ‖ 0x1f ‖ route ‖ 0x1f ‖ partition)
//
// route is the route's public model name and partition comes from
// semantic.Classify.
func IndexKey(namespace, path, scope, route string, partition [32]byte) string {
	return VariantIndexKey(namespace, path, scope, route, "", partition)
}

// VariantIndexKey is [IndexKey] for a request assigned to a route variant:
// a non-empty variant adds 0x1e ‖ variant ‖ 0x1f after route ‖ 0x1f, so
// each variant has its own semantic partitions. An empty variant gives
// IndexKey's key.
func VariantIndexKey(namespace, path, scope, route, variant string, partition [32]byte) string {
	h := sha256.New()
	for _, s := range []string{path, scope, route} {
		h.Write([]byte(s))
		h.Write([]byte{sep})
	}
	if variant != "" {
		h.Write([]byte{variantMark})
		h.Write([]byte(variant))
		h.Write([]byte{sep})
	}
	h.Write(partition[:])
	var sum [sha256.Size]byte
	return namespace + ":semantic:" + SemanticLayoutVersion + ":" + hex.EncodeToString(h.Sum(sum[:0]))
}

// EntryKey returns the key of semantic entry id of index: index + ":entry:" + id.
func EntryKey(index, id string) string { return index + ":entry:" + id }
