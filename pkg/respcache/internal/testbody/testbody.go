// Package testbody generates realistic request bodies of a given size for the
// response cache's tests and benchmarks.
package testbody

import (
	"encoding/json"
	"fmt"
	"strings"
)

// words make up the turns; a few need escapes or are not ASCII.
var words = []string{
	"the", "replica", "cache", "prefix", "token", "model", "answer", "question", "\"quoted\"",
	"naïve", "café", "日本語", "tab\there", "line\nbreak", "path/to", "<tag>", "emoji😀", "über",
}

// Chat returns an OpenAI chat-completions body of about size bytes: a system
// prompt, alternating user and assistant turns, tools and sampling
// parameters, with its keys in the order SDKs write them (not sorted).
func Chat(size int) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", "You are a helpful assistant. Answer briefly."}}
	total := 0
	for i := 0; total < size; i++ {
		var sb strings.Builder
		for j := range 40 {
			sb.WriteString(words[(i*7+j*3)%len(words)])
			sb.WriteByte(' ')
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, fmt.Sprintf("turn %d: %s", i, sb.String())})
		total += sb.Len() + 40
	}
	if msgs[len(msgs)-1].Role != "user" {
		msgs = append(msgs, msg{"user", "and now?"})
	}
	body := map[string]any{"messages": msgs}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	// Put the envelope first, unsorted, as an SDK would.
	head := `{"model":"llama-3.1-8b","temperature":0.7,"max_tokens":512,"stream":true,` +
		`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],`
	return append([]byte(head), b[1:]...)
}
