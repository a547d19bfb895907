package usage_test

import (
	"strings"
	"testing"

	"go.uber.org/goleak"

	"rolter.dev/pkg/usage"
)

// No goroutine (test servers, writers, client connections) may outlive the
// tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseJSON(t *testing.T) {
	tests := []struct {
		name string
		body string
		want usage.Usage
	}{
		{"openai chat with cached tokens",
			`{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":0}}}`,
			usage.Usage{PromptTokens: 10, CompletionTokens: 3, CachedTokens: 4, Known: true}},
		{"openai completions",
			`{"object":"text_completion","choices":[{"text":"x"}],"usage":{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}}`,
			usage.Usage{PromptTokens: 5, CompletionTokens: 16, Known: true}},
		{"embeddings",
			`{"object":"list","data":[{"embedding":[0.1]}],"usage":{"prompt_tokens":8,"total_tokens":8}}`,
			usage.Usage{PromptTokens: 8, Known: true}},
		{"responses",
			`{"object":"response","usage":{"input_tokens":30,"input_tokens_details":{"cached_tokens":10},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":37}}`,
			usage.Usage{PromptTokens: 30, CompletionTokens: 7, CachedTokens: 10, Known: true}},
		{"anthropic with prompt caching",
			`{"type":"message","usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":400,"output_tokens":15}}`,
			usage.Usage{PromptTokens: 525, CompletionTokens: 15, CachedTokens: 400, CacheWriteTokens: 100, Known: true}},
		{"anthropic without caching",
			`{"type":"message","usage":{"input_tokens":12,"output_tokens":6}}`,
			usage.Usage{PromptTokens: 12, CompletionTokens: 6, Known: true}},
		{"integral floats", `{"usage":{"prompt_tokens":12.0,"completion_tokens":3}}`, usage.Usage{PromptTokens: 12, CompletionTokens: 3, Known: true}},
		{"cached clamped to the prompt", `{"usage":{"prompt_tokens":2,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9}}}`,
			usage.Usage{PromptTokens: 2, CompletionTokens: 1, CachedTokens: 2, Known: true}},
		{"negative and string counts ignored", `{"usage":{"prompt_tokens":-3,"completion_tokens":"4"}}`, usage.Usage{}},
		{"no usage", `{"choices":[]}`, usage.Usage{}},
		{"usage null", `{"usage":null}`, usage.Usage{}},
		{"usage empty", `{"usage":{}}`, usage.Usage{}},
		{"usage of the wrong type", `{"usage":[1]}`, usage.Usage{}},
		{"not JSON", `<html>`, usage.Usage{}},
		{"empty", ``, usage.Usage{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := usage.ParseJSON([]byte(tc.body)); got != tc.want {
				t.Errorf("ParseJSON = %+v, want %+v", got, tc.want)
			}
			if got := usage.Parse("application/json", []byte(tc.body)); got != tc.want {
				t.Errorf("Parse = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// sseStreams are complete streams of every dialect and what they report.
var sseStreams = []struct {
	name string
	body string
	want usage.Usage
}{
	{
		name: "openai chat with include_usage",
		body: "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n" +
			"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"say \\\"usage\\\"\"}}],\"usage\":null}\n\n" +
			": keep-alive\n\n" +
			"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n" +
			"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"total_tokens\":17,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n" +
			"data: [DONE]\n\n",
		want: usage.Usage{PromptTokens: 12, CompletionTokens: 5, CachedTokens: 8, Known: true},
	},
	{
		name: "openai chat without include_usage is unknown",
		body: "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n" +
			"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
			"data: [DONE]\n\n",
	},
	{
		name: "continuous usage: the last chunk wins",
		body: "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1}}\n\n" +
			"data: {\"choices\":[{\"text\":\"b\"}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n" +
			"data: [DONE]\n\n",
		want: usage.Usage{PromptTokens: 4, CompletionTokens: 2, Known: true},
	},
	{
		name: "anthropic message_start and message_delta",
		body: "event: message_start\n" +
			"data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":400,\"output_tokens\":1}}}\n\n" +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
			"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n" +
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		want: usage.Usage{PromptTokens: 525, CompletionTokens: 15, CachedTokens: 400, CacheWriteTokens: 100, Known: true},
	},
	{
		name: "anthropic message_delta with cumulative input counts",
		body: "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":3,\"output_tokens\":9}}\n\n",
		want: usage.Usage{PromptTokens: 15, CompletionTokens: 9, CachedTokens: 3, Known: true},
	},
	{
		name: "responses response.completed",
		body: "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"status\":\"completed\",\"usage\":{\"input_tokens\":30,\"input_tokens_details\":{\"cached_tokens\":10},\"output_tokens\":7,\"total_tokens\":37}}}\n\n",
		want: usage.Usage{PromptTokens: 30, CompletionTokens: 7, CachedTokens: 10, Known: true},
	},
	{
		name: "multi-line data and no space after the colon",
		body: "data:{\"choices\":[],\n" +
			"data:\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n",
		want: usage.Usage{PromptTokens: 3, CompletionTokens: 4, Known: true},
	},
	{
		name: "a last event without the blank line",
		body: "data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}",
		want: usage.Usage{PromptTokens: 1, CompletionTokens: 2, Known: true},
	},
	{
		name: "an error event has no usage",
		body: "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n",
	},
	{
		name: "malformed usage JSON is skipped",
		body: "data: {\"usage\":{\"prompt_tokens\":1,\n\n" +
			"data: {\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2}}\n\n",
		want: usage.Usage{PromptTokens: 2, CompletionTokens: 2, Known: true},
	},
}

// lineEndings rewrites a stream's line endings.
var lineEndings = map[string]func(string) string{
	"LF":   func(s string) string { return s },
	"CRLF": func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") },
	"CR":   func(s string) string { return strings.ReplaceAll(s, "\n", "\r") },
}

func TestSSEParser(t *testing.T) {
	for _, st := range sseStreams {
		for endingName, ending := range lineEndings {
			body := ending(st.body)
			t.Run(st.name+"/"+endingName, func(t *testing.T) {
				if got := usage.Parse("text/event-stream; charset=utf-8", []byte(body)); got != st.want {
					t.Fatalf("whole: %+v, want %+v", got, st.want)
				}
				if got := usage.Parse("", []byte(body)); got != st.want {
					t.Errorf("sniffed: %+v, want %+v", got, st.want)
				}
				// Split at every byte boundary.
				for i := 0; i <= len(body); i++ {
					var p usage.SSEParser
					p.Write([]byte(body[:i]))
					p.Write([]byte(body[i:]))
					if got := p.End(); got != st.want {
						t.Fatalf("split at %d (%q|%q): %+v, want %+v", i, body[max(0, i-5):i], body[i:min(len(body), i+5)], got, st.want)
					}
				}
				// One byte at a time.
				var p usage.SSEParser
				for i := 0; i < len(body); i++ {
					p.Write([]byte{body[i]})
				}
				if got := p.End(); got != st.want {
					t.Errorf("byte by byte: %+v, want %+v", got, st.want)
				}
			})
		}
	}
}

func TestSSEParserUsageBeforeEnd(t *testing.T) {
	var p usage.SSEParser
	p.Write([]byte("data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n"))
	if p.Usage().Known {
		t.Error("usage reported before the event ended")
	}
	p.Write([]byte("\n"))
	if got := p.Usage(); got.CompletionTokens != 2 {
		t.Errorf("usage = %+v", got)
	}
}

func TestSSEParserSkipsOversizedEvents(t *testing.T) {
	var p usage.SSEParser
	big := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", usage.MaxEventBytes) + "\"}}],\"usage\":{\"prompt_tokens\":99}}\n\n"
	for i := 0; i < len(big); i += 4096 {
		p.Write([]byte(big[i:min(len(big), i+4096)]))
	}
	// Many data lines that together pass the cap.
	line := "data: " + strings.Repeat("y", 1<<16) + "\n"
	for range 20 {
		p.Write([]byte(line))
	}
	p.Write([]byte("\n"))
	p.Write([]byte("data: {\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1}}\n\n"))
	if got := p.End(); got != (usage.Usage{PromptTokens: 7, CompletionTokens: 1, Known: true}) {
		t.Errorf("usage = %+v", got)
	}
}

// TestSSEParserDone: the terminal event of each dialect is seen once it is
// complete (its blank line arrived), and nothing else counts as one.
func TestSSEParserDone(t *testing.T) {
	tests := []struct {
		name, stream string
		done         bool
	}{
		{"openai [DONE]", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", true},
		{"openai [DONE] without its blank line", "data: {\"choices\":[]}\n\ndata: [DONE]\n", false},
		{"openai cut", "data: {\"choices\":[]}\n\n", false},
		{"anthropic message_stop", "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", true},
		{"anthropic, the name inside a text", "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"message_stop\"}}\n\n", false},
		{"responses completed", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n", true},
		{"responses failed, CRLF", "event: response.failed\r\ndata: {\"type\":\"response.failed\"}\r\n\r\n", true},
		{"responses delta", "data: {\"type\":\"response.output_text.delta\",\"delta\":\"response.completed\"}\n\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p usage.SSEParser
			for i := 0; i < len(tc.stream); i++ { // split anywhere
				p.Write([]byte{tc.stream[i]})
			}
			if p.Done() != tc.done {
				t.Fatalf("Done() = %v, want %v", p.Done(), tc.done)
			}
		})
	}
}

// TestSSEParserErrorStatus: a stream's first error event, in each
// dialect's form, gives its status; text that only mentions an error does
// not.
func TestSSEParserErrorStatus(t *testing.T) {
	tests := []struct {
		name, stream string
		status       int
	}{
		{"none", "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n", 0},
		{"vllm mid-stream, then [DONE]", "data: {\"choices\":[]}\n\ndata: {\"error\":{\"message\":\"engine died\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n", 500},
		{"vllm, a bad request", "data: {\"error\":{\"message\":\"bad tool call\",\"type\":\"BadRequestError\",\"code\":400}}\n\n", 400},
		{"older vllm, object error", "data: {\"object\":\"error\",\"message\":\"x\",\"type\":\"BadRequestError\",\"code\":400}\n\n", 400},
		{"openai, a string code", "data: {\"error\":{\"message\":\"x\",\"type\":\"server_error\",\"code\":\"server_error\"}}\n\n", 500},
		{"anthropic error event", "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"x\"}}\n\n", 500},
		{"responses failed", "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\"}}\n\n", 500},
		{"the first error wins", "data: {\"error\":{\"code\":429}}\n\ndata: {\"error\":{\"code\":500}}\n\n", 429},
		{"error: null", "data: {\"choices\":[],\"error\":null}\n\n", 0},
		{"a text mentioning an error", "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"error\\\": none\"}}]}\n\n", 0},
		{"without its blank line", "data: {\"error\":{\"code\":500}}\n", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p usage.SSEParser
			for i := 0; i < len(tc.stream); i++ { // split anywhere
				p.Write([]byte{tc.stream[i]})
			}
			if got := p.ErrorStatus(); got != tc.status {
				t.Fatalf("ErrorStatus() = %d, want %d", got, tc.status)
			}
		})
	}
}
