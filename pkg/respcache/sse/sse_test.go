package sse_test

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"rolter.dev/pkg/respcache/sse"
)

const (
	openAIStream = "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n" +
		"data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"lo, error-free\"}}]}\n\n" +
		"data: [DONE]\n\n"
	anthropicStream = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hi\"}}\n\n" +
		"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
)

var (
	openAIEvents = []string{
		`data: {"id":"c1","choices":[{"delta":{"content":"Hel"}}]}`,
		`data: {"id":"c1","choices":[{"delta":{"content":"lo, error-free"}}]}`,
		`data: [DONE]`,
	}
	anthropicEvents = []string{
		"event: message_start\ndata: {\"type\":\"message_start\"}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hi\"}}",
		"event: ping\ndata: {\"type\": \"ping\"}",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}",
	}
)

func TestRecorder(t *testing.T) {
	tests := []struct {
		name         string
		stream       string
		endErr       error
		want         []string
		wantComplete bool
	}{
		{"OpenAI stream", openAIStream, nil, openAIEvents, true},
		{"OpenAI stream with CRLF", strings.ReplaceAll(openAIStream, "\n", "\r\n"), nil, openAIEvents, true},
		{"OpenAI stream with CR", strings.ReplaceAll(openAIStream, "\n", "\r"), nil, openAIEvents, true},
		{"Anthropic stream", anthropicStream, nil, anthropicEvents, true},
		{"Anthropic stream with CRLF", strings.ReplaceAll(anthropicStream, "\n", "\r\n"), nil, anthropicEvents, true},
		{"data without a space after the colon", "data:[DONE]\n\n", nil, []string{"data:[DONE]"}, true},
		{
			"blank lines between and before events collapse",
			"\n\ndata: a\n\n\n\r\n\rdata: [DONE]\n\n", nil,
			[]string{"data: a", "data: [DONE]"}, true,
		},
		{
			"comment-only events are dropped, comments inside events kept",
			": keep-alive\n\n:another\r\n\r\ndata: a\n: note\n\ndata: [DONE]\n\n", nil,
			[]string{"data: a\n: note", "data: [DONE]"}, true,
		},
		{
			"multi-line data kept as one event",
			"id: 7\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n", nil,
			[]string{"id: 7\ndata: line1\ndata: line2", "data: [DONE]"}, true,
		},
		{"final blank line missing", "data: a\n\ndata: [DONE]\n", nil, []string{"data: a", "data: [DONE]"}, true},
		{"final line break missing", "data: a\n\ndata: [DONE]", nil, []string{"data: a", "data: [DONE]"}, true},
		{"incomplete: no terminal event", "data: a\n\ndata: b\n\n", nil, []string{"data: a", "data: b"}, false},
		{"incomplete: cut inside the terminal event", "data: a\n\ndata: [DO", nil, []string{"data: a", "data: [DO"}, false},
		{"incomplete: Anthropic without message_stop", anthropicStream[:strings.Index(anthropicStream, "event: message_stop")], nil, anthropicEvents[:3], false},
		{"incomplete: upstream read error", openAIStream, errors.New("unexpected EOF"), openAIEvents, false},
		{
			"incomplete: OpenAI error payload",
			"data: {\"error\":{\"message\":\"overloaded\"}}\n\ndata: [DONE]\n\n", nil,
			[]string{`data: {"error":{"message":"overloaded"}}`, "data: [DONE]"}, false,
		},
		{
			"incomplete: vLLM error object",
			"data: {\"object\":\"error\",\"message\":\"x\"}\n\ndata: [DONE]\n\n", nil,
			[]string{`data: {"object":"error","message":"x"}`, "data: [DONE]"}, false,
		},
		{
			"incomplete: Anthropic error event",
			"event: message_start\ndata: {}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n", nil,
			[]string{"event: message_start\ndata: {}", "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}"}, false,
		},
		{
			"complete: a null error member is not an error",
			"data: {\"error\":null,\"choices\":[]}\n\ndata: [DONE]\n\n", nil,
			[]string{`data: {"error":null,"choices":[]}`, "data: [DONE]"}, true,
		},
		{
			"complete: the word error in content",
			"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"error\\\"\"}}]}\n\ndata: [DONE]\n\n", nil,
			[]string{`data: {"choices":[{"delta":{"content":"\"error\""}}]}`, "data: [DONE]"}, true,
		},
		{"empty stream", "", nil, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Every way of cutting the stream in two, and byte by byte.
			for cut := 0; cut <= len(tc.stream); cut++ {
				check(t, tc.stream, []string{tc.stream[:cut], tc.stream[cut:]}, tc.endErr, tc.want, tc.wantComplete)
			}
			check(t, tc.stream, strings.Split(tc.stream, ""), tc.endErr, tc.want, tc.wantComplete)
		})
	}
}

func check(t *testing.T, stream string, chunks []string, endErr error, want []string, wantComplete bool) {
	t.Helper()
	r := sse.NewRecorder(0)
	for _, c := range chunks {
		if n, err := r.Write([]byte(c)); n != len(c) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	r.End(endErr)
	got := strs(r.Events())
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("chunks %q:\nevents %q\nwant   %q", chunks, got, want)
	}
	if r.Complete() != wantComplete {
		t.Fatalf("chunks %q: Complete = %v, want %v", chunks, r.Complete(), wantComplete)
	}
	if r.Size() != int64(len(sse.AppendStream(nil, r.Events()))) {
		t.Fatalf("Size = %d, replay is %d bytes", r.Size(), len(sse.AppendStream(nil, r.Events())))
	}
	if endErr == nil && !reflect.DeepEqual(parse(stream+"\n\n"), parse(string(sse.AppendStream(nil, r.Events())))) {
		t.Fatalf("replay of %q parses to other events", stream)
	}
}

func strs(evs [][]byte) []string {
	var out []string
	for _, e := range evs {
		out = append(out, string(e))
	}
	return out
}

func TestRecorderCap(t *testing.T) {
	full := int64(len(openAIStream)) // what the events take when replayed
	tests := []struct {
		name         string
		max          int64
		wantTooLarge bool
	}{
		{"no cap", 0, false},
		{"cap equal to the replay size", full, false},
		{"cap one byte short", full - 1, true},
		{"tiny cap", 3, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := sse.NewRecorder(tc.max)
			stream := openAIStream + "\n\r\n" // trailing blank lines cost nothing
			for i := range len(stream) {
				if n, err := r.Write([]byte{stream[i]}); n != 1 || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			r.End(nil)
			if r.TooLarge() != tc.wantTooLarge || r.Complete() == tc.wantTooLarge {
				t.Fatalf("TooLarge = %v, Complete = %v", r.TooLarge(), r.Complete())
			}
			if tc.wantTooLarge && (len(r.Events()) != 0 || r.Size() != 0) {
				t.Fatalf("a recording over the cap kept %d events", len(r.Events()))
			}
			if !tc.wantTooLarge && r.Size() != full {
				t.Fatalf("Size = %d, want %d", r.Size(), full)
			}
		})
	}
}

func TestRecorderEnd(t *testing.T) {
	r := sse.NewRecorder(0)
	r.Write([]byte("data: a\n\n"))
	r.End(nil)
	r.Write([]byte("data: [DONE]\n\n")) // after End: ignored
	r.End(errors.New("late"))           // idempotent
	if got := len(r.Events()); got != 1 || r.Complete() || r.Terminal() {
		t.Fatalf("events %d, Complete %v, Terminal %v", got, r.Complete(), r.Terminal())
	}
	if (&sse.Recorder{}).Complete() {
		t.Fatal("a Recorder that never ended is complete")
	}
}

type flushRecorder struct {
	*httptest.ResponseRecorder
	flushes int
	writes  int
}

func (f *flushRecorder) Flush() { f.flushes++; f.ResponseRecorder.Flush() }
func (f *flushRecorder) Write(p []byte) (int, error) {
	f.writes++
	return f.ResponseRecorder.Write(p)
}

func TestReplay(t *testing.T) {
	for _, stream := range []string{openAIStream, anthropicStream} {
		r := sse.NewRecorder(0)
		r.Write([]byte(stream))
		r.End(nil)
		w := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
		if err := sse.Replay(t.Context(), w, r.Events()); err != nil {
			t.Fatal(err)
		}
		if w.Body.String() != stream {
			t.Fatalf("replay = %q, want %q", w.Body.String(), stream)
		}
		if w.flushes != len(r.Events()) {
			t.Fatalf("%d flushes for %d events", w.flushes, len(r.Events()))
		}
	}
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	if f.n == 0 {
		return 0, errors.New("broken pipe")
	}
	f.n--
	return len(p), nil
}

func TestReplayStops(t *testing.T) {
	evs := [][]byte{[]byte("data: a"), []byte("data: [DONE]")}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var buf bytes.Buffer
	if err := sse.Replay(ctx, &buf, evs); !errors.Is(err, context.Canceled) || buf.Len() != 0 {
		t.Fatalf("Replay with a cancelled context = %v, wrote %q", err, buf.String())
	}
	if err := sse.Replay(t.Context(), &failWriter{n: 2}, evs); err == nil || !strings.Contains(err.Error(), "broken pipe") {
		t.Fatalf("Replay to a failing writer = %v", err)
	}
}

// event is one dispatched server-sent event, as a browser's EventSource
// would report it.
type event struct{ typ, data, id string }

// parse is the WHATWG event-stream parsing algorithm, the reference the
// recorder's replays are checked against.
func parse(s string) []event {
	var out []event
	var typ, id string
	var data strings.Builder
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = strings.ReplaceAll(s, "\r", "\n")
	lines := strings.Split(s, "\n")
	lines = lines[:len(lines)-1] // text after the last line break is not a line
	for _, line := range lines {
		if line == "" {
			if data.Len() > 0 {
				d := strings.TrimSuffix(data.String(), "\n")
				if typ == "" {
					typ = "message"
				}
				out = append(out, event{typ, d, id})
			}
			data.Reset()
			typ = ""
			continue
		}
		if line[0] == ':' {
			continue
		}
		name, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch name {
		case "event":
			typ = value
		case "data":
			data.WriteString(value)
			data.WriteByte('\n')
		case "id":
			if !strings.Contains(value, "\x00") {
				id = value
			}
		}
	}
	return out
}

// FuzzRecorder checks that how the stream is cut into reads never changes
// what is recorded, and that a replay parses to the same events as the
// original stream.
func FuzzRecorder(f *testing.F) {
	f.Add(openAIStream, uint16(7))
	f.Add(anthropicStream, uint16(30))
	f.Add(strings.ReplaceAll(anthropicStream, "\n", "\r\n"), uint16(1))
	f.Add("data: a\r\rdata: b\r\n:c\n\n", uint16(0))
	f.Fuzz(func(t *testing.T, stream string, cut uint16) {
		whole := sse.NewRecorder(0)
		whole.Write([]byte(stream))
		whole.End(nil)
		split := sse.NewRecorder(0)
		c := int(cut) % (len(stream) + 1)
		split.Write([]byte(stream[:c]))
		split.Write([]byte(stream[c:]))
		split.End(nil)
		a, b := strs(whole.Events()), strs(split.Events())
		if !reflect.DeepEqual(a, b) || whole.Complete() != split.Complete() {
			t.Fatalf("cut at %d changed the recording: %q vs %q", c, a, b)
		}
		replay := string(sse.AppendStream(nil, whole.Events()))
		if !reflect.DeepEqual(parse(stream+"\n\n"), parse(replay)) {
			t.Fatalf("replay %q of %q parses to other events", replay, stream)
		}
		again := sse.NewRecorder(0)
		again.Write([]byte(replay))
		again.End(nil)
		if !reflect.DeepEqual(strs(again.Events()), a) {
			t.Fatalf("recording the replay gives other events: %q vs %q", strs(again.Events()), a)
		}
	})
}
