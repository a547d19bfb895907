package proxy

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"time"

	"rolter.dev/pkg/delivery"
	"rolter.dev/pkg/request"
	"rolter.dev/pkg/respcache"
	"rolter.dev/pkg/usage"
)

// accounting is the usage-record sink built from [accounting]; kept across
// reloads while that section is unchanged (it owns a writer goroutine).
type accounting struct {
	cfg  usage.AccountingConfig
	sink *usage.JSONLines
}

// refusal turns a delivery-policy refusal into a catalogue entry in both
// dialects.
func refusal(r delivery.Refuse) apiError {
	e := apiError{status: r.Status, code: r.Code, openaiType: "invalid_request_error", anthropicType: "invalid_request_error"}
	switch {
	case r.Status == http.StatusForbidden:
		e.openaiType, e.anthropicType = "permission_error", "permission_error"
	case r.Status >= 500:
		e.openaiType, e.anthropicType = "api_error", "api_error"
	}
	return e
}

// requestLegs runs the request side of the delivery policy: a stream that
// no post-response stage can handle is refused up front, pre-call
// guardrails, then the PII sanitizer's request leg. It returns the body to
// forward, or a refusal. Halt cuts the sanitizer's call; the caller then
// refuses the request whatever this returns.
func (p *Proxy) requestLegs(r *http.Request, x *exchange, raw []byte) ([]byte, *delivery.Refuse) {
	pol := x.rt.policy
	if x.body.Stream {
		if ok, ref := pol.StreamDecision(x.dreq); !ok {
			return nil, &ref
		}
	}
	g, ref := pol.GuardRequest(x.dreq, raw)
	if ref != nil {
		return nil, ref
	}
	for k, vs := range g.Header {
		x.extraHeader[k] = vs
	}
	if g.Changed {
		raw = g.Body
	}
	ctx := r.Context()
	if x.rt.snap.Delivery.PII.Enabled { // a hook costs every request: only with a sanitizer to call
		var stop context.CancelCauseFunc
		ctx, stop = p.untilHalt(ctx)
		defer stop(nil)
	}
	leg, ref := pol.SanitizeRequest(ctx, x.dreq, raw)
	if ref != nil {
		return nil, ref
	}
	x.dreq.PIITicket = leg.Ticket
	if leg.Changed {
		raw = leg.Body
	}
	return raw, nil
}

// reparse refreshes the exchange's parsed body after a request leg rewrote
// it; a leg that produced invalid JSON is an internal fault, answered 502.
func reparse(x *exchange, raw []byte) bool {
	b, err := request.Parse(raw)
	if err != nil {
		return false
	}
	x.body = b
	return true
}

// deliver sends a buffered successful body through the delivery policy:
// the (possibly transformed) body, or the refusal in the endpoint's dialect.
// When Halt cut a call of the policy (a plugin, the PII sanitizer) it sends
// nothing and returns errHalted: what the policy made of the failed call
// (a fail_open skip, a fail_closed refusal) is not the answer.
func (p *Proxy) deliver(w http.ResponseWriter, r *http.Request, x *exchange, status int, ctype string, body []byte) error {
	ctx, stop := p.untilHalt(r.Context())
	defer stop(nil)
	d := x.rt.policy.Apply(ctx, x.dreq, status, ctype, body)
	if halted(ctx) {
		return errHalted
	}
	switch d := d.(type) {
	case delivery.Refuse:
		x.withheld = d.Reason // it starts with the code already
		x.status = d.Status
		w.Header().Del("Content-Length")
		writeError(w, x.ep.dialect, refusal(d), d.Message)
	case delivery.Send:
		for k, vs := range d.Header {
			w.Header()[k] = vs
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(d.Body)))
		x.status = status
		w.WriteHeader(status)
		if _, err := w.Write(d.Body); err != nil {
			p.clientGone(x, err)
		}
	}
	return nil
}

// usageTap measures a response's usage from the bytes relayed to the
// client: SSE incrementally, JSON from a bounded copy.
type usageTap struct {
	sse  *usage.SSEParser
	json bytes.Buffer
	over bool
}

const usageTapMax = 1 << 20 // JSON usage sits in small bodies; larger ones are not parsed

func newUsageTap(ctype string) *usageTap {
	if respcache.IsEventStream(ctype) {
		return &usageTap{sse: &usage.SSEParser{}}
	}
	return &usageTap{}
}

func (u *usageTap) write(b []byte) {
	if u.sse != nil {
		_, _ = u.sse.Write(b)
		return
	}
	if !u.over && u.json.Len()+len(b) <= usageTapMax {
		u.json.Write(b)
	} else {
		u.over = true
	}
}

// done reports whether a stream's terminal event was relayed.
func (u *usageTap) done() bool { return u.sse != nil && u.sse.Done() }

// errorStatus is the status of the first error event a relayed stream
// carried, 0 if none (see usage.SSEParser.ErrorStatus).
func (u *usageTap) errorStatus() int {
	if u.sse == nil {
		return 0
	}
	return u.sse.ErrorStatus()
}

func (u *usageTap) result() usage.Usage {
	if u.sse != nil {
		return u.sse.End()
	}
	if u.over {
		return usage.Usage{}
	}
	return usage.ParseJSON(u.json.Bytes())
}

// record writes the request's usage record.
func (p *Proxy) record(x *exchange, model string) {
	if x.rt == nil || x.rt.accounting == nil || model == "" {
		return
	}
	rec := usage.Record{
		TS: time.Now(), RequestID: x.id, Model: model, Provider: x.provider, TargetModel: x.targetModel, Variant: x.variant,
		Status: x.status, Stream: x.body != nil && x.body.Stream,
		LatencyMS: usage.Millis(time.Since(x.start)), TTFTMS: usage.Millis(x.ttft),
		CacheHit: x.cache, Withheld: x.withheld != "", WithheldReason: x.withheld, Error: x.errCode,
	}
	if x.key != nil {
		rec.KeyID = x.key.ID
	}
	x.rt.prices.Bill(&rec, x.usage)
	x.rt.accounting.sink.Write(rec)
}
