package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"rolter.dev/dataplane/internal/responseid"
	"rolter.dev/dataplane/internal/tokenize"
	"rolter.dev/pkg/affinity"
	"rolter.dev/pkg/backoff"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/delivery"
	"rolter.dev/pkg/request"
	"rolter.dev/pkg/respcache"
	"rolter.dev/pkg/routing"
	"rolter.dev/pkg/usage"
)

// exchange is the state of one client request across its attempts.
type exchange struct {
	ctx         context.Context
	dreq        delivery.Request // what the delivery policy knows of the request
	extraHeader http.Header      // annotations of the request legs
	usage       usage.Usage
	withheld    string // the refusal's reason (its code and rule or plugin), when the policy refused
	errCode     string
	targetModel string
	lookup      *respcache.Lookup // nil unless the request is cacheable
	cache       string            // "exact" or "semantic" on a hit
	start       time.Time
	id          string
	ep          *endpoint
	rt          *runtime
	route       *route
	body        *request.Body
	rctx        routing.Context
	key         *config.Key
	// pools are the request's target pools in the order they are tried:
	// the plain route's one, or the variants as assigned (the assigned
	// one first, then the fall-over order). cur is the current attempt's.
	pools    []poolState
	cur      int
	assigned string // the assigned variant ("" for a plain route): the cache's
	variant  string // the variant of the last attempt (x-rolter-variant)
	attempts int
	status   int
	provider string
	ttft     time.Duration
	abort    bool // the response started and then broke off: abort the connection
	// eventErr is the status of an error event the upstream's stream
	// carried (0: none): the answer failed although it began as a 200.
	eventErr int
	// gone: the client went away (closed, or cut off for not reading)
	// before its answer reached it whole; see clientGone.
	gone bool
	// observed is the target of the attempt the balancer observed and has
	// not yet been told the end of (-1: none), with the attempt's dispatch
	// time and whether its first token was reported, for
	// routing.TTFTObserver. It is in the current pool (x.pool()).
	observed  int
	sent      time.Time
	firstSeen bool
	// tokenizedFor: rctx.TokenIDs are an engine's /tokenize answer (fresh
	// or cached) for this upstream model, checked against the prompt length
	// the answer reports; "" when they are not.
	tokenizedFor   string
	tokenizedShape tokenize.Shape
	// namesResponse: a Responses request whose response id the proxy
	// chooses per attempt, naming the target (package responseid).
	namesResponse bool
	// hostedPrevious: a Responses request continuing a response the
	// gateway did not name (a hosted account's; see otherAccount).
	hostedPrevious bool
	// background: a Responses request the engine answers at once (queued)
	// and generates later; its answer's timing is no time to first token,
	// so the balancer learns nothing from it (the attempt is abandoned).
	background bool
	// askedUsage: the current attempt asked for the stream's usage on the
	// client's behalf, with usageBody (streamusage.go).
	askedUsage bool
	usageBody  *request.Body
}

// poolState is one pool's share of an exchange.
type poolState struct {
	pool    *pool
	allowed routing.Set // targets the key may use and that serve the endpoint
	tried   routing.Set
}

// pool is the pool of the current attempt.
func (x *exchange) pool() *pool { return x.pools[x.cur].pool }

func (p *Proxy) serveAPI(w http.ResponseWriter, r *http.Request, ep *endpoint) {
	x := &exchange{start: time.Now(), id: w.Header().Get("X-Request-Id"), ep: ep, extraHeader: http.Header{}, observed: -1}
	p.metrics.InFlight.Inc()
	defer p.metrics.InFlight.Dec()
	ctx, span := p.tracer.Start(p.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header)), "rolter.request",
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.route", ep.path), attribute.String("rolter.request_id", x.id)))
	r = r.WithContext(ctx)
	model := ""
	defer func() {
		span.SetAttributes(attribute.Int("http.response.status_code", x.status), attribute.String("rolter.model", model),
			attribute.Int("rolter.attempts", x.attempts), attribute.String("rolter.provider", x.provider))
		if x.variant != "" {
			span.SetAttributes(attribute.String("rolter.variant", x.variant))
		}
		if x.errCode != "" {
			span.SetAttributes(attribute.String("rolter.error", x.errCode))
		}
		if x.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(x.status))
		}
		span.End()
		code := strconv.Itoa(x.status)
		p.metrics.Requests.WithLabelValues(ep.path, model, code, x.variant).Inc()
		if model != "" {
			p.metrics.Latency.WithLabelValues(model, x.variant).Observe(time.Since(x.start).Seconds())
		}
		p.record(x, model)
		p.log.LogAttrs(r.Context(), slog.LevelInfo, "request",
			slog.String("request_id", x.id), slog.String("endpoint", ep.path), slog.String("model", model),
			slog.String("provider", x.provider), slog.Int("status", x.status), slog.Int("attempts", x.attempts),
			slog.String("cache", x.cache), slog.String("variant", x.variant), slog.String("error", x.errCode),
			slog.Float64("duration_ms", float64(time.Since(x.start).Microseconds())/1000),
			slog.Float64("ttft_ms", float64(x.ttft.Microseconds())/1000))
	}()
	rt, cb := p.watchRequest(r, x.start)
	fail := func(e apiError, msg string) {
		x.status = e.status
		x.errCode = e.code
		refuse(w, r, cb, ep.dialect, e, msg)
	}
	if e, msg := p.unavailable(rt); e != nil {
		fail(*e, msg)
		return
	}
	x.rt = rt
	_, authSpan := p.tracer.Start(ctx, "auth")
	key, aerr, msg := p.authenticate(rt, r)
	authSpan.SetAttributes(attribute.Bool("rolter.auth.open", rt.snap.Open()), attribute.Bool("rolter.auth.ok", aerr == nil))
	if key != nil {
		authSpan.SetAttributes(attribute.String("rolter.key", key.ID))
	}
	authSpan.End()
	if aerr != nil {
		fail(*aerr, msg)
		return
	}
	x.key = key

	raw, berr, msg := readBody(w, r, cb, rt.snap.Server.MaxBodyBytes)
	if berr != nil {
		fail(*berr, msg)
		return
	}
	body, perr, msg := parseRequest(raw)
	if perr != nil {
		fail(*perr, msg)
		return
	}
	x.body = body
	rte := rt.routes[body.Model]
	if rte == nil {
		fail(errModelNotFound, fmt.Sprintf("model %q does not exist", echoedName(body.Model)))
		return
	}
	model = body.Model
	x.route = rte
	if key != nil && !key.AllowsModel(body.Model) {
		p.metrics.AuthFailures.WithLabelValues("model_not_allowed").Inc()
		fail(errModelNotAllowed, fmt.Sprintf("this key may not use model %q", body.Model))
		return
	}
	if e, msg := p.assign(x, r); e != nil {
		fail(*e, msg)
		return
	}
	servable, allowed := false, false
	for k := range x.pools {
		ps := &x.pools[k]
		for i := range ps.pool.targets {
			t := &ps.pool.targets[i]
			if !ep.serves(t.cfg.Provider.Kind) {
				continue
			}
			servable = true
			if key == nil || key.AllowsProvider(t.cfg.Provider.Name) {
				ps.allowed.Add(i)
				allowed = true
			}
		}
	}
	switch {
	case !servable:
		fail(errUnsupported, fmt.Sprintf("no target of model %q can serve %s (cross-dialect translation is not supported)", body.Model, ep.path))
		return
	case !allowed:
		p.metrics.AuthFailures.WithLabelValues("provider_not_allowed").Inc()
		fail(errProviderDenied, fmt.Sprintf("this key may not use any provider of model %q", body.Model))
		return
	}
	x.dreq = delivery.Request{
		RequestID: x.id, Model: body.Model, Route: rte.cfg.Model, Stream: body.Stream,
		PIIRestoreOptIn: delivery.RestoreOptIn(r.Header),
	}
	if key != nil {
		x.dreq.KeyID = key.ID
	}
	fwd, ref := p.requestLegs(r, x, raw)
	if p.halted.Err() != nil {
		// Halt may have cut the sanitizer's call: its failure is no answer.
		p.refuseHalted(w, x)
		return
	}
	if ref != nil {
		// Refused before any upstream call: an error, not a withheld answer.
		fail(refusal(*ref), ref.Message)
		return
	}
	if len(fwd) != len(raw) || len(fwd) == 0 || &fwd[0] != &raw[0] {
		if !reparse(x, fwd) || !x.body.HasModel {
			fail(errUpstream, "a request transform produced an invalid body")
			return
		}
		raw = fwd
	}
	if ep.path == tokenize.PathResponses {
		// The proxy names the response after its target, unless the
		// client named it; one that continues a response it named goes
		// where that response is stored (storedresponse.go).
		f := responseid.Read(raw)
		x.namesResponse, x.background = !f.OwnID, f.Background
		tag, ours := responseid.TagOf(f.Previous)
		x.hostedPrevious = f.Previous != "" && !ours
		if ours {
			if e, msg := pinStored(x, f.Previous, tag); e != nil {
				if e.code == errProviderDenied.code {
					p.metrics.AuthFailures.WithLabelValues("provider_not_allowed").Inc()
				}
				fail(*e, msg)
				return
			}
		}
	}
	for k, vs := range x.extraHeader {
		w.Header()[k] = vs
	}
	// The route context is built from the body as it will be forwarded, in
	// one pass (the conversation text, its whole length and digest); for
	// predicted_ttft, read as the engine caches it: a Messages body less
	// Claude Code's per-request billing block, which vLLM leaves out of
	// the prompt, a salted request's prompt as one that shares prefixes
	// only with its salt, which vLLM hashes into its blocks (its token ids,
	// which cannot say so, are not used), and a request with prompt log
	// probabilities as one no replica holds, which vLLM prefills whole
	// (tokenize.ReadsNoCache). The seed's strategies
	// read the body as sent.
	salt := ""
	if x.pools[0].pool.strategy == routing.PredictedTTFT {
		aff := raw
		if ep.path == tokenize.PathMessages {
			aff, _ = tokenize.WithoutBillingHeader(raw)
		}
		salt = tokenize.CacheSalt(raw)
		x.rctx = affinity.BuildSalted(ep.path, aff, r.Header, salt)
		x.rctx.ReadsNoCache = tokenize.ReadsNoCache(ep.path, raw)
	} else {
		x.rctx = affinity.Build(ep.path, raw, r.Header)
	}
	// A client that does not stream gets the answer whole: no first token
	// reaches the proxy (predicted_ttft hears of the whole answer instead).
	x.rctx.Buffered = !x.body.Stream
	x.ctx = ctx
	if x.rt.cache != nil {
		cctx, cspan := p.tracer.Start(ctx, "cache.lookup")
		l := p.lookupCache(cctx, x, raw)
		cspan.SetAttributes(attribute.Bool("rolter.cache.cacheable", l != nil))
		if l != nil {
			cspan.SetAttributes(attribute.Bool("rolter.cache.hit", l.Hit()), attribute.String("rolter.cache.kind", l.Source.String()))
		}
		cspan.End()
		if l != nil && l.Hit() {
			p.serveHit(w, r, x, l)
			return
		}
		if l != nil {
			x.lookup = l
			w.Header().Set("X-Rolter-Cache", "MISS")
		}
	}
	if len(x.rctx.TokenIDs) == 0 && r.Header.Get(routing.TokenIDsHeader) != "" {
		// A wrong token list would steer precise routing wrongly (the
		// seed's rule: ignored whole); counted so that an integration
		// sending a broken header is seen.
		p.metrics.TokenIDsIgnored.WithLabelValues(x.route.cfg.Model).Inc()
	}
	if salt != "" {
		x.rctx.TokenIDs = nil // see above; tokenIDs asks nothing for it either
	}
	p.tokenIDs(ctx, x, raw)
	if p.halted.Err() != nil {
		// Halt may have cut /tokenize: the request is refused before it is
		// routed (a balancer that defers counts its arrival).
		p.refuseHalted(w, x)
		return
	}
	p.forward(w, r, x)
	if x.abort {
		// The response started and the upstream broke it off: end it so
		// that it cannot pass for a complete one (HTTP/1.1: a chunked body
		// without its terminator or a short Content-Length body; HTTP/2: a
		// stream reset). The deferred accounting above still runs.
		panic(http.ErrAbortHandler)
	}
}

// parseRequest reads a request body and its model, or says what is wrong
// with it.
func parseRequest(raw []byte) (*request.Body, *apiError, string) {
	body, err := request.Parse(raw)
	var ferr *request.FieldError
	switch {
	case errors.As(err, &ferr):
		return nil, &errInvalidRequest, ferr.Field + ": " + ferr.Reason
	case errors.Is(err, request.ErrNotObject):
		return nil, &errInvalidJSON, "request body must be a JSON object"
	case err != nil:
		return nil, &errInvalidJSON, "request body is not valid JSON"
	case !body.HasModel || body.Model == "":
		return nil, &errInvalidRequest, "the request must name a model (a string)"
	}
	return body, nil, ""
}

// pick chooses the target of the next attempt, or -1, and sets x.cur to
// its pool. The pools are asked in order (the assigned variant first): the
// first with an eligible target (untried, allowed, not parked, healthy,
// breaker allows) picks among those, so a variant whose targets are all
// down never shapes the pick. When no pool has one, the first pool with an
// untried allowed target picks among those: the gateway fails open past
// cooldown, health and breaker as a plain route does, never past the key.
func (p *Proxy) pick(x *exchange, loads []int, now time.Time) int {
	eligible, loads, ok := p.candidates(x, loads, now)
	if !ok {
		return -1
	}
	pl := x.pool()
	idx := pl.balancer.Pick(&x.rctx, loads, eligible)
	if !eligible.Has(idx) {
		idx = eligible.Nth(0, len(pl.targets))
	}
	return idx
}

// turnWait is how long the request waits for its turn in a burst before
// its first pick, as the balancer of the pool it would pick from asks
// (routing.Deferrer; 0 for every other balancer).
func (p *Proxy) turnWait(x *exchange, loads []int, now time.Time) time.Duration {
	asks := false
	for _, ps := range x.pools {
		_, ok := ps.pool.balancer.(routing.Deferrer)
		asks = asks || ok
	}
	if !asks {
		return 0 // no pool's balancer asks: pick alone finds the eligible targets
	}
	eligible, loads, ok := p.candidates(x, loads, now)
	if !ok {
		return 0
	}
	if d, ok := x.pool().balancer.(routing.Deferrer); ok {
		return d.Defer(&x.rctx, loads, eligible)
	}
	return 0
}

// candidates finds the pool pick chooses from and its eligible targets
// (see pick), sets x.cur to it and returns loads cut to its targets and
// filled with their fleet loads; false when no pool has a target left.
func (p *Proxy) candidates(x *exchange, loads []int, now time.Time) (routing.Set, []int, bool) {
	open, openAt := routing.Set{}, -1
	var eligible routing.Set
	chosen := -1
	for k := range x.pools {
		ps := &x.pools[k]
		var candidates routing.Set
		eligible = routing.Set{}
		for i := range ps.pool.targets {
			if !ps.allowed.Has(i) || ps.tried.Has(i) {
				continue
			}
			candidates.Add(i)
			t := &ps.pool.targets[i]
			if x.rt.snap.Cooldown.BaseSecs > 0 && t.state.CoolingDown(now) {
				continue
			}
			if !t.health.Healthy() || !t.state.BreakerAllows(now, x.rt.breaker) {
				continue
			}
			eligible.Add(i)
		}
		if !eligible.Empty() {
			chosen = k
			break
		}
		if openAt < 0 && !candidates.Empty() {
			open, openAt = candidates, k
		}
	}
	if chosen < 0 {
		if openAt < 0 {
			return routing.Set{}, nil, false
		}
		// Fail open past cooldown, health and breaker; never past the key.
		chosen, eligible = openAt, open
	}
	x.cur = chosen
	pl := x.pools[chosen].pool
	targets := pl.targets
	loads = loads[:len(targets)]
	for i := range targets {
		// The fleet's load: this proxy's live count plus its peers' latest.
		t := &targets[i]
		load := t.state.InFlight() + pl.fleet.PeerLoad(i)
		// With [providers.engine_load], the replica's own running + waiting
		// count, if fresh, raises it: the engine counts every client's
		// requests (proxies not sharing with this one, other routes and
		// models on the same replica, clients going around the proxies),
		// which this proxy cannot see, but it lags by up to a scrape
		// interval, while this proxy's own count is exact for its own
		// requests (including ones sent since the scrape). Each is a lower
		// bound of the truth, so the larger is the better estimate; a sum
		// would count this proxy's requests twice. Stale (failed or slow
		// scrapes) or absent: the proxy's own view, never a wait.
		if el := t.cfg.Provider.EngineLoad; el != nil {
			if n, ok := t.health.EngineLoad(now, el.Stale); ok && n > load {
				load = n
			}
		}
		loads[i] = load
	}
	return eligible, loads, true
}

// firstToken tells a TTFTObserver balancer the observed attempt's time to
// first token (from dispatch), once; an error answer's first byte is no
// first token (attemptEnded abandons it).
func (p *Proxy) firstToken(x *exchange, status int) {
	if x.observed < 0 || x.firstSeen || x.route == nil || status >= 300 || x.background {
		return
	}
	if o, ok := x.pool().balancer.(routing.TTFTObserver); ok && !x.rctx.Buffered {
		// A buffered answer's first bytes are its end: forward reports it
		// whole (WholeAnswer) when it completes.
		o.FirstToken(x.observed, &x.rctx, time.Since(x.sent), len(x.rctx.TokenIDs))
	}
	x.firstSeen = true
}

// learned records that the balancer was told the observed attempt
// completed (routing.Learner), which ends it there.
func (x *exchange) learned() { x.observed, x.firstSeen = -1, false }

// attemptEnded tells a TTFTObserver balancer that the observed attempt
// ended without completing, before or after its first token, if it did:
// every observed attempt ends in exactly one Learn or Abandon, so the
// balancer's in-flight count of the target comes back down (a stream cut
// after its first token, a client that left, a withheld answer).
func (p *Proxy) attemptEnded(x *exchange) {
	if x.observed < 0 || x.route == nil {
		return
	}
	if o, ok := x.pool().balancer.(routing.TTFTObserver); ok {
		o.Abandon(x.observed, &x.rctx)
	}
	x.observed, x.firstSeen = -1, false
}

// retryable reports whether a status may succeed on another target.
func retryable(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500
}

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, x *exchange) {
	snap := x.rt.snap
	maxAttempts := 1 + snap.Retry.MaxRetries
	n := 0
	for _, ps := range x.pools {
		n = max(n, len(ps.pool.targets))
	}
	loads := make([]int, n)
	var lastErr error
	timedOut, bodyFailed := false, false
	defer p.attemptEnded(x)
	if d := p.turnWait(x, loads, time.Now()); d > 0 {
		// Its turn in a burst: the peers' picks before it reach this
		// proxy meanwhile (routing.Deferrer).
		p.metrics.TurnWait.WithLabelValues(x.route.cfg.Model).Observe(d.Seconds())
		if !sleep(r.Context(), p.halted.Done(), d) && r.Context().Err() != nil {
			p.clientGone(x, nil)
			return
		}
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		p.attemptEnded(x)
		if attempt > 0 {
			if !p.hasUntried(x) {
				break
			}
			// Back off before choosing, so the choice sees the state after
			// the wait (a cooldown that ended, a breaker that half-opened).
			d := backoff.Delay(attempt, time.Duration(snap.Retry.BaseBackoffMS)*time.Millisecond,
				time.Duration(snap.Retry.MaxBackoffMS)*time.Millisecond, rand.Float64())
			if !sleep(r.Context(), p.halted.Done(), d) && r.Context().Err() != nil {
				p.clientGone(x, nil)
				return
			}
		}
		if p.halted.Err() != nil {
			// Nothing has gone to the client yet, and no attempt may
			// start: the process is about to close its connections.
			p.refuseHalted(w, x)
			return
		}
		now := time.Now()
		_, selSpan := p.tracer.Start(r.Context(), "route.select",
			trace.WithAttributes(attribute.Int("rolter.attempt", attempt+1)))
		idx := p.pick(x, loads, now)
		pl := x.pool()
		selSpan.SetAttributes(attribute.String("rolter.strategy", pl.strategy))
		if pl.variant != "" {
			selSpan.SetAttributes(attribute.String("rolter.variant", pl.variant))
		}
		if idx < 0 {
			selSpan.SetAttributes(attribute.String("rolter.decision", "none"))
			selSpan.End()
			break
		}
		selSpan.SetAttributes(attribute.String("rolter.decision", "picked"), attribute.Int("rolter.target", idx),
			attribute.String("rolter.provider", pl.targets[idx].cfg.Provider.Name), attribute.Int("rolter.target_load", loads[idx]))
		selSpan.End()
		if attempt > 0 {
			p.metrics.Retries.WithLabelValues(x.route.cfg.Model).Inc()
		}
		t := &pl.targets[idx]
		queueDepth := loads[idx]
		pl.balancer.Observe(idx, &x.rctx)
		x.observed = idx
		x.pools[x.cur].tried.Add(idx)
		x.attempts++
		x.variant = pl.variant
		x.provider = t.cfg.Provider.Name
		x.targetModel = t.cfg.Model
		probe := t.state.BreakerAttempt(now, x.rt.breaker)
		release := t.state.Acquire()

		sent := time.Now()
		x.sent = sent
		uctx, upSpan := p.tracer.Start(r.Context(), "upstream.request", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("rolter.provider", t.cfg.Provider.Name), attribute.String("gen_ai.request.model", t.cfg.Model)))
		resp, cancel, err := p.send(r.WithContext(uctx), x, t)
		if err != nil {
			upSpan.RecordError(err)
			upSpan.SetStatus(codes.Error, "transport")
			upSpan.End()
			release()
			if r.Context().Err() != nil {
				// The client left before the upstream's headers came.
				p.clientGone(x, nil)
				p.attemptAbandoned(x, t, probe)
				return
			}
			if errors.Is(err, errHalted) {
				p.attemptHalted(x, t, probe)
				p.refuseHalted(w, x)
				return
			}
			timedOut, bodyFailed = errors.Is(err, errHeaderTimeout), false
			reason := "transport"
			if timedOut {
				reason = "timeout"
			}
			p.targetFailed(x, t, reason, 0)
			lastErr = err
			p.log.LogAttrs(r.Context(), slog.LevelWarn, "upstream attempt failed",
				slog.String("request_id", x.id), slog.String("provider", t.cfg.Provider.Name), slog.String("err", err.Error()))
			continue
		}
		if resp.StatusCode == http.StatusNotFound && attempt+1 < maxAttempts && otherAccount(x, t) {
			// A continuation of a response another hosted account stores:
			// this one's 404 is no failure of it (generation never
			// started), and the next account may hold it.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			cancel()
			upSpan.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
			upSpan.End()
			release()
			if t.state.BreakerSuccess(x.rt.breaker) {
				p.metrics.BreakerClosed.WithLabelValues(t.cfg.Provider.Name).Inc()
			}
			p.metrics.TargetRequests.WithLabelValues(x.route.cfg.Model, t.cfg.Provider.Name, "error").Inc()
			lastErr, bodyFailed = fmt.Errorf("upstream status %d", resp.StatusCode), false
			continue
		}
		failed := retryable(resp.StatusCode) // counted as the target's failure here
		if failed {
			ra, _ := backoff.RetryAfter(resp.Header.Get("Retry-After"), time.Now())
			p.targetFailed(x, t, "status_"+strconv.Itoa(resp.StatusCode), ra)
			if attempt+1 < maxAttempts && p.hasUntried(x) {
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
				resp.Body.Close()
				cancel()
				upSpan.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
				upSpan.SetStatus(codes.Error, "retryable status")
				upSpan.End()
				release()
				lastErr, bodyFailed = fmt.Errorf("upstream status %d", resp.StatusCode), false
				continue
			}
			// Last chance: the upstream's own answer goes back unchanged.
		}
		end, berr := p.relay(w, r, x, t, resp)
		resp.Body.Close()
		cancel()
		upSpan.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode), attribute.Bool("rolter.complete", end == relayDone))
		if berr != nil {
			upSpan.RecordError(berr)
			upSpan.SetStatus(codes.Error, "body")
		}
		upSpan.End()
		release()
		if errors.Is(berr, errHalted) {
			// Halt cancelled the attempt: no verdict on the target (unless
			// its status already was one), no retry, as the process is
			// about to close its connections.
			if !failed {
				p.attemptHalted(x, t, probe)
			}
			if end == relayUnsent {
				p.refuseHalted(w, x)
				return
			}
			// relayCut: as an upstream's cut below, but the proxy's doing.
			x.status, x.errCode, x.usage, x.abort = errShuttingDown.status, errShuttingDown.code, usage.Usage{}, true
			return
		}
		if end == relayUnsent || end == relayCut {
			// The upstream broke off mid-body, or went silent: a failure
			// of the target like a transport error, whatever its status
			// line said.
			idle := errors.Is(berr, errUpstreamIdle)
			if !failed {
				reason := "body"
				if idle {
					reason = "idle"
				}
				p.targetFailed(x, t, reason, 0)
			}
			p.log.LogAttrs(r.Context(), slog.LevelWarn, "upstream body broke off",
				slog.String("request_id", x.id), slog.String("provider", t.cfg.Provider.Name),
				slog.Bool("response_started", end == relayCut), slog.String("err", berr.Error()))
			if end == relayUnsent {
				lastErr, timedOut, bodyFailed = berr, idle, true
				continue
			}
			// Too late to answer otherwise: the request is an upstream
			// error everywhere it is counted, its usage was never
			// reported, and serveAPI aborts the connection.
			x.status, x.errCode, x.usage, x.abort = errUpstream.status, errUpstream.code, usage.Usage{}, true
			return
		}
		switch {
		case failed:
			// Counted as the target's failure above, whoever ended the relay.
		case x.gone:
			p.attemptAbandoned(x, t, probe)
		case x.eventErr >= 500:
			// The stream carried the upstream's own error event (vLLM's
			// when generation fails mid-stream), relayed to the client,
			// which is told; the answer failed although it began as a 200.
			p.targetFailed(x, t, "event", 0)
			x.status, x.errCode = errUpstream.status, errUpstream.code
		default:
			if t.state.BreakerSuccess(x.rt.breaker) {
				p.metrics.BreakerClosed.WithLabelValues(t.cfg.Provider.Name).Inc()
			}
			outcome := "ok"
			if resp.StatusCode >= 300 || x.eventErr != 0 {
				outcome = "error"
			}
			if x.eventErr != 0 {
				// A client error the stream reported: the request's status.
				x.status = x.eventErr
			}
			p.metrics.TargetRequests.WithLabelValues(x.route.cfg.Model, t.cfg.Provider.Name, outcome).Inc()
			if outcome == "ok" {
				p.checkTokenized(x)
			}
		}
		learn := end == relayDone && resp.StatusCode < 300 && x.eventErr == 0 && !x.background
		if o, ok := pl.balancer.(routing.TTFTObserver); ok && x.rctx.Buffered && learn {
			// Without usage the balancer counts the request's token ids.
			o.WholeAnswer(idx, &x.rctx, time.Since(sent), int(x.usage.PromptTokens), int(x.usage.CompletionTokens))
		}
		if l, ok := pl.balancer.(routing.Learner); ok && learn {
			l.Learn(idx, &x.rctx, queueDepth, time.Since(sent))
			x.learned()
		}
		return
	}
	if x.attempts == 0 {
		x.status, x.errCode = errNoTarget.status, errNoTarget.code
		writeError(w, x.ep.dialect, errNoTarget, fmt.Sprintf("no target of model %q could be tried", x.route.cfg.Model))
		return
	}
	e := errUpstream
	if timedOut {
		e = errUpstreamTimeout
	}
	x.status, x.errCode = e.status, e.code
	msg := fmt.Sprintf("every target of model %q failed after %d attempt(s)", x.route.cfg.Model, x.attempts)
	switch {
	case errors.Is(lastErr, errUpstreamIdle):
		msg += fmt.Sprintf(": the upstream sent nothing for %d s (timeouts.idle_secs)", x.rt.snap.Timeouts.IdleSecs)
	case lastErr != nil && timedOut:
		msg += ": timed out waiting for response headers"
	case bodyFailed:
		msg += ": the upstream broke off the response body"
	}
	writeError(w, x.ep.dialect, e, msg)
}

func (p *Proxy) hasUntried(x *exchange) bool {
	for _, ps := range x.pools {
		for i := range ps.pool.targets {
			if ps.allowed.Has(i) && !ps.tried.Has(i) {
				return true
			}
		}
	}
	return false
}

// targetFailed parks the target and feeds its breaker after a retryable
// failure. A Retry-After sets the park time (within cooldown bounds); it does
// not delay the retry on another target.
func (p *Proxy) targetFailed(x *exchange, t *target, reason string, retryAfter time.Duration) {
	name := t.cfg.Provider.Name
	p.metrics.UpstreamErrors.WithLabelValues(name, reason).Inc()
	p.metrics.TargetRequests.WithLabelValues(x.route.cfg.Model, name, "error").Inc()
	now := time.Now()
	cd := x.rt.snap.Cooldown
	if cd.BaseSecs > 0 {
		d := time.Duration(cd.BaseSecs) * time.Second
		if retryAfter > d {
			d = min(retryAfter, time.Duration(cd.MaxSecs)*time.Second)
		}
		if t.state.CoolDown(now, d) {
			p.metrics.CooldownsTripped.WithLabelValues(name).Inc()
		}
	}
	if t.state.BreakerFailure(now, x.rt.breaker) {
		p.metrics.BreakerOpened.WithLabelValues(name).Inc()
		p.log.Warn("circuit breaker opened", "provider", name, "route", x.route.cfg.Model)
	}
}

// attemptAbandoned ends an attempt whose client went away before the
// answer reached it whole (x.gone): the attempt is counted with outcome
// client_gone, and it is no verdict on the target, so its breaker neither
// counts a failure nor closes (if the attempt is the half-open probe, its
// BreakerAttempt ticket probe, the probe is released for the next request
// to probe).
func (p *Proxy) attemptAbandoned(x *exchange, t *target, probe uint64) {
	t.state.BreakerAbandon(x.rt.breaker, probe)
	p.metrics.TargetRequests.WithLabelValues(x.route.cfg.Model, t.cfg.Provider.Name, "client_gone").Inc()
}

// attemptHalted ends an attempt that Halt cancelled, counted with outcome
// shutting_down: like one whose client left, it says nothing of the target
// (see attemptAbandoned), and routing learns nothing from it.
func (p *Proxy) attemptHalted(x *exchange, t *target, probe uint64) {
	t.state.BreakerAbandon(x.rt.breaker, probe)
	p.metrics.TargetRequests.WithLabelValues(x.route.cfg.Model, t.cfg.Provider.Name, "shutting_down").Inc()
}

// msgShuttingDown is the message of errShuttingDown before the response
// started.
const msgShuttingDown = "the proxy is shutting down; send the request again"

// refuseHalted answers a request halted before its response started.
func (p *Proxy) refuseHalted(w http.ResponseWriter, x *exchange) {
	x.status, x.errCode = errShuttingDown.status, errShuttingDown.code
	writeError(w, x.ep.dialect, errShuttingDown, msgShuttingDown)
}

// clientGone ends a request whose client went away, or stopped reading
// (err wraps errClientWriteTimeout): the caller stops relaying and
// forward's usual end of an attempt cancels the upstream request and
// releases the target. err is the failed write's, nil when the request's
// context ended.
func (p *Proxy) clientGone(x *exchange, err error) {
	x.gone = true
	reason := "closed"
	if errors.Is(err, errClientWriteTimeout) {
		reason = "write_timeout"
		x.errCode = codeClientWriteTimeout
	}
	p.metrics.ClientDisconnects.WithLabelValues(reason).Inc()
	x.status = 499 // client closed request (nginx's convention), for logs and metrics only
}

// codeClientWriteTimeout is the error code logged (and in the usage row
// and span) for a client cut off by server.client_write_timeout_ms. It
// never reaches the client, which is no longer reading.
const codeClientWriteTimeout = "client_write_timeout"

// sleep waits d and reports whether it did: false when ctx ended or halt
// was closed first.
func sleep(ctx context.Context, halt <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-halt:
		return false
	}
}

var errHeaderTimeout = errors.New("proxy: timed out waiting for upstream response headers")

// hopHeaders are never forwarded in either direction (RFC 9110 §7.6.1),
// plus the client's credentials, which are for rolter, not the upstream.
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

var dropRequestHeaders = map[string]bool{
	"Authorization": true, "X-Api-Key": true, "Cookie": true, "Host": true, "Content-Length": true,
	"Accept-Encoding": true, "Anthropic-Version": true,
	// The proxy sends the body it read, uncoded (a coded one is refused).
	"Content-Encoding": true,
	// The upstream is called with the provider's key: which organization
	// or project it bills is the operator's choice, not the client's.
	"Openai-Organization": true, "Openai-Project": true,
	// Conditional and partial requests: an inference POST has no use for
	// them, and an upstream honouring one could answer 206 or 304, which
	// the response cache must never store for other clients.
	"Range": true, "If-Range": true, "If-Match": true, "If-None-Match": true,
	"If-Modified-Since": true, "If-Unmodified-Since": true,
}

// connectionHeaders returns the header names h's Connection header lists:
// hop-by-hop too (RFC 9110 §7.6.1), so never forwarded. nil when none.
func connectionHeaders(h http.Header) map[string]bool {
	var named map[string]bool
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				if named == nil {
					named = map[string]bool{}
				}
				named[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	return named
}

// send makes one upstream attempt. The returned cancel must be called when
// the response body is done with. An attempt that Halt cancelled fails with
// errHalted, and so do the reads of its body.
func (p *Proxy) send(r *http.Request, x *exchange, t *target) (*http.Response, context.CancelFunc, error) {
	prov := t.cfg.Provider
	// Halt cancels the attempt as the header timeout below does.
	ctx, cancelCause := p.untilHalt(r.Context())
	cancel := func() { cancelCause(nil) }
	var timedOut bool
	var mu sync.Mutex
	timer := time.AfterFunc(time.Duration(x.rt.snap.Timeouts.RequestSecs)*time.Second, func() {
		mu.Lock()
		timedOut = true
		mu.Unlock()
		cancelCause(nil)
	})
	payload := x.upstreamBody(p.asksUsage(x, prov, time.Now())).WithModel(t.cfg.Model)
	if x.namesResponse && namesResponses(t) {
		payload = responseid.WithID(payload, responseid.New(responseid.Tag(prov.Name)))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, upstreamURL(prov.APIBase, x.ep.path), bytes.NewReader(payload))
	if err != nil {
		timer.Stop()
		cancel()
		return nil, nil, fmt.Errorf("proxy: build upstream request: %w", err)
	}
	named := connectionHeaders(r.Header)
	for k, vs := range r.Header {
		if hopHeaders[k] || named[k] || dropRequestHeaders[k] || strings.HasPrefix(k, "X-Rolter-") {
			continue
		}
		req.Header[k] = vs
	}
	// As httputil.ReverseProxy does by default: the peer's address is
	// appended to the X-Forwarded-For the client sent (its lines folded
	// into one), so the upstream sees who called; X-Forwarded-Host and
	// -Proto pass as sent, and are not added.
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := req.Header["X-Forwarded-For"]; len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		req.Header.Set("X-Forwarded-For", ip)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", x.id)
	p.prop.Inject(ctx, propagation.HeaderCarrier(req.Header))
	req.ContentLength = int64(len(payload))
	switch prov.Kind {
	case config.KindAnthropic:
		if prov.APIKey != "" {
			req.Header.Set("X-Api-Key", prov.APIKey)
		}
		v := r.Header.Get("Anthropic-Version")
		if v == "" {
			v = prov.AnthropicVersion
		}
		req.Header.Set("Anthropic-Version", v)
	default:
		if prov.APIKey != "" {
			req.Header.Set("Authorization", "Bearer "+prov.APIKey)
		}
		if v := r.Header.Get("Anthropic-Version"); v != "" && x.ep.dialect == dialectAnthropic {
			req.Header.Set("Anthropic-Version", v)
		}
	}
	resp, err := p.client.Do(req)
	if err == nil && x.askedUsage && refusedUsage(resp) {
		// The option the proxy added was refused (streamusage.go): the
		// attempt again as the client wrote it.
		resp.Body.Close()
		p.usageRefused.add(prov.Name, time.Now().Add(RefusalFor))
		p.log.LogAttrs(r.Context(), slog.LevelWarn, "the upstream refused stream_options: its streams go without usage for a while",
			slog.String("provider", prov.Name), slog.Int("status", resp.StatusCode), slog.Duration("for", RefusalFor))
		plain := x.upstreamBody(false).WithModel(t.cfg.Model)
		req = req.Clone(ctx)
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(plain)), int64(len(plain))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(plain)), nil }
		resp, err = p.client.Do(req)
	}
	stopped := timer.Stop()
	if err != nil {
		cancel()
		if halted(ctx) {
			return nil, nil, fmt.Errorf("%w: %s", errHalted, prov.Name)
		}
		mu.Lock()
		to := timedOut
		mu.Unlock()
		if !stopped && to {
			return nil, nil, fmt.Errorf("%w: %s", errHeaderTimeout, prov.Name)
		}
		return nil, nil, fmt.Errorf("proxy: upstream %s: %w", prov.Name, err)
	}
	if idle := time.Duration(x.rt.snap.Timeouts.IdleSecs) * time.Second; idle > 0 {
		resp.Body = newIdleBody(resp.Body, idle, func() { cancelCause(nil) })
	}
	resp.Body = &haltBody{ReadCloser: resp.Body, ctx: ctx}
	return resp, cancel, nil
}

// haltBody reports errHalted as the read error of a body whose request
// Halt cancelled, so that every reader of it (relay, relayBuffered) tells
// the proxy's shutdown from the upstream's failure.
type haltBody struct {
	io.ReadCloser
	ctx context.Context
}

func (b *haltBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && halted(b.ctx) {
		err = errHalted
	}
	return n, err
}

// errUpstreamIdle is the read error of a response body the upstream sent
// nothing of for timeouts.idle_secs.
var errUpstreamIdle = errors.New("proxy: the upstream sent nothing for timeouts.idle_secs")

// idleBody cancels the upstream request when a Read of its body waits
// longer than idle: a replica that hangs mid-answer. Only the time spent
// waiting in Read counts, not the time between reads (writing to a slow
// client), so a busy client never makes the upstream look idle.
type idleBody struct {
	io.ReadCloser
	idle  time.Duration
	timer *time.Timer
	fired atomic.Bool
}

func newIdleBody(body io.ReadCloser, idle time.Duration, cancel context.CancelFunc) *idleBody {
	b := &idleBody{ReadCloser: body, idle: idle}
	b.timer = time.AfterFunc(time.Hour, func() { b.fired.Store(true); cancel() })
	b.timer.Stop()
	return b
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.timer.Reset(b.idle)
	n, err := b.ReadCloser.Read(p)
	b.timer.Stop()
	if err != nil && b.fired.Load() {
		return n, errUpstreamIdle
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.timer.Stop()
	return b.ReadCloser.Close()
}

// upstreamURL joins a provider base and an API path. A base that already
// ends in /v1 (as OpenAI's documented base URL does) is not doubled.
func upstreamURL(base, path string) string {
	if strings.HasSuffix(base, "/v1") {
		return base + strings.TrimPrefix(path, "/v1")
	}
	return base + path
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// relayEnd says how a relay ended.
type relayEnd int

const (
	// relayDone: the whole body reached the client.
	relayDone relayEnd = iota
	// relayStopped: the body did not reach the client whole for a reason
	// that is not the upstream's: the client went away, or the delivery
	// policy withheld the response.
	relayStopped
	// relayUnsent: the upstream broke off before a byte went to the
	// client, so another target may still answer; or Halt cut the
	// delivery policy (errHalted) before the answer went out.
	relayUnsent
	// relayCut: the upstream broke off after the response had started. A
	// stream was sent an error event; the caller must abort the connection
	// so that the body does not end like a complete one.
	relayCut
)

// startResponse sets the client's response headers from the upstream's.
// It is called when the response is committed, never before: an attempt
// that breaks off earlier leaves nothing behind for the next one.
func startResponse(w http.ResponseWriter, x *exchange, t *target, resp *http.Response) {
	h := w.Header()
	named := connectionHeaders(resp.Header)
	for k, vs := range resp.Header {
		if hopHeaders[k] || named[k] || k == "Content-Length" && resp.ContentLength < 0 {
			continue
		}
		h[k] = vs
	}
	h.Set("X-Request-Id", x.id)
	h.Set("X-Rolter-Provider", t.cfg.Provider.Name)
	h.Set("X-Rolter-Model", x.route.cfg.Model)
	if x.variant != "" {
		h.Set(VariantHeader, x.variant)
	}
}

// errTruncatedJSON is the read error of a 200 JSON answer whose whole body
// is not JSON: cut short, however cleanly the body ended.
var errTruncatedJSON = errors.New("the JSON body ended before its end")

// truncatedJSON reports whether body, the whole body of a 200 declared
// JSON, is not JSON: every such answer of the endpoints the proxy serves is
// one object, so a body that is not is a broken one. (Other statuses are
// relayed as they come: a 204 has no body.)
func truncatedJSON(resp *http.Response, body []byte) bool {
	return resp.StatusCode == http.StatusOK && respcache.IsJSON(resp.Header.Get("Content-Type")) && !json.Valid(body)
}

// errUnterminated is the read error of a 200 event stream whose body ended
// before the stream's terminal event: data: [DONE] (chat, completions),
// message_stop (Messages), response.completed, .incomplete or .failed
// (Responses). Every endpoint the proxy serves ends its streams with one.
var errUnterminated = errors.New("the event stream ended before its terminal event")

// relay sends the upstream response to the client as it arrives. A stream
// is flushed after every read, so each SSE event reaches the client when the
// upstream sends it; nothing is buffered.
//
// The response starts (status line and headers go out) with the first body
// bytes of a stream, or once a JSON body filled a copy buffer or ended, not
// with the upstream's headers: until then an upstream that breaks off can
// still be replaced by another target (relayUnsent). After it, a stream gets
// an error event in the endpoint's dialect, and the caller aborts the
// connection (relayCut). The error is the upstream's read error.
func (p *Proxy) relay(w http.ResponseWriter, r *http.Request, x *exchange, t *target, resp *http.Response) (relayEnd, error) {
	rec := p.newRecorder(x, x.lookup, resp)
	ctype := resp.Header.Get("Content-Type")
	// One predicate decides SSE everywhere (buffering, recording, flushing).
	stream := respcache.IsEventStream(ctype)
	if resp.StatusCode < 400 && !stream && (rec != nil || x.rt.policy.Active(x.dreq)) {
		return p.relayBuffered(w, r, x, t, resp, rec)
	}
	tap := newUsageTap(ctype)
	defer func() { x.usage, x.eventErr = tap.result(), tap.errorStatus() }()
	var strip *usageStrip
	if stream && x.askedUsage {
		strip = &usageStrip{}
	}
	rc := http.NewResponseController(w)
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	buf := *bufp
	started := false
	held := 0        // a JSON body's first bytes, read but not yet sent
	var last [2]byte // the last two bytes sent, to find an SSE event boundary
	end := func(err error) {
		if rec != nil {
			rec.finish(err)
		}
	}
	for {
		n, rerr := resp.Body.Read(buf[held:])
		eof := errors.Is(rerr, io.EOF)
		if !stream && !started && rerr == nil && held+n < len(buf) {
			// A JSON client waits for the whole body anyway: hold the first
			// buffer's worth, so a body that breaks off within it (most do:
			// they are small) is retried or answered 502, never sent short.
			held += n
			continue
		}
		n, held = n+held, 0
		if !started && n == 0 && eof && stream && resp.StatusCode == http.StatusOK {
			// An empty stream: nothing went out, another target may answer.
			end(errUnterminated)
			return relayUnsent, errUnterminated
		}
		if !started && eof && !stream && truncatedJSON(resp, buf[:n]) {
			// A JSON body that ended within the held buffer, not whole.
			end(errTruncatedJSON)
			return relayUnsent, errTruncatedJSON
		}
		if !started && (rerr == nil && n > 0 || eof) {
			started = true
			startResponse(w, x, t, resp)
			x.status = resp.StatusCode
			x.ttft = time.Since(x.start)
			p.metrics.TTFT.WithLabelValues(x.route.cfg.Model, x.variant).Observe(x.ttft.Seconds())
			p.firstToken(x, resp.StatusCode)
			w.WriteHeader(resp.StatusCode)
		}
		if n > 0 && started {
			tap.write(buf[:n])
		}
		out := buf[:n]
		if strip != nil && started {
			out = strip.next(out)
			if rerr != nil {
				// The stream ends here: what the filter held goes out.
				out = append(out, strip.rest()...)
			}
		}
		if len(out) > 0 && started {
			if rec != nil {
				// Recorded before it is written, so a stream whose terminal
				// event is in this chunk is stored before the client can see
				// its end and ask again.
				rec.write(out)
			}
			last = lastTwo(last, out)
			if _, werr := w.Write(out); werr != nil {
				p.clientGone(x, werr)
				end(werr)
				return relayStopped, nil
			}
			if stream {
				if err := rc.Flush(); err != nil {
					p.clientGone(x, err)
					end(err)
					return relayStopped, nil
				}
			}
		}
		if rerr == nil {
			continue
		}
		if started && (tap.done() || tap.errorStatus() != 0) || eof && !(stream && resp.StatusCode == http.StatusOK) {
			// After a stream's terminal event the answer is whole: an
			// upstream that breaks off then has lost nothing of it. After
			// its error event the client knows it failed (the caller
			// counts the failure).
			end(nil)
			return relayDone, nil
		}
		if eof {
			// A stream that ends before its terminal event was cut short,
			// however cleanly its body ended (an engine shutting down ends
			// its running streams that way).
			rerr = errUnterminated
		}
		end(rerr)
		if r.Context().Err() != nil {
			p.clientGone(x, nil)
			return relayStopped, nil
		}
		if !started {
			return relayUnsent, rerr
		}
		if stream {
			_, _ = w.Write(cutEvent(last, x.ep.dialect, rerr))
		}
		// What did arrive goes out before the connection is aborted.
		_ = rc.Flush()
		return relayCut, rerr
	}
}

// lastTwo is the last two bytes sent once b follows a stream whose last two
// were last: where an SSE event boundary is.
func lastTwo(last [2]byte, b []byte) [2]byte {
	switch len(b) {
	case 0:
		return last
	case 1:
		return [2]byte{last[1], b[0]}
	}
	return [2]byte{b[len(b)-2], b[len(b)-1]}
}

// cutEvent is what ends a stream the upstream broke off (rerr) after it had
// started, whose last two bytes sent were last: the end of the event the
// upstream left open, if it did, so that the error event stands alone (a
// blank line too many is ignored), then the error event in dialect d.
func cutEvent(last [2]byte, d dialect, rerr error) []byte {
	var ev []byte
	if last != [2]byte{'\n', '\n'} {
		ev = append(ev, "\n\n"...)
	}
	e, msg := errUpstream, "the upstream broke off the response after it had started; the response is incomplete"
	if errors.Is(rerr, errHalted) {
		e, msg = errShuttingDown, "the proxy shut down before the response finished; the response is incomplete"
	}
	return append(ev, errorEvent(d, e, msg)...)
}
