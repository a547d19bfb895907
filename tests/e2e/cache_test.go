package e2e_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"rolter.dev/tests/vllmsim"
)

func rawChat(t *testing.T, base, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func upstreamRequests(rs []*replica) uint64 {
	var n uint64
	for _, r := range rs {
		n += r.sim.Stats().Requests
	}
	return n
}

func TestResponseCacheThroughProxy(t *testing.T) {
	redis := startRedis(t)
	var rs []*replica
	for range 2 {
		rs = append(rs, startReplica(t, vllmsim.Options{Models: []string{"sim"}}))
	}
	cfg := fleetConfig(fmt.Sprintf("[cache]\nenabled = true\nredis_url = %q\ntimeout_ms = 200\n", redis.url()), "round_robin", rs...) +
		"\n[routes.cache]\nttl_secs = 600\n"
	a, _ := startProxy(t, cfg)
	base := a.URL()

	t.Run("exact hit, canonical key", func(t *testing.T) {
		body := `{"model":"m","messages":[{"role":"user","content":"cache me"}],"max_tokens":4}`
		r1, b1 := rawChat(t, base, body)
		if r1.StatusCode != 200 || r1.Header.Get("X-Rolter-Cache") != "MISS" {
			t.Fatalf("first: %d %q", r1.StatusCode, r1.Header.Get("X-Rolter-Cache"))
		}
		before := upstreamRequests(rs)
		r2, b2 := rawChat(t, base, body)
		if r2.Header.Get("X-Rolter-Cache") != "HIT" || b2 != b1 {
			t.Fatalf("second: %q, same body %v", r2.Header.Get("X-Rolter-Cache"), b2 == b1)
		}
		// Key order and whitespace do not cost a hit.
		r3, b3 := rawChat(t, base, "{ \"max_tokens\": 4,\n \"messages\": [ {\"content\":\"cache me\", \"role\":\"user\"} ], \"model\": \"m\" }")
		if r3.Header.Get("X-Rolter-Cache") != "HIT" || b3 != b1 {
			t.Fatalf("reordered: %q", r3.Header.Get("X-Rolter-Cache"))
		}
		if upstreamRequests(rs) != before {
			t.Fatal("a hit reached an upstream")
		}
	})

	t.Run("streams replay to the SDKs", func(t *testing.T) {
		oc := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0))
		params := openai.ChatCompletionNewParams{
			Model:         "m",
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("stream and cache")},
			MaxTokens:     openai.Int(6),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		}
		run := func() string {
			s := oc.Chat.Completions.NewStreaming(t.Context(), params)
			var acc openai.ChatCompletionAccumulator
			for s.Next() {
				acc.AddChunk(s.Current())
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
			if acc.Usage.CompletionTokens != 6 {
				t.Fatalf("usage lost: %+v", acc.Usage)
			}
			return acc.Choices[0].Message.Content
		}
		first := run()
		before := upstreamRequests(rs)
		if second := run(); second != first || upstreamRequests(rs) != before {
			t.Fatalf("openai replay %q vs %q, upstream calls %d→%d", second, first, before, upstreamRequests(rs))
		}

		ac := anthropic.NewClient(aoption.WithBaseURL(base), aoption.WithAPIKey("x"), aoption.WithMaxRetries(0))
		mp := anthropic.MessageNewParams{Model: "m", MaxTokens: 5,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("anthropic stream cache"))}}
		arun := func() string {
			s := ac.Messages.NewStreaming(t.Context(), mp)
			var msg anthropic.Message
			for s.Next() {
				if err := msg.Accumulate(s.Current()); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
			return msg.Content[0].Text
		}
		first = arun()
		before = upstreamRequests(rs)
		if second := arun(); second != first || upstreamRequests(rs) != before {
			t.Fatalf("anthropic replay %q vs %q", second, first)
		}
	})

	t.Run("a stream whose usage the proxy asked for is stored as the client got it", func(t *testing.T) {
		// The client did not ask for usage: the proxy did (stream_usage),
		// and neither the answer nor its replay carries the usage chunk;
		// a client that asks is another request, and gets it.
		body := `{"model":"m","messages":[{"role":"user","content":"usage kept out"}],"max_tokens":4,"stream":true}`
		r1, b1 := rawChat(t, base, body)
		r2, b2 := rawChat(t, base, body)
		if r1.Header.Get("X-Rolter-Cache") != "MISS" || r2.Header.Get("X-Rolter-Cache") != "HIT" || b2 != b1 {
			t.Fatalf("cache %q then %q, same body %v", r1.Header.Get("X-Rolter-Cache"), r2.Header.Get("X-Rolter-Cache"), b1 == b2)
		}
		for _, d := range sseData(t, b2) {
			if strings.Contains(d, `"usage"`) {
				t.Fatalf("the replay carries usage: %s", d)
			}
		}
		asked := strings.Replace(body, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
		r3, b3 := rawChat(t, base, asked)
		if r3.Header.Get("X-Rolter-Cache") != "MISS" || !strings.Contains(b3, `"choices":[],"usage"`) {
			t.Fatalf("asked: cache %q, body %s", r3.Header.Get("X-Rolter-Cache"), b3)
		}
	})

	t.Run("redis down fails open, then hits again", func(t *testing.T) {
		body := `{"model":"m","messages":[{"role":"user","content":"survive redis"}],"max_tokens":3}`
		redis.stop()
		for i := range 5 {
			r, _ := rawChat(t, base, body)
			if r.StatusCode != 200 || r.Header.Get("X-Rolter-Cache") != "MISS" {
				t.Fatalf("request %d with redis down: %d %q", i, r.StatusCode, r.Header.Get("X-Rolter-Cache"))
			}
		}
		redis.restart()
		waitFor(t, "a hit after redis restarted", func() bool {
			r, _ := rawChat(t, base, body)
			return r.StatusCode == 200 && r.Header.Get("X-Rolter-Cache") == "HIT"
		})
	})
}

func TestSemanticCacheThroughProxy(t *testing.T) {
	// Every text embeds to the same vector, so similarity alone would match
	// anything: each miss below is the partition at work.
	emb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.6,0.8,0]}],"model":"e","usage":{"prompt_tokens":1,"total_tokens":1}}`)
	}))
	t.Cleanup(emb.Close)
	rs := []*replica{startReplica(t, vllmsim.Options{Models: []string{"sim"}})}
	cfg := "[cache]\nenabled = true\n" + fleetConfig("", "round_robin", rs...) + fmt.Sprintf(`
[routes.cache]
ttl_secs = 600
[routes.cache.semantic]
provider = "embedder"
model = "e"
threshold = 0.9

[[providers]]
name = "embedder"
kind = "openai"
api_base = %q
`, emb.URL)
	a, _ := startProxy(t, cfg)
	ask := func(system, question string) *http.Response {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":3}`, system, question)
		r, _ := rawChat(t, a.URL(), body)
		return r
	}
	if r := ask("Answer in German.", "What is the capital of France?"); r.Header.Get("X-Rolter-Cache") != "MISS" {
		t.Fatalf("first: %q", r.Header.Get("X-Rolter-Cache"))
	}
	r := ask("Answer in German.", "Tell me France's capital city.")
	if r.Header.Get("X-Rolter-Cache") != "HIT" || r.Header.Get("X-Rolter-Cache-Kind") != "semantic" || r.Header.Get("X-Rolter-Cache-Similarity") == "" {
		t.Fatalf("reworded question: %q kind %q similarity %q", r.Header.Get("X-Rolter-Cache"), r.Header.Get("X-Rolter-Cache-Kind"), r.Header.Get("X-Rolter-Cache-Similarity"))
	}
	if r := ask("Answer in Japanese.", "What is the capital of France?"); r.Header.Get("X-Rolter-Cache") != "MISS" {
		t.Fatalf("another system prompt must not share the answer: %q", r.Header.Get("X-Rolter-Cache"))
	}
}
