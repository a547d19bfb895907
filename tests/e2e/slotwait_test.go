package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"rolter.dev/tests/vllmsim"
)

// chatFor sends a chat completion of up to maxTokens tokens through the
// proxy with the official SDK and returns the provider that served it ("" if
// ctx ended it first).
func (f *kvFleet) chatFor(ctx context.Context, t testing.TB, system, user string, maxTokens int64) string {
	client := openai.NewClient(option.WithBaseURL(f.base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	var raw *http.Response
	_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:               "m",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(user)},
		MaxCompletionTokens: openai.Int(maxTokens),
	}, option.WithResponseInto(&raw))
	if err != nil {
		if ctx.Err() == nil {
			t.Error(err)
		}
		return ""
	}
	return raw.Header.Get("X-Rolter-Provider")
}

// TestPredictedTTFTAvoidsFullReplica: vllmsim replicas that run one request
// at a time (max_num_seqs 1). Once the replica holding a group's prefix
// runs one of the group's long requests and another waits behind it (the
// proxy scrapes both counts with [providers.engine_load]), a request of the
// group goes to the other replica: waiting for the holder's slot takes
// longer than computing the prefix there.
func TestPredictedTTFTAvoidsFullReplica(t *testing.T) {
	// Prefill at 20,000 tokens/s: the ~2,000-token prefix costs ~0.1 s
	// where it is not cached; a request holds its slot for 20 tokens at
	// 20 ms, 0.4 s, so a wait for the holder's slot costs more.
	f := startKVFleet(t, 2, "predicted_ttft", openKVConfig, "[routes.balancer]\nspeculative_ttl_ms = 0\n",
		vllmsim.Options{MaxNumSeqs: 1, ITL: 20 * time.Millisecond, PrefillTokensPerSecond: 20_000})
	system := longSystem("slot-", 400)
	bg := context.Background()
	holder := f.chatFor(bg, t, system, "first question", 20)
	other := map[string]string{"vllm-0": "vllm-1", "vllm-1": "vllm-0"}[holder]
	if other == "" {
		t.Fatalf("served by %q", holder)
	}
	waitFor(t, "the watcher has the blocks", func() bool { return f.storedEvents(t, holder) > 0 })
	waitFor(t, "the proxy routes the group to "+holder, func() bool {
		for range 3 {
			if f.chatFor(bg, t, system, "are the events in?", 20) != holder {
				return false
			}
		}
		return true
	})
	load := func(provider string) float64 {
		return metric(t, f.base, fmt.Sprintf(`rolter_engine_load_requests{provider=%q}`, provider))
	}
	waitFor(t, "the holder's scraped load is back to 0", func() bool { return load(holder) == 0 })

	// Two long requests of the group: the first runs on the holder, the
	// second waits there for its slot.
	ctx, cancel := context.WithCancel(bg)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); f.chatFor(ctx, t, system, fmt.Sprintf("long %d", i), 1000) }()
		waitFor(t, "the long request is on the holder", func() bool { return load(holder) == float64(i+1) })
	}
	if got := f.chatFor(bg, t, system, "while the holder is full", 2); got != other {
		t.Fatalf("holder %s running one request with one waiting: a request of its group went to %s, want %s", holder, got, other)
	}
}
