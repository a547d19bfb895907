package e2e_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

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
			var rs []*replica
			for range 3 {
				rs = append(rs, startReplica(t, vllmsim.Options{Models: []string{"sim"}}))
			}
			cfg := fleetConfig("", strategy, rs...)
			var clients []openai.Client
			for range 2 {
				a, _ := startProxy(t, cfg)
				clients = append(clients, openai.NewClient(option.WithBaseURL(a.URL()+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0)))
			}
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
