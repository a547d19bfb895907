package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"rolter.dev/dataplane/internal/responseid"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/delivery"
	"rolter.dev/pkg/respcache"
)

// This file keeps the requests on a stored Responses API answer on the
// replica that stores it (see package responseid): a request that
// continues one (previous_response_id) is routed to it alone, and the
// requests on one by id are forwarded to it.

// storedResponsesPrefix is the path of the requests on one stored response.
const storedResponsesPrefix = "/v1/responses/"

// namesResponses reports whether the proxy chooses the response id of a
// Responses request sent to t: an engine's (vLLM, SGLang) takes it as
// request_id; a hosted API keeps its own store (and may refuse a
// parameter it does not know).
func namesResponses(t *target) bool { return t.cfg.Provider.Kind == config.KindOpenAICompatible }

// storesFor reports whether t is the target an id with tag names.
func storesFor(t *target, tag string) bool {
	return namesResponses(t) && responseid.Tag(t.cfg.Provider.Name) == tag
}

// pinStored keeps in x's pools only the targets that store the response
// prev (an id the gateway issued, with tag), so that no attempt goes where
// the engine would answer 404; there is no other target to fail over to.
// A target that is down is still tried (only it can answer). The error when
// the route has no such target the key may use.
func pinStored(x *exchange, prev, tag string) (*apiError, string) {
	found, denied := false, false
	for k := range x.pools {
		ps := &x.pools[k]
		for i := range ps.pool.targets {
			t := &ps.pool.targets[i]
			if !storesFor(t, tag) {
				ps.allowed.Remove(i)
				continue
			}
			denied = denied || !ps.allowed.Has(i)
			found = found || ps.allowed.Has(i)
		}
	}
	switch {
	case found:
		return nil, ""
	case denied:
		return &errProviderDenied, fmt.Sprintf("this key may not use the replica that stores response %q (previous_response_id)", echoedName(prev))
	}
	return &errNotFound, fmt.Sprintf("previous_response_id %q names a response stored by a replica that model %q's route does not have (any longer)", echoedName(prev), echoedName(x.route.cfg.Model))
}

// otherAccount reports whether a 404 from t to x may be another hosted
// account's to answer: x continues a response the gateway did not name, t
// is a hosted openai provider (OpenAI keeps each account's responses
// apart), and an untried openai target remains. It then keeps only such
// targets for the next attempts: no engine holds an id it did not make.
func otherAccount(x *exchange, t *target) bool {
	if !x.hostedPrevious || t.cfg.Provider.Kind != config.KindOpenAI {
		return false
	}
	left := false
	for k := range x.pools {
		ps := &x.pools[k]
		for i := range ps.pool.targets {
			if ps.pool.targets[i].cfg.Provider.Kind != config.KindOpenAI {
				ps.allowed.Remove(i)
			}
			left = left || ps.allowed.Has(i) && !ps.tried.Has(i)
		}
	}
	return left
}

// storedResponsePath splits a path under /v1/responses/ into the response
// id and what follows it: "" (GET, DELETE), "/cancel" (POST) or
// "/input_items" (GET), the requests OpenAI's API and vLLM serve on a
// stored response; false for any other path.
func storedResponsePath(path string) (id, sub string, ok bool) {
	rest, ok := strings.CutPrefix(path, storedResponsesPrefix)
	if !ok {
		return "", "", false
	}
	id, sub, found := strings.Cut(rest, "/")
	if found {
		sub = "/" + sub
	}
	// compact and input_tokens are OpenAI's own POST endpoints, not ids.
	if id == "" || id == "compact" || id == "input_tokens" || sub != "" && sub != "/cancel" && sub != "/input_items" {
		return "", "", false
	}
	return id, sub, true
}

// storedResponseMethods is the Allow header of a stored-response path.
func storedResponseMethods(sub string) string {
	switch sub {
	case "/cancel":
		return http.MethodPost
	case "/input_items":
		return http.MethodGet
	}
	return http.MethodGet + ", " + http.MethodDelete
}

// serveStoredResponse forwards a request on one stored response to the
// replica its id names, or for an id the gateway did not issue to the
// hosted openai providers in turn (storingTargets; none: 404, said so), and
// answers through the delivery policy: a JSON answer held whole when the
// policy may change it, anything else relayed as it comes (a retrieval
// with stream=true is an event stream).
func (p *Proxy) serveStoredResponse(w http.ResponseWriter, r *http.Request, id, sub string) {
	start := time.Now()
	status, provider := 0, ""
	label := storedResponsesPrefix + "{id}" + sub // the endpoint in metrics and logs
	defer func() {
		p.metrics.Requests.WithLabelValues(label, "", strconv.Itoa(status), "").Inc()
		p.log.LogAttrs(r.Context(), slog.LevelInfo, "request", slog.String("request_id", w.Header().Get("X-Request-Id")),
			slog.String("endpoint", label), slog.String("provider", provider), slog.Int("status", status),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
	}()
	rt, cb := p.watchRequest(r, start)
	fail := func(e apiError, msg string) {
		status = e.status
		refuse(w, r, cb, dialectOpenAI, e, msg)
	}
	if allow := storedResponseMethods(sub); !slices.Contains(strings.Split(allow, ", "), r.Method) {
		w.Header().Set("Allow", allow)
		fail(errMethodNotAllowed, "use "+allow+" "+storedResponsesPrefix+"{id}"+sub)
		return
	}
	if e, msg := p.unavailable(rt); e != nil {
		fail(*e, msg)
		return
	}
	key, aerr, msg := p.authenticate(rt, r)
	if aerr != nil {
		fail(*aerr, msg)
		return
	}
	raw, berr, msg := readBody(w, r, cb, rt.snap.Server.MaxBodyBytes)
	if berr != nil {
		fail(*berr, msg)
		return
	}
	ts, denied := storingTargets(rt, key, id)
	if len(ts) == 0 {
		switch _, ours := responseid.TagOf(id); {
		case denied:
			p.metrics.AuthFailures.WithLabelValues("provider_not_allowed").Inc()
			fail(errProviderDenied, fmt.Sprintf("this key may not use the replica that stores response %q", echoedName(id)))
		case ours:
			fail(errNotFound, fmt.Sprintf("response %q is stored by a replica this gateway does not have (any longer)", echoedName(id)))
		default:
			fail(errNotFound, fmt.Sprintf("response %q was not created through this gateway, which finds a stored response by the replica its id names (or on a hosted openai provider)", echoedName(id)))
		}
		return
	}
	// The delivery policy governs these answers as it does the create's:
	// a retrieval returns the same output (whose create may have been
	// answered queued, before any output existed, or in the background).
	reqID := w.Header().Get("X-Request-Id")
	dreq := func(model string) delivery.Request {
		d := delivery.Request{RequestID: reqID, Model: model, Route: model, Stream: streamQuery(r),
			PIIRestoreOptIn: delivery.RestoreOptIn(r.Header)}
		if key != nil {
			d.KeyID = key.ID
		}
		return d
	}
	if d := dreq(ts[0].model); d.Stream {
		if ok, ref := rt.policy.StreamDecision(d); !ok {
			fail(refusal(ref), ref.Message)
			return
		}
	}
	var resp *http.Response
	var cancel func()
	var err error
	var answered storing
	for i, t := range ts {
		provider = t.cfg.Provider.Name
		resp, cancel, err = p.sendStored(r, reqID, t.target, raw, rt)
		if err != nil {
			p.log.Debug("stored response request failed", "provider", provider, "error", err)
			if errors.Is(err, errHalted) {
				break
			}
			continue
		}
		if resp.StatusCode == http.StatusNotFound && i < len(ts)-1 {
			// Another hosted account may hold it; a 404 changed nothing.
			resp.Body.Close()
			cancel()
			resp = nil
			continue
		}
		answered = t
		break
	}
	if resp == nil {
		switch {
		case errors.Is(err, errHalted):
			fail(errShuttingDown, msgShuttingDown)
		case errors.Is(err, errHeaderTimeout):
			fail(errUpstreamTimeout, "the provider that stores the response did not answer in time")
		default:
			fail(errUpstream, "the provider that stores the response could not be reached")
		}
		return
	}
	defer cancel()
	defer resp.Body.Close()
	ctype := resp.Header.Get("Content-Type")
	var held []byte // a JSON answer read whole for the delivery policy
	x := &exchange{rt: rt, dreq: dreq(answered.model), ep: &endpoint{path: label, dialect: dialectOpenAI}, id: reqID}
	if resp.StatusCode < 400 && !respcache.IsEventStream(ctype) && rt.policy.Active(x.dreq) {
		var buf bytes.Buffer
		_, rerr := buf.ReadFrom(io.LimitReader(resp.Body, maxBufferedBody+1))
		if rerr == nil && buf.Len() <= maxBufferedBody && truncatedJSON(resp, buf.Bytes()) {
			rerr = errTruncatedJSON
		}
		if rerr != nil {
			// Nothing has reached the client: the part is not sent (it
			// would pass as a success, around the policy).
			p.log.Warn("stored response answer broke off", "provider", provider, "error", rerr)
			fail(errUpstream, "the provider that stores the response broke off its answer")
			return
		}
		held = buf.Bytes()
	}
	h := w.Header()
	named := connectionHeaders(resp.Header)
	for k, vs := range resp.Header {
		if !hopHeaders[k] && !named[k] && !(held != nil && k == "Content-Length") {
			h[k] = vs
		}
	}
	h.Set("X-Rolter-Provider", provider)
	if held != nil && len(held) <= maxBufferedBody {
		if err := p.deliver(w, r, x, resp.StatusCode, ctype, held); err != nil {
			fail(errShuttingDown, msgShuttingDown)
			return
		}
		status = x.status
		return
	}
	status = resp.StatusCode
	w.WriteHeader(resp.StatusCode)
	if held != nil {
		// Too large to hold (as an inference answer's): sent unexamined.
		if _, err := w.Write(held); err != nil {
			return
		}
	}
	if end := p.relayStored(w, resp); end != nil {
		// Broken off: the client must see a cut answer, not an ended one
		// (see serveAPI), counted 502 as any.
		status = http.StatusBadGateway
		p.log.Warn("stored response answer broke off", "provider", provider, "error", end)
		panic(http.ErrAbortHandler)
	}
}

// streamQuery reports whether a retrieval asks for its events (stream in
// its query). Any value but a spelling of false counts, as the stricter
// reading for the delivery policy's stream decision.
func streamQuery(r *http.Request) bool {
	v, ok := r.URL.Query()["stream"]
	if !ok || len(v) == 0 {
		return false
	}
	switch strings.ToLower(v[len(v)-1]) {
	case "", "0", "f", "false", "n", "no", "off":
		return false
	}
	return true
}

// relayStored copies a stored response's answer to the client as it comes,
// an event stream flushed per read. It returns the error that cut the
// answer: a read error, or the end of a 200 stream before its terminal
// event (vLLM ends a retrieval stream it cannot replay that way), after
// which an error event has been written; nil when the answer ended whole
// or the client left.
func (p *Proxy) relayStored(w http.ResponseWriter, resp *http.Response) error {
	ctype := resp.Header.Get("Content-Type")
	stream := respcache.IsEventStream(ctype)
	tap := newUsageTap(ctype)
	rc := http.NewResponseController(w)
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	buf := *bufp
	var last [2]byte // the last two bytes sent, to find an SSE event boundary
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			tap.write(buf[:n])
			last = lastTwo(last, buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				return nil // the client left
			}
			if stream && rc.Flush() != nil {
				return nil
			}
		}
		switch {
		case rerr == nil:
			continue
		case tap.done() || tap.errorStatus() != 0:
			return nil // whole, or failed and said so
		case errors.Is(rerr, io.EOF) && !(stream && resp.StatusCode == http.StatusOK):
			return nil
		case errors.Is(rerr, io.EOF):
			rerr = errUnterminated
		}
		if stream {
			_, _ = w.Write(cutEvent(last, dialectOpenAI, rerr))
			_ = rc.Flush()
		}
		return rerr
	}
}

// storing is a target that may hold a stored response, with the model
// through which the key reaches it.
type storing struct {
	*target
	model string
}

// storingTargets are the targets the key may use that can hold the stored
// response id: the one its tag names (the gateway issued it), else every
// hosted openai provider, whose API keeps its own store, one target each in
// the order of their names (asked in turn until one knows the id).
// denied when a target the id names exists that the key may not use.
func storingTargets(rt *runtime, key *config.Key, id string) (ts []storing, denied bool) {
	tag, ours := responseid.TagOf(id)
	byProvider := map[string]storing{}
	for model, rte := range rt.routes {
		for _, pl := range rte.pools {
			for i := range pl.targets {
				c := &pl.targets[i]
				name := c.cfg.Provider.Name
				if _, seen := byProvider[name]; seen || ours && !storesFor(c, tag) || !ours && c.cfg.Provider.Kind != config.KindOpenAI {
					continue
				}
				if key != nil && (!key.AllowsModel(model) || !key.AllowsProvider(name)) {
					denied = denied || ours
					continue
				}
				byProvider[name] = storing{c, model}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byProvider)) {
		ts = append(ts, byProvider[name])
	}
	return ts, denied && len(ts) == 0
}

// sendStored sends a request on a stored response to t: the client's
// method, path, query and body, with the provider's key. Its headers are
// bounded by timeouts.request_secs, its body by timeouts.idle_secs, as an
// inference attempt's (send).
func (p *Proxy) sendStored(r *http.Request, id string, t *target, body []byte, rt *runtime) (*http.Response, func(), error) {
	prov := t.cfg.Provider
	ctx, cancelCause := p.untilHalt(r.Context())
	cancel := func() { cancelCause(nil) }
	timer := time.AfterFunc(time.Duration(rt.snap.Timeouts.RequestSecs)*time.Second, func() { cancelCause(errHeaderTimeout) })
	url := upstreamURL(prov.APIBase, r.URL.Path)
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	var rd io.Reader
	if len(body) > 0 {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, url, rd)
	if err != nil {
		timer.Stop()
		cancel()
		return nil, nil, fmt.Errorf("proxy: build upstream request: %w", err)
	}
	if len(body) > 0 {
		req.Header.Set("Content-Type", r.Header.Get("Content-Type"))
	}
	if a := r.Header.Get("Accept"); a != "" {
		req.Header.Set("Accept", a)
	}
	req.Header.Set("X-Request-Id", id)
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		req.Header.Set("X-Forwarded-For", ip)
	}
	if prov.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+prov.APIKey)
	}
	resp, err := p.client.Do(req)
	timer.Stop()
	if err != nil {
		cause := context.Cause(ctx)
		cancel()
		switch {
		case errors.Is(cause, errHalted):
			return nil, nil, fmt.Errorf("%w: %s", errHalted, prov.Name)
		case errors.Is(cause, errHeaderTimeout):
			return nil, nil, fmt.Errorf("%w: %s", errHeaderTimeout, prov.Name)
		}
		return nil, nil, fmt.Errorf("proxy: upstream %s: %w", prov.Name, err)
	}
	if idle := time.Duration(rt.snap.Timeouts.IdleSecs) * time.Second; idle > 0 {
		resp.Body = newIdleBody(resp.Body, idle, cancel)
	}
	resp.Body = &haltBody{ReadCloser: resp.Body, ctx: ctx}
	return resp, cancel, nil
}
