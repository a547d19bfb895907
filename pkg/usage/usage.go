package usage

import (
	"bytes"
	"encoding/json"
	"math"
	"mime"
	"strings"
)

// Usage is the token usage an upstream reported for one response.
type Usage struct {
	// PromptTokens counts every input token, including those read from or
	// written to a provider's prompt cache.
	PromptTokens int64
	// CompletionTokens counts the output tokens.
	CompletionTokens int64
	// CachedTokens is the part of PromptTokens served from the provider's
	// prompt cache (OpenAI cached_tokens, Anthropic
	// cache_read_input_tokens).
	CachedTokens int64
	// CacheWriteTokens is the part of PromptTokens written to the
	// provider's prompt cache (Anthropic cache_creation_input_tokens).
	CacheWriteTokens int64
	// Known reports whether the response carried usage at all; when false
	// the counts are zero and the record is usage_unknown.
	Known bool
}

// count is a token count that decodes from any JSON number (some servers
// send 12.0) and ignores anything else; present tells whether it was there.
type count struct {
	n       int64
	present bool
}

func (c *count) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil || math.IsNaN(f) || f < 0 {
		return nil // null, a string, a negative number: absent
	}
	c.n, c.present = int64(min(f, math.MaxInt64/4)), true
	return nil
}

type details struct {
	CachedTokens count `json:"cached_tokens"`
}

// usageJSON is the union of the usage objects of every dialect.
type usageJSON struct {
	// OpenAI chat, completions, embeddings.
	PromptTokens        count    `json:"prompt_tokens"`
	CompletionTokens    count    `json:"completion_tokens"`
	PromptTokensDetails *details `json:"prompt_tokens_details"`
	// OpenAI Responses and Anthropic.
	InputTokens        count    `json:"input_tokens"`
	OutputTokens       count    `json:"output_tokens"`
	InputTokensDetails *details `json:"input_tokens_details"`
	// Anthropic prompt caching (not part of input_tokens).
	CacheReadInputTokens     count `json:"cache_read_input_tokens"`
	CacheCreationInputTokens count `json:"cache_creation_input_tokens"`
}

// toUsage interprets a usage object. OpenAI style (prompt_tokens) wins
// over Responses / Anthropic style (input_tokens). Anthropic's input_tokens
// exclude cache reads and writes, which are added; Responses'
// input_tokens include the cached tokens already.
func (u *usageJSON) toUsage() Usage {
	switch {
	case u.PromptTokens.present || u.CompletionTokens.present:
		out := Usage{PromptTokens: u.PromptTokens.n, CompletionTokens: u.CompletionTokens.n, Known: true}
		if d := u.PromptTokensDetails; d != nil {
			out.CachedTokens = d.CachedTokens.n
		}
		return out.clamp()
	case u.InputTokens.present || u.OutputTokens.present || u.CacheReadInputTokens.present || u.CacheCreationInputTokens.present:
		out := Usage{
			PromptTokens:     u.InputTokens.n + u.CacheReadInputTokens.n + u.CacheCreationInputTokens.n,
			CompletionTokens: u.OutputTokens.n,
			CachedTokens:     u.CacheReadInputTokens.n,
			CacheWriteTokens: u.CacheCreationInputTokens.n,
			Known:            true,
		}
		if d := u.InputTokensDetails; d != nil && d.CachedTokens.present {
			out.CachedTokens = d.CachedTokens.n
		}
		return out.clamp()
	}
	return Usage{}
}

// clamp keeps the cached parts within the prompt.
func (u Usage) clamp() Usage {
	u.CachedTokens = min(u.CachedTokens, u.PromptTokens)
	u.CacheWriteTokens = min(u.CacheWriteTokens, u.PromptTokens-u.CachedTokens)
	return u
}

// ParseJSON reads the top-level "usage" object of a JSON response body:
// OpenAI chat and completions (prompt_tokens, completion_tokens,
// prompt_tokens_details.cached_tokens), embeddings (prompt_tokens only),
// Responses (input_tokens, output_tokens, input_tokens_details.
// cached_tokens) and Anthropic Messages (input_tokens +
// cache_read_input_tokens + cache_creation_input_tokens, output_tokens). A
// body without usage, or that is not JSON, gives a Usage that is not Known.
func ParseJSON(body []byte) Usage {
	var doc struct {
		Usage *usageJSON `json:"usage"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || doc.Usage == nil {
		return Usage{}
	}
	return doc.Usage.toUsage()
}

// Parse reads the usage of a complete response body: an SSE stream when
// the content type is text/event-stream (or, with no content type, the body
// looks like one), else JSON.
func Parse(contentType string, body []byte) Usage {
	if isEventStream(contentType) || contentType == "" && looksLikeSSE(body) {
		var p SSEParser
		p.Write(body)
		return p.End()
	}
	return ParseJSON(body)
}

func isEventStream(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		mt, _, _ = strings.Cut(contentType, ";")
	}
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

func looksLikeSSE(body []byte) bool {
	body = bytes.TrimLeft(body, " \t\r\n")
	return bytes.HasPrefix(body, []byte("data:")) || bytes.HasPrefix(body, []byte("event:")) || bytes.HasPrefix(body, []byte(":"))
}
