package respcache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"rolter.dev/pkg/respcache/semantic"
	"rolter.dev/pkg/respcache/sse"
)

// Defaults applied by [New] and [Cache.Lookup].
const (
	DefaultNamespace        = "rolter:cache"
	DefaultEmbeddingTimeout = time.Second
	// breakerThreshold consecutive backend failures open the breaker for
	// breakerCooldown: during it the backend is not called at all.
	breakerThreshold = 5
	breakerCooldown  = time.Second
)

// Errors returned by [Cache.Store] and [Cache.StoreStream] for a response
// that is deliberately not stored. Backend failures are returned wrapped as
// they are.
var (
	ErrNotStorable = errors.New("respcache: response not storable")
	ErrTooLarge    = errors.New("respcache: response larger than max_entry_bytes")
	ErrIncomplete  = errors.New("respcache: stream did not complete")
	ErrUnavailable = errors.New("respcache: backend unavailable (breaker open)")
	// ErrNotCacheable is returned by [Cache.Lookup] for a request that is
	// never response-cached: a body that is not JSON (wrapped with the
	// syntax error), or the stateful /v1/responses endpoint.
	ErrNotCacheable = errors.New("respcache: request not cacheable")
)

// Options configure a [Cache]. The zero value is usable.
type Options struct {
	// Namespace prefixes every key; "" means DefaultNamespace.
	Namespace string
	// MaxEntryBytes caps a stored body (see [Entry.Size]); 0 means no cap.
	MaxEntryBytes int64
	// Logger receives backend state changes (Warn when the breaker opens,
	// Info when the backend answers again) and per-operation failures at
	// Debug. Nothing about a request's content is ever logged. nil discards.
	Logger *slog.Logger
}

// Cache is the response cache: exact lookups by the canonical request, then
// semantic lookups within the request's partition, over a [Backend]. It
// fails open: a backend, decode or embedding failure is counted (see
// [Cache.Stats]) and treated as a miss. After breakerThreshold consecutive
// backend failures it stops calling the backend for breakerCooldown, so an
// outage costs requests nothing; it then tries again by itself. A Cache is
// safe for concurrent use.
type Cache struct {
	backend   Backend
	namespace string
	maxEntry  int64
	log       *slog.Logger

	// breaker
	failures  atomic.Int32
	openUntil atomic.Int64 // unix nanoseconds; 0 when closed
	// errLoggedAt (unix nanoseconds) and errUnlogged rate-limit the Warn
	// line of backend errors to one a second, with the count in between.
	errLoggedAt atomic.Int64
	errUnlogged atomic.Int64

	st counters
}

// New returns a Cache over backend.
func New(backend Backend, opts Options) *Cache {
	ns := opts.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cache{backend: backend, namespace: ns, maxEntry: max(opts.MaxEntryBytes, 0), log: log}
}

// Namespace returns the key prefix in use.
func (c *Cache) Namespace() string { return c.namespace }

// MaxEntryBytes returns the cap on a stored body (0 = none).
func (c *Cache) MaxEntryBytes() int64 { return c.maxEntry }

// Request is what a lookup needs to know about a cacheable request.
type Request struct {
	// Path is the endpoint, e.g. "/v1/chat/completions".
	Path string
	// Scope is "" when the route's cache is shared by all callers, or the
	// virtual key's id when the route caches per key (per_key).
	Scope string
	// Route is the route's public model name; it scopes the semantic index.
	Route string
	// Variant is the route variant the request is assigned to ("" for a
	// route without variants); it is part of the exact key and of the
	// semantic partition, so variants never share answers.
	Variant string
	// Body is the JSON body as forwarded upstream (after any rewriting).
	Body []byte
	// Stream tells whether the request asks for a stream; a semantic
	// candidate of the other mode is never replayed.
	Stream bool
	// TTL is how long a response stored for this request lives; <= 0 means
	// it is not stored.
	TTL time.Duration
	// Semantic enables the semantic lookup after an exact miss; nil means
	// exact only.
	Semantic *Semantic
}

// Semantic is a route's semantic-cache settings.
type Semantic struct {
	// Embedder embeds the conversation text (typically a
	// semantic.HTTPEmbedder for the configured provider and model).
	Embedder semantic.Embedder
	// Threshold is the least cosine similarity of a hit.
	Threshold float64
	// MaxCandidates bounds the recent entries compared, and the entries the
	// partition's index keeps.
	MaxCandidates int
	// Timeout bounds the embedding call; 0 means DefaultEmbeddingTimeout.
	Timeout time.Duration
}

// Source tells where a lookup's answer came from.
type Source uint8

// Lookup sources.
const (
	Miss Source = iota
	ExactHit
	SemanticHit
)

// String returns "miss", "exact" or "semantic".
func (s Source) String() string {
	switch s {
	case ExactHit:
		return "exact"
	case SemanticHit:
		return "semantic"
	}
	return "miss"
}

// Lookup is the outcome of [Cache.Lookup]. On a miss it also carries what
// [Cache.Store] needs to store the response afterwards. A Lookup is not safe
// for concurrent use.
type Lookup struct {
	// Entry is the cached response on a hit, nil on a miss. Its byte slices
	// must not be modified.
	Entry *Entry
	// Source is Miss, ExactHit or SemanticHit.
	Source Source
	// Similarity is the cosine similarity of a semantic hit.
	Similarity float64
	// Bypassed is set when a semantic lookup was configured but the request
	// is not a semantic candidate (see package semantic).
	Bypassed bool

	key       string // exact key
	ttl       time.Duration
	index     string    // semantic index key, "" when no semantic store
	embedding []float32 // the request's embedding, for the semantic store
	maxCands  int
	stored    bool
}

// Hit reports whether the lookup found a response to replay.
func (l *Lookup) Hit() bool { return l != nil && l.Entry != nil }

// Key returns the request's exact-cache key.
func (l *Lookup) Key() string { return l.key }

// Lookup looks the request up: the exact key first, then, on a miss and when
// req.Semantic is set, the semantic index of the request's partition. It
// returns ErrNotCacheable only for a request that must be served uncached
// (a body that is not JSON, or /v1/responses); every failure after that is
// counted and is a miss. The exact and semantic backend reads are each
// bounded by the backend's timeout, the embedding by req.Semantic.Timeout.
func (c *Cache) Lookup(ctx context.Context, req Request) (*Lookup, error) {
	if req.Path == "/v1/responses" {
		return nil, ErrNotCacheable
	}
	key, err := VariantExactKey(c.namespace, req.Path, req.Scope, req.Variant, req.Body)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotCacheable, err)
	}
	l := &Lookup{key: key, ttl: req.TTL}
	if blob, ok := c.get(ctx, key); ok {
		if e, _, err := decodeEntry(blob); err != nil {
			c.st.decodeErrors.Add(1)
		} else {
			c.st.hits.Add(1)
			l.Entry, l.Source = e, ExactHit
			return l, nil
		}
	}
	c.st.misses.Add(1)
	if s := req.Semantic; s != nil && s.Embedder != nil && s.MaxCandidates > 0 {
		c.semanticLookup(ctx, req, l)
	}
	return l, nil
}

func (c *Cache) semanticLookup(ctx context.Context, req Request, l *Lookup) {
	s := req.Semantic
	text, partition, ok := semantic.Classify(req.Path, req.Body)
	if !ok {
		c.st.semBypasses.Add(1)
		l.Bypassed = true
		return
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultEmbeddingTimeout
	}
	ectx, cancel := context.WithTimeout(ctx, timeout)
	emb, err := s.Embedder.Embed(ectx, text)
	cancel()
	if err != nil || len(emb) == 0 {
		c.st.embedErrors.Add(1)
		c.log.LogAttrs(ctx, slog.LevelDebug, "semantic cache: embedding failed", slog.Any("err", err))
		return
	}
	index := VariantIndexKey(c.namespace, req.Path, req.Scope, req.Route, req.Variant, partition)
	l.index, l.embedding, l.maxCands = index, emb, s.MaxCandidates

	blobs, ok := c.recent(ctx, index, s.MaxCandidates)
	if ok {
		best, bestSim := (*Entry)(nil), 0.0
		for _, blob := range blobs {
			e, cand, err := decodeEntry(blob)
			if err != nil || cand == nil {
				c.st.decodeErrors.Add(1)
				continue
			}
			sim, ok := semantic.Cosine(emb, cand)
			if !ok || sim < s.Threshold {
				continue
			}
			if e.IsSSE() != req.Stream {
				c.st.semModeSkips.Add(1) // similar, but a reply of the other mode
				continue
			}
			if best == nil || sim > bestSim {
				best, bestSim = e, sim
			}
		}
		if best != nil {
			c.st.semHits.Add(1)
			l.Entry, l.Source, l.Similarity = best, SemanticHit, bestSim
			return
		}
	}
	c.st.semMisses.Add(1)
}

// Storable reports whether a response of this status may be stored and
// replayed to another request: only 200 OK. Every other status tells of
// this one exchange, not of the answer to the request: a 201 or 202 of a
// resource or job the upstream created, a 204 with no answer at all, a 206
// of part of one, a redirect (the proxy does not follow them), an error.
// The proxy decides with it whether to record a response, and a stored
// entry of another status (written by an older rolter sharing the backend)
// does not decode, so it is never replayed.
func Storable(status int) bool { return status == 200 }

// Store stores the response to a missed lookup: the exact entry and, when
// the lookup embedded the request, the semantic entry. It is a no-op
// returning ErrNotStorable for a hit, a nil lookup, a status that is not
// [Storable] (anything but 200), a TTL <= 0 or a second call; ErrTooLarge (counted) over MaxEntryBytes. A
// backend failure is counted and returned. e must be the upstream's own
// response, before any delivery policy, and must not be modified afterwards.
func (c *Cache) Store(ctx context.Context, l *Lookup, e *Entry) error {
	if l == nil || l.Hit() || l.ttl <= 0 || e == nil || !Storable(e.Status) {
		return ErrNotStorable
	}
	if c.maxEntry > 0 && e.Size() > c.maxEntry {
		c.st.tooLarge.Add(1)
		return ErrTooLarge
	}
	if l.stored {
		return ErrNotStorable
	}
	l.stored = true
	if err := c.set(ctx, l.key, encodeEntry(e, nil), l.ttl); err != nil {
		return err
	}
	c.st.stores.Add(1)
	if l.index != "" {
		id := l.key[strings.LastIndexByte(l.key, ':')+1:] // the exact key's digest
		if err := c.push(ctx, l.index, id, encodeEntry(e, l.embedding), l.maxCands, l.ttl); err != nil {
			return err
		}
		c.st.semStores.Add(1)
	}
	return nil
}

// NoteTooLarge counts a response that was served but not stored because it
// outgrew MaxEntryBytes before the caller buffered it whole.
func (c *Cache) NoteTooLarge() { c.st.tooLarge.Add(1) }

// NewRecorder returns an sse.Recorder capped at MaxEntryBytes, for teeing a
// cacheable streamed response through.
func (c *Cache) NewRecorder() *sse.Recorder { return sse.NewRecorder(c.maxEntry) }

// StoreStream stores a streamed response recorded by rec (see
// [Cache.NewRecorder]) once rec has ended: ErrTooLarge (counted) when the
// recording outgrew MaxEntryBytes, ErrIncomplete (counted) when the stream
// did not complete normally, else as [Cache.Store].
func (c *Cache) StoreStream(ctx context.Context, l *Lookup, status int, contentType string, rec *sse.Recorder) error {
	if l == nil || l.Hit() || l.ttl <= 0 {
		return ErrNotStorable
	}
	if rec.TooLarge() {
		c.st.tooLarge.Add(1)
		return ErrTooLarge
	}
	if !rec.Complete() {
		c.st.incomplete.Add(1)
		return ErrIncomplete
	}
	return c.Store(ctx, l, &Entry{Status: status, ContentType: contentType, Events: rec.Events()})
}

// Backend calls, through the breaker.

func (c *Cache) get(ctx context.Context, key string) ([]byte, bool) {
	if !c.allow() {
		return nil, false
	}
	val, ok, err := c.backend.Get(ctx, key)
	c.done(ctx, "get", err)
	return val, ok && err == nil
}

func (c *Cache) recent(ctx context.Context, index string, max int) ([][]byte, bool) {
	if !c.allow() {
		return nil, false
	}
	blobs, err := c.backend.Recent(ctx, index, max)
	c.done(ctx, "recent", err)
	return blobs, err == nil
}

func (c *Cache) set(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	if !c.allow() {
		return ErrUnavailable
	}
	err := c.backend.Set(ctx, key, val, ttl)
	c.done(ctx, "set", err)
	return err
}

func (c *Cache) push(ctx context.Context, index, id string, blob []byte, max int, ttl time.Duration) error {
	if !c.allow() {
		return ErrUnavailable
	}
	err := c.backend.Push(ctx, index, id, blob, max, ttl)
	c.done(ctx, "push", err)
	return err
}

// allow reports whether the backend may be called: the breaker is closed, or
// its cooldown is over (then calls go through again, and the first failure
// re-opens it).
func (c *Cache) allow() bool {
	until := c.openUntil.Load()
	if until == 0 || time.Now().UnixNano() >= until {
		return true
	}
	c.st.backendSkips.Add(1)
	return false
}

func (c *Cache) done(ctx context.Context, op string, err error) {
	if err == nil {
		c.failures.Store(0)
		if c.openUntil.Swap(0) != 0 {
			c.log.LogAttrs(ctx, slog.LevelInfo, "response cache backend answers again")
		}
		return
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return // the caller gave up: says nothing about the backend
	}
	c.st.backendErrors.Add(1)
	// At Warn, so that a burst of misses has a visible cause; at most one
	// line a second, so that a backend down does not flood the log.
	now := time.Now().UnixNano()
	if last := c.errLoggedAt.Load(); now-last >= int64(time.Second) && c.errLoggedAt.CompareAndSwap(last, now) {
		c.log.LogAttrs(ctx, slog.LevelWarn, "response cache backend error: served as a miss", slog.String("op", op), slog.Any("err", err),
			slog.Int64("unlogged_errors_before", c.errUnlogged.Swap(0)))
	} else {
		c.errUnlogged.Add(1)
		c.log.LogAttrs(ctx, slog.LevelDebug, "response cache backend error", slog.String("op", op), slog.Any("err", err))
	}
	reopen := c.openUntil.Load() != 0 // a failure right after a cooldown
	if c.failures.Add(1) >= breakerThreshold || reopen {
		c.failures.Store(0)
		if c.openUntil.Swap(time.Now().Add(breakerCooldown).UnixNano()) == 0 {
			c.log.LogAttrs(ctx, slog.LevelWarn, "response cache backend failing: bypassing it",
				slog.String("for", breakerCooldown.String()), slog.Any("err", err))
		}
	}
}

// Stats are the cache's counters since [New]. The proxy exports them as
// Prometheus counters (rolter_cache_*, rolter_semantic_cache_*).
type Stats struct {
	// Hits and Misses count exact lookups.
	Hits, Misses uint64
	// Stores counts exact entries stored.
	Stores uint64
	// TooLarge counts responses over MaxEntryBytes, served but not stored.
	TooLarge uint64
	// Incomplete counts streams not stored because they did not complete.
	Incomplete uint64
	// DecodeErrors counts stored blobs that did not decode (misses),
	// among them entries of a status that is not [Storable].
	DecodeErrors uint64
	// BackendErrors counts failed backend operations (misses or skipped
	// stores); BackendSkips counts operations not attempted while the
	// breaker was open.
	BackendErrors, BackendSkips uint64
	// SemanticHits, SemanticMisses (an embedding was obtained but nothing
	// matched), SemanticStores, and SemanticBypasses (not a semantic
	// candidate: no embedding call).
	SemanticHits, SemanticMisses, SemanticStores, SemanticBypasses uint64
	// SemanticModeSkips counts candidates above the threshold skipped
	// because their mode (stream or not) differs from the request's.
	SemanticModeSkips uint64
	// EmbeddingErrors counts failed embedding calls (no semantic lookup).
	EmbeddingErrors uint64
}

type counters struct {
	hits, misses, stores, tooLarge, incomplete, decodeErrors atomic.Uint64
	backendErrors, backendSkips                              atomic.Uint64
	semHits, semMisses, semStores, semBypasses, semModeSkips atomic.Uint64
	embedErrors                                              atomic.Uint64
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() Stats {
	s := &c.st
	return Stats{
		Hits: s.hits.Load(), Misses: s.misses.Load(), Stores: s.stores.Load(),
		TooLarge: s.tooLarge.Load(), Incomplete: s.incomplete.Load(), DecodeErrors: s.decodeErrors.Load(),
		BackendErrors: s.backendErrors.Load(), BackendSkips: s.backendSkips.Load(),
		SemanticHits: s.semHits.Load(), SemanticMisses: s.semMisses.Load(), SemanticStores: s.semStores.Load(),
		SemanticBypasses: s.semBypasses.Load(), SemanticModeSkips: s.semModeSkips.Load(),
		EmbeddingErrors: s.embedErrors.Load(),
	}
}

// String renders a Lookup for debugging, without any content.
func (l *Lookup) String() string {
	if l == nil {
		return "<nil>"
	}
	if l.Source == SemanticHit {
		return fmt.Sprintf("semantic hit (similarity %.4f)", l.Similarity)
	}
	return l.Source.String()
}
