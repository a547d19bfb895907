package vllmsim

import (
	"slices"
	"testing"
)

// TestMessagesRenderLikeTheirChatConversion: a Messages request's prompt is
// the prompt of the chat completion vLLM converts it to
// (vllm/entrypoints/anthropic/serving.py), written out here by hand.
func TestMessagesRenderLikeTheirChatConversion(t *testing.T) {
	for _, tc := range []struct{ name, messages, chat string }{
		{"system blocks joined with nothing, the billing header left out, system messages after them",
			`{"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"sys"},{"type":"text","text":""},{"type":"text","text":"tem"}],` +
				`"messages":[{"role":"system","content":"atic"},{"role":"user","content":"hi"}]}`,
			`{"messages":[{"role":"system","content":"systematic"},{"role":"user","content":"hi"}]}`},
		{"text parts, a tool use and its result before the user's text",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},` +
				`{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"text","text":"calling"},{"type":"tool_use","id":"u","name":"f","input":{}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"u","content":[{"type":"text","text":"r1"},{"type":"text","text":"r2"}]},{"type":"text","text":"thanks"}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":"calling"},` +
				`{"role":"tool","content":"r1\nr2"},{"role":"user","content":"thanks"}]}`},
		{"an empty user message dropped, an empty assistant one kept, an assistant's tool result as text",
			`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_result","content":"x"}]},{"role":"assistant","content":[]},{"role":"user","content":[{"type":"text","text":""}]},{"role":"user","content":"go"}]}`,
			`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Tool result: x"},{"role":"assistant","content":null},{"role":"user","content":"go"}]}`},
		{"tools in the chat form, the schema typed",
			`{"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{"properties":{}}},{"name":"g","description":"d","input_schema":{"type":"object"},"defer_loading":null}]}`,
			`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"parameters":{"type":"object","properties":{}},"name":"f"}},` +
				`{"function":{"name":"g","description":"d","parameters":{"type":"object"}},"type":"function"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, got, aerr := parseMessagesRequest([]byte(tc.messages))
			if aerr != nil {
				t.Fatal(aerr.msg)
			}
			_, want, aerr := parseChatRequest([]byte(tc.chat))
			if aerr != nil {
				t.Fatal(aerr.msg)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("messages prompt %v\nchat prompt     %v", got, want)
			}
		})
	}
}
