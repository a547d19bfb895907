package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/pagination"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"rolter.dev/tests/vllmsim"
)

const virtualKey = "sk-rolter-e2e-test-key-0001"

// sdkFleet starts three replicas and a proxy that requires a virtual key.
func sdkFleet(t *testing.T) (string, []*replica) {
	t.Helper()
	var rs []*replica
	for range 3 {
		rs = append(rs, startReplica(t, vllmsim.Options{Models: []string{"sim"}}))
	}
	cfg := fleetConfig("", "round_robin", rs...) + "\n[[virtual_keys]]\nname = \"e2e\"\nkey = \"" + virtualKey + "\"\n"
	a, _ := startProxy(t, cfg)
	return a.URL(), rs
}

func TestOpenAISDKThroughProxy(t *testing.T) {
	base, _ := sdkFleet(t)
	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey(virtualKey), option.WithMaxRetries(0))
	ctx := t.Context()
	chat := openai.ChatCompletionNewParams{
		Model:               "m",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello through rolter")},
		MaxCompletionTokens: openai.Int(7),
	}

	t.Run("chat", func(t *testing.T) {
		resp, err := client.Chat.Completions.New(ctx, chat)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
			t.Fatalf("no content: %+v", resp)
		}
		if resp.Usage.CompletionTokens != 7 || resp.Usage.PromptTokens == 0 || resp.Usage.TotalTokens != resp.Usage.PromptTokens+7 {
			t.Fatalf("usage %+v", resp.Usage)
		}
		if resp.Model != "sim" {
			t.Fatalf("model %q (the replica's name for it)", resp.Model)
		}
	})

	t.Run("chat streaming", func(t *testing.T) {
		p := chat
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if chunks < 7 || acc.Choices[0].Message.Content == "" || acc.Usage.CompletionTokens != 7 {
			t.Fatalf("stream: %d chunks, content %q, usage %+v", chunks, acc.Choices[0].Message.Content, acc.Usage)
		}
		// The same prompt non-streamed gives the same deterministic text.
		resp, err := client.Chat.Completions.New(ctx, chat)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Choices[0].Message.Content != acc.Choices[0].Message.Content {
			t.Fatalf("streamed %q, unstreamed %q", acc.Choices[0].Message.Content, resp.Choices[0].Message.Content)
		}
	})

	t.Run("completions", func(t *testing.T) {
		resp, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     "m",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(5),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Text == "" || resp.Usage.CompletionTokens != 5 {
			t.Fatalf("completion %+v", resp)
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		resp, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: "m",
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"alpha", "beta", "alpha"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Data) != 3 || len(resp.Data[0].Embedding) == 0 {
			t.Fatalf("embeddings %+v", resp)
		}
		if !equal(resp.Data[0].Embedding, resp.Data[2].Embedding) || equal(resp.Data[0].Embedding, resp.Data[1].Embedding) {
			t.Fatal("embeddings not deterministic per text")
		}
	})

	t.Run("responses", func(t *testing.T) {
		resp, err := client.Responses.New(ctx, responses.ResponseNewParams{
			Model:        "m",
			Instructions: openai.String("be brief"),
			Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("hello responses")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != responses.ResponseStatusCompleted || resp.OutputText() == "" || resp.Usage.OutputTokens == 0 {
			t.Fatalf("response status %q text %q usage %+v", resp.Status, resp.OutputText(), resp.Usage)
		}
	})

	t.Run("responses streaming", func(t *testing.T) {
		stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
			Model:           "m",
			Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("hello responses")},
			MaxOutputTokens: openai.Int(4),
		})
		var text strings.Builder
		completed := false
		for stream.Next() {
			ev := stream.Current()
			switch ev.Type {
			case "response.output_text.delta":
				text.WriteString(ev.Delta)
			case "response.incomplete": // max_output_tokens reached, as OpenAI reports it
				completed = ev.Response.IncompleteDetails.Reason == "max_output_tokens"
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if !completed || text.Len() == 0 {
			t.Fatalf("completed=%v text=%q", completed, text.String())
		}
	})

	t.Run("error: wrong key", func(t *testing.T) {
		bad := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("sk-rolter-wrong-key-000000"), option.WithMaxRetries(0))
		_, err := bad.Chat.Completions.New(ctx, chat)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || apiErr.Code != "invalid_api_key" {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("error: unknown model", func(t *testing.T) {
		p := chat
		p.Model = "nope"
		_, err := client.Chat.Completions.New(ctx, p)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestAnthropicSDKThroughProxy(t *testing.T) {
	base, _ := sdkFleet(t)
	client := anthropic.NewClient(aoption.WithBaseURL(base), aoption.WithAPIKey(virtualKey), aoption.WithMaxRetries(0))
	params := anthropic.MessageNewParams{
		Model:     "m",
		MaxTokens: 6,
		System:    []anthropic.TextBlockParam{{Text: "you are terse"}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello from the anthropic sdk"))},
	}
	msg, err := client.Messages.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) == 0 || msg.Content[0].Text == "" || msg.Usage.OutputTokens != 6 || msg.Usage.InputTokens == 0 {
		t.Fatalf("message %+v", msg)
	}
	if msg.StopReason != anthropic.StopReasonMaxTokens {
		t.Fatalf("stop reason %q", msg.StopReason)
	}

	stream := client.Messages.NewStreaming(t.Context(), params)
	var acc anthropic.Message
	events := 0
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
		events++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if events < 8 || acc.Content[0].Text != msg.Content[0].Text || acc.Usage.OutputTokens != 6 {
		t.Fatalf("stream: %d events, text %q (want %q), usage %+v", events, acc.Content[0].Text, msg.Content[0].Text, acc.Usage)
	}

	bad := anthropic.NewClient(aoption.WithBaseURL(base), aoption.WithAPIKey("nope-nope-nope-nope"), aoption.WithMaxRetries(0))
	_, err = bad.Messages.New(t.Context(), params)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("err = %v", err)
	}

	// An Anthropic API the gateway does not serve: a 404 the SDK reads.
	_, err = client.Files.List(t.Context(), anthropic.FileListParams{})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Type() != "not_found_error" {
		t.Fatalf("files.list: %v", err)
	}
}

func equal(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The OpenAI SDK's models.retrieve and the Anthropic SDK's
// messages.countTokens work through the proxy: the model from the route
// table, the count from the engine's /tokenize (vllmsim, as vLLM) on the
// templated messages.
func TestModelRetrieveAndCountTokensThroughProxy(t *testing.T) {
	base, rs := sdkFleet(t)
	oc := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey(virtualKey), option.WithMaxRetries(0))
	m, err := oc.Models.Get(t.Context(), "m")
	if err != nil || m.ID != "m" {
		t.Fatalf("models.retrieve m: %+v, %v", m, err)
	}
	_, err = oc.Models.Get(t.Context(), "no-such-model")
	var oErr *openai.Error
	if !errors.As(err, &oErr) || oErr.StatusCode != http.StatusNotFound || oErr.Code != "model_not_found" {
		t.Fatalf("models.retrieve of an unknown model: %v", err)
	}

	ac := anthropic.NewClient(aoption.WithBaseURL(base), aoption.WithAPIKey(virtualKey), aoption.WithMaxRetries(0))
	params := anthropic.MessageCountTokensParams{
		Model:    "m",
		System:   anthropic.MessageCountTokensParamsSystemUnion{OfString: anthropic.String("you are terse")},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("how many tokens is this?"))},
	}
	got, err := ac.Messages.CountTokens(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	// The engine's own count of the same conversation.
	resp, err := http.Post(rs[0].url()+"/tokenize", "application/json", strings.NewReader(
		`{"model":"sim","messages":[{"role":"system","content":"you are terse"},{"role":"user","content":"how many tokens is this?"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var want struct{ Count int64 }
	if err := json.NewDecoder(resp.Body).Decode(&want); err != nil || want.Count == 0 {
		t.Fatalf("engine count: %+v, %v", want, err)
	}
	if got.InputTokens != want.Count {
		t.Fatalf("count_tokens = %d, the engine counts %d", got.InputTokens, want.Count)
	}

	params.Model = "no-such-model"
	_, err = ac.Messages.CountTokens(t.Context(), params)
	var aErr *anthropic.Error
	if !errors.As(err, &aErr) || aErr.StatusCode != http.StatusNotFound || !strings.Contains(aErr.RawJSON(), `"not_found_error"`) {
		t.Fatalf("count_tokens of an unknown model: %v", err)
	}
}

// The Anthropic SDK's models.list (auto-paging forward and back) and
// models.retrieve, and the OpenAI SDK's models.list, through the proxy:
// the routes in config order, filtered by the key, in each SDK's shape.
func TestModelsThroughProxy(t *testing.T) {
	r := startReplica(t, vllmsim.Options{Models: []string{"sim"}})
	routes := []string{"m", "m-b", "m-c", "m-d", "m-e"}
	cfg := fleetConfig("", "round_robin", r) // routes m
	for _, m := range routes[1:] {
		cfg += fmt.Sprintf("\n[[routes]]\nmodel = %q\ntargets = [{ provider = \"vllm-0\", model = \"sim\" }]\n", m)
	}
	const limitedKey = "sk-rolter-e2e-limited-0001"
	cfg += "\n[[virtual_keys]]\nname = \"e2e\"\nkey = \"" + virtualKey + "\"\n" +
		"\n[[virtual_keys]]\nname = \"limited\"\nkey = \"" + limitedKey + "\"\nmodels = [\"m-b\", \"m-d\"]\n"
	a, _ := startProxy(t, cfg)
	base := a.URL()
	ctx := t.Context()

	pages := 0 // list requests the SDK sent; its calls run on this goroutine
	ac := anthropic.NewClient(aoption.WithBaseURL(base), aoption.WithAPIKey(virtualKey), aoption.WithMaxRetries(0),
		aoption.WithMiddleware(func(req *http.Request, next aoption.MiddlewareNext) (*http.Response, error) {
			if req.URL.Path == "/v1/models" {
				pages++
			}
			return next(req)
		}))
	collect := func(it *pagination.PageAutoPager[anthropic.ModelInfo]) []string {
		t.Helper()
		var ids []string
		for it.Next() {
			ids = append(ids, it.Current().ID)
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return ids
	}

	t.Run("anthropic list, auto-paging forward", func(t *testing.T) {
		pages = 0
		got := collect(ac.Models.ListAutoPaging(ctx, anthropic.ModelListParams{Limit: anthropic.Int(2)}))
		// 2 + 2 + 1: has_more false on the third page ends the walk.
		if !slices.Equal(got, routes) || pages != 3 {
			t.Fatalf("%v in %d pages, want %v in 3", got, pages, routes)
		}
	})

	t.Run("anthropic list, auto-paging back", func(t *testing.T) {
		pages = 0
		got := collect(ac.Models.ListAutoPaging(ctx, anthropic.ModelListParams{Limit: anthropic.Int(2), BeforeID: anthropic.String("m-e")}))
		// The page before m-e, then the one before that (each in list order).
		if want := []string{"m-c", "m-d", "m", "m-b"}; !slices.Equal(got, want) || pages != 2 {
			t.Fatalf("%v in %d pages, want %v in 2", got, pages, want)
		}
	})

	t.Run("anthropic list, one page", func(t *testing.T) {
		page, err := ac.Models.List(ctx, anthropic.ModelListParams{Limit: anthropic.Int(3), AfterID: anthropic.String("m")})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) != 3 || page.Data[0].ID != "m-b" || !page.HasMore || page.FirstID != "m-b" || page.LastID != "m-d" {
			t.Fatalf("page %s", page.RawJSON())
		}
	})

	t.Run("anthropic retrieve", func(t *testing.T) {
		m, err := ac.Models.Get(ctx, "m-c", anthropic.ModelGetParams{})
		if err != nil {
			t.Fatal(err)
		}
		if m.ID != "m-c" || m.DisplayName != "m-c" || !m.CreatedAt.Equal(time.Unix(0, 0)) || !m.JSON.Type.Valid() || m.Type != "model" {
			t.Fatalf("model %s", m.RawJSON())
		}
	})

	t.Run("anthropic errors", func(t *testing.T) {
		var aErr *anthropic.Error
		_, err := ac.Models.Get(ctx, "no-such-model", anthropic.ModelGetParams{})
		if !errors.As(err, &aErr) || aErr.StatusCode != http.StatusNotFound || aErr.Type() != anthropic.ErrorTypeNotFoundError {
			t.Fatalf("retrieve of an unknown model: %v", err)
		}
		_, err = ac.Models.List(ctx, anthropic.ModelListParams{Limit: anthropic.Int(1001)})
		if !errors.As(err, &aErr) || aErr.StatusCode != http.StatusBadRequest || aErr.Type() != anthropic.ErrorTypeInvalidRequestError {
			t.Fatalf("list with limit 1001: %v", err)
		}
	})

	t.Run("anthropic, a key limited to some models", func(t *testing.T) {
		lc := anthropic.NewClient(aoption.WithBaseURL(base), aoption.WithAPIKey(limitedKey), aoption.WithMaxRetries(0))
		got := collect(lc.Models.ListAutoPaging(ctx, anthropic.ModelListParams{Limit: anthropic.Int(1)}))
		if want := []string{"m-b", "m-d"}; !slices.Equal(got, want) {
			t.Fatalf("%v, want %v", got, want)
		}
		var aErr *anthropic.Error
		if _, err := lc.Models.Get(ctx, "m-c", anthropic.ModelGetParams{}); !errors.As(err, &aErr) || aErr.StatusCode != http.StatusNotFound {
			t.Fatalf("retrieve of a model the key may not use: %v", err)
		}
	})

	t.Run("openai list", func(t *testing.T) {
		for key, want := range map[string][]string{virtualKey: routes, limitedKey: {"m-b", "m-d"}} {
			oc := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
			page, err := oc.Models.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range page.Data {
				if m.Object != "model" || m.OwnedBy != "rolter" {
					t.Fatalf("model %s", m.RawJSON())
				}
				got = append(got, m.ID)
			}
			if !slices.Equal(got, want) || page.Object != "list" {
				t.Fatalf("%s: %v (object %q), want %v", key, got, page.Object, want)
			}
		}
	})
}
