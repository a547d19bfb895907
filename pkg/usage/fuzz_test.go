package usage_test

import (
	"testing"

	"rolter.dev/pkg/usage"
)

// FuzzSSEParser checks that the parser never panics and that the usage of
// a stream, whether it ended and its error status do not depend on how it
// was split into chunks.
func FuzzSSEParser(f *testing.F) {
	for _, st := range sseStreams {
		for _, ending := range lineEndings {
			f.Add([]byte(ending(st.body)), uint16(7), uint16(3))
		}
	}
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1e300,\"completion_tokens\":-1}}\n\n"), uint16(1), uint16(1))
	f.Add([]byte("\r\r\n\n:\r\ndata\ndata:\n\n"), uint16(2), uint16(5))
	f.Add([]byte("data: [DONE]\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\r\n\r\n"), uint16(9), uint16(20))
	f.Add([]byte("data: {\"error\":{\"message\":\"x\",\"code\":503}}\n\ndata: [DONE]\n\n"), uint16(4), uint16(30))
	f.Fuzz(func(t *testing.T, body []byte, a, b uint16) {
		var whole usage.SSEParser
		whole.Write(body)
		want := whole.End()
		if want.PromptTokens < 0 || want.CompletionTokens < 0 || want.CachedTokens > want.PromptTokens ||
			want.CacheWriteTokens < 0 || want.CachedTokens+want.CacheWriteTokens > want.PromptTokens {
			t.Errorf("inconsistent usage %+v", want)
		}
		if !want.Known && want != (usage.Usage{}) {
			t.Errorf("unknown usage with counts %+v", want)
		}
		// Three chunks, cut at a and b.
		i, j := 0, 0
		if len(body) > 0 {
			i, j = int(a)%(len(body)+1), int(b)%(len(body)+1)
		}
		i, j = min(i, j), max(i, j)
		var split usage.SSEParser
		split.Write(body[:i])
		split.Write(body[i:j])
		split.Write(body[j:])
		if got := split.End(); got != want {
			t.Errorf("split at %d,%d: %+v, whole: %+v", i, j, got, want)
		}
		if split.Done() != whole.Done() {
			t.Errorf("split at %d,%d: Done %v, whole: %v", i, j, split.Done(), whole.Done())
		}
		if split.ErrorStatus() != whole.ErrorStatus() {
			t.Errorf("split at %d,%d: ErrorStatus %d, whole: %d", i, j, split.ErrorStatus(), whole.ErrorStatus())
		}
		if s := whole.ErrorStatus(); s != 0 && (s < 400 || s > 599) {
			t.Errorf("ErrorStatus %d is not an error status", s)
		}
	})
}
