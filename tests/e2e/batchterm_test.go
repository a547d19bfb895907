package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"rolter.dev/tests/vllmsim"
)

// TestPredictedTTFTLearnsBatchSlowdown: vllmsim replicas whose steps slow
// by 20 ms for every other request running (Options.StepGrowth), publishing
// KV events, the proxy scraping their engine load, the official OpenAI SDK
// streaming without a token-ids header. Streams with long answers keep 0 to
// 4 requests decoding in the background while short probes of different
// lengths go through: a probe's first token comes 20 ms later per request
// running beside it, which the prefill law does not explain, and the
// proxy's batch term learns it from the law's residuals: the law reports a
// slope per running request between half and twice the truth
// (rolter_predicted_ttft_law_ms{term="per_request_running"}; 15-16 ms in
// six runs, the prefill law taking a share of the slowdown).
func TestPredictedTTFTLearnsBatchSlowdown(t *testing.T) {
	const growth = 20 // ms per other running request
	f := startKVFleet(t, 2, "predicted_ttft", openKVConfig, "",
		vllmsim.Options{PrefillTokensPerSecond: 20_000, StepGrowth: growth * time.Millisecond, ITL: 5 * time.Millisecond})
	warm := 0
	waitFor(t, "both replicas have published blocks", func() bool {
		warm++
		f.chat(t, longSystem(fmt.Sprintf("warm%d-", warm), 50), "hello")
		return f.storedEvents(t, "vllm-0") > 0 && f.storedEvents(t, "vllm-1") > 0
	})
	client := openai.NewClient(option.WithBaseURL(f.base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	stream := func(ctx context.Context, prompt string, tokens int64) *ssestream.Stream[openai.ChatCompletionChunk] {
		return client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:               "m",
			Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
			MaxCompletionTokens: openai.Int(tokens),
		})
	}
	// What the proxy last scraped of the engines: the probes are sent once
	// it shows the background streams running, the next round once it
	// shows them gone, so that each probe's running count is the truth.
	engines := func() float64 {
		return metric(t, f.base, `rolter_engine_load_requests{provider="vllm-0"}`) +
			metric(t, f.base, `rolter_engine_load_requests{provider="vllm-1"}`)
	}
	probe := 0
	for round := range 10 {
		background := round % 5
		ctx, cancel := context.WithCancel(t.Context())
		var decoding []*ssestream.Stream[openai.ChatCompletionChunk]
		for b := range background {
			s := stream(ctx, fmt.Sprintf("background %d-%d: tell a long story", round, b), 2000)
			if !s.Next() { // its first token: it decodes from now on
				t.Fatalf("background stream %d-%d ended before its first token: %v", round, b, s.Err())
			}
			decoding = append(decoding, s)
			// The next one is sent once the proxy's scrape shows this one:
			// its first token teaches the law too.
			waitFor(t, "the scrape shows the background streams", func() bool { return engines() == float64(b+1) })
		}
		for _, words := range []int{200, 900, 1600} {
			probe++
			// New prompts whose prefill differs, the same lengths in every
			// round, so that the law learns the prefill rate apart from the
			// slowdown.
			s := stream(t.Context(), longSystem(fmt.Sprintf("probe%d-", probe), words), 2)
			for s.Next() {
			}
			if err := s.Err(); err != nil {
				t.Fatalf("probe %d: %v", probe, err)
			}
		}
		cancel()
		for _, s := range decoding {
			for s.Next() {
			}
		}
		waitFor(t, "the scrape shows the engines idle", func() bool { return engines() == 0 })
	}
	var slope float64
	waitFor(t, "the law reports a slope per running request", func() bool {
		slope = lawTerm(t, f.base, "per_request_running")
		return slope > 0
	})
	if slope < growth/2 || slope > growth*2 {
		t.Fatalf("per_request_running = %.1f ms, want about %d", slope, growth)
	}
	if testing.Verbose() {
		t.Logf("per_request_running = %.1f ms", slope)
	}
}

// lawTerm reads one term of a proxy's predicted_ttft law
// (rolter_predicted_ttft_law_ms), -1 when it is not exported.
func lawTerm(t testing.TB, base, term string) float64 {
	t.Helper()
	return sample(t, base, func(line string) bool {
		return strings.HasPrefix(line, "rolter_predicted_ttft_law_ms{") && strings.Contains(line, `term="`+term+`"`)
	})
}
