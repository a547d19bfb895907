package e2e_test

import (
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"rolter.dev/tests/vllmsim"
)

// keyed adds the e2e virtual key to a config.
func keyed(cfg string) string {
	return cfg + "\n[[virtual_keys]]\nname = \"e2e\"\nkey = \"" + virtualKey + "\"\n"
}

// TestStreamCutByADyingReplica: a replica killed in the middle of a stream
// (its connections closed, as a crashed process's are) on a single-target
// route. The official SDKs must raise, not end the stream as if it were
// complete, and the proxy counts a 502.
func TestStreamCutByADyingReplica(t *testing.T) {
	// 300 tokens 20 ms apart: the stream lasts 6 s, the kill comes after a few.
	opts := vllmsim.Options{Models: []string{"sim"}, ITL: 20 * time.Millisecond}

	t.Run("openai", func(t *testing.T) {
		rep := startReplica(t, opts)
		a, _ := startProxy(t, keyed(fleetConfig("", "round_robin", rep)))
		client := openai.NewClient(option.WithBaseURL(a.URL()+"/v1"), option.WithAPIKey(virtualKey), option.WithMaxRetries(0))
		stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
			Model:               "m",
			Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me a long story")},
			MaxCompletionTokens: openai.Int(300),
		})
		chunks, finished := 0, false
		for stream.Next() {
			chunks++
			if chunks == 5 {
				rep.kill()
			}
			for _, c := range stream.Current().Choices {
				finished = finished || c.FinishReason != ""
			}
		}
		err := stream.Err()
		if err == nil {
			t.Fatalf("the SDK took a stream cut after %d chunks (finished=%v) for a complete one", chunks, finished)
		}
		if !strings.Contains(err.Error(), "broke off") {
			t.Fatalf("err = %v, want the proxy's error event", err)
		}
		if finished || chunks >= 300 {
			t.Fatalf("%d chunks, finished=%v: the stream was not cut", chunks, finished)
		}
		waitFor(t, "the request counted as a 502", func() bool {
			return metric(t, a.URL(), `rolter_requests_total{code="502",endpoint="/v1/chat/completions",model="m",variant=""}`) == 1
		})
	})

	t.Run("anthropic", func(t *testing.T) {
		rep := startReplica(t, opts)
		a, _ := startProxy(t, keyed(fleetConfig("", "round_robin", rep)))
		client := anthropic.NewClient(aoption.WithBaseURL(a.URL()), aoption.WithAPIKey(virtualKey), aoption.WithMaxRetries(0))
		stream := client.Messages.NewStreaming(t.Context(), anthropic.MessageNewParams{
			Model:     "m",
			MaxTokens: 300,
			Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("tell me a long story"))},
		})
		events, stopped := 0, false
		for stream.Next() {
			events++
			if events == 5 {
				rep.kill()
			}
			stopped = stopped || stream.Current().Type == "message_stop"
		}
		err := stream.Err()
		if err == nil {
			t.Fatalf("the SDK took a stream cut after %d events (message_stop=%v) for a complete one", events, stopped)
		}
		if !strings.Contains(err.Error(), "broke off") {
			t.Fatalf("err = %v, want the proxy's error event", err)
		}
		if stopped {
			t.Fatal("message_stop arrived: the stream was not cut")
		}
		waitFor(t, "the request counted as a 502", func() bool {
			return metric(t, a.URL(), `rolter_requests_total{code="502",endpoint="/v1/messages",model="m",variant=""}`) == 1
		})
	})
}

// TestStreamEndedByAReplicaShuttingDown: a replica shut down gracefully in
// the middle of a stream ends it cleanly, without its terminal event (the
// vllmsim binary on SIGTERM; an engine's server cancelling its running
// requests at shutdown). The proxy must not pass that for a complete
// answer: the official SDKs raise, for chat completions and the Responses
// API, and the proxy counts a 502.
func TestStreamEndedByAReplicaShuttingDown(t *testing.T) {
	opts := vllmsim.Options{Models: []string{"sim"}, ITL: 20 * time.Millisecond}
	for _, api := range []string{"chat", "responses"} {
		t.Run(api, func(t *testing.T) {
			rep := startReplica(t, opts)
			a, _ := startProxy(t, keyed(fleetConfig("", "round_robin", rep)))
			client := openai.NewClient(option.WithBaseURL(a.URL()+"/v1"), option.WithAPIKey(virtualKey), option.WithMaxRetries(0))
			var events int
			var err error
			endpoint := "/v1/chat/completions"
			if api == "chat" {
				stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
					Model:               "m",
					Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me a long story")},
					MaxCompletionTokens: openai.Int(300),
				})
				for stream.Next() {
					if events++; events == 5 {
						rep.shutDown()
					}
				}
				err = stream.Err()
			} else {
				endpoint = "/v1/responses"
				stream := client.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{
					Model:           "m",
					Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("tell me a long story")},
					MaxOutputTokens: openai.Int(300),
				})
				for stream.Next() {
					if events++; events == 5 {
						rep.shutDown()
					}
					if typ := stream.Current().Type; typ == "response.completed" || typ == "response.incomplete" {
						t.Fatalf("terminal event %s after %d events: the stream was not cut", typ, events)
					}
				}
				err = stream.Err()
			}
			if err == nil || !strings.Contains(err.Error(), "broke off") {
				t.Fatalf("after %d events: err = %v, want the proxy's error event", events, err)
			}
			waitFor(t, "the request counted as a 502", func() bool {
				return metric(t, a.URL(), `rolter_requests_total{code="502",endpoint="`+endpoint+`",model="m",variant=""}`) == 1
			})
		})
	}
}

// TestReplicaDyingBeforeTheFirstByteIsRetried: the first replica accepts
// the stream (vLLM sends its 200 before prefill) and is killed during
// prefill, before any token. Nothing reached the client yet, so the proxy
// retries on the other replica and the SDK sees a normal, complete stream.
func TestReplicaDyingBeforeTheFirstByteIsRetried(t *testing.T) {
	slow := startReplica(t, vllmsim.Options{Models: []string{"sim"}, TTFT: time.Minute})
	ok := startReplica(t, vllmsim.Options{Models: []string{"sim"}})
	// round_robin's first pick is the first target: the slow one.
	a, _ := startProxy(t, keyed(fleetConfig("[retry]\nbase_backoff_ms = 1\nmax_backoff_ms = 5\n", "round_robin", slow, ok)))
	client := openai.NewClient(option.WithBaseURL(a.URL()+"/v1"), option.WithAPIKey(virtualKey), option.WithMaxRetries(0))

	type result struct {
		text     string
		finished bool
		err      error
	}
	done := make(chan result, 1)
	go func() { // the SDK waits for the response to start, which is after the kill
		stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
			Model:               "m",
			Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
			MaxCompletionTokens: openai.Int(8),
		})
		var r result
		for stream.Next() {
			for _, c := range stream.Current().Choices {
				r.text += c.Delta.Content
				r.finished = r.finished || c.FinishReason != ""
			}
		}
		r.err = stream.Err()
		done <- r
	}()
	waitFor(t, "the slow replica prefilling the request", func() bool { return slow.sim.Stats().Running == 1 })
	slow.kill()
	r := <-done
	if r.err != nil || r.text == "" || !r.finished {
		t.Fatalf("stream: err %v, text %q, finished %v", r.err, r.text, r.finished)
	}
	if n := ok.sim.Stats().Completed; n != 1 {
		t.Fatalf("the other replica completed %d requests, want 1", n)
	}
	if n := metric(t, a.URL(), `rolter_upstream_errors_total{provider="vllm-0",reason="body"}`); n != 1 {
		t.Fatalf("the broken attempt: rolter_upstream_errors_total{reason=body} = %v, want 1", n)
	}
	if n := metric(t, a.URL(), `rolter_requests_total{code="200",endpoint="/v1/chat/completions",model="m",variant=""}`); n != 1 {
		t.Fatalf("rolter_requests_total{code=200} = %v", n)
	}
}
