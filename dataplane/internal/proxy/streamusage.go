package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"

	"rolter.dev/pkg/config"
	"rolter.dev/pkg/request"
	"rolter.dev/pkg/usage"
)

// A stream's usage, asked for the client (providers[].stream_usage).
//
// An OpenAI chat or completions stream carries its token counts only when
// the client sets stream_options.include_usage, which the SDKs leave unset:
// without it the usage record is usage_unknown, the cost zero, and the
// /tokenize check never runs. So the proxy asks the upstream for it on the
// client's behalf, and takes the chunk the upstream adds for it (an event
// whose data has "choices":[] and a usage, sent before [DONE]) out of the
// stream the client gets, which is then the stream it asked for. The usage
// tap reads the upstream's bytes, the client and the cache recorder the
// filtered ones.

// An upstream may refuse the option (an OpenAI-compatible server that
// forbids fields it does not know, an Azure API version before it): the
// client would get a 400 about a field it never sent. So a 400 or 422 to
// an attempt that added it, naming stream_options, is not the answer: the
// attempt is sent again as the client wrote it, and the provider is not
// asked for usage again for RefusalFor (a warn line says so).

// RefusalFor is how long a provider that refused the option is not asked
// for usage; then it is tried again (an upgraded server may take it).
const RefusalFor = time.Hour

// refusalPeek bounds how much of a 400 body is read to find the option
// named; an error is short.
const refusalPeek = 16 << 10

// refusals are the providers that refused the option, until when.
type refusals struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func (r *refusals) refused(provider string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return now.Before(r.until[provider])
}

func (r *refusals) add(provider string, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.until == nil {
		r.until = map[string]time.Time{}
	}
	r.until[provider] = until
}

// asksUsage reports whether an attempt of x at provider prov asks for the
// stream's usage on the client's behalf.
func (p *Proxy) asksUsage(x *exchange, prov *config.CompiledProvider, now time.Time) bool {
	return x.ep.streamUsage && prov.StreamUsage && prov.Kind != config.KindAnthropic && x.body.CanAskUsage() &&
		!p.usageRefused.refused(prov.Name, now)
}

// upstreamBody is the body an attempt at prov sends, before its model is
// rewritten: the client's, or the one asking for the usage (built once per
// exchange) when ask. It records in x.askedUsage which, for the attempt's
// relay.
func (x *exchange) upstreamBody(ask bool) *request.Body {
	x.askedUsage = ask
	if !ask {
		return x.body
	}
	if x.usageBody == nil {
		x.usageBody = x.body.WithStreamUsage()
	}
	return x.usageBody
}

// refusedUsage reports whether resp, the answer to an attempt that asked
// for the usage, refuses the option; the body it read is put back when
// not.
func refusedUsage(resp *http.Response) bool {
	if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusUnprocessableEntity {
		return false
	}
	peek, _ := io.ReadAll(io.LimitReader(resp.Body, refusalPeek))
	if bytes.Contains(peek, []byte("stream_options")) || bytes.Contains(peek, []byte("include_usage")) {
		return true
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(peek), resp.Body), resp.Body}
	return false
}

// usageStrip passes a stream through event by event, leaving out the usage
// chunk. An event is held until its blank line arrives (the client can do
// nothing with half an event), so nothing is delayed that could be used.
// An event that grows past usage.MaxEventBytes is no usage chunk: from
// then on the stream passes unfiltered.
type usageStrip struct {
	pending []byte // the bytes of the event not yet ended
	scanned int    // how far pending has been searched for its end
	lineLen int    // bytes of the current line up to scanned
	out     []byte // reused output buffer
	off     bool   // gave up: pass everything through
}

// next takes the stream's next bytes and returns what may go to the client
// now, valid until the next call.
func (s *usageStrip) next(b []byte) []byte {
	if s.off {
		return b
	}
	if len(s.pending) == 0 && bytes.HasSuffix(b, []byte("\n\n")) && !bytes.Contains(b, usageKey) {
		// Whole events (vLLM writes one or more at a time), none of them
		// the usage chunk: they pass as they are.
		return b
	}
	s.out = s.out[:0]
	s.pending = append(s.pending, b...)
	for {
		end, ok := s.eventEnd()
		if !ok {
			break
		}
		if ev := s.pending[:end]; !isUsageChunk(ev) {
			s.out = append(s.out, ev...)
		}
		n := copy(s.pending, s.pending[end:])
		s.pending, s.scanned, s.lineLen = s.pending[:n], 0, 0
	}
	if len(s.pending) > usage.MaxEventBytes {
		s.off = true
		s.out = append(s.out, s.pending...)
		s.pending = nil
	}
	return s.out
}

// rest returns the bytes held back (an event the stream ended within); the
// filter then holds nothing.
func (s *usageStrip) rest() []byte {
	p := s.pending
	s.pending, s.scanned, s.lineLen = nil, 0, 0
	return p
}

// eventEnd finds the end of the first event in pending: just past the
// blank line that ends it. Lines end in "\n", "\r\n" or "\r" (the SSE
// grammar); a "\r" at the end of pending waits for the next byte.
func (s *usageStrip) eventEnd() (int, bool) {
	p := s.pending
	for i := s.scanned; i < len(p); i++ {
		if j := bytes.IndexAny(p[i:], "\r\n"); j != 0 {
			// The rest of a line, skipped at once.
			if j < 0 {
				s.lineLen += len(p) - i
				break
			}
			s.lineLen += j
			i += j
		}
		switch p[i] {
		case '\r':
			if i+1 == len(p) {
				s.scanned = i
				return 0, false
			}
			if p[i+1] == '\n' {
				i++
			}
			fallthrough
		case '\n':
			if s.lineLen == 0 {
				return i + 1, true
			}
			s.lineLen = 0
		}
	}
	s.scanned = len(p)
	return 0, false
}

var usageKey = []byte(`"usage"`)

// isUsageChunk reports whether an SSE event is the usage chunk: one data
// field whose JSON has an empty choices array and a usage that is not
// null. Only events holding the JSON string "usage" are decoded: a key, or
// a text that is exactly the word (a quote within a string is escaped), so
// nearly every event is passed after one scan.
func isUsageChunk(ev []byte) bool {
	if !bytes.Contains(ev, usageKey) {
		return false
	}
	var data []byte
	for line := range bytes.Lines(ev) {
		line = bytes.TrimRight(line, "\r\n")
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if data != nil {
				return false // several data lines: not the engine's chunk
			}
			data = bytes.TrimPrefix(v, []byte(" "))
		}
	}
	var c struct {
		Choices *[]json.RawMessage `json:"choices"`
		Usage   json.RawMessage    `json:"usage"`
	}
	if data == nil || json.Unmarshal(data, &c) != nil {
		return false
	}
	return c.Choices != nil && len(*c.Choices) == 0 && len(c.Usage) > 0 && string(c.Usage) != "null"
}
