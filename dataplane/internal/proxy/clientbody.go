package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"rolter.dev/pkg/config"
	"rolter.dev/pkg/request"
)

// clientBody is a request body with the bounds of reading it: a deadline
// (server.body_read_timeout_secs from the handler's start, which is when the
// headers had arrived) and how much of it may be thrown away after a
// refusal. It records whether the body was read to its end.
type clientBody struct {
	io.ReadCloser
	deadline time.Time
	discard  int64
	eof      bool
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// watchBody wraps r.Body. snap may be nil (no config yet): the defaults
// apply.
func watchBody(r *http.Request, snap *config.Snapshot, now time.Time) *clientBody {
	timeout, discard := time.Duration(config.DefaultBodyReadTimeoutSecs)*time.Second, int64(config.DefaultMaxDiscardBytes)
	if snap != nil {
		timeout, discard = time.Duration(snap.Server.BodyReadTimeoutSecs)*time.Second, snap.Server.MaxDiscardBytes
	}
	b := &clientBody{ReadCloser: r.Body, deadline: now.Add(timeout), discard: discard}
	if r.Body == nil || r.Body == http.NoBody {
		b.ReadCloser, b.eof = http.NoBody, true
	}
	r.Body = b
	return b
}

// watchRequest loads the runtime a request is served with (nil before the
// first config) and watches its body with that runtime's limits.
func (p *Proxy) watchRequest(r *http.Request, start time.Time) (*runtime, *clientBody) {
	rt := p.rt.Load()
	var snap *config.Snapshot
	if rt != nil {
		snap = rt.snap
	}
	return rt, watchBody(r, snap, start)
}

// unavailable is the refusal of every API request while the proxy cannot
// serve one: after Halt (few arrive: the listener closed before it) or
// before its first config; nil otherwise.
func (p *Proxy) unavailable(rt *runtime) (*apiError, string) {
	switch {
	case p.halted.Err() != nil:
		return &errShuttingDown, msgShuttingDown
	case rt == nil:
		return &errNoTarget, "no configuration loaded yet"
	}
	return nil, ""
}

// readBody reads the whole body within its deadline and limit. The deadline
// is on the connection, so a client that stops sending is cut off even
// mid-read; it is cleared once the body is in, because the server keeps
// reading the connection in the background while the response streams and
// an expired deadline there would cancel the request.
func readBody(w http.ResponseWriter, r *http.Request, b *clientBody, limit int64) ([]byte, *apiError, string) {
	if ce := contentCoding(r.Header); ce != "" { // refused on its header, unread
		// RFC 9110 §15.5.16: say which codings would have been accepted.
		w.Header().Set("Accept-Encoding", "identity")
		return nil, &errContentEncoding, fmt.Sprintf("the request body has Content-Encoding %q, which is not supported; send it uncompressed", ce)
	}
	if r.ContentLength > limit { // refused on its declared length, unread
		return nil, &errTooLarge, fmt.Sprintf("request body is larger than %d bytes", limit)
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(b.deadline) // not supported by test recorders: then unbounded
	raw, err := request.Read(b, limit)
	if err == nil {
		_ = rc.SetReadDeadline(time.Time{})
	}
	switch {
	case errors.Is(err, request.ErrTooLarge):
		return nil, &errTooLarge, fmt.Sprintf("request body is larger than %d bytes", limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, &errBodyTimeout, "the request body did not arrive in time (server.body_read_timeout_secs); closing the connection"
	case err != nil:
		return nil, &errInvalidRequest, "could not read the request body"
	}
	return raw, nil, ""
}

// contentCoding returns the request's Content-Encoding when it names a
// coding (gzip, deflate, br…): bodies are read as they come, never decoded.
// None, or identity only, is "".
func contentCoding(h http.Header) string {
	vs := h.Values("Content-Encoding")
	for _, v := range vs {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				if all := strings.Join(vs, ", "); len(all) <= 100 {
					return all
				}
				return c[:min(len(c), 100)] // echoed in the error: bounded
			}
		}
	}
	return ""
}

// refuse answers with an error. When the body was not read to its end (the
// request was refused on its headers, or its body is too large or stalled),
// the answer must not wait for the body: Go's HTTP/1 server would otherwise
// try to read the rest before sending it. So the connection is marked to
// close, the answer flushed at once, and then up to server.max_discard_bytes
// of the body read and dropped before the deadline: a client that writes its
// whole body before it reads (Python's urllib, most raw HTTP/1.1 clients)
// then finds the answer instead of a reset, which is what closing a socket
// with unread data in it sends. A body declared larger than the discard
// bound is not read at all: the reset would come anyway.
func refuse(w http.ResponseWriter, r *http.Request, b *clientBody, d dialect, e apiError, msg string) {
	if b == nil || b.eof || r.ProtoMajor != 1 {
		// HTTP/2 resets only the stream of an unread body, after the answer.
		writeError(w, d, e, msg)
		return
	}
	rc := http.NewResponseController(w)
	// Full duplex: the handler may read the body after writing, and the
	// server does not try to drain it before the answer.
	_ = rc.EnableFullDuplex()
	w.Header().Set("Connection", "close")
	writeError(w, d, e, msg)
	if err := rc.Flush(); err != nil {
		return
	}
	if b.discard <= 0 || r.ContentLength > b.discard {
		return
	}
	if err := rc.SetReadDeadline(b.deadline); err != nil {
		return // cannot bound the read
	}
	_, _ = io.CopyN(io.Discard, b.ReadCloser, b.discard)
}
