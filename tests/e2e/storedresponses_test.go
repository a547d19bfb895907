package e2e_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"rolter.dev/tests/vllmsim"
)

// TestStoredResponsesThroughProxies: a conversation the official OpenAI
// SDK continues with previous_response_id, through two proxies in turn
// (as an L4 balancer spreads a client's connections), over three replicas
// that each store their own responses, as vLLM with its response store on
// does. Every turn reaches the replica that stores the one before, whatever
// the strategy would pick and whichever proxy it goes through; the
// retrieval by id too.
func TestStoredResponsesThroughProxies(t *testing.T) {
	for _, strategy := range []string{"round_robin", "predicted_ttft"} {
		t.Run(strategy, func(t *testing.T) {
			clients := twoProxies(t, strategy, vllmsim.Options{Models: []string{"sim"}})
			ctx := t.Context()
			for conv := range 3 {
				var prev *responses.Response
				for turn := range 5 {
					p := responses.ResponseNewParams{
						Model:           "m",
						Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(fmt.Sprintf("conversation %d, turn %d", conv, turn))},
						MaxOutputTokens: openai.Int(6),
					}
					if prev != nil {
						p.PreviousResponseID = openai.String(prev.ID)
					}
					resp, err := clients[turn%2].Responses.New(ctx, p)
					if err != nil {
						t.Fatalf("conversation %d turn %d: %v", conv, turn, err)
					}
					// The replica read the conversation so far: the prompt
					// grows by at least the last answer each turn.
					if prev != nil && resp.Usage.InputTokens <= prev.Usage.InputTokens+prev.Usage.OutputTokens {
						t.Fatalf("turn %d read %d input tokens after %d+%d: the conversation was not continued", turn, resp.Usage.InputTokens, prev.Usage.InputTokens, prev.Usage.OutputTokens)
					}
					prev = resp
				}
				got, err := clients[1].Responses.Get(ctx, prev.ID, responses.ResponseGetParams{})
				if err != nil {
					t.Fatalf("retrieve %s: %v", prev.ID, err)
				}
				if got.ID != prev.ID || got.OutputText() != prev.OutputText() || got.OutputText() == "" {
					t.Fatalf("retrieved %s %q, created %s %q", got.ID, got.OutputText(), prev.ID, prev.OutputText())
				}
			}
			_, err := clients[0].Responses.Get(ctx, "resp_0123456789abcdef0123456789abcdef", responses.ResponseGetParams{})
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
				t.Fatalf("retrieving an id no replica of the gateway issued: %v", err)
			}
		})
	}
}

// TestBackgroundResponsesThroughProxies: a background response created
// through one proxy is polled, and another cancelled, through the other,
// with the official OpenAI SDK, over replicas that store their own.
func TestBackgroundResponsesThroughProxies(t *testing.T) {
	clients := twoProxies(t, "predicted_ttft", vllmsim.Options{Models: []string{"sim"}, ITL: 20 * time.Millisecond})
	ctx := t.Context()
	create := func(tokens int64) *responses.Response {
		t.Helper()
		resp, err := clients[0].Responses.New(ctx, responses.ResponseNewParams{
			Model:           "m",
			Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("a background question")},
			MaxOutputTokens: openai.Int(tokens),
			Background:      openai.Bool(true),
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != responses.ResponseStatusQueued && resp.Status != responses.ResponseStatusInProgress {
			t.Fatalf("a background create answered %q", resp.Status)
		}
		return resp
	}

	done := create(5)
	var got *responses.Response
	waitFor(t, "the background response to complete", func() bool {
		var err error
		got, err = clients[1].Responses.Get(ctx, done.ID, responses.ResponseGetParams{})
		if err != nil {
			t.Fatalf("poll %s: %v", done.ID, err)
		}
		return got.Status != responses.ResponseStatusQueued && got.Status != responses.ResponseStatusInProgress
	})
	if got.OutputText() == "" || got.Usage.OutputTokens != 5 {
		t.Fatalf("finished as %q with %q, usage %+v", got.Status, got.OutputText(), got.Usage)
	}

	long := create(2000)
	cancelled, err := clients[1].Responses.Cancel(ctx, long.ID)
	if err != nil {
		t.Fatalf("cancel %s: %v", long.ID, err)
	}
	if cancelled.Status != responses.ResponseStatusCancelled {
		t.Fatalf("cancel answered %q", cancelled.Status)
	}
	got, err = clients[0].Responses.Get(ctx, long.ID, responses.ResponseGetParams{})
	if err != nil || got.Status != responses.ResponseStatusCancelled {
		t.Fatalf("after cancel: %v %v", got, err)
	}
}

// twoProxies starts three replicas with opts, each storing its own
// responses, and two proxies routing model m over them with strategy, and
// returns an OpenAI SDK client of each proxy.
func twoProxies(t *testing.T, strategy string, opts vllmsim.Options) []openai.Client {
	t.Helper()
	var rs []*replica
	for range 3 {
		rs = append(rs, startReplica(t, opts))
	}
	cfg := fleetConfig("", strategy, rs...)
	var clients []openai.Client
	for range 2 {
		a, _ := startProxy(t, cfg)
		clients = append(clients, openai.NewClient(option.WithBaseURL(a.URL()+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0)))
	}
	return clients
}
