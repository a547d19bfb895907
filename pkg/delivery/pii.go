package delivery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// HeaderPIIRestore is the caller's opt-in to PII restoration under
// restoration = "caller_authorized".
const HeaderPIIRestore = "X-Rolter-Pii-Restore"

// RestoreOptIn reports whether h carries the caller's restoration opt-in:
// x-rolter-pii-restore set to 1, true or yes (trimmed, case-insensitive).
// It is honoured only under restoration = "caller_authorized".
func RestoreOptIn(h http.Header) bool {
	switch strings.ToLower(strings.TrimSpace(h.Get(HeaderPIIRestore))) {
	case "1", "true", "yes":
		return true
	}
	return false
}

// Ticket lets the response leg restore the placeholders the request leg put
// into one request. It holds the sanitizer's restoration token, which is a
// secret: a Ticket never prints, logs or marshals its token, and it is
// redeemed only for the same route and key it was issued to. A Ticket
// belongs to one request and must never be stored.
type Ticket struct {
	token string
	route string
	keyID string
}

// String hides the token.
func (Ticket) String() string { return "delivery.Ticket{redacted}" }

// GoString hides the token.
func (t Ticket) GoString() string { return t.String() }

// LogValue hides the token.
func (t Ticket) LogValue() slog.Value { return slog.StringValue(t.String()) }

// MarshalJSON hides the token.
func (Ticket) MarshalJSON() ([]byte, error) { return []byte(`"redacted"`), nil }

// SanitizePayload is the body both legs POST to url.
type SanitizePayload struct {
	// Direction is "request" or "response".
	Direction string `json:"direction"`
	Model     string `json:"model"`
	Route     string `json:"route"`
	RequestID string `json:"request_id"`
	// Entities is the configured entity filter (omitted when empty).
	Entities []string `json:"entities,omitempty"`
	// Reversible asks the service for a restoration_token that can undo
	// the replacement later.
	Reversible bool `json:"reversible"`
	// Content holds the texts, in document order: every text of the
	// request, tool results included (request leg), or the assistant text
	// and reasoning of the response (response leg).
	Content []string `json:"content"`
}

// SanitizeReply is the sanitizer's answer. Content must have exactly one
// element per element sent.
type SanitizeReply struct {
	Content  []string  `json:"content"`
	Findings []Finding `json:"findings"`
	// RestorationToken is returned for a reversible request.
	RestorationToken string `json:"restoration_token,omitempty"`
}

// Finding counts the occurrences of one entity type.
type Finding struct {
	EntityType string `json:"entity_type"`
	Count      int    `json:"count"`
}

// RestorePayload is the body POSTed to restore_url.
type RestorePayload struct {
	RequestID        string   `json:"request_id"`
	RestorationToken string   `json:"restoration_token"`
	Content          []string `json:"content"`
}

// RestoreReply is the restore service's answer, one element per element
// sent.
type RestoreReply struct {
	Content []string `json:"content"`
}

// piiClient calls the sanitizer.
type piiClient struct {
	cfg        PIIConfig
	timeout    time.Duration
	token      string
	failClosed bool
}

func (c *piiClient) sanitizesRequest() bool {
	return c.cfg.Direction == DirectionRequest || c.cfg.Direction == DirectionBoth
}

func (c *piiClient) sanitizesResponse() bool {
	return c.cfg.Direction == DirectionResponse || c.cfg.Direction == DirectionBoth
}

// restores reports whether this request is entitled to restoration.
func (c *piiClient) restores(req *Request) bool {
	switch c.cfg.Restoration {
	case RestorationTrustedDownstream:
		return true
	case RestorationCallerAuthorized:
		return req.PIIRestoreOptIn
	}
	return false
}

// ticketFor returns the request's ticket if it may be redeemed now.
func (c *piiClient) ticketFor(req *Request) *Ticket {
	t := req.PIITicket
	if t == nil || t.token == "" || !c.restores(req) || t.route != req.Route || t.keyID != req.KeyID {
		return nil
	}
	return t
}

// post POSTs payload as JSON and decodes the 2xx reply into reply.
func (c *piiClient) post(ctx context.Context, client *http.Client, url, requestID string, payload, reply any) error {
	body, err := json.Marshal(payload)
	if err != nil {
		return &callFailure{class: "malformed", err: err}
	}
	raw, err := postJSON(ctx, client, url, c.token, requestID, c.timeout, body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, reply); err != nil {
		return &callFailure{class: "malformed", err: err}
	}
	return nil
}

// sameLength checks that a reply has one text per text sent.
func sameLength(got, sent []string) error {
	if len(got) != len(sent) {
		return &callFailure{class: "malformed", err: fmt.Errorf("content has %d elements, sent %d", len(got), len(sent))}
	}
	return nil
}

func (c *piiClient) sanitize(ctx context.Context, client *http.Client, req *Request, direction string, reversible bool, texts []string) (SanitizeReply, error) {
	var r SanitizeReply
	err := c.post(ctx, client, c.cfg.URL, req.RequestID, &SanitizePayload{
		Direction: direction, Model: req.Model, Route: req.Route, RequestID: req.RequestID,
		Entities: c.cfg.Entities, Reversible: reversible, Content: texts,
	}, &r)
	if err == nil {
		err = sameLength(r.Content, texts)
	}
	return r, err
}

func (c *piiClient) restore(ctx context.Context, client *http.Client, req *Request, t *Ticket, texts []string) ([]string, error) {
	var r RestoreReply
	err := c.post(ctx, client, c.cfg.RestoreURL, req.RequestID, &RestorePayload{
		RequestID: req.RequestID, RestorationToken: t.token, Content: texts,
	}, &r)
	if err == nil {
		err = sameLength(r.Content, texts)
	}
	return r.Content, err
}

func countFindings(fs []Finding) uint64 {
	var n uint64
	for _, f := range fs {
		if f.Count > 0 {
			n += uint64(f.Count)
		}
	}
	return n
}

// RequestLeg is the outcome of [Policy.SanitizeRequest].
type RequestLeg struct {
	// Body is the request to forward: the sanitized body, or the original
	// when nothing applied or the sanitizer failed open.
	Body []byte
	// Changed reports whether Body differs from the original.
	Changed bool
	// Ticket lets the response leg restore this request's placeholders;
	// nil unless restoration applies to the request and the service
	// returned a token. Put it into [Request.PIITicket] for [Policy.Apply].
	Ticket *Ticket
}

// SanitizeRequest runs the PII sanitizer's request leg over the texts of a
// JSON request body (messages including system and developer turns, the
// Anthropic system, prompt, input, instructions) and returns the body to
// forward. It asks for a reversible replacement, and so a [Ticket], when
// restoration applies to req (trusted_downstream, or caller_authorized with
// [Request.PIIRestoreOptIn]). A sanitizer failure under fail_closed
// returns a 502 pii_sanitizer_unavailable refusal; under fail_open the
// original body is forwarded. body is never modified. Safe for concurrent
// use.
func (p *Policy) SanitizeRequest(ctx context.Context, req Request, body []byte) (RequestLeg, *Refuse) {
	out := RequestLeg{Body: body}
	if p == nil || p.pii == nil || !p.pii.sanitizesRequest() {
		return out, nil
	}
	doc, err := parseText(body)
	if err != nil {
		return out, nil
	}
	if doc.truncated {
		// Texts past the bound would go out unsanitized.
		if refuse := p.sanitizeFailed(ctx, &req, DirectionRequest, errTooManyTexts); refuse != nil {
			p.stats.PIIBlocks.Add(1)
			return out, refuse
		}
	}
	idx, _ := doc.requestTexts()
	if len(idx) == 0 {
		return out, nil
	}
	texts := doc.values(idx)
	reversible := p.pii.restores(&req)
	r, err := p.pii.sanitize(ctx, p.client, &req, DirectionRequest, reversible, texts)
	if err != nil {
		refuse := p.sanitizeFailed(ctx, &req, DirectionRequest, err)
		if refuse != nil {
			p.stats.PIIBlocks.Add(1)
		}
		return out, refuse
	}
	p.stats.PIIEntities.Add(countFindings(r.Findings))
	out.Body = spliceTexts(body, doc, idx, r.Content)
	out.Changed = !bytes.Equal(out.Body, body)
	if reversible && r.RestorationToken != "" {
		out.Ticket = &Ticket{token: r.RestorationToken, route: req.Route, keyID: req.KeyID}
	}
	return out, nil
}

// errTooManyTexts: a body held more texts than parseText records
// (maxTextLeaves), so the sanitizer cannot be given them all. A
// callFailure, so that it is counted and classed as a failed call is.
var errTooManyTexts = &callFailure{class: "too_many_texts", err: errors.New("delivery: more texts than the sanitizer is given")}

// sanitizeFailed counts and logs a failed sanitize call of a leg and
// returns the refusal fail_closed asks for (nil under fail_open).
func (p *Policy) sanitizeFailed(ctx context.Context, req *Request, leg string, err error) *Refuse {
	class, level := p.countFailure(&p.stats.PIIErrors, err)
	p.log.LogAttrs(ctx, level, "pii sanitizer failed", slog.String("request_id", req.RequestID),
		slog.String("leg", leg), slog.String("failure", class), slog.Bool("fail_closed", p.pii.failClosed))
	if !p.pii.failClosed {
		return nil
	}
	msg := "the PII sanitizer is unavailable"
	if errors.Is(err, errTooManyTexts) {
		msg = fmt.Sprintf("the %s holds more than %d texts, more than the PII sanitizer is given", leg, maxTextLeaves)
	}
	return &Refuse{
		Status: http.StatusBadGateway, Code: CodePIIUnavailable,
		Message: msg,
		Reason:  CodePIIUnavailable + ": " + leg + ": " + class,
	}
}

// piiResponse runs the response leg: sanitize the assistant text (when the
// direction includes responses), then restore the request's placeholders
// with its own ticket. A restore failure delivers the unrestored text.
// doc is body parsed, or nil.
func (p *Policy) piiResponse(ctx context.Context, req *Request, body []byte, doc *textDoc) ([]byte, *Refuse) {
	ticket := p.pii.ticketFor(req)
	if !p.pii.sanitizesResponse() && ticket == nil {
		return body, nil
	}
	if doc == nil {
		var err error
		if doc, err = parseText(body); err != nil {
			return body, nil
		}
	}
	if doc.truncated && p.pii.sanitizesResponse() {
		if refuse := p.sanitizeFailed(ctx, req, DirectionResponse, errTooManyTexts); refuse != nil {
			return nil, refuse
		}
	}
	idx := doc.responseTexts()
	if len(idx) == 0 {
		return body, nil
	}
	texts := doc.values(idx)
	if p.pii.sanitizesResponse() {
		r, err := p.pii.sanitize(ctx, p.client, req, DirectionResponse, false, texts)
		if err != nil {
			if refuse := p.sanitizeFailed(ctx, req, DirectionResponse, err); refuse != nil {
				return nil, refuse
			}
		} else {
			p.stats.PIIEntities.Add(countFindings(r.Findings))
			texts = r.Content
		}
	}
	if ticket != nil {
		restored, err := p.pii.restore(ctx, p.client, req, ticket, texts)
		if err != nil {
			class, level := p.countFailure(&p.stats.PIIRestoreErrors, err)
			p.log.LogAttrs(ctx, level, "pii restore failed",
				slog.String("request_id", req.RequestID), slog.String("failure", class))
		} else {
			p.stats.PIIRestorations.Add(1)
			texts = restored
		}
	}
	return spliceTexts(body, doc, idx, texts), nil
}
