package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"rolter.dev/pkg/config"
	"rolter.dev/pkg/respcache"
	"rolter.dev/pkg/respcache/semantic"
	"rolter.dev/pkg/respcache/sse"
	"rolter.dev/pkg/usage"
)

// responseCache is the response cache built from a snapshot's [cache]
// section. It is kept across reloads while that section is unchanged, so a
// route edit neither drops the Redis pool nor empties the in-process store.
type responseCache struct {
	cfg   config.Cache
	cache *respcache.Cache
	close func() error
}

func newResponseCache(cfg config.Cache, log *slog.Logger) (*responseCache, error) {
	var backend respcache.Backend
	closer := func() error { return nil }
	if cfg.RedisURL != "" {
		r, err := respcache.NewRedis(cfg.RedisURL, respcache.RedisOptions{Timeout: time.Duration(cfg.TimeoutMS) * time.Millisecond})
		if err != nil {
			return nil, fmt.Errorf("cache.redis_url: %w", err)
		}
		backend, closer = r, r.Close
	} else {
		backend = respcache.NewMemory(cfg.MemoryMaxBytes)
	}
	c := respcache.New(backend, respcache.Options{Namespace: cfg.Namespace, MaxEntryBytes: cfg.MaxEntryBytes, Logger: log})
	return &responseCache{cfg: cfg, cache: c, close: closer}, nil
}

// cacheTotals keeps the counts of caches retired by reloads, so the
// exported counters never go backwards.
type cacheTotals struct {
	mu      sync.Mutex
	retired respcache.Stats
}

func (t *cacheTotals) retire(s respcache.Stats) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.retired = addStats(t.retired, s)
}

func (t *cacheTotals) total(live *responseCache) respcache.Stats {
	t.mu.Lock()
	s := t.retired
	t.mu.Unlock()
	if live != nil {
		s = addStats(s, live.cache.Stats())
	}
	return s
}

func addStats(a, b respcache.Stats) respcache.Stats {
	a.Hits += b.Hits
	a.Misses += b.Misses
	a.Stores += b.Stores
	a.TooLarge += b.TooLarge
	a.Incomplete += b.Incomplete
	a.DecodeErrors += b.DecodeErrors
	a.BackendErrors += b.BackendErrors
	a.BackendSkips += b.BackendSkips
	a.SemanticHits += b.SemanticHits
	a.SemanticMisses += b.SemanticMisses
	a.SemanticStores += b.SemanticStores
	a.SemanticBypasses += b.SemanticBypasses
	a.SemanticModeSkips += b.SemanticModeSkips
	a.EmbeddingErrors += b.EmbeddingErrors
	return a
}

// cacheable reports whether this request may use the response cache: the
// cache is on, the endpoint is not /v1/responses, and the route opts in
// unless the key overrides it.
func cacheable(rt *runtime, x *exchange) bool {
	if rt.cache == nil || x.ep.path == "/v1/responses" {
		return false
	}
	on := x.route.cfg.Cache != nil && x.route.cfg.Cache.Enabled
	if x.key != nil && x.key.Cache != nil {
		on = *x.key.Cache
	}
	return on
}

// lookupCache looks the request up. It returns nil when the request is not
// cacheable; a lookup that failed for any reason is a miss (fail open).
func (p *Proxy) lookupCache(ctx context.Context, x *exchange, raw []byte) *respcache.Lookup {
	if !cacheable(x.rt, x) {
		return nil
	}
	rc := x.route.cfg.Cache
	ttl := time.Duration(x.rt.snap.Cache.DefaultTTLSecs) * time.Second
	scope := ""
	var sem *respcache.Semantic
	if rc != nil {
		ttl = rc.TTL
		if rc.PerKey && x.key != nil {
			scope = x.key.ID
		}
		if s := rc.Semantic; s != nil {
			sem = &respcache.Semantic{
				Embedder:      &semantic.HTTPEmbedder{Client: p.client, BaseURL: s.Provider.APIBase, Model: s.Model, APIKey: s.Provider.APIKey},
				Threshold:     s.Threshold,
				MaxCandidates: s.MaxCandidates,
				Timeout:       s.Timeout,
			}
		}
	}
	if ttl <= 0 {
		return nil
	}
	start := time.Now()
	l, err := x.rt.cache.cache.Lookup(ctx, respcache.Request{
		Path: x.ep.path, Scope: scope, Route: x.route.cfg.Model, Variant: x.assigned, Body: raw,
		Stream: x.body.Stream, TTL: ttl, Semantic: sem,
	})
	result := "error"
	if err == nil {
		result = l.Source.String()
	}
	p.metrics.CacheLookup.WithLabelValues(result).Observe(time.Since(start).Seconds())
	if err != nil {
		if !errors.Is(err, respcache.ErrNotCacheable) {
			p.log.Debug("cache lookup failed; serving uncached", "request_id", x.id, "err", err)
		}
		return nil
	}
	return l
}

// serveHit answers from a cache entry: the stored status and content type,
// and the stored body (an SSE entry is replayed event by event).
func (p *Proxy) serveHit(w http.ResponseWriter, r *http.Request, x *exchange, l *respcache.Lookup) {
	h := w.Header()
	h.Set("Content-Type", l.Entry.ContentType)
	h.Set("X-Rolter-Cache", "HIT")
	h.Set("X-Rolter-Cache-Kind", l.Source.String())
	h.Set("X-Rolter-Model", x.route.cfg.Model)
	if x.assigned != "" {
		// Entries of a variant are stored and found only under its name.
		x.variant = x.assigned
		h.Set(VariantHeader, x.variant)
	}
	if l.Source == respcache.SemanticHit {
		h.Set("X-Rolter-Cache-Similarity", strconv.FormatFloat(l.Similarity, 'f', 4, 64))
	}
	x.status = l.Entry.Status
	x.cache = l.Source.String()
	x.ttft = time.Since(x.start)
	if !l.Entry.IsSSE() && l.Entry.Status < 300 && x.rt.policy.Active(x.dreq) {
		// The same policy as a live response, run on the stored upstream
		// bytes for this delivery (a reload's new rules reach old entries).
		if p.deliver(w, r, x, l.Entry.Status, l.Entry.ContentType, l.Entry.Body) != nil {
			p.refuseHalted(w, x)
		}
		return
	}
	w.WriteHeader(l.Entry.Status)
	if err := l.Entry.WriteBody(r.Context(), w); err != nil {
		p.clientGone(x, err)
	}
}

// recorder captures a cacheable response while it is relayed, without
// holding back a byte, and stores it when it ended well.
type recorder struct {
	p      *Proxy
	x      *exchange
	l      *respcache.Lookup
	status int
	ctype  string
	stream *sse.Recorder // SSE responses
	buf    bytes.Buffer  // other responses
	over   bool
	done   bool
}

// relayBuffered answers a non-streamed successful response that is
// cacheable or that the delivery policy may change: the body is read whole
// (a client of a JSON response waits for all of it anyway), stored as the
// upstream sent it, then delivered through the policy, so the next identical
// request hits and sees the same policy. A body too large to buffer is
// relayed as it comes, not stored, and not post-processed.
func (p *Proxy) relayBuffered(w http.ResponseWriter, r *http.Request, x *exchange, t *target, resp *http.Response, rec *recorder) (relayEnd, error) {
	limit := int64(maxBufferedBody)
	if rec != nil {
		if max := x.rt.cache.cache.MaxEntryBytes(); max > 0 && !x.rt.policy.Active(x.dreq) {
			limit = max
		}
	}
	var buf bytes.Buffer
	_, err := buf.ReadFrom(io.LimitReader(resp.Body, limit+1))
	if err == nil && int64(buf.Len()) <= limit && truncatedJSON(resp, buf.Bytes()) {
		err = errTruncatedJSON
	}
	if err != nil {
		// The upstream failed mid-body. Nothing has reached the client:
		// the part is neither sent (it would pass as a success, around the
		// policy) nor stored; another target may answer, else a 502.
		if rec != nil {
			rec.done = true
		}
		if r.Context().Err() != nil {
			p.clientGone(x, nil)
			return relayStopped, nil
		}
		return relayUnsent, err
	}
	x.ttft = time.Since(x.start)
	p.metrics.TTFT.WithLabelValues(x.route.cfg.Model, x.variant).Observe(x.ttft.Seconds())
	p.firstToken(x, resp.StatusCode)
	x.status = resp.StatusCode
	ctype := resp.Header.Get("Content-Type")
	startResponse(w, x, t, resp)
	if int64(buf.Len()) > limit {
		// Too large to keep: send what was read, then stream the rest.
		if rec != nil {
			rec.finish(errTooLargeToStore)
			x.rt.cache.cache.NoteTooLarge()
		}
		w.WriteHeader(resp.StatusCode)
		if _, err := w.Write(buf.Bytes()); err != nil {
			p.clientGone(x, err)
			return relayStopped, nil
		}
		rerr, werr := copyBody(w, resp.Body)
		switch {
		case werr != nil || rerr != nil && r.Context().Err() != nil:
			p.clientGone(x, werr)
			return relayStopped, nil
		case rerr != nil:
			return relayCut, rerr
		}
		return relayDone, nil
	}
	if rec != nil {
		rec.buf = buf
		rec.finish(nil) // Store counts a body over max_entry_bytes as too large
	}
	x.usage = usage.Parse(ctype, buf.Bytes())
	if err := p.deliver(w, r, x, resp.StatusCode, ctype, buf.Bytes()); err != nil {
		return relayUnsent, err // forward answers it, with no verdict on the target
	}
	if x.withheld != "" {
		return relayStopped, nil
	}
	return relayDone, nil
}

// copyBody copies body to w and tells a read error (the upstream's) from a
// write error (the client's).
func copyBody(w io.Writer, body io.Reader) (rerr, werr error) {
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	buf := *bufp
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return nil, werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		if err != nil {
			return err, nil
		}
	}
}

// maxBufferedBody bounds a body buffered for the cache or the delivery
// policy; larger ones pass through untouched.
const maxBufferedBody = 64 << 20

var errTooLargeToStore = errors.New("proxy: response larger than cache.max_entry_bytes")

// newRecorder returns the recorder of a response the cache may store, or
// nil: only a 200 is stored (respcache.Storable), as only a 200 says
// nothing of this one exchange that a replay to another request would
// repeat untruthfully.
func (p *Proxy) newRecorder(x *exchange, l *respcache.Lookup, resp *http.Response) *recorder {
	if l == nil || !respcache.Storable(resp.StatusCode) || x.variant != x.assigned {
		// A variant's answer is stored only under its own name: one that
		// fell over to another variant is not stored at all.
		return nil
	}
	rec := &recorder{p: p, x: x, l: l, status: resp.StatusCode, ctype: resp.Header.Get("Content-Type")}
	if rec.ctype == "" {
		rec.ctype = "application/json"
	}
	if respcache.IsEventStream(rec.ctype) {
		rec.stream = x.rt.cache.cache.NewRecorder()
	}
	return rec
}

func (rec *recorder) write(b []byte) {
	if rec.stream != nil {
		_, _ = rec.stream.Write(b)
		if rec.stream.Terminal() && !rec.done {
			// The stream is complete: store it now, not at the upstream's
			// EOF, which may come after the client has already moved on.
			rec.finish(nil)
		}
		return
	}
	if rec.over {
		return
	}
	if max := rec.x.rt.cache.cache.MaxEntryBytes(); max > 0 && int64(rec.buf.Len()+len(b)) > max {
		rec.over = true
		rec.buf = bytes.Buffer{}
		return
	}
	rec.buf.Write(b)
}

// finish stores the response if it ended well (err == nil). Later calls
// are no-ops.
func (rec *recorder) finish(err error) {
	if rec.done {
		return
	}
	rec.done = true
	c := rec.x.rt.cache.cache
	// The client has its answer; the store gets its own bounded context.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rec.x.ctx), 2*time.Second)
	defer cancel()
	var serr error
	if rec.stream != nil {
		rec.stream.End(err)
		serr = c.StoreStream(ctx, rec.l, rec.status, rec.ctype, rec.stream)
	} else if err == nil {
		if rec.over {
			c.NoteTooLarge()
			serr = respcache.ErrTooLarge
		} else {
			serr = c.Store(ctx, rec.l, &respcache.Entry{Status: rec.status, ContentType: rec.ctype, Body: rec.buf.Bytes()})
		}
	}
	if serr != nil {
		rec.p.log.Debug("response not cached", "request_id", rec.x.id, "reason", serr.Error())
	}
}
