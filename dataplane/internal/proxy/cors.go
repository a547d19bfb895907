package proxy

import (
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"rolter.dev/pkg/config"
)

// corsPolicy is [server.cors] of one runtime, ready for requests. A
// browser's preflight (OPTIONS with Origin and
// Access-Control-Request-Method) to an API path is answered by the proxy
// itself: it carries no key (browsers never send credentials on one),
// reaches no upstream and is no API request in the metrics. Every other
// response to a request on an API path gets the Access-Control-* headers
// of the policy as its headers go out (see headerWriter), whatever
// produced it: a relayed answer or stream, a cache hit, an error of the
// proxy's own. The upstream's Access-Control-* headers are dropped then:
// vLLM answers an Origin too, and two Allow-Origin values make browsers
// refuse the response.
//
// nil is CORS off (allowed_origins = []): nothing is added or dropped,
// and OPTIONS gets 405 as any method a path does not serve.
type corsPolicy struct {
	// anyOrigin: allowed_origins = ["*"], answered "*" (validation keeps
	// credentials off then), so the answer does not depend on Origin.
	anyOrigin bool
	origins   map[string]bool // lower case
	// headers is Access-Control-Allow-Headers; "" reflects what the
	// preflight asks for (allowed_headers = ["*"], as vLLM does: the
	// literal "*" would not cover Authorization).
	headers     string
	maxAge      string
	credentials bool
}

func newCORSPolicy(c config.CORS) *corsPolicy {
	if len(c.AllowedOrigins) == 0 {
		return nil
	}
	p := &corsPolicy{maxAge: strconv.Itoa(c.MaxAgeSecs), credentials: c.AllowCredentials}
	if slices.Equal(c.AllowedOrigins, []string{"*"}) {
		p.anyOrigin = true
	} else {
		p.origins = make(map[string]bool, len(c.AllowedOrigins))
		for _, o := range c.AllowedOrigins {
			p.origins[strings.ToLower(o)] = true
		}
	}
	if !slices.Equal(c.AllowedHeaders, []string{"*"}) {
		p.headers = strings.Join(c.AllowedHeaders, ", ")
	}
	return p
}

// corsFor returns the policy of a request on path, or nil: CORS is off, no
// config is loaded yet, or the path is not an API path (under /v1/, or an
// endpoint elsewhere: /rerank, /v2/rerank, /score).
func (rt *runtime) corsFor(path string) *corsPolicy {
	if rt == nil || rt.cors == nil || !strings.HasPrefix(path, "/v1/") && endpoints[path] == nil || path == rt.snap.Server.MetricsPath {
		return nil
	}
	return rt.cors
}

// allowOrigin is the Access-Control-Allow-Origin answering origin, or ""
// when origin may not call the API.
func (c *corsPolicy) allowOrigin(origin string) string {
	switch {
	case origin == "":
		return ""
	case c.anyOrigin:
		return "*"
	case c.origins[strings.ToLower(origin)]:
		return origin
	}
	return ""
}

// isPreflight reports whether r is a CORS preflight. An OPTIONS without
// these headers is not one, and gets 405.
func isPreflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != ""
}

// servePreflight answers a preflight: 204, with the Access-Control-*
// headers when the origin is allowed, without them (which the browser
// takes as a refusal) when it is not.
func (p *Proxy) servePreflight(w http.ResponseWriter, r *http.Request, c *corsPolicy) {
	h := w.Header()
	origin := r.Header.Get("Origin")
	method := r.Header.Get("Access-Control-Request-Method")
	methods := pathMethods(r.URL.Path)
	var vary []string
	if !c.anyOrigin {
		vary = append(vary, "Origin")
	}
	if c.headers == "" {
		vary = append(vary, "Access-Control-Request-Headers")
	}
	if methods == "" {
		// A path the proxy does not serve answers every method with the
		// same 404: the method asked for is allowed, so that the page
		// reads that answer instead of a network error.
		vary = append(vary, "Access-Control-Request-Method")
		if config.IsToken(method) {
			methods = method
		}
	}
	if len(vary) > 0 {
		h.Set("Vary", strings.Join(vary, ", "))
	}
	allow := c.allowOrigin(origin)
	if allow == "" {
		p.metrics.CORSPreflights.WithLabelValues("denied").Inc()
		p.log.LogAttrs(r.Context(), slog.LevelDebug, "CORS preflight from an origin not in server.cors.allowed_origins",
			slog.String("origin", origin), slog.String("endpoint", r.URL.Path))
		w.WriteHeader(http.StatusNoContent)
		return
	}
	p.metrics.CORSPreflights.WithLabelValues("allowed").Inc()
	h.Set("Access-Control-Allow-Origin", allow)
	if c.credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
	if methods != "" {
		h.Set("Access-Control-Allow-Methods", methods)
	}
	headers := c.headers
	if headers == "" {
		headers = strings.Join(r.Header.Values("Access-Control-Request-Headers"), ", ")
	}
	if headers != "" {
		h.Set("Access-Control-Allow-Headers", headers)
	}
	h.Set("Access-Control-Max-Age", c.maxAge)
	w.WriteHeader(http.StatusNoContent)
}

// pathMethods is Access-Control-Allow-Methods for path: the methods
// ServeHTTP serves there, "" for a path it does not serve.
func pathMethods(path string) string {
	switch {
	case path == "/v1/models":
		return allowRead
	case path == countTokensPath || endpoints[path] != nil:
		return http.MethodPost
	}
	if id, ok := strings.CutPrefix(path, "/v1/models/"); ok && id != "" {
		return allowRead
	}
	if _, sub, ok := storedResponsePath(path); ok {
		return storedResponseMethods(sub)
	}
	return ""
}

// answer sets the CORS headers of an actual response to a request with
// origin ("" for none) as its headers go out.
func (c *corsPolicy) answer(h http.Header, origin string) {
	for k := range h {
		if strings.HasPrefix(k, "Access-Control-") {
			delete(h, k) // the upstream's: the proxy answers for CORS
		}
	}
	if !c.anyOrigin {
		// For every response, with an Origin or without: a cache must
		// not serve one origin's answer to another.
		addVary(h, "Origin")
	}
	allow := c.allowOrigin(origin)
	if allow == "" {
		return
	}
	h.Set("Access-Control-Allow-Origin", allow)
	if c.credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
	if names := exposable(h); names != "" {
		h.Set("Access-Control-Expose-Headers", names)
	}
}

// corsSafelisted are the response headers a page reads without
// Access-Control-Expose-Headers (Fetch, "CORS-safelisted response-header
// name").
var corsSafelisted = map[string]bool{
	"Cache-Control": true, "Content-Language": true, "Content-Length": true, "Content-Type": true,
	"Expires": true, "Last-Modified": true, "Pragma": true,
}

// exposable lists the headers of h a page cannot read unless exposed:
// the proxy's own (x-request-id, x-rolter-cache, x-rolter-variant,
// x-rolter-error…), a plugin's annotations, the upstream's retry-after and
// rate-limit headers (x-ratelimit-*, anthropic-ratelimit-*), which the
// proxy passes through. The names are those of this response, not a fixed
// list: no list covers every upstream's, and the "*" wildcard does not
// work with credentials.
func exposable(h http.Header) string {
	names := make([]string, 0, len(h))
	for k := range h {
		if !corsSafelisted[k] && !strings.HasPrefix(k, "Access-Control-") && k != "Set-Cookie" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// addVary adds name to the Vary header unless it is there already.
func addVary(h http.Header, name string) {
	for _, v := range h.Values("Vary") {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f == "*" || strings.EqualFold(f, name) {
				return
			}
		}
	}
	h.Add("Vary", name)
}
