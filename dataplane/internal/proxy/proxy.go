package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"rolter.dev/dataplane/internal/metrics"
	"rolter.dev/dataplane/internal/routingstate"
	"rolter.dev/dataplane/internal/tokenize"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/delivery"
	"rolter.dev/pkg/fleet"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/reliability"
)

// Options configures a Proxy.
type Options struct {
	// Logger receives access and error logs; never prompts or completions.
	Logger *slog.Logger
	// Registerer and Gatherer back the metrics and /metrics.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// Transport overrides the upstream transport (tests, benchmarks).
	Transport http.RoundTripper
	// Registry holds live target state; a new one is made when nil.
	Registry *reliability.Registry
	// TracerProvider makes the request spans; nil means no tracing (trace
	// context is still propagated to upstreams).
	TracerProvider trace.TracerProvider
	// KVIndex, when set, feeds precise_cache_aware and lmcache_aware with
	// the engines' KV events and LMCache occupancy shared over NATS; the
	// proxy keeps its provider list in step with the config.
	KVIndex *kvindex.Index
	// Fleet, when set, shares routing observations and in-flight counts
	// with the other proxies (rolter.dev/pkg/fleet); the caller runs it.
	Fleet *fleet.Node
	// Restore is what the previous process's balancers learned (its
	// RoutingState, from the --routing-state file): the first config
	// applied builds each route's balancer with it.
	Restore []routingstate.Route
}

// Proxy serves the data plane's HTTP API. Create it with [New] and give it a
// config with [Proxy.Apply] before serving.
type Proxy struct {
	log      *slog.Logger
	metrics  *metrics.Metrics
	gatherer prometheus.Gatherer
	client   *http.Client
	tok      *tokenize.Client
	reg      *reliability.Registry
	kv       *kvindex.Index
	fleet    *fleet.Node
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator

	rt             atomic.Pointer[runtime]
	applyMu        sync.Mutex // serializes Apply; never held by requests
	draining       atomic.Bool
	openWarned     atomic.Bool
	closedWarned   atomic.Bool
	connectTimeout atomic.Int64 // nanoseconds, from the current snapshot
	writeTimeout   atomic.Int64 // nanoseconds, server.client_write_timeout_ms of the current snapshot
	cacheTotals    cacheTotals
	deliveryStats  delivery.Stats
	// usageRefused are the providers that refused a stream_options the
	// proxy added (streamusage.go).
	usageRefused refusals

	// saved is Options.Restore by route and variant, until the first
	// Apply that succeeds (under applyMu).
	saved map[string]routingstate.Route

	// halted is cancelled by Halt (haltNow); every upstream attempt hooks
	// its cancellation to it for as long as it runs.
	halted  context.Context
	haltNow context.CancelFunc
}

// New builds a Proxy with no config; it answers 503 until [Proxy.Apply].
func New(opts Options) *Proxy {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registerer == nil {
		r := prometheus.NewRegistry()
		opts.Registerer, opts.Gatherer = r, r
	}
	if opts.Registry == nil {
		opts.Registry = reliability.NewRegistry()
	}
	if opts.TracerProvider == nil {
		opts.TracerProvider = noop.NewTracerProvider()
	}
	p := &Proxy{
		kv:       opts.KVIndex,
		fleet:    opts.Fleet,
		tracer:   opts.TracerProvider.Tracer("rolter.dev/dataplane/proxy"),
		prop:     propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		log:      opts.Logger.With("component", "proxy"),
		metrics:  metrics.New(opts.Registerer),
		gatherer: opts.Gatherer,
		reg:      opts.Registry,
	}
	p.halted, p.haltNow = context.WithCancel(context.Background())
	if len(opts.Restore) > 0 {
		p.saved = make(map[string]routingstate.Route, len(opts.Restore))
		for _, r := range opts.Restore {
			p.saved[restoreKey(r.Route, r.Variant)] = r
		}
	}
	p.connectTimeout.Store(int64(10 * time.Second))
	p.writeTimeout.Store(int64(config.DefaultClientWriteTimeoutMS * time.Millisecond))
	transport := opts.Transport
	if transport == nil {
		transport = p.newTransport()
	}
	p.client = &http.Client{
		Transport: transport,
		// Upstream redirects are answered to the client as they are.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	p.tok = tokenize.New(p.client)
	opts.Registerer.MustRegister(&inflightCollector{p: p})
	if p.fleet != nil {
		opts.Registerer.MustRegister(&fleetCollector{p: p})
	}
	return p
}

func (p *Proxy) newTransport() *http.Transport {
	dialer := &net.Dialer{KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := *dialer
			d.Timeout = time.Duration(p.connectTimeout.Load())
			return d.DialContext(ctx, network, addr)
		},
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
		// Bodies pass through byte for byte; transparent gzip would
		// re-chunk streams and hide the upstream's encoding.
		DisableCompression: true,
	}
}

// Registry returns the live target state, for the health prober.
func (p *Proxy) Registry() *reliability.Registry { return p.reg }

// Metrics returns the proxy's collectors, for components that report into
// them (the health prober, the config watcher).
func (p *Proxy) Metrics() *metrics.Metrics { return p.metrics }

// Snapshot returns the config in use, or nil before the first Apply.
func (p *Proxy) Snapshot() *config.Snapshot {
	if rt := p.rt.Load(); rt != nil {
		return rt.snap
	}
	return nil
}

// Apply builds a runtime from snap and swaps it in. On error the current
// runtime keeps serving. Safe for concurrent use.
func (p *Proxy) Apply(snap *config.Snapshot) error {
	p.applyMu.Lock()
	defer p.applyMu.Unlock()
	prev := p.rt.Load()
	rt, err := p.newRuntime(snap, prev)
	if err != nil {
		return err
	}
	p.saved = nil // read by the first runtime only: a later one inherits from it
	p.connectTimeout.Store(int64(time.Duration(snap.Timeouts.ConnectSecs) * time.Second))
	p.writeTimeout.Store(int64(time.Duration(snap.Server.ClientWriteTimeoutMS) * time.Millisecond))
	if p.kv != nil {
		var names []string
		for _, pr := range snap.Providers {
			if pr.PublishesKV() {
				names = append(names, pr.Name)
			}
		}
		if err := p.kv.SetProviders(names); err != nil {
			p.log.Warn("KV index: following the new providers", "err", err)
		}
	}
	p.rt.Store(rt)
	rt.retain(p.reg)
	if p.fleet != nil {
		p.fleet.Retain(rt.fleetRoutes())
	}
	if prev != nil && prev.cache != nil && prev.cache != rt.cache {
		// Requests still on prev may store into it; their errors are misses.
		p.cacheTotals.retire(prev.cache.cache.Stats())
		if err := prev.cache.close(); err != nil {
			p.log.Warn("closing the previous cache backend", "err", err)
		}
	}
	if prev != nil && prev.accounting != nil && prev.accounting != rt.accounting {
		// Records of requests still on prev are dropped (and counted) once
		// it is closed; Close flushes what is queued.
		if err := prev.accounting.sink.Close(); err != nil {
			p.log.Warn("closing the previous accounting sink", "err", err)
		}
	}
	p.metrics.ConfigVersion.Set(float64(rt.generation))
	p.metrics.ConfigInfo.Reset()
	p.metrics.ConfigInfo.WithLabelValues(snap.Version).Set(1)
	if prev != nil {
		p.metrics.ConfigReloads.Inc()
	}
	for _, pr := range snap.Providers {
		h := 0.0
		if p.reg.Provider(pr.Name).Healthy() {
			h = 1
		}
		p.metrics.ProviderHealthy.WithLabelValues(pr.Name).Set(h)
	}
	return nil
}

// Close flushes and stops the accounting sink. Call it once the server has
// stopped serving.
func (p *Proxy) Close() error {
	if rt := p.rt.Load(); rt != nil && rt.accounting != nil {
		return rt.accounting.sink.Close()
	}
	return nil
}

// SetDraining makes /readyz fail so load balancers stop sending traffic,
// while requests still being sent are served, with "Connection: close" so
// that keep-alive clients reconnect (through the balancer, to a proxy that
// is not draining).
func (p *Proxy) SetDraining(v bool) { p.draining.Store(v) }

// Halt ends what is still running at the end of a drain, so that closing
// the server's connections then cuts nothing: every call the proxy makes
// for a request is cancelled (upstream attempts, count_tokens' counts, an
// engine's /tokenize for routing, post_response plugins and the PII
// sanitizer); a stream that had started gets an error event saying the
// proxy shut down and its connection is aborted, so it cannot pass for a
// complete answer; a response that had not started is answered 503
// shutting_down in the endpoint's dialect, not retried on another target,
// nor routed when Halt cut a call made before routing; requests arriving
// after Halt get the same 503. None of it counts against the targets. Halt
// does not wait for the handlers to finish (http.Server.Shutdown does). It
// is idempotent and safe for concurrent use, and cannot be undone.
func (p *Proxy) Halt() { p.haltNow() }

// errHalted is the error of an upstream attempt that Halt cancelled: the
// transport error of send, or the read error of the response body.
var errHalted = errors.New("proxy: halted: the proxy shut down before the response finished")

// untilHalt returns a child of ctx that Halt cancels with the cause
// errHalted, and its cancel function, which also unhooks it from the halt:
// call it when the call is done, else the hook stays registered on the
// proxy's long-lived halt context.
func (p *Proxy) untilHalt(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(p.halted, func() { cancel(errHalted) })
	return ctx, func(cause error) { stop(); cancel(cause) }
}

// halted reports whether Halt cancelled ctx (one of untilHalt, or its child).
func halted(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errHalted) }

// allowRead is the Allow header of the paths that are read: HEAD as GET
// (net/http sends a HEAD answer's headers without its body).
const allowRead = "GET, HEAD"

// headerWriter adds the headers that are decided when a response's headers
// go out, not when its request arrived: "Connection: close" while the proxy
// drains, and the CORS headers.
//
// Draining: deciding then covers a request already in flight when draining
// starts (a slow answer, a stream waiting for its first event): its response
// closes the connection too, instead of leaving the client a keep-alive
// connection that the server closes at shutdown, which can cross the next
// request sent on it (a POST, that HTTP/1.1 cannot retry).
//
// CORS: only then are the headers final, the upstream's included, which
// corsPolicy.answer replaces with the proxy's and exposes.
type headerWriter struct {
	http.ResponseWriter
	draining *atomic.Bool
	// cors is the policy of the request (nil: none), origin its Origin.
	cors   *corsPolicy
	origin string
	wrote  bool
}

func (w *headerWriter) header() {
	if !w.wrote {
		w.wrote = true
		if w.draining.Load() {
			w.ResponseWriter.Header().Set("Connection", "close")
		}
		if w.cors != nil {
			w.cors.answer(w.ResponseWriter.Header(), w.origin)
		}
	}
}

func (w *headerWriter) WriteHeader(code int) {
	if code >= 200 { // 1xx informational headers are not the response's
		w.header()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *headerWriter) Write(b []byte) (int, error) {
	w.header()
	return w.ResponseWriter.Write(b)
}

// FlushError is what http.ResponseController calls: a flush before any
// write sends the headers too.
func (w *headerWriter) FlushError() error {
	w.header()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the server's writer (read
// deadlines, full duplex).
func (w *headerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// endpoint describes one API path.
type endpoint struct {
	path    string
	dialect dialect
	// serves reports whether a provider kind can take this endpoint.
	serves func(kind string) bool
	// streamUsage: its streams carry usage only when asked (OpenAI's
	// stream_options.include_usage; streamusage.go).
	streamUsage bool
}

var endpoints = map[string]*endpoint{
	"/v1/chat/completions": {path: "/v1/chat/completions", serves: notAnthropic, streamUsage: true},
	"/v1/completions":      {path: "/v1/completions", serves: notAnthropic, streamUsage: true},
	"/v1/responses":        {path: "/v1/responses", serves: notAnthropic},
	"/v1/embeddings":       {path: "/v1/embeddings", serves: notAnthropic},
	// vLLM's scoring endpoints (pooling/scoring/api_router.py at
	// 055e47c28003): rerank (Jina's and Cohere's v1 and v2 shapes) and
	// score, each at the path vLLM names canonical and the /v1 ones it
	// keeps. Only an engine serves them.
	"/rerank":    {path: "/rerank", serves: engineOnly},
	"/v1/rerank": {path: "/v1/rerank", serves: engineOnly},
	"/v2/rerank": {path: "/v2/rerank", serves: engineOnly},
	"/score":     {path: "/score", serves: engineOnly},
	"/v1/score":  {path: "/v1/score", serves: engineOnly},
	// vLLM serves the Messages API too; the OpenAI API does not.
	"/v1/messages": {path: "/v1/messages", dialect: dialectAnthropic, serves: func(k string) bool { return k != config.KindOpenAI }},
}

func notAnthropic(kind string) bool { return kind != config.KindAnthropic }

func engineOnly(kind string) bool { return kind == config.KindOpenAICompatible }

// notFoundDialect is the dialect of the 404 for a path no route serves,
// the API the client speaks: a request with an anthropic-version header
// (every Anthropic SDK sends one, whatever the path: /v1/files,
// /v1/complete) or a path under /v1/messages/ (a Messages API resource
// the gateway does not serve, such as batches, or a mistyped
// count_tokens) comes from an Anthropic client, which reads only the
// Anthropic error shape; any other gets the OpenAI one.
func notFoundDialect(r *http.Request) dialect {
	if strings.HasPrefix(r.URL.Path, "/v1/messages/") {
		return dialectAnthropic
	}
	return clientDialect(r)
}

// clientDialect is the API a request on a path both APIs serve
// (/v1/models) speaks: Anthropic's when it carries an anthropic-version
// header, which every Anthropic SDK sends and the Anthropic API requires,
// else OpenAI's. x-api-key alone does not decide it: any client may send
// its key that way (see credentials).
func clientDialect(r *http.Request) dialect {
	if r.Header.Get("Anthropic-Version") != "" {
		return dialectAnthropic
	}
	return dialectOpenAI
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every write to the client is bounded (server.client_write_timeout_ms,
	// read once per request): a client that stops reading holds nothing
	// for longer.
	sw := newStallWriter(w, r, time.Duration(p.writeTimeout.Load()))
	defer sw.finish()
	w = sw
	switch r.URL.Path {
	case "/healthz":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
		return
	case "/readyz":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch {
		case p.draining.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("draining\n"))
		case p.rt.Load() == nil:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("no config\n"))
		default:
			_, _ = w.Write([]byte("ready\n"))
		}
		return
	}
	hw := &headerWriter{ResponseWriter: w, draining: &p.draining}
	w = hw
	rt := p.rt.Load()
	// A preflight is answered here, before any auth: browsers send no key
	// on it (cors.go).
	if c := rt.corsFor(r.URL.Path); c != nil {
		if isPreflight(r) {
			p.servePreflight(w, r, c)
			return
		}
		hw.cors, hw.origin = c, r.Header.Get("Origin")
	}
	switch r.URL.Path {
	case "/v1/models":
		w.Header().Set("X-Request-Id", requestID(r))
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", allowRead)
			writeError(w, clientDialect(r), errMethodNotAllowed, "use GET /v1/models")
			return
		}
		p.serveModels(w, r)
		return
	case countTokensPath:
		w.Header().Set("X-Request-Id", requestID(r))
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, dialectAnthropic, errMethodNotAllowed, "use POST "+countTokensPath)
			return
		}
		p.serveCountTokens(w, r)
		return
	}
	if id, ok := strings.CutPrefix(r.URL.Path, "/v1/models/"); ok && id != "" {
		w.Header().Set("X-Request-Id", requestID(r))
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", allowRead)
			writeError(w, clientDialect(r), errMethodNotAllowed, "use GET /v1/models/{model}")
			return
		}
		p.serveModel(w, r, id)
		return
	}
	if rt != nil && r.URL.Path == rt.snap.Server.MetricsPath || rt == nil && r.URL.Path == config.DefaultMetricsPath {
		promhttp.HandlerFor(p.gatherer, promhttp.HandlerOpts{}).ServeHTTP(w, r)
		return
	}
	w.Header().Set("X-Request-Id", requestID(r))
	if id, sub, ok := storedResponsePath(r.URL.Path); ok {
		p.serveStoredResponse(w, r, id, sub)
		return
	}
	ep, ok := endpoints[r.URL.Path]
	if !ok {
		writeError(w, notFoundDialect(r), errNotFound, "no such endpoint: "+r.URL.Path)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, ep.dialect, errMethodNotAllowed, "use POST "+ep.path)
		return
	}
	p.serveAPI(w, r, ep)
}

// requestID returns the client's x-request-id when it is sane, else a new one.
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 && printableASCII(id) {
		return id
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// credentials returns the virtual key the client presented: the
// Authorization header's Bearer token, else x-api-key (Anthropic's header;
// also when Authorization carries other credentials, such as a forward
// proxy's Basic ones). malformed reports an Authorization header that is
// not `Bearer <key>` when there is no x-api-key either: a credential sent
// the wrong way, which deserves another answer than a missing one.
func credentials(r *http.Request) (secret string, malformed bool) {
	a := r.Header.Get("Authorization")
	if len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		if s := strings.TrimSpace(a[7:]); s != "" {
			return s, false
		}
	}
	if k := strings.TrimSpace(r.Header.Get("X-Api-Key")); k != "" {
		return k, false
	}
	return "", a != ""
}

// authenticate resolves the request's key. A nil key with a nil error means
// the proxy is open (no keys configured).
func (p *Proxy) authenticate(rt *runtime, r *http.Request) (*config.Key, *apiError, string) {
	if rt.snap.Open() {
		if p.openWarned.CompareAndSwap(false, true) {
			msg := "no virtual keys configured and server.require_auth = false: the proxy is open to every client"
			if rt.cors != nil && rt.cors.anyOrigin {
				// A browser on the operator's network runs any site's
				// script, which may then call the gateway and read it.
				msg += `, and server.cors.allowed_origins = ["*"] (the default) lets any web page a user opens call it; set allowed_origins to your pages' origins, or [] to refuse browsers`
			}
			p.log.Warn(msg)
		}
		return nil, nil, ""
	}
	if rt.snap.KeyCount() == 0 && p.closedWarned.CompareAndSwap(false, true) {
		p.log.Warn("no virtual keys configured and server.require_auth is true (the default): every request is refused; add [[virtual_keys]], or set server.require_auth = false to run open")
	}
	secret, malformed := credentials(r)
	key, err := rt.snap.Authenticate(secret, time.Now())
	switch {
	case malformed:
		p.metrics.AuthFailures.WithLabelValues("invalid").Inc()
		return nil, &errInvalidKey, "malformed Authorization header: send a rolter virtual key as `Authorization: Bearer sk-rolter-…` or `x-api-key`"
	case errors.Is(err, config.ErrKeyMissing):
		p.metrics.AuthFailures.WithLabelValues("missing").Inc()
		return nil, &errMissingKey, "missing api key: send a rolter virtual key as `Authorization: Bearer sk-rolter-…` or `x-api-key`"
	case err != nil:
		p.metrics.AuthFailures.WithLabelValues("invalid").Inc()
		return nil, &errInvalidKey, "invalid api key" + providerKeyHint(secret)
	}
	return key, nil, ""
}

// providerKeyHint helps clients that pasted a provider's key instead of a
// rolter virtual key.
func providerKeyHint(secret string) string {
	switch {
	case strings.HasPrefix(secret, "sk-ant-"):
		return " (this looks like an Anthropic API key; send your rolter virtual key instead)"
	case strings.HasPrefix(secret, "sk-proj-") || (strings.HasPrefix(secret, "sk-") && !strings.HasPrefix(secret, "sk-rolter-")):
		return " (this looks like an OpenAI API key; send your rolter virtual key instead)"
	}
	return ""
}
