package semantic_test

import (
	"testing"

	"rolter.dev/pkg/respcache/semantic"
)

const (
	chat     = "/v1/chat/completions"
	messages = "/v1/messages"
	complete = "/v1/completions"
)

func classify(t *testing.T, path, body string) (string, [32]byte) {
	t.Helper()
	text, part, ok := semantic.Classify(path, []byte(body))
	if !ok {
		t.Fatalf("Classify(%s, %s) bypassed, want a candidate", path, body)
	}
	return text, part
}

// TestPartition proves each rule of the partition with a pair of requests
// that must (or must not) share one. The embedded text is the same within
// every pair unless sameText says otherwise.
func TestPartition(t *testing.T) {
	const q = `{"role":"user","content":"What is the capital of France?"}`
	tests := []struct {
		name          string
		pathA, bodyA  string
		pathB, bodyB  string
		samePartition bool
		sameText      bool
	}{
		{
			"split: German vs Japanese system prompt",
			chat, `{"model":"m","messages":[{"role":"system","content":"Answer in German."},` + q + `]}`,
			chat, `{"model":"m","messages":[{"role":"system","content":"Answer in Japanese."},` + q + `]}`,
			false, true,
		},
		{
			"split: German vs Japanese developer prompt",
			chat, `{"model":"m","messages":[{"role":"developer","content":"Answer in German."},` + q + `]}`,
			chat, `{"model":"m","messages":[{"role":"developer","content":"Answer in Japanese."},` + q + `]}`,
			false, true,
		},
		{
			"split: system vs developer role",
			chat, `{"model":"m","messages":[{"role":"system","content":"Be brief."},` + q + `]}`,
			chat, `{"model":"m","messages":[{"role":"developer","content":"Be brief."},` + q + `]}`,
			false, true,
		},
		{
			"split: system prompt position",
			chat, `{"model":"m","messages":[{"role":"system","content":"Be brief."},` + q + `]}`,
			chat, `{"model":"m","messages":[` + q + `,{"role":"system","content":"Be brief."}]}`,
			false, true,
		},
		{
			"split: system prompt present vs absent",
			chat, `{"model":"m","messages":[{"role":"system","content":"Be brief."},` + q + `]}`,
			chat, `{"model":"m","messages":[` + q + `]}`,
			false, true,
		},
		{
			"split: German vs Japanese Anthropic system",
			messages, `{"model":"m","max_tokens":100,"system":"Answer in German.","messages":[` + q + `]}`,
			messages, `{"model":"m","max_tokens":100,"system":"Answer in Japanese.","messages":[` + q + `]}`,
			false, true,
		},
		{
			"split: Anthropic system string vs text blocks",
			messages, `{"model":"m","max_tokens":100,"system":"Be brief.","messages":[` + q + `]}`,
			messages, `{"model":"m","max_tokens":100,"system":[{"type":"text","text":"Be brief."}],"messages":[` + q + `]}`,
			false, true,
		},
		{
			"same: stream false equals absent",
			chat, `{"model":"m","messages":[` + q + `],"stream":false}`,
			chat, `{"model":"m","messages":[` + q + `]}`,
			true, true,
		},
		{
			"split: stream true vs absent",
			chat, `{"model":"m","messages":[` + q + `],"stream":true}`,
			chat, `{"model":"m","messages":[` + q + `]}`,
			false, true,
		},
		{
			"split: stream true vs false",
			chat, `{"model":"m","messages":[` + q + `],"stream":true}`,
			chat, `{"model":"m","messages":[` + q + `],"stream":false}`,
			false, true,
		},
		{
			"split: stream true vs false (Anthropic)",
			messages, `{"model":"m","max_tokens":9,"messages":[` + q + `],"stream":true}`,
			messages, `{"model":"m","max_tokens":9,"messages":[` + q + `],"stream":false}`,
			false, true,
		},
		{
			"same: stream false equals absent (completions)",
			complete, `{"model":"m","prompt":"Once upon a time","stream":false}`,
			complete, `{"model":"m","prompt":"Once upon a time"}`,
			true, true,
		},
		{
			"split: stream_options",
			chat, `{"model":"m","messages":[` + q + `],"stream":true,"stream_options":{"include_usage":true}}`,
			chat, `{"model":"m","messages":[` + q + `],"stream":true}`,
			false, true,
		},
		{
			"split: different tools",
			chat, `{"model":"m","messages":[` + q + `],"tools":[{"type":"function","function":{"name":"get_weather"}}]}`,
			chat, `{"model":"m","messages":[` + q + `],"tools":[{"type":"function","function":{"name":"get_time"}}]}`,
			false, true,
		},
		{
			"split: tools vs no tools",
			chat, `{"model":"m","messages":[` + q + `],"tools":[{"type":"function","function":{"name":"get_weather"}}]}`,
			chat, `{"model":"m","messages":[` + q + `]}`,
			false, true,
		},
		{
			"split: tool_choice",
			chat, `{"model":"m","messages":[` + q + `],"tool_choice":"auto"}`,
			chat, `{"model":"m","messages":[` + q + `],"tool_choice":"none"}`,
			false, true,
		},
		{
			"same: tools with keys in another order",
			chat, `{"model":"m","messages":[` + q + `],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`,
			chat, `{"tools":[{"function":{"parameters":{"type":"object"},"name":"f"},"type":"function"}],"messages":[` + q + `],"model":"m"}`,
			true, true,
		},
		{
			"split: different response_format",
			chat, `{"model":"m","messages":[` + q + `],"response_format":{"type":"json_object"}}`,
			chat, `{"model":"m","messages":[` + q + `],"response_format":{"type":"text"}}`,
			false, true,
		},
		{
			"split: temperature",
			chat, `{"model":"m","messages":[` + q + `],"temperature":0}`,
			chat, `{"model":"m","messages":[` + q + `],"temperature":1}`,
			false, true,
		},
		{
			"split: max_tokens",
			chat, `{"model":"m","messages":[` + q + `],"max_tokens":10}`,
			chat, `{"model":"m","messages":[` + q + `],"max_tokens":11}`,
			false, true,
		},
		{
			"split: model",
			chat, `{"model":"a","messages":[` + q + `]}`,
			chat, `{"model":"b","messages":[` + q + `]}`,
			false, true,
		},
		{
			"split: unknown field",
			chat, `{"model":"m","messages":[` + q + `],"x_custom":1}`,
			chat, `{"model":"m","messages":[` + q + `]}`,
			false, true,
		},
		{
			"split: dialect",
			chat, `{"model":"m","max_tokens":9,"messages":[` + q + `]}`,
			messages, `{"model":"m","max_tokens":9,"messages":[` + q + `]}`,
			false, true,
		},
		{
			"same: user differs",
			chat, `{"model":"m","messages":[` + q + `],"user":"alice"}`,
			chat, `{"model":"m","messages":[` + q + `],"user":"bob"}`,
			true, true,
		},
		{
			"same: metadata differs",
			messages, `{"model":"m","max_tokens":9,"messages":[` + q + `],"metadata":{"user_id":"a"}}`,
			messages, `{"model":"m","max_tokens":9,"messages":[` + q + `]}`,
			true, true,
		},
		{
			"same: key order and whitespace",
			chat, `{"model":"m","temperature":0.5,"messages":[{"role":"system","content":"S"},` + q + `]}`,
			chat, "{ \"messages\" : [ {\"content\":\"S\" , \"role\":\"system\"},\n {\"content\":\"What is the capital of France?\",\"role\":\"user\"} ] ,\n\"temperature\":0.5, \"model\":\"m\"}",
			true, true,
		},
		{
			"same: escapes in fields",
			chat, `{"model":"caf\u00e9","messages":[` + q + `]}`,
			chat, `{"model":"café","messages":[` + q + `]}`,
			true, true,
		},
		{
			"same: duplicate key, last wins",
			chat, `{"model":"x","model":"m","messages":[` + q + `]}`,
			chat, `{"model":"m","messages":[` + q + `]}`,
			true, true,
		},
		{
			"same: text parts vs string, cache_control ignored",
			messages, `{"model":"m","max_tokens":9,"messages":[{"role":"user","content":[{"type":"text","text":"What is the capital of France?","cache_control":{"type":"ephemeral"}}]}]}`,
			messages, `{"model":"m","max_tokens":9,"messages":[` + q + `]}`,
			true, true,
		},
		{
			"same partition, other text: different question",
			chat, `{"model":"m","messages":[{"role":"user","content":"What is the capital of Spain?"}]}`,
			chat, `{"model":"m","messages":[` + q + `]}`,
			true, false,
		},
		{
			"same partition, other text: name",
			chat, `{"model":"m","messages":[{"role":"user","name":"ann","content":"What is the capital of France?"}]}`,
			chat, `{"model":"m","messages":[` + q + `]}`,
			true, false,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			textA, partA := classify(t, tc.pathA, tc.bodyA)
			textB, partB := classify(t, tc.pathB, tc.bodyB)
			if (partA == partB) != tc.samePartition {
				t.Errorf("same partition = %v, want %v", partA == partB, tc.samePartition)
			}
			if (textA == textB) != tc.sameText {
				t.Errorf("same text = %v, want %v (%q vs %q)", textA == textB, tc.sameText, textA, textB)
			}
		})
	}
}

func TestText(t *testing.T) {
	tests := []struct {
		name, path, body, want string
	}{
		{
			"turns with roles and a name, whitespace collapsed",
			chat,
			`{"model":"m","messages":[{"role":"system","content":"not embedded"},{"role":"user","content":"  hello \n\t world "},` +
				`{"role":"assistant","content":"hi"},{"role":"user","name":"ann","content":[{"type":"text","text":"again"}]}]}`,
			"user hello world assistant hi user ann again",
		},
		{
			"Anthropic system is not embedded",
			messages,
			`{"model":"m","max_tokens":5,"system":"not embedded","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b\u00a0c"}]}]}`,
			"user a b c",
		},
		{"completion prompt", complete, `{"model":"m","prompt":"Once\u0020upon\r\na   time"}`, "Once upon a time"},
		{"unicode kept", chat, `{"messages":[{"role":"user","content":"日本語\u3000テキスト"}]}`, "user 日本語 テキスト"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := classify(t, tc.path, tc.body); got != tc.want {
				t.Fatalf("text = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestBypass(t *testing.T) {
	const u = `{"role":"user","content":"hi"}`
	tests := []struct {
		name, path, body string
	}{
		{"embeddings endpoint", "/v1/embeddings", `{"model":"m","input":"hi"}`},
		{"responses endpoint", "/v1/responses", `{"model":"m","input":"hi"}`},
		{"images endpoint", "/v1/images/generations", `{"model":"m","prompt":"hi"}`},
		{"audio endpoint", "/v1/audio/speech", `{"model":"m","input":"hi"}`},
		{"rerank endpoint", "/v1/rerank", `{"model":"m","query":"hi"}`},
		{"invalid JSON", chat, `{"messages":[`},
		{"not an object", chat, `[` + u + `]`},
		{"no messages", chat, `{"model":"m"}`},
		{"messages not an array", chat, `{"messages":{"role":"user","content":"hi"}}`},
		{"message not an object", chat, `{"messages":["hi"]}`},
		{"image_url part", chat, `{"messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"data:"}}]}]}`},
		{"input_audio part", chat, `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"","format":"wav"}}]}]}`},
		{"file part", chat, `{"messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"f"}}]}]}`},
		{"Anthropic image block", messages, `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":""}}]}]}`},
		{"Anthropic document block", messages, `{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","data":"x"}}]}]}`},
		{"Anthropic tool_use", messages, `{"messages":[` + u + `,{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`},
		{"Anthropic tool_result", messages, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"42"}]}]}`},
		{"Anthropic system inside messages", messages, `{"messages":[{"role":"system","content":"x"},` + u + `]}`},
		{"Anthropic system with an image", messages, `{"system":[{"type":"image","source":{}}],"messages":[` + u + `]}`},
		{"tool role", chat, `{"messages":[` + u + `,{"role":"tool","tool_call_id":"c","content":"42"}]}`},
		{"tool role without extra keys", chat, `{"messages":[` + u + `,{"role":"tool","content":"42"}]}`},
		{"function role", chat, `{"messages":[` + u + `,{"role":"function","name":"f","content":"42"}]}`},
		{"assistant tool_calls", chat, `{"messages":[` + u + `,{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`},
		{"function_call", chat, `{"messages":[` + u + `,{"role":"assistant","content":"x","function_call":{"name":"f","arguments":"{}"}}]}`},
		{"refusal key", chat, `{"messages":[` + u + `,{"role":"assistant","content":"x","refusal":null}]}`},
		{"audio key", chat, `{"messages":[` + u + `,{"role":"assistant","content":"x","audio":{"id":"a"}}]}`},
		{"message-level cache_control", messages, `{"messages":[{"role":"user","content":"hi","cache_control":{"type":"ephemeral"}}]}`},
		{"null content", chat, `{"messages":[{"role":"user","content":null}]}`},
		{"missing content", chat, `{"messages":[{"role":"user"}]}`},
		{"number content", chat, `{"messages":[{"role":"user","content":5}]}`},
		{"role not a string", chat, `{"messages":[{"role":1,"content":"hi"}]}`},
		{"missing role", chat, `{"messages":[{"content":"hi"}]}`},
		{"unknown role", chat, `{"messages":[{"role":"critic","content":"hi"}]}`},
		{"name not a string", chat, `{"messages":[{"role":"user","name":7,"content":"hi"}]}`},
		{"text part without text", chat, `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`},
		{"text part with non-string text", chat, `{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`},
		{"text part without type", chat, `{"messages":[{"role":"user","content":[{"text":"hi"}]}]}`},
		{"text part with an extra key", chat, `{"messages":[{"role":"user","content":[{"type":"text","text":"hi","annotations":[]}]}]}`},
		{"part not an object", chat, `{"messages":[{"role":"user","content":["hi"]}]}`},
		{"only a system turn", chat, `{"messages":[{"role":"system","content":"be brief"}]}`},
		{"empty messages", chat, `{"messages":[]}`},
		{"batch prompt", complete, `{"model":"m","prompt":["a","b"]}`},
		{"token prompt", complete, `{"model":"m","prompt":[1,2,3]}`},
		{"missing prompt", complete, `{"model":"m"}`},
		{"messages on the completions endpoint", complete, `{"model":"m","messages":[` + u + `]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			text, part, ok := semantic.Classify(tc.path, []byte(tc.body))
			if ok || text != "" || part != [32]byte{} {
				t.Fatalf("Classify = %q, %x, %v; want a bypass", text, part, ok)
			}
		})
	}
}
