package semantic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Embedder turns the conversation text of a request into an embedding.
// Implementations must be safe for concurrent use and honour ctx; an error
// makes the caller skip the semantic cache for the request (fail open).
type Embedder interface {
	Embed(ctx context.Context, text string) ([]float32, error)
}

// ErrEmbedding is wrapped by every error [HTTPEmbedder.Embed] returns.
var ErrEmbedding = errors.New("semantic: embedding failed")

// MaxEmbeddingResponseBytes bounds the embeddings response an
// [HTTPEmbedder] reads.
const MaxEmbeddingResponseBytes = 8 << 20

// HTTPEmbedder calls an OpenAI-compatible POST {BaseURL}/v1/embeddings with
// {"model": Model, "input": text} and returns data[0].embedding. A transport
// error, a non-2xx status, a body over [MaxEmbeddingResponseBytes] or a reply
// without a non-empty embedding is an error wrapping [ErrEmbedding]; errors
// never quote the request or the reply. It is safe for concurrent use once
// its fields are set.
type HTTPEmbedder struct {
	// Client sends the request; nil means http.DefaultClient. Bound the time
	// an embedding may take with the ctx passed to Embed.
	Client *http.Client
	// BaseURL is the provider's API base, e.g. "https://api.openai.com"
	// (a trailing slash is ignored).
	BaseURL string
	// Model is the embedding model.
	Model string
	// APIKey, when set, is sent as "Authorization: Bearer <APIKey>".
	APIKey string
	// Header holds extra request headers.
	Header http.Header
}

var _ Embedder = (*HTTPEmbedder)(nil)

// Embed returns the embedding of text.
func (e *HTTPEmbedder) Embed(ctx context.Context, text string) ([]float32, error) {
	payload, err := json.Marshal(struct {
		Model string `json:"model"`
		Input string `json:"input"`
	}{e.Model, text})
	if err != nil {
		return nil, fmt.Errorf("%w: encode request: %w", ErrEmbedding, err)
	}
	url := strings.TrimSuffix(e.BaseURL, "/") + "/v1/embeddings"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEmbedding, err)
	}
	for k, vs := range e.Header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if e.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+e.APIKey)
	}
	client := e.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEmbedding, err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // let the connection be reused
		_ = resp.Body.Close()
	}()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, fmt.Errorf("%w: status %d", ErrEmbedding, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxEmbeddingResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read reply: %w", ErrEmbedding, err)
	}
	if len(body) > MaxEmbeddingResponseBytes {
		return nil, fmt.Errorf("%w: reply larger than %d bytes", ErrEmbedding, MaxEmbeddingResponseBytes)
	}
	var reply struct {
		Data []struct {
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &reply); err != nil {
		return nil, fmt.Errorf("%w: malformed reply", ErrEmbedding)
	}
	if len(reply.Data) == 0 || len(reply.Data[0].Embedding) == 0 {
		return nil, fmt.Errorf("%w: reply has no embedding", ErrEmbedding)
	}
	return reply.Data[0].Embedding, nil
}
