package affinity_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"rolter.dev/pkg/affinity"
	"rolter.dev/pkg/routing"
)

// Benchmark bodies are realistic: prose with escapes and some non-ASCII,
// tool results that look like files and logs (a newline and quotes every
// few dozen bytes), and the envelope fields real clients send.

const prose = "The quick brown fox jumps over the lazy dog; \"quoted\" text, naïve café, 中文 and an emoji 😀.\n"

func text(n int) string {
	return strings.Repeat(prose, n/len(prose)+1)[:n]
}

// logText is tool output: many short lines with quotes, so the JSON string
// has an escape every few dozen bytes.
func logText(n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "%05d\tINFO\tserver.go:%d\trequest \"GET /v1/items/%d\" took %dms\n", i, 100+i%900, i, i%97)
	}
	return sb.String()[:n]
}

// message is one turn; fields are written in this order.
type message struct {
	Role       string `json:"role"`
	Content    any    `json:"content"`
	ToolCalls  any    `json:"tool_calls,omitempty"`
	ToolCallID string `json:"tool_call_id,omitempty"`
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func chatBody(size int) []byte {
	msgs := []message{{Role: "system", Content: text(600)}}
	for i := 0; ; i++ {
		msgs = append(msgs, message{Role: "user", Content: text(200 + i%300)})
		if i%4 == 3 {
			msgs = append(msgs, message{Role: "assistant", Content: nil, ToolCalls: []any{block{
				{"id", fmt.Sprintf("call_%d", i)}, {"type", "function"},
				{"function", block{{"name", "search"}, {"arguments", `{"query":"fox","limit":10}`}}},
			}}})
			msgs = append(msgs, message{Role: "tool", ToolCallID: fmt.Sprintf("call_%d", i), Content: logText(400)})
		}
		msgs = append(msgs, message{Role: "assistant", Content: text(300 + i%500)})
		body := mustJSON(struct {
			Model       string    `json:"model"`
			Messages    []message `json:"messages"`
			Temperature float64   `json:"temperature"`
			MaxTokens   int       `json:"max_tokens"`
			Stream      bool      `json:"stream"`
		}{"gpt-4o", msgs, 0.7, 1024, true})
		if len(body) >= size {
			return body
		}
	}
}

// block is an object written with its keys in the order given, as the
// SDK documentation writes them: type first.
type block = object

// anthropicTurns is an agent loop: the tool results grow with the body, so
// the 4 MiB body carries tool results of about 1 MiB each.
func anthropicTurns(size int) []any {
	result := max(300, size/4)
	turns := []any{}
	total := 0
	for i := 0; total < size; i++ {
		user := []any{block{{"type", "text"}, {"text", text(150)}}}
		if i > 0 {
			user = append([]any{block{{"type", "tool_result"}, {"tool_use_id", fmt.Sprintf("toolu_%d", i-1)},
				{"content", []any{block{{"type", "text"}, {"text", logText(result)}}}}}}, user...)
		}
		turns = append(turns,
			message{Role: "user", Content: user},
			message{Role: "assistant", Content: []any{
				block{{"type", "text"}, {"text", text(200)}},
				block{{"type", "tool_use"}, {"id", fmt.Sprintf("toolu_%d", i)}, {"name", "read_file"},
					{"input", block{{"path", "/srv/app/server.go"}, {"offset", i * 100}, {"limit", 2000}}}},
			}},
		)
		total += result + 800
	}
	return turns
}

func anthropicBody(size int) []byte {
	return mustJSON(struct {
		Model     string `json:"model"`
		MaxTokens int    `json:"max_tokens"`
		System    string `json:"system"`
		Messages  []any  `json:"messages"`
	}{"claude-sonnet", 4096, text(2000), anthropicTurns(size)})
}

// anthropicSortedBody is the same conversation with every object's keys
// sorted, as the Anthropic Python SDK and Go maps write them: messages
// before system, content before role, and so on.
func anthropicSortedBody(size int) []byte {
	var turns []any
	if err := json.Unmarshal(mustJSON(anthropicTurns(size)), &turns); err != nil {
		panic(err)
	}
	return mustJSON(map[string]any{"model": "claude-sonnet", "max_tokens": 4096, "system": text(2000), "messages": turns})
}

func responsesBody(size int) []byte {
	output := max(300, size/8)
	items := []any{}
	total := 0
	for i := 0; total < size; i++ {
		items = append(items,
			block{{"type", "message"}, {"role", "user"}, {"content", []any{block{{"type", "input_text"}, {"text", text(250)}}}}},
			block{{"type", "reasoning"}, {"id", fmt.Sprintf("rs_%d", i)}, {"summary", []any{block{{"type", "summary_text"}, {"text", text(120)}}}}},
			block{{"type", "function_call"}, {"call_id", fmt.Sprintf("call_%d", i)}, {"name", "shell"}, {"arguments", `{"cmd":["grep","-rn","fox","."]}`}},
			block{{"type", "function_call_output"}, {"call_id", fmt.Sprintf("call_%d", i)}, {"output", logText(output)}},
			block{{"type", "message"}, {"role", "assistant"}, {"content", []any{block{{"type", "output_text"}, {"text", text(300)}}}}},
		)
		total += output + 1200
	}
	// Fields in the order the OpenAI Node SDK writes a typical request.
	return mustJSON(struct {
		Model        string `json:"model"`
		Instructions string `json:"instructions"`
		Input        []any  `json:"input"`
		Store        bool   `json:"store"`
	}{"gpt-5", text(1500), items, false})
}

var benchShapes = []struct {
	name, path string
	body       func(int) []byte
}{
	{"chat", affinity.PathChatCompletions, chatBody},
	{"anthropic_tools", affinity.PathMessages, anthropicBody},
	{"anthropic_tools_sorted", affinity.PathMessages, anthropicSortedBody},
	{"responses", affinity.PathResponses, responsesBody},
}

var benchSink routing.Context

func BenchmarkBuild(b *testing.B) {
	for _, shape := range benchShapes {
		b.Run(shape.name, func(b *testing.B) {
			for _, size := range []struct {
				name string
				n    int
			}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"4MiB", 4 << 20}} {
				b.Run(size.name, func(b *testing.B) {
					body := shape.body(size.n)
					if got, want := affinity.Build(shape.path, body, nil), refBuild(shape.path, body, nil); !got.HasDigest ||
						got.Prompt != want.Prompt || got.PromptLen != want.PromptLen || got.PromptDigest != want.PromptDigest {
						b.Fatalf("%s/%s: the body does not give the reference's prompt", shape.name, size.name)
					}
					b.Run("impl=affinity", func(b *testing.B) {
						b.ReportAllocs()
						b.SetBytes(int64(len(body)))
						for b.Loop() {
							benchSink = affinity.Build(shape.path, body, nil)
						}
					})
					b.Run("impl=encoding_json", func(b *testing.B) {
						b.ReportAllocs()
						b.SetBytes(int64(len(body)))
						for b.Loop() {
							var m map[string]any
							if err := json.Unmarshal(body, &m); err != nil {
								b.Fatal(err)
							}
						}
					})
				})
			}
		})
	}
}
