package proxy

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"rolter.dev/dataplane/internal/tokenize"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/routing"
)

// routesOnKV reports whether strategy reads the engines' KV events through
// the request's token ids: only these get token ids from the engine, so no
// other route pays a /tokenize call for ids its balancer would not read.
func routesOnKV(strategy string) bool {
	return strategy == routing.PreciseCacheAware || strategy == routing.PredictedTTFT
}

// tokenIDs fills x.rctx.TokenIDs, for a request that came without the
// x-rolter-vllm-token-ids header (the header wins) to a route that routes
// on KV events, with the token ids one eligible replica's POST /tokenize
// computes for raw, the body as it will be forwarded. Every replica of a
// route serves the same model with the same tokenizer and chat template
// (docs/routing.md), so any one of them answers for all: a uniformly
// random target that publishes KV events and allows tokenize, among those
// the key may use and that are healthy and not cooling down, and whose
// /tokenize did not time out or go unanswered lately (parked for the
// cooldown's base time; asked anyway when every candidate is). A failure or
// a timeout leaves the ids unset: the route decides on its approximate
// state, and rolter_tokenize_total counts why. Halt cuts the call
// (shutting_down, no verdict on the replica); serveAPI then refuses the
// request.
func (p *Proxy) tokenIDs(ctx context.Context, x *exchange, raw []byte) {
	if p.kv == nil || len(x.rctx.TokenIDs) > 0 || len(x.pools) == 0 || !routesOnKV(x.pools[0].pool.strategy) {
		return
	}
	// The assigned variant's replicas (a variant may run another build,
	// with another tokenizer); a plain route's own.
	ps := &x.pools[0]
	model := x.route.cfg.Model
	count := func(outcome string) { p.metrics.Tokenize.WithLabelValues(model, outcome).Inc() }
	if x.rctx.ReadsNoCache {
		// The engine reads none of its prompt from its cache: its ids
		// would route it nowhere better.
		count("reads_no_cache")
		return
	}
	now := time.Now()
	var cands, parked [routing.MaxTargets]int
	n, np := 0, 0
	for i := range ps.pool.targets {
		t := &ps.pool.targets[i]
		kv := t.cfg.Provider.KVEvents
		if !ps.allowed.Has(i) || kv == nil || (kv.Tokenize != nil && !*kv.Tokenize) || t.cfg.Provider.Kind != config.KindOpenAICompatible {
			continue
		}
		if !t.health.Healthy() || (x.rt.snap.Cooldown.BaseSecs > 0 && t.state.CoolingDown(now)) {
			continue
		}
		if p.tok.Parked(t.cfg.Provider.APIBase, now) {
			parked[np] = i
			np++
			continue
		}
		cands[n] = i
		n++
	}
	if n == 0 {
		// Every candidate's /tokenize failed lately: ask one anyway, which
		// tells when it is back.
		cands, n = parked, np
	}
	if n == 0 {
		count("none")
		return
	}
	t := &ps.pool.targets[cands[rand.IntN(n)]]
	tok, ids, shape, ok := tokenize.Build(x.ep.path, raw, t.cfg.Model)
	switch {
	case !ok:
		count("unsupported")
		return
	case ids != nil:
		x.rctx.TokenIDs = ids
		count("cached")
		return
	case p.tok.Distrusted(t.cfg.Model, x.ep.path, shape, now):
		// This endpoint's ids, or its ids for requests of this shape,
		// were lately proven wrong (checkTokenized).
		count("distrusted")
		return
	}
	if ids, ok := p.tok.Cached(tok); ok {
		x.rctx.TokenIDs, x.tokenizedFor, x.tokenizedShape = ids, t.cfg.Model, shape
		count("cached")
		return
	}
	timeout := time.Duration(t.cfg.Provider.KVEvents.TokenizeTimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = config.DefaultTokenizeTimeoutMS * time.Millisecond
	}
	ctx, stop := p.untilHalt(ctx)
	defer stop(nil)
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cctx, span := p.tracer.Start(cctx, "tokenize")
	start := time.Now()
	ids, err := p.tok.Tokenize(cctx, t.cfg.Provider.APIBase, t.cfg.Provider.APIKey, tok)
	p.metrics.TokenizeSeconds.WithLabelValues(model).Observe(time.Since(start).Seconds())
	outcome := "engine"
	switch {
	case err == nil:
		x.rctx.TokenIDs, x.tokenizedFor, x.tokenizedShape = ids, t.cfg.Model, shape
	case halted(ctx):
		outcome = "shutting_down"
	case errors.Is(err, context.DeadlineExceeded) || cctx.Err() != nil && ctx.Err() == nil:
		outcome = "timeout"
	case errors.Is(err, tokenize.ErrRejected):
		outcome = "rejected"
	default:
		outcome = "error"
	}
	if park := time.Duration(x.rt.snap.Cooldown.BaseSecs) * time.Second; park > 0 && ctx.Err() == nil &&
		(outcome == "timeout" || errors.Is(err, tokenize.ErrUnavailable)) {
		// Not asked again for a cooldown's base time while another
		// replica can answer (the request itself is not failed over: the
		// replica may still be serving).
		p.tok.Park(t.cfg.Provider.APIBase, time.Now().Add(park))
	}
	span.SetAttributes(attribute.String("rolter.provider", t.cfg.Provider.Name), attribute.String("rolter.tokenize", outcome),
		attribute.Int("rolter.tokens", len(ids)))
	span.End()
	count(outcome)
}

// checkTokenized counts whether the token ids a request was routed on,
// from an engine's /tokenize, are as many as the prompt the answer's usage
// reports: the one check of the conversion (package tokenize) against the
// vLLM release actually serving, whose templates and request handling may
// differ from the source the conversion follows. Only for the assigned
// pool (a fall-over variant may serve another model), and only when the
// answer reported its prompt (a stream without usage does not). Equal
// lengths do not prove equal ids; unequal ones prove the ids wrong, and an
// endpoint whose ids are proven wrong more often than not is distrusted
// for a while (tokenize.Client.Check): its requests then route on the
// approximate state.
func (p *Proxy) checkTokenized(x *exchange) {
	if x.tokenizedFor == "" || x.cur != 0 || !x.usage.Known || x.usage.PromptTokens <= 0 {
		return
	}
	match := x.usage.PromptTokens == int64(len(x.rctx.TokenIDs))
	result := "match"
	if !match {
		result = "mismatch"
		p.log.LogAttrs(x.ctx, slog.LevelDebug, "token ids unlike the engine's prompt",
			slog.String("request_id", x.id), slog.String("endpoint", x.ep.path),
			slog.Int("ids", len(x.rctx.TokenIDs)), slog.Int64("prompt_tokens", x.usage.PromptTokens))
	}
	p.metrics.TokenizeChecked.WithLabelValues(x.route.cfg.Model, x.ep.path, result).Inc()
	if d, shapeOnly := p.tok.Check(x.tokenizedFor, x.ep.path, x.tokenizedShape, match, time.Now()); d > 0 {
		what := "this endpoint"
		if shapeOnly {
			what = "this endpoint's requests of this shape"
		}
		p.log.LogAttrs(x.ctx, slog.LevelWarn, "token ids from /tokenize disagree with the engine's prompts: routing "+what+" on the approximate state for a while",
			slog.String("model", x.tokenizedFor), slog.String("endpoint", x.ep.path), slog.String("shape", x.tokenizedShape.String()),
			slog.Duration("for", d), slog.Int("ids", len(x.rctx.TokenIDs)), slog.Int64("prompt_tokens", x.usage.PromptTokens))
	}
}

// engineState is what the route's replicas report about themselves, for
// predicted_ttft: the waiting and running counts of [providers.engine_load]
// scrapes (fresh within stale_ms) and the KV capacity of
// vllm:cache_config_info.
type engineState struct{ targets []target }

var _ routing.EngineState = engineState{}

// Counts implements routing.EngineState: the waiting count, and the engine
// load less it as the running count (one scrape sets both), with the
// scrape's age.
func (e engineState) Counts(i int) (waiting, running int, age time.Duration, ok bool) {
	load, waiting, age, ok := e.scraped(i)
	return waiting, max(load-waiting, 0), age, ok
}

// scraped returns target i's scraped engine load (running + waiting), its
// waiting part and how old the scrape is; ok is false when it has no
// [providers.engine_load] or the scrape is stale.
func (e engineState) scraped(i int) (load, waiting int, age time.Duration, ok bool) {
	if i < 0 || i >= len(e.targets) {
		return 0, 0, 0, false
	}
	t := &e.targets[i]
	el := t.cfg.Provider.EngineLoad
	if el == nil {
		return 0, 0, 0, false
	}
	now := time.Now()
	if load, ok = t.health.EngineLoad(now, el.Stale); !ok {
		return 0, 0, 0, false
	}
	if waiting, ok = t.health.EngineWaiting(now, el.Stale); !ok {
		return 0, 0, 0, false
	}
	age, _ = t.health.EngineLoadAge(now)
	return load, waiting, age, true
}

// KVCapacityTokens implements routing.EngineState.
func (e engineState) KVCapacityTokens(i int) int {
	if i < 0 || i >= len(e.targets) {
		return 0
	}
	return e.targets[i].health.KVCapacityTokens()
}
