package sse

import (
	"bytes"
	"encoding/json"
)

// Recorder splits a server-sent-events byte stream into events as it
// arrives and keeps them, up to a size cap, for the response cache. The zero
// Recorder has no cap; use [NewRecorder] to set one. A Recorder is not safe
// for concurrent use.
type Recorder struct {
	max int64 // 0 = no cap

	// data holds the kept events back to back (without separators), then
	// the event being read: complete lines each followed by '\n', then the
	// line in progress.
	data      []byte
	ends      []int // end offset in data of each kept event
	evStart   int   // where the event being read starts in data
	lineStart int   // where the line in progress starts in data

	pendingCR bool // the last byte seen was '\r': a following '\n' belongs to it

	tooLarge bool
	terminal bool // the terminal event was dispatched
	errEvent bool // an error event was dispatched
	ended    bool
	endErr   bool
}

// NewRecorder returns a Recorder that gives up (see [Recorder.TooLarge]) once
// the replayed size of its events would exceed maxBytes; 0 means no cap.
func NewRecorder(maxBytes int64) *Recorder {
	return &Recorder{max: max(maxBytes, 0)}
}

// Write records the next bytes of the stream. It always returns len(p) and a
// nil error, so it can sit behind an io.MultiWriter or io.TeeReader without
// ever disturbing the stream. Bytes written after [Recorder.End], or once
// the recording is too large, are ignored. Write does not keep p.
func (r *Recorder) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 && !r.tooLarge && !r.ended {
		if r.pendingCR {
			r.pendingCR = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		i := lineEnd(p)
		if i < 0 {
			r.appendData(p)
			break
		}
		r.appendData(p[:i])
		r.pendingCR = p[i] == '\r'
		p = p[i+1:]
		r.endLine()
	}
	return n, nil
}

// lineEnd returns the index of the first '\r' or '\n' in p, or -1.
func lineEnd(p []byte) int {
	n := bytes.IndexByte(p, '\n')
	limit := p
	if n >= 0 {
		limit = p[:n]
	}
	if r := bytes.IndexByte(limit, '\r'); r >= 0 {
		return r
	}
	return n
}

// appendData adds bytes to the event being read, enforcing the cap on the
// least the recording will take when replayed: the events kept so far, each
// with its blank line, plus the event being read, which gains at least one
// byte when its blank line replaces its last line's '\n'.
func (r *Recorder) appendData(p []byte) {
	if r.tooLarge || len(p) == 0 {
		return
	}
	if r.max > 0 && int64(len(r.data)+len(p)+2*len(r.ends)+1) > r.max {
		r.giveUp()
		return
	}
	if len(r.data)+len(p) > cap(r.data) {
		// Double, rather than append's 1.25x for large slices: a recording
		// grows a little at a time and is copied ~2x instead of ~5x.
		// The cap bounds the data, so never reserve past it.
		c := max(2*cap(r.data), 4<<10)
		if r.max > 0 {
			c = int(min(int64(c), r.max))
		}
		grown := make([]byte, len(r.data), max(c, len(r.data)+len(p)))
		copy(grown, r.data)
		r.data = grown
	}
	r.data = append(r.data, p...)
}

func (r *Recorder) giveUp() {
	r.tooLarge = true
	r.data, r.ends = nil, nil
	r.evStart, r.lineStart = 0, 0
}

var newline = []byte{'\n'}

// endLine ends the line in progress: a blank line dispatches the event.
func (r *Recorder) endLine() {
	switch {
	case r.tooLarge:
	case r.lineStart < len(r.data): // a non-blank line
		r.appendData(newline)
		r.lineStart = len(r.data)
	case len(r.data) > r.evStart: // a blank line after at least one line
		r.data = r.data[:len(r.data)-1] // the last line's '\n'
		r.dispatch()
		r.lineStart = len(r.data)
	}
}

// dispatch keeps the event data[evStart:] unless it holds only comments, and
// notes a terminal or error event.
func (r *Recorder) dispatch() {
	ev := r.data[r.evStart:]
	var typ, payload []byte
	hasField := false
	for line := range bytes.SplitSeq(ev, newline) {
		if len(line) > 0 && line[0] == ':' {
			continue // a comment
		}
		hasField = true
		name, value, _ := bytes.Cut(line, []byte{':'})
		value = bytes.TrimPrefix(value, []byte{' '})
		switch string(name) {
		case "event":
			typ = value
		case "data":
			if payload != nil {
				payload = append(append(payload, '\n'), value...)
			} else {
				payload = value[:len(value):len(value)] // appending copies
			}
		}
	}
	if !hasField {
		r.data = r.data[:r.evStart]
		return
	}
	switch {
	case string(typ) == "message_stop", string(payload) == "[DONE]":
		r.terminal = true
	case string(typ) == "error", isErrorPayload(payload):
		r.errEvent = true
	}
	r.ends = append(r.ends, len(r.data))
	r.evStart = len(r.data)
}

// isErrorPayload reports whether an event's data is a JSON object with a
// top-level "error" member, or an "object" or "type" of "error".
func isErrorPayload(p []byte) bool {
	if len(p) == 0 || p[0] != '{' || !bytes.Contains(p, []byte(`"error"`)) {
		return false // the common case: no need to parse
	}
	var v struct {
		Error  json.RawMessage `json:"error"`
		Object string          `json:"object"`
		Type   string          `json:"type"`
	}
	if json.Unmarshal(p, &v) != nil {
		return false
	}
	return (len(v.Error) > 0 && string(v.Error) != "null") || v.Object == "error" || v.Type == "error"
}

// End marks the end of the stream. err is the error that ended it early (an
// upstream read error, or the client's write error or disconnect), nil if
// the upstream body ended normally. An event still open at a normal end (its
// blank line missing) is dispatched. End is idempotent: later calls are
// ignored.
func (r *Recorder) End(err error) {
	if r.ended {
		return
	}
	if err != nil {
		r.endErr = true
	} else if !r.tooLarge {
		r.pendingCR = false
		if r.lineStart < len(r.data) {
			r.endLine() // the line in progress
		}
		r.endLine() // the missing blank line (a no-op after a complete event)
	}
	r.ended = true
}

// Complete reports whether the recording may be stored: the stream ended
// without error, within the cap, after its terminal event, and carried no
// error event.
func (r *Recorder) Complete() bool {
	return r.ended && !r.endErr && !r.tooLarge && r.terminal && !r.errEvent
}

// TooLarge reports whether the recording exceeded its cap and was dropped.
func (r *Recorder) TooLarge() bool { return r.tooLarge }

// Terminal reports whether the stream's terminal event has been seen.
func (r *Recorder) Terminal() bool { return r.terminal }

// Events returns the events recorded so far, without their blank-line
// separators and with "\n" line endings. The slices alias the Recorder's
// buffer: they stay valid, unchanged, until the next Write or End.
func (r *Recorder) Events() [][]byte {
	evs := make([][]byte, len(r.ends))
	start := 0
	for i, end := range r.ends {
		evs[i] = r.data[start:end:end]
		start = end
	}
	return evs
}

// Size returns the size of the recorded events when replayed, each followed
// by its blank line.
func (r *Recorder) Size() int64 {
	if len(r.ends) == 0 {
		return 0
	}
	return int64(r.ends[len(r.ends)-1] + 2*len(r.ends))
}
