package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Refusal codes: the stable client-facing error codes of a [Refuse].
const (
	CodeGuardrailBlocked   = "guardrail_blocked"
	CodePluginBlocked      = "plugin_blocked"
	CodePluginUnavailable  = "plugin_unavailable"
	CodePIIUnavailable     = "pii_sanitizer_unavailable"
	CodeGuardrailStreaming = "guardrail_streaming_unsupported"
	CodePluginStreaming    = "plugin_streaming_unsupported"
	CodePIIStreaming       = "pii_streaming_unsupported"
)

const (
	refusalMessageGuardrail    = "response withheld by guardrail '%s'"
	refusalMessageRequestGuard = "request blocked by guardrail '%s'"
)

// Request describes the request a response is being delivered to. Nothing
// in it is content.
type Request struct {
	// RequestID is the request's x-request-id (sent to plugins and the
	// sanitizer, and used in logs).
	RequestID string
	// Model is the model the client asked for; Route the route serving it.
	Model string
	Route string
	// KeyID identifies the caller's virtual key ("" for none).
	KeyID string
	// Stream is the request's stream flag. Apply delivers a streamed
	// request's body unchanged: streams are governed by
	// [Policy.StreamDecision].
	Stream bool
	// PIITicket is the ticket [Policy.SanitizeRequest] returned for this
	// request, if any. It is redeemed only for the same Route and KeyID.
	PIITicket *Ticket
	// PIIRestoreOptIn is [RestoreOptIn] of the request's headers.
	PIIRestoreOptIn bool
}

// Delivery is the outcome of [Policy.Apply]: a [Send] or a [Refuse].
type Delivery interface{ isDelivery() }

// Send delivers Body with the headers in Header added to the response.
type Send struct {
	// Body is the body to send: the one given to Apply when nothing
	// changed, else a new slice (the input is never modified).
	Body []byte
	// Header holds annotations to add to the response (rule names,
	// plugin annotations); never nil.
	Header http.Header
}

// Refuse withholds the response and answers with an error instead.
type Refuse struct {
	// Status is the HTTP status of the error response.
	Status int
	// Code is the stable error code (guardrail_blocked, plugin_blocked...).
	Code string
	// Message is the client-facing message: rule and plugin names, or the
	// block reason a plugin chose to give the caller.
	Message string
	// Reason is for logs and the usage record: the code and the rule or
	// plugin name, never content.
	Reason string
}

func (Send) isDelivery()   {}
func (Refuse) isDelivery() {}

// Error returns the refusal's reason, so a Refuse can travel as an error.
func (r *Refuse) Error() string { return r.Reason }

// Stats counts what the policies did. One Stats is shared by every policy
// built with [WithStats], so the counters survive reloads. Safe for
// concurrent use.
type Stats struct {
	// Pre-call guardrails.
	GuardrailBlocks, GuardrailRedactions, GuardrailAnnotations atomic.Uint64
	// Post-call guardrails.
	GuardrailOutputBlocks, GuardrailOutputRedactions, GuardrailOutputAnnotations atomic.Uint64
	// Streams refused because post_call rules exist.
	GuardrailStreamRejections atomic.Uint64
	// Scans that stopped at max_scan_bytes.
	GuardrailScanTruncations atomic.Uint64
	// post_response plugins.
	PluginBlocks, PluginTransforms, PluginAnnotations, PluginErrors, PluginStreamRejections atomic.Uint64
	// PII sanitizer: entities replaced (sum of the findings' counts), call
	// failures of either leg, request-leg refusals, successful restores,
	// failed restores, refused streams.
	PIIEntities, PIIErrors, PIIBlocks, PIIRestorations, PIIRestoreErrors, PIIStreamRejections atomic.Uint64
	// CallsCancelled counts the plugin and sanitizer calls cut because
	// their request ended first (the client left, the proxy halted it):
	// not in PluginErrors, PIIErrors or PIIRestoreErrors.
	CallsCancelled atomic.Uint64
	// Withheld counts every Refuse returned by [Policy.Apply].
	Withheld atomic.Uint64
}

// Option configures [New].
type Option func(*Policy)

// WithStats makes the policy count into s (shared across reloads) instead
// of a Stats of its own.
func WithStats(s *Stats) Option { return func(p *Policy) { p.stats = s } }

// WithGetenv replaces os.Getenv for the auth_token_env lookups.
func WithGetenv(getenv func(string) string) Option { return func(p *Policy) { p.getenv = getenv } }

// Policy is the delivery policy built from one configuration. It is
// immutable and safe for concurrent use: a reload builds a new Policy and
// swaps it in, and the new one applies to every delivery from then on,
// including responses cached before it.
type Policy struct {
	pre, post      *guard
	streamRejectGR bool
	plugins        []*plugin
	pii            *piiClient
	client         *http.Client
	log            *slog.Logger
	stats          *Stats
	getenv         func(string) string
}

// New builds a Policy from cfg. It applies the list defaults
// ([GuardrailsConfig.ApplyDefaults], [ApplyPluginDefaults]) to a copy,
// runs [Config.Validate], resolves every auth_token_env, and returns the
// joined [*FieldError]s of what it cannot build, so a bad reload never
// replaces a good policy. client makes the plugin and sanitizer calls (nil
// means a client of its own; the per-call timeouts of the config apply);
// logger receives failures, never content (nil discards).
func New(cfg Config, client *http.Client, logger *slog.Logger, opts ...Option) (*Policy, error) {
	p := &Policy{client: client, log: logger, getenv: os.Getenv}
	for _, o := range opts {
		o(p)
	}
	if p.client == nil {
		p.client = &http.Client{}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.log = p.log.With("component", "delivery")
	if p.stats == nil {
		p.stats = &Stats{}
	}
	// The policy keeps nothing the caller can still change.
	cfg.Guardrails.Rules = slices.Clone(cfg.Guardrails.Rules)
	cfg.Plugins = slices.Clone(cfg.Plugins)
	cfg.PII.Entities = slices.Clone(cfg.PII.Entities)
	cfg.Guardrails.ApplyDefaults()
	ApplyPluginDefaults(cfg.Plugins)
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var err error
	if p.pre, p.post, err = compileGuards(&cfg.Guardrails); err != nil {
		return nil, err
	}
	p.streamRejectGR = cfg.Guardrails.StreamingPostCall == StreamingReject
	for i, pc := range cfg.Plugins {
		if pc.Stage != PluginStagePostResponse {
			continue
		}
		token, err := p.secret(fmt.Sprintf("plugins[%d].auth_token_env", i), pc.AuthTokenEnv)
		if err != nil {
			return nil, err
		}
		p.plugins = append(p.plugins, &plugin{
			name: pc.Name, url: pc.URL, timeout: time.Duration(pc.TimeoutMS) * time.Millisecond,
			failClosed: pc.FailureMode == FailClosed, token: token,
		})
	}
	if cfg.PII.Enabled {
		token, err := p.secret("pii_sanitizer.auth_token_env", cfg.PII.AuthTokenEnv)
		if err != nil {
			return nil, err
		}
		p.pii = &piiClient{
			cfg: cfg.PII, timeout: time.Duration(cfg.PII.TimeoutMS) * time.Millisecond,
			token: token, failClosed: cfg.PII.FailureMode == FailClosed,
		}
	}
	return p, nil
}

func (p *Policy) secret(path, env string) (string, error) {
	if env == "" {
		return "", nil
	}
	v := p.getenv(env)
	if v == "" {
		return "", &FieldError{Path: path, Msg: fmt.Sprintf("environment variable %s is not set", env)}
	}
	return v, nil
}

// Stats returns the counters the policy writes to.
func (p *Policy) Stats() *Stats { return p.stats }

// Active reports whether [Policy.Apply] may change or refuse a successful
// JSON response to req, so that the caller must buffer the body; when it
// returns false Apply always sends the body unchanged.
func (p *Policy) Active(req Request) bool {
	if p == nil {
		return false
	}
	return p.post != nil || len(p.plugins) > 0 ||
		p.pii != nil && (p.pii.sanitizesResponse() || p.pii.ticketFor(&req) != nil)
}

// isEventStream reports whether a content type is text/event-stream.
func isEventStream(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		mt, _, _ = strings.Cut(contentType, ";")
	}
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// Apply finalises one buffered response to req: built-in output guardrails
// (post_call rules), then the post_response plugin chain, then the PII
// sanitizer's response leg. It returns a [Send] with the body to deliver
// (possibly transformed) and headers to add, or a [Refuse] to answer
// instead; every Refuse is counted in Stats.Withheld.
//
// Apply is the one function every delivery path calls: the live buffered
// response, the cacheable miss, and exact and semantic hits. The caller
// stores the upstream's own bytes before calling Apply and never stores
// what Apply returns: a transform or a PII restore is applied per
// delivery and never persisted. body is never modified.
//
// A status outside 2xx, a streamed request or a text/event-stream body
// (streams are governed by [Policy.StreamDecision]) and a body that is not
// JSON pass unchanged.
// Safe for concurrent use.
func (p *Policy) Apply(ctx context.Context, req Request, status int, contentType string, body []byte) Delivery {
	send := Send{Body: body, Header: http.Header{}}
	if p == nil || status < 200 || status > 299 || req.Stream || isEventStream(contentType) ||
		p.post == nil && len(p.plugins) == 0 && p.pii == nil {
		return send
	}
	// One validating pass serves every stage until a stage rewrites the
	// body; a body that is not JSON passes unexamined.
	doc, err := parseText(body)
	if err != nil {
		return send
	}
	refuse := func(r *Refuse) Delivery {
		p.stats.Withheld.Add(1)
		p.log.LogAttrs(ctx, slog.LevelInfo, "response withheld",
			slog.String("request_id", req.RequestID), slog.String("reason", r.Reason))
		return *r
	}
	if p.post != nil {
		idx, kinds := doc.responseTexts(), []textKind(nil)
		if p.post.toolCalls {
			idx, kinds = doc.responseTextsAndCalls()
		}
		v, out := p.post.rewrite(body, doc, idx, kinds)
		if v.truncated {
			p.stats.GuardrailScanTruncations.Add(1)
		}
		if v.blocked != "" {
			p.stats.GuardrailOutputBlocks.Add(1)
			return refuse(&Refuse{
				Status: http.StatusForbidden, Code: CodeGuardrailBlocked,
				Message: fmt.Sprintf(refusalMessageGuardrail, v.blocked),
				Reason:  CodeGuardrailBlocked + ": " + v.blocked,
			})
		}
		p.stats.GuardrailOutputRedactions.Add(uint64(len(v.redacted)))
		p.stats.GuardrailOutputAnnotations.Add(uint64(len(v.matched)))
		v.annotate(send.Header)
		if len(v.redacted) > 0 {
			send.Body, doc = out, nil
		}
	}
	if len(p.plugins) > 0 {
		out, transformed, r := p.runPlugins(ctx, &req, status, contentType, send.Body, send.Header)
		if r != nil {
			return refuse(r)
		}
		if transformed {
			send.Body, doc = out, nil
		}
	}
	if p.pii != nil {
		out, r := p.piiResponse(ctx, &req, send.Body, doc)
		if r != nil {
			return refuse(r)
		}
		send.Body = out
	}
	return send
}

// countFailure counts a failed call of a plugin or the sanitizer in errs
// and returns its class and the level to log it at; a call cut because its
// request ended (classCancelled) is counted in CallsCancelled instead and
// logged at debug: a client that hangs up, or a drain, is no outage of
// the service called.
func (p *Policy) countFailure(errs *atomic.Uint64, err error) (string, slog.Level) {
	class := failureClass(err)
	if class == classCancelled {
		p.stats.CallsCancelled.Add(1)
		return class, slog.LevelDebug
	}
	errs.Add(1)
	return class, slog.LevelWarn
}

// runPlugins calls each post_response plugin in order. A transform
// replaces the body for the next plugin; a block stops the chain. It
// returns the final body and whether a plugin transformed it.
func (p *Policy) runPlugins(ctx context.Context, req *Request, status int, contentType string, body []byte, h http.Header) (out []byte, transformed bool, refuse *Refuse) {
	for _, pl := range p.plugins {
		r, err := pl.call(ctx, p.client, &Envelope{
			Plugin: pl.name, Stage: PluginStagePostResponse, Model: req.Model, Route: req.Route,
			RequestID: req.RequestID, Status: status, ContentType: contentType, Body: body,
		})
		if err != nil {
			class, level := p.countFailure(&p.stats.PluginErrors, err)
			p.log.LogAttrs(ctx, level, "post_response plugin failed",
				slog.String("request_id", req.RequestID), slog.String("plugin", pl.name),
				slog.String("failure", class), slog.Bool("fail_closed", pl.failClosed))
			if pl.failClosed {
				return nil, false, &Refuse{
					Status: http.StatusBadGateway, Code: CodePluginUnavailable,
					Message: fmt.Sprintf("response withheld: plugin '%s' is unavailable", pl.name),
					Reason:  fmt.Sprintf("%s: %s: %s", CodePluginUnavailable, pl.name, class),
				}
			}
			continue
		}
		switch r.Action {
		case PluginBlock:
			p.stats.PluginBlocks.Add(1)
			msg := r.Reason
			if msg == "" {
				msg = fmt.Sprintf("response withheld by plugin '%s'", pl.name)
			}
			return nil, false, &Refuse{
				Status: http.StatusForbidden, Code: CodePluginBlocked, Message: msg,
				Reason: CodePluginBlocked + ": " + pl.name,
			}
		case PluginTransform:
			p.stats.PluginTransforms.Add(1)
			body, transformed = r.Body, true
		case PluginAnnotate:
			p.stats.PluginAnnotations.Add(1)
			for k, v := range r.Headers {
				h.Set(k, v)
			}
		}
	}
	return body, transformed, nil
}

// StreamDecision decides up front whether a streamed request may be
// served. Streams skip all three stages, exactly as uncached streams do, so
// a stage that cannot be skipped refuses the stream with 400: post_call
// guardrail rules under streaming_post_call = "reject"
// (guardrail_streaming_unsupported), a fail_closed post_response plugin
// (plugin_streaming_unsupported), and a PII response leg (response
// sanitizing, or restoration this request is entitled to) under streaming =
// "reject" (pii_streaming_unsupported). Fail-open plugins and passthrough
// stages are skipped. Safe for concurrent use.
func (p *Policy) StreamDecision(req Request) (allow bool, refuse Refuse) {
	if p == nil {
		return true, Refuse{}
	}
	if p.post != nil && p.streamRejectGR {
		p.stats.GuardrailStreamRejections.Add(1)
		return false, Refuse{
			Status: http.StatusBadRequest, Code: CodeGuardrailStreaming,
			Message: "streaming is not supported while output guardrails apply; send the request without stream",
			Reason:  CodeGuardrailStreaming,
		}
	}
	for _, pl := range p.plugins {
		if pl.failClosed {
			p.stats.PluginStreamRejections.Add(1)
			return false, Refuse{
				Status: http.StatusBadRequest, Code: CodePluginStreaming,
				Message: fmt.Sprintf("streaming is not supported while the fail-closed plugin '%s' applies; send the request without stream", pl.name),
				Reason:  CodePluginStreaming + ": " + pl.name,
			}
		}
	}
	if c := p.pii; c != nil && c.cfg.Streaming == StreamingReject && (c.sanitizesResponse() || c.restores(&req)) {
		p.stats.PIIStreamRejections.Add(1)
		return false, Refuse{
			Status: http.StatusBadRequest, Code: CodePIIStreaming,
			Message: "streaming is not supported while the PII sanitizer's response leg applies; send the request without stream",
			Reason:  CodePIIStreaming,
		}
	}
	return true, Refuse{}
}

// RequestGuard is the outcome of [Policy.GuardRequest].
type RequestGuard struct {
	// Body is the request to forward (redacted when Changed).
	Body []byte
	// Changed reports whether a redact rule rewrote the body.
	Changed bool
	// Header holds annotations for the response (matched and redacted
	// rule names); never nil.
	Header http.Header
}

// GuardRequest applies the pre_call guardrail rules to a JSON request body
// (the conversation text; system and developer instructions only for rules
// with include_system). A block returns a 400 guardrail_blocked refusal;
// redactions rewrite only the matched string values. body is never
// modified. Safe for concurrent use.
func (p *Policy) GuardRequest(req Request, body []byte) (RequestGuard, *Refuse) {
	out := RequestGuard{Body: body, Header: http.Header{}}
	if p == nil || p.pre == nil {
		return out, nil
	}
	doc, err := parseText(body)
	if err != nil {
		return out, nil
	}
	idx, kinds := doc.requestTexts()
	v, nb := p.pre.rewrite(body, doc, idx, kinds)
	if v.truncated {
		p.stats.GuardrailScanTruncations.Add(1)
	}
	if v.blocked != "" {
		p.stats.GuardrailBlocks.Add(1)
		return out, &Refuse{
			Status: http.StatusBadRequest, Code: CodeGuardrailBlocked,
			Message: fmt.Sprintf(refusalMessageRequestGuard, v.blocked),
			Reason:  CodeGuardrailBlocked + ": " + v.blocked,
		}
	}
	p.stats.GuardrailRedactions.Add(uint64(len(v.redacted)))
	p.stats.GuardrailAnnotations.Add(uint64(len(v.matched)))
	v.annotate(out.Header)
	out.Body, out.Changed = nb, len(v.redacted) > 0
	return out, nil
}
