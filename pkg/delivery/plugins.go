package delivery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Limits of the plugin reply.
const (
	// maxReplyBytes caps a plugin reply (a transform carries a whole body).
	maxReplyBytes = 32 << 20
	// maxAnnotations caps the headers one annotate reply may add.
	maxAnnotations = 32
	// maxAnnotationBytes caps one annotation header value.
	maxAnnotationBytes = 1024
	// maxBlockReason caps the client-facing reason of a block reply.
	maxBlockReason = 512
)

// Plugin reply actions.
const (
	PluginAllow     = "allow"
	PluginBlock     = "block"
	PluginTransform = "transform"
	PluginAnnotate  = "annotate"
)

// Envelope is the JSON body POSTed to a post_response plugin.
type Envelope struct {
	// Plugin is the plugin's configured name.
	Plugin string `json:"plugin"`
	// Stage is "post_response".
	Stage string `json:"stage"`
	// Model is the model the client asked for; Route the route that
	// served it.
	Model string `json:"model"`
	Route string `json:"route"`
	// RequestID is the request's x-request-id.
	RequestID string `json:"request_id"`
	// Status and ContentType are the response's.
	Status      int    `json:"status"`
	ContentType string `json:"content_type"`
	// Body is the JSON response body as a JSON value (after the
	// guardrails and the transforms of earlier plugins).
	Body json.RawMessage `json:"body"`
}

// Reply is a plugin's decoded answer.
type Reply struct {
	// Action is allow, block, transform or annotate.
	Action string `json:"action"`
	// Reason is a block's client-facing explanation (optional).
	Reason string `json:"reason,omitempty"`
	// Body is a transform's replacement body, a JSON value.
	Body json.RawMessage `json:"body,omitempty"`
	// Headers are an annotate's response headers: names must start with
	// "x-" and not with "x-rolter-".
	Headers map[string]string `json:"headers,omitempty"`
}

// errMalformed wraps every reply that does not follow the contract.
var errMalformed = errors.New("delivery: malformed plugin reply")

// DecodeReply decodes and checks a plugin reply. An unknown action, a
// transform without a JSON body, an annotation header outside the x-
// namespace (or in x-rolter-) or with an invalid value is malformed; unknown
// members are ignored.
func DecodeReply(data []byte) (Reply, error) {
	var r Reply
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&r); err != nil {
		return Reply{}, fmt.Errorf("%w: %w", errMalformed, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Reply{}, fmt.Errorf("%w: trailing data", errMalformed)
	}
	switch r.Action {
	case PluginAllow:
	case PluginBlock:
		r.Reason = cleanReason(r.Reason)
	case PluginTransform:
		if len(r.Body) == 0 || string(r.Body) == "null" {
			return Reply{}, fmt.Errorf("%w: transform without a body", errMalformed)
		}
	case PluginAnnotate:
		if len(r.Headers) > maxAnnotations {
			return Reply{}, fmt.Errorf("%w: %d headers (at most %d)", errMalformed, len(r.Headers), maxAnnotations)
		}
		for k, v := range r.Headers {
			if err := checkAnnotation(k, v); err != nil {
				return Reply{}, err
			}
		}
	default:
		return Reply{}, fmt.Errorf("%w: unknown action %q", errMalformed, r.Action)
	}
	return r, nil
}

// checkAnnotation accepts an x- header that is not one of the gateway's
// own (x-rolter-*, x-request-id) with a printable value.
func checkAnnotation(name, value string) error {
	lower := strings.ToLower(name)
	if !strings.HasPrefix(lower, "x-") || strings.HasPrefix(lower, "x-rolter-") || lower == "x-request-id" {
		return fmt.Errorf("%w: header %q is not an x- annotation", errMalformed, name)
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return fmt.Errorf("%w: invalid header name %q", errMalformed, name)
		}
	}
	if len(value) > maxAnnotationBytes {
		return fmt.Errorf("%w: header %q value longer than %d bytes", errMalformed, name, maxAnnotationBytes)
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return fmt.Errorf("%w: header %q has a control character", errMalformed, name)
		}
	}
	return nil
}

// isTokenChar reports whether c may appear in an HTTP header name (RFC 9110
// token).
func isTokenChar(c byte) bool {
	return isAlnum(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// cleanReason bounds a block reason and drops control characters.
func cleanReason(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, s)
	if len(s) > maxBlockReason {
		cut := maxBlockReason
		for cut > 0 && s[cut]&0xc0 == 0x80 {
			cut--
		}
		s = s[:cut]
	}
	return strings.TrimSpace(s)
}

// plugin is a post_response plugin ready to call.
type plugin struct {
	name       string
	url        string
	timeout    time.Duration
	failClosed bool
	token      string
}

// callFailure classifies a failed call for logs and refusal reasons; it
// never contains content.
type callFailure struct {
	class string // timeout, unreachable, status, malformed
	err   error
}

func (f *callFailure) Error() string { return f.class + ": " + f.err.Error() }
func (f *callFailure) Unwrap() error { return f.err }

// postJSON POSTs payload to url within timeout and returns the 2xx reply
// body, at most maxReplyBytes. Failures are *callFailure.
func postJSON(ctx context.Context, client *http.Client, url, token, requestID string, timeout time.Duration, payload []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return nil, &callFailure{class: "unreachable", err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if requestID != "" {
		req.Header.Set("X-Request-Id", requestID)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, classify(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, &callFailure{class: "status", err: fmt.Errorf("status %d", resp.StatusCode)}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes+1))
	if err != nil {
		return nil, classify(ctx, err)
	}
	if len(body) > maxReplyBytes {
		return nil, &callFailure{class: "malformed", err: fmt.Errorf("reply larger than %d bytes", maxReplyBytes)}
	}
	return body, nil
}

func classify(ctx context.Context, err error) error {
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return &callFailure{class: "timeout", err: err}
	case errors.Is(ctx.Err(), context.Canceled):
		return &callFailure{class: classCancelled, err: err}
	}
	return &callFailure{class: "unreachable", err: err}
}

// classCancelled is the failure of a call its caller gave up on: the
// client left, or the proxy halted it (a drain). It is no fault of the
// service called, so it is counted apart from the errors (countFailure).
const classCancelled = "cancelled"

// failureClass returns the class of a call error.
func failureClass(err error) string {
	var f *callFailure
	if errors.As(err, &f) {
		return f.class
	}
	return "malformed"
}

// encodeEnvelope encodes the envelope without HTML escaping, so the
// plugin sees the body's strings as they are.
func encodeEnvelope(env *Envelope) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(env); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// call sends one envelope to the plugin and decodes its reply.
func (p *plugin) call(ctx context.Context, client *http.Client, env *Envelope) (Reply, error) {
	payload, err := encodeEnvelope(env)
	if err != nil {
		return Reply{}, &callFailure{class: "malformed", err: err}
	}
	body, err := postJSON(ctx, client, p.url, p.token, env.RequestID, p.timeout, payload)
	if err != nil {
		return Reply{}, err
	}
	r, err := DecodeReply(body)
	if err != nil {
		return Reply{}, &callFailure{class: "malformed", err: err}
	}
	return r, nil
}
