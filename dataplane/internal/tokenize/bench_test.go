package tokenize_test

import (
	"fmt"
	"strings"
	"testing"

	"rolter.dev/dataplane/internal/tokenize"
)

// BenchmarkBuild: the /tokenize body of a long agent conversation, about
// 1 MB (200 tool results of 4,800 bytes and the calls between them), as
// an Anthropic Messages request and as the chat completion it converts to.
// Build runs before every precise pick of a request without token ids.
func BenchmarkBuild(b *testing.B) {
	system := fmt.Sprintf("%q", strings.Repeat("rules ", 2000))
	var anth, chat []string
	for i := range 200 {
		out := fmt.Sprintf("%q", strings.Repeat("output line ", 400))
		anth = append(anth, fmt.Sprintf(`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t%d","content":[{"type":"text","text":%s}]}]}`, i, out),
			fmt.Sprintf(`{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"t%d","name":"bash","input":{"command":"ls -la /tmp","timeout":120}}]}`, i+1))
		chat = append(chat, fmt.Sprintf(`{"role":"tool","tool_call_id":"t%d","content":%s}`, i, out),
			fmt.Sprintf(`{"role":"assistant","content":"ok","tool_calls":[{"id":"t%d","type":"function","function":{"name":"bash","arguments":"{\"command\": \"ls -la /tmp\", \"timeout\": 120}"}}]}`, i+1))
	}
	for _, tc := range []struct{ name, path, body string }{
		{"messages", tokenize.PathMessages, `{"model":"m","max_tokens":8,"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":` + system + `}],"messages":[` + strings.Join(anth, ",") + `]}`},
		{"chat", tokenize.PathChatCompletions, `{"model":"m","max_tokens":8,"messages":[{"role":"system","content":` + system + `},` + strings.Join(chat, ",") + `]}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body := []byte(tc.body)
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, _, _, ok := tokenize.Build(tc.path, body, "m"); !ok {
					b.Fatal("not built")
				}
			}
		})
	}
}
