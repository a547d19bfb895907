package semantic_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"rolter.dev/pkg/respcache/semantic"
)

func TestHTTPEmbedder(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		reply   string
		want    []float32
		wantErr bool
	}{
		{"ok", 200, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-1,2e-3]}],"model":"e","usage":{}}`, []float32{0.5, -1, 0.002}, false},
		{"ok: first of several", 200, `{"data":[{"embedding":[1]},{"embedding":[2]}]}`, []float32{1}, false},
		{"error: non-2xx", 429, `{"error":{"message":"slow down"}}`, nil, true},
		{"error: server error", 500, `oops`, nil, true},
		{"error: malformed JSON", 200, `{"data":[{"embedding":[1,2`, nil, true},
		{"error: not numbers", 200, `{"data":[{"embedding":["a"]}]}`, nil, true},
		{"error: no data", 200, `{"data":[]}`, nil, true},
		{"error: empty embedding", 200, `{"data":[{"embedding":[]}]}`, nil, true},
		{"error: missing embedding", 200, `{"data":[{}]}`, nil, true},
		{"error: float32 overflow", 200, `{"data":[{"embedding":[1e300]}]}`, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != "/v1/embeddings" {
					t.Errorf("request %s %s", r.Method, r.URL.Path)
				}
				if got := r.Header.Get("Authorization"); got != "Bearer sk-test" {
					t.Errorf("Authorization = %q", got)
				}
				if got := r.Header.Get("X-Extra"); got != "1" {
					t.Errorf("X-Extra = %q", got)
				}
				var req struct{ Model, Input string }
				if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model != "emb" || req.Input != "user hello" {
					t.Errorf("request body %+v, %v", req, err)
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.reply)
			}))
			defer srv.Close()
			e := &semantic.HTTPEmbedder{
				Client: srv.Client(), BaseURL: srv.URL + "/", Model: "emb", APIKey: "sk-test",
				Header: http.Header{"X-Extra": {"1"}},
			}
			got, err := e.Embed(t.Context(), "user hello")
			if tc.wantErr {
				if !errors.Is(err, semantic.ErrEmbedding) {
					t.Fatalf("err = %v, want ErrEmbedding", err)
				}
				if strings.Contains(err.Error(), "hello") || strings.Contains(err.Error(), "slow down") {
					t.Fatalf("error quotes the request or the reply: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("embedding %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("embedding %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestHTTPEmbedderFailures(t *testing.T) {
	stop := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	defer slow.Close()
	defer close(stop) // runs before slow.Close
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"data":[{"embedding":[`)
		chunk := strings.Repeat("0.1,", 1<<16)
		for range semantic.MaxEmbeddingResponseBytes/len(chunk) + 1 {
			io.WriteString(w, chunk)
		}
		io.WriteString(w, `1]}]}`)
	}))
	defer huge.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	tests := []struct {
		name string
		url  string
	}{
		{"error: deadline", slow.URL},
		{"error: reply too large", huge.URL},
		{"error: connection refused", closedURL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			if tc.name == "error: reply too large" {
				ctx = t.Context()
			}
			e := &semantic.HTTPEmbedder{BaseURL: tc.url, Model: "emb"}
			start := time.Now()
			_, err := e.Embed(ctx, "x")
			if !errors.Is(err, semantic.ErrEmbedding) {
				t.Fatalf("err = %v, want ErrEmbedding", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v", d)
			}
		})
	}
}
