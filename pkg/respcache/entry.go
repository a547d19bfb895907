package respcache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"rolter.dev/pkg/respcache/sse"
)

// Entry is a stored response: the upstream's own status, content type and
// bytes, before any delivery policy ran.
type Entry struct {
	// Status is the upstream's HTTP status: always 200 in a stored entry
	// (see [Storable]).
	Status int
	// ContentType is the upstream's Content-Type.
	ContentType string
	// Body is the body of a response that is not a server-sent-events
	// stream.
	Body []byte
	// Events are the events of a streamed response, each without its
	// blank-line separator (see package sse); nil otherwise.
	Events [][]byte
}

// IsSSE reports whether the entry is a server-sent-events stream, by its
// content type (see [IsEventStream]).
func (e *Entry) IsSSE() bool { return IsEventStream(e.ContentType) }

// Size returns the number of body bytes the entry replays: the body, or
// every event followed by its blank line.
func (e *Entry) Size() int64 {
	n := int64(len(e.Body))
	for _, ev := range e.Events {
		n += int64(len(ev)) + 2
	}
	return n
}

// WriteBody writes the entry's body to w: the stored bytes in one write, or
// for a stream the events as a well-formed SSE stream, flushed after each
// event (see sse.Replay). The caller has already written the status and
// headers.
func (e *Entry) WriteBody(ctx context.Context, w io.Writer) error {
	if e.Events != nil {
		return sse.Replay(ctx, w, e.Events)
	}
	if _, err := w.Write(e.Body); err != nil {
		return fmt.Errorf("respcache: write body: %w", err)
	}
	return nil
}

// IsEventStream reports whether a Content-Type is text/event-stream: its
// media type (before any ';'), trimmed, compared case-insensitively.
func IsEventStream(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// IsJSON reports whether a Content-Type is JSON's (application/json, any
// parameters).
func IsJSON(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// The stored form of an entry, version 1, all integers unsigned varints:
//
//	'r' 'c' version flags
//	status (200: an entry of another status does not decode)
//	len(content type) content type
//	[flagEmbedding] dims, dims × float32 little-endian
//	[flagEvents]    count, count × (len event)
//	otherwise       len(body) body
//
// Anything else (another magic or version, a length past the end, trailing
// bytes) does not decode, and is a miss.
const (
	entryVersion  = 1
	flagEvents    = 1 << 0
	flagEmbedding = 1 << 1
	knownFlags    = flagEvents | flagEmbedding

	maxContentType = 1 << 10
	maxDims        = 1 << 16
)

var errDecode = errors.New("respcache: stored entry does not decode")

// encodeEntry returns the stored form of e, with an embedding when emb is
// not nil (a semantic entry).
func encodeEntry(e *Entry, emb []float32) []byte {
	flags := byte(0)
	size := 4 + 3*binary.MaxVarintLen64 + len(e.ContentType) + len(e.Body)
	if e.Events != nil {
		flags |= flagEvents
		for _, ev := range e.Events {
			size += binary.MaxVarintLen64 + len(ev)
		}
	}
	if emb != nil {
		flags |= flagEmbedding
		size += binary.MaxVarintLen64 + 4*len(emb)
	}
	b := make([]byte, 0, size)
	b = append(b, 'r', 'c', entryVersion, flags)
	b = binary.AppendUvarint(b, uint64(e.Status))
	b = binary.AppendUvarint(b, uint64(len(e.ContentType)))
	b = append(b, e.ContentType...)
	if emb != nil {
		b = binary.AppendUvarint(b, uint64(len(emb)))
		for _, f := range emb {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
		}
	}
	if e.Events != nil {
		b = binary.AppendUvarint(b, uint64(len(e.Events)))
		for _, ev := range e.Events {
			b = binary.AppendUvarint(b, uint64(len(ev)))
			b = append(b, ev...)
		}
	} else {
		b = binary.AppendUvarint(b, uint64(len(e.Body)))
		b = append(b, e.Body...)
	}
	return b
}

// decodeEntry decodes a stored entry and its embedding (nil for an exact
// entry). The entry's byte slices alias b.
func decodeEntry(b []byte) (*Entry, []float32, error) {
	d := decoder{b: b}
	if len(b) < 4 || b[0] != 'r' || b[1] != 'c' || b[2] != entryVersion || b[3]&^knownFlags != 0 {
		return nil, nil, errDecode
	}
	flags := b[3]
	d.b = b[4:]
	e := &Entry{}
	status := d.uvarint()
	if status > 599 || !Storable(int(status)) {
		return nil, nil, errDecode
	}
	e.Status = int(status)
	e.ContentType = string(d.bytes(maxContentType))
	var emb []float32
	if flags&flagEmbedding != 0 {
		n := d.uvarint()
		if n == 0 || n > maxDims || n*4 > uint64(len(d.b)) {
			return nil, nil, errDecode
		}
		emb = make([]float32, n)
		for i := range emb {
			emb[i] = math.Float32frombits(binary.LittleEndian.Uint32(d.b[4*i:]))
		}
		d.b = d.b[4*n:]
	}
	if flags&flagEvents != 0 {
		n := d.uvarint()
		if n > uint64(len(d.b)) { // each event takes at least its length byte
			return nil, nil, errDecode
		}
		e.Events = make([][]byte, n)
		for i := range e.Events {
			e.Events[i] = d.bytes(math.MaxInt)
		}
	} else {
		e.Body = d.bytes(math.MaxInt)
	}
	if d.bad || len(d.b) != 0 {
		return nil, nil, errDecode
	}
	return e, emb, nil
}

type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad = true
		d.b = nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(limit int) []byte {
	n := d.uvarint()
	if d.bad || n > uint64(len(d.b)) || n > uint64(limit) {
		d.bad = true
		d.b = nil
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}
