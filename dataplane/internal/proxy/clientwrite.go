package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"
)

// errClientWriteTimeout wraps the error of a write to the client that did
// not complete within server.client_write_timeout_ms.
var errClientWriteTimeout = errors.New("proxy: the client took none of the response for server.client_write_timeout_ms")

// stallWriter bounds every write to the client (status line and headers
// when they go out, body, at most maxStallWrite bytes of it at a time,
// flush): before each it sets the write deadline (HTTP/1.1: the
// connection's; HTTP/2: the stream's) to now plus the timeout, and clears
// it once the write returned. A client that stops reading therefore fails
// the write that fills its window, within the timeout, instead of holding
// the handler, its upstream request and the replica's slot for as long as
// it keeps the connection open; its error wraps [errClientWriteTimeout].
// It is a stall timeout, not a total one: each write gets the whole
// timeout, and the time a stream waits for its upstream's next event has
// none set (an HTTP/2 stream deadline is a timer that would reset the
// stream even with no write in progress).
//
// The server writes the end of the response (HTTP/1.1: what is still
// buffered and the chunked terminator; HTTP/2: the last DATA frame) after
// the handler returns; [stallWriter.finish] sets the deadline once more for
// that. The server clears it afterwards (HTTP/1.1: once the response is
// finished, before the connection waits for its next request; HTTP/2: when
// the stream closes).
//
// A stallWriter belongs to one request's handler goroutine.
type stallWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController // of the server's writer
	ctx      context.Context          // the request's
	h1       bool
	timeout  time.Duration
	deadline time.Time // of the write in progress or the last one
	timedOut bool
}

func newStallWriter(w http.ResponseWriter, r *http.Request, timeout time.Duration) *stallWriter {
	return &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), ctx: r.Context(), h1: r.ProtoMajor == 1, timeout: timeout}
}

// arm sets the deadline of the write about to start. A writer that cannot
// take one (a test recorder) writes unbounded, as it did before.
func (w *stallWriter) arm() {
	w.deadline = time.Now().Add(w.timeout)
	_ = w.rc.SetWriteDeadline(w.deadline)
}

// disarm clears the deadline after a write, and tells a write that failed
// because it passed from any other failure.
func (w *stallWriter) disarm(err error) error {
	if err == nil {
		_ = w.rc.SetWriteDeadline(time.Time{})
		return nil
	}
	// HTTP/1.1 returns the connection's deadline error; HTTP/2 resets the
	// stream, and the blocked write returns "stream closed", after the
	// deadline.
	if errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(w.deadline) {
		w.timedOut = true
	}
	if w.timedOut {
		return fmt.Errorf("%w: %w", errClientWriteTimeout, err)
	}
	return err
}

// maxStallWrite is the most one deadline covers. A larger write (a body
// the proxy holds whole: buffered for the cache or the delivery policy, or
// replayed from the cache) goes out in pieces of this size, each with its
// own deadline, so that a client that keeps reading is asked for as much
// per timeout as by a relayed body (copyBufs' 32 KiB), not for the whole
// body within one timeout.
const maxStallWrite = 32 << 10

func (w *stallWriter) Write(b []byte) (int, error) {
	n := 0
	for {
		w.arm()
		m, err := w.ResponseWriter.Write(b[n:min(len(b), n+maxStallWrite)])
		n += m
		if err = w.disarm(err); err != nil || n >= len(b) {
			return n, err
		}
	}
}

// WriteHeader bounds an informational (1xx) response, which the server
// writes at once; a final status only goes out with the first write or
// flush.
func (w *stallWriter) WriteHeader(code int) {
	if code >= 200 {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.arm()
	w.ResponseWriter.WriteHeader(code)
	_ = w.disarm(nil)
}

// FlushError is what http.ResponseController calls.
func (w *stallWriter) FlushError() error {
	w.arm()
	return w.disarm(w.rc.Flush())
}

// Unwrap lets http.ResponseController reach the server's writer (read
// deadlines, full duplex).
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish bounds what the server still writes once the handler returns.
// Not after a write timed out: nothing more can be written. Nor on an
// HTTP/2 stream the client already closed: the deadline would be a timer
// that nothing stops.
func (w *stallWriter) finish() {
	if w.timedOut || !w.h1 && w.ctx.Err() != nil {
		return
	}
	w.arm()
}
