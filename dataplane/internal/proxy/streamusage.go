package proxy

import (
	"bytes"
	"encoding/json"

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

// asksUsage reports whether an attempt of x at provider prov asks for the
// stream's usage on the client's behalf.
func asksUsage(x *exchange, prov *config.CompiledProvider) bool {
	return x.ep.streamUsage && prov.StreamUsage && prov.Kind != config.KindAnthropic && x.body.CanAskUsage()
}

// upstreamBody is the body an attempt at prov sends, before its model is
// rewritten: the client's, or the one asking for the usage (built once per
// exchange). It records in x.askedUsage which, for the attempt's relay.
func (x *exchange) upstreamBody(prov *config.CompiledProvider) *request.Body {
	x.askedUsage = asksUsage(x, prov)
	if !x.askedUsage {
		return x.body
	}
	if x.usageBody == nil {
		x.usageBody = x.body.WithStreamUsage()
	}
	return x.usageBody
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
