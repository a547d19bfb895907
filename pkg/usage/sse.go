package usage

import (
	"bytes"
	"encoding/json"
)

// MaxEventBytes caps the data of one SSE event the parser keeps; a larger
// event (never a usage event in practice) is skipped.
const MaxEventBytes = 1 << 20

// SSEParser extracts usage from a server-sent-events response fed to it in
// chunks of any size, as they stream: an event, even a line ending "\r\n",
// may be split anywhere across writes. It understands
//
//   - OpenAI chat and completions streams: the chunk carrying a non-null
//     "usage" (the final one with stream_options.include_usage; the last
//     one wins when every chunk carries usage);
//   - OpenAI Responses streams: the "usage" of the response in
//     response.completed (or response.incomplete / response.failed);
//   - Anthropic Messages streams: message_start's message.usage (input,
//     cache read and cache write tokens) updated by message_delta's
//     cumulative usage (output tokens, and input counts when present).
//
// A stream with none of these gives a Usage that is not Known. Only events
// whose data mention "usage" are decoded, so the per-chunk cost is a scan.
// The zero value is ready to use. An SSEParser is used by one goroutine at
// a time.
type SSEParser struct {
	line       []byte // the current, unterminated line
	lineTooBig bool   // the current line passed MaxEventBytes
	skipLF     bool   // the previous byte was '\r': a following '\n' ends nothing
	data       []byte // the data of the current event
	hasData    bool
	eventBig   bool // the current event passed MaxEventBytes

	openai   *usageJSON // last OpenAI-style usage seen
	respUse  *usageJSON // last Responses usage seen
	anthro   usageJSON  // Anthropic usage merged across events
	anthroOK bool
	done     bool // the terminal event was seen
	errCode  int  // the status the stream's first error event names, 0 if none
}

// Write feeds the next bytes of the stream. It never fails and keeps at
// most one line and one event's data in memory.
func (p *SSEParser) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		if p.skipLF {
			p.skipLF = false
			if b[0] == '\n' {
				b = b[1:]
				continue
			}
		}
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			p.appendLine(b)
			break
		}
		p.appendLine(b[:i])
		p.skipLF = b[i] == '\r'
		b = b[i+1:]
		p.endLine()
	}
	return n, nil
}

func (p *SSEParser) appendLine(b []byte) {
	if p.lineTooBig {
		return
	}
	if len(p.line)+len(b) > MaxEventBytes {
		p.lineTooBig, p.line = true, p.line[:0]
		return
	}
	p.line = append(p.line, b...)
}

// endLine handles one complete line.
func (p *SSEParser) endLine() {
	line, big := p.line, p.lineTooBig
	p.line, p.lineTooBig = p.line[:0], false
	switch {
	case big:
		p.eventBig = true
	case len(line) == 0:
		p.dispatch()
	case line[0] == ':':
		// A comment (keep-alive).
	default:
		field, value, found := bytes.Cut(line, []byte(":"))
		if found && len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		if string(field) != "data" || p.eventBig {
			return // event names are not needed: every payload names its type
		}
		if len(p.data)+len(value)+1 > MaxEventBytes {
			p.eventBig, p.data = true, p.data[:0]
			return
		}
		if p.hasData {
			p.data = append(p.data, '\n')
		}
		p.data = append(p.data, value...)
		p.hasData = true
	}
}

// dispatch handles the event that a blank line ended.
func (p *SSEParser) dispatch() {
	data, ok := p.data, p.hasData && !p.eventBig
	p.data, p.hasData, p.eventBig = p.data[:0], false, false
	if ok && !p.done && terminal(data) {
		p.done = true
	}
	if ok && p.errCode == 0 {
		p.errCode = errorStatus(data)
	}
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return
	}
	var ev struct {
		Type    string     `json:"type"`
		Usage   *usageJSON `json:"usage"`
		Message *struct {
			Usage *usageJSON `json:"usage"`
		} `json:"message"`
		Response *struct {
			Usage *usageJSON `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return
	}
	switch {
	case ev.Type == "message_start":
		if ev.Message != nil && ev.Message.Usage != nil {
			p.mergeAnthropic(ev.Message.Usage)
		}
	case ev.Type == "message_delta":
		if ev.Usage != nil {
			p.mergeAnthropic(ev.Usage)
		}
	case ev.Response != nil && ev.Response.Usage != nil:
		p.respUse = ev.Response.Usage
	case ev.Usage != nil:
		p.openai = ev.Usage
	}
}

// ErrorStatus returns the HTTP status of the first error event the stream
// carried, 0 if it carried none: the answer failed although the response
// began as a success. An error event is a JSON object with a non-null
// top-level "error" (OpenAI and vLLM, which sends one when generation
// fails mid-stream, then data: [DONE]), or whose "type" or "object" is
// "error" (Anthropic, the Responses API) or whose "type" is
// response.failed. The status is the error's integer code when it is one
// (vLLM's "code": 400), else 500.
func (p *SSEParser) ErrorStatus() int { return p.errCode }

// errorStatus returns the status an event's data names as an error event
// (see ErrorStatus), 0 for any other event. Only data mentioning "error"
// or response.failed is decoded.
func errorStatus(data []byte) int {
	if len(data) == 0 || data[0] != '{' || !bytes.Contains(data, []byte(`"error"`)) && !bytes.Contains(data, []byte(`"response.failed"`)) {
		return 0
	}
	var ev struct {
		Type   string          `json:"type"`
		Object string          `json:"object"`
		Code   json.RawMessage `json:"code"`
		Error  json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return 0
	}
	hasErr := len(ev.Error) > 0 && string(ev.Error) != "null"
	if !hasErr && ev.Type != "error" && ev.Object != "error" && ev.Type != "response.failed" {
		return 0
	}
	code := ev.Code
	if hasErr {
		var inner struct {
			Code json.RawMessage `json:"code"`
		}
		if json.Unmarshal(ev.Error, &inner) == nil && len(inner.Code) > 0 {
			code = inner.Code
		}
	}
	var n int
	if json.Unmarshal(code, &n) == nil && n >= 400 && n <= 599 {
		return n
	}
	return 500
}

// terminalTypes are the "type" of the events that end a stream: Anthropic
// Messages, and OpenAI Responses (completed, cut at a limit, or failed).
var terminalTypes = [...]string{"message_stop", "response.completed", "response.incomplete", "response.failed"}

// terminal reports whether an event's data ends its stream: OpenAI chat
// and completions' [DONE], or a JSON object whose type is terminal. Only
// data naming such a type is decoded.
func terminal(data []byte) bool {
	if string(data) == "[DONE]" {
		return true
	}
	named := false
	for _, t := range terminalTypes {
		named = named || bytes.Contains(data, []byte(t))
	}
	if !named {
		return false
	}
	var ev struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return false
	}
	for _, t := range terminalTypes {
		if ev.Type == t {
			return true
		}
	}
	return false
}

// Done reports whether the stream's terminal event has arrived in a
// complete event (see [terminal]): what follows it carries no more of the
// answer, so a stream that breaks off after it is still complete.
func (p *SSEParser) Done() bool { return p.done }

// mergeAnthropic folds a message_start or message_delta usage into the
// running total: every count present replaces the earlier one (the delta's
// counts are cumulative).
func (p *SSEParser) mergeAnthropic(u *usageJSON) {
	for _, f := range []struct{ dst, src *count }{
		{&p.anthro.InputTokens, &u.InputTokens},
		{&p.anthro.OutputTokens, &u.OutputTokens},
		{&p.anthro.CacheReadInputTokens, &u.CacheReadInputTokens},
		{&p.anthro.CacheCreationInputTokens, &u.CacheCreationInputTokens},
	} {
		if f.src.present {
			*f.dst = *f.src
		}
	}
	p.anthroOK = true
}

// Usage returns the usage seen so far, in complete events.
func (p *SSEParser) Usage() Usage {
	switch {
	case p.openai != nil:
		return p.openai.toUsage()
	case p.respUse != nil:
		return p.respUse.toUsage()
	case p.anthroOK:
		return p.anthro.toUsage()
	}
	return Usage{}
}

// End completes the stream: a last event that was not followed by a blank
// line is handled too. It returns the final usage. Writing after End
// starts a new line.
func (p *SSEParser) End() Usage {
	if len(p.line) > 0 || p.lineTooBig {
		p.endLine()
	}
	p.skipLF = false
	p.dispatch()
	return p.Usage()
}
