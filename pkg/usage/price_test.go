package usage_test

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"rolter.dev/pkg/usage"
)

func ptr[T any](v T) *T { return &v }

func TestCost(t *testing.T) {
	tests := []struct {
		name  string
		price usage.ModelPrice
		u     usage.Usage
		want  float64
	}{
		{"cached tokens at the cached price",
			usage.ModelPrice{InputPerMTok: 2.5, OutputPerMTok: 10, CachedInputPerMTok: ptr(1.25)},
			usage.Usage{PromptTokens: 1000, CachedTokens: 400, CompletionTokens: 100, Known: true},
			(600*2.5 + 400*1.25 + 100*10) / 1e6},
		{"no cached price: cached tokens at the input price",
			usage.ModelPrice{InputPerMTok: 2.5, OutputPerMTok: 10},
			usage.Usage{PromptTokens: 1000, CachedTokens: 400, CompletionTokens: 100, Known: true},
			(1000*2.5 + 100*10) / 1e6},
		{"cache writes at the input price",
			usage.ModelPrice{InputPerMTok: 3, OutputPerMTok: 15, CachedInputPerMTok: ptr(0.3)},
			usage.Usage{PromptTokens: 525, CachedTokens: 400, CacheWriteTokens: 100, CompletionTokens: 15, Known: true},
			(125*3 + 400*0.3 + 15*15) / 1e6},
		{"embeddings: prompt only",
			usage.ModelPrice{InputPerMTok: 0.02},
			usage.Usage{PromptTokens: 1_000_000, Known: true},
			0.02},
		{"free model", usage.ModelPrice{}, usage.Usage{PromptTokens: 5, CompletionTokens: 5, Known: true}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.price.Cost(tc.u); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("Cost = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBill(t *testing.T) {
	table := usage.NewPriceTable([]usage.ModelPrice{
		{Model: "gpt-4o", InputPerMTok: 2.5, OutputPerMTok: 10},
		{Model: "llama-3.1-8b", InputPerMTok: 0.1, OutputPerMTok: 0.1},
		{Model: "vllm-a/llama-3.1-8b", InputPerMTok: 0.05, OutputPerMTok: 0.05},
		{Model: "public-alias", InputPerMTok: 1, OutputPerMTok: 1},
	})
	known := usage.Usage{PromptTokens: 1000, CompletionTokens: 1000, Known: true}
	tests := []struct {
		name         string
		rec          usage.Record
		u            usage.Usage
		wantCost     float64
		wantTokens   bool
		wantUnknown  bool
		wantUnpriced bool
	}{
		{"target model price", usage.Record{Model: "gpt", Provider: "openai", TargetModel: "gpt-4o"}, known, 0.0125, true, false, false},
		{"provider-qualified price wins", usage.Record{Model: "llama", Provider: "vllm-a", TargetModel: "llama-3.1-8b"}, known, 0.0001, true, false, false},
		{"other provider: the target model's price", usage.Record{Model: "llama", Provider: "vllm-b", TargetModel: "llama-3.1-8b"}, known, 0.0002, true, false, false},
		{"requested model as the fallback", usage.Record{Model: "public-alias", Provider: "x", TargetModel: "unpriced"}, known, 0.002, true, false, false},
		{"unpriced", usage.Record{Model: "m", Provider: "p", TargetModel: "t"}, known, 0, true, false, true},
		{"usage unknown", usage.Record{Model: "gpt-4o", TargetModel: "gpt-4o"}, usage.Usage{}, 0, false, true, false},
		{"exact hit costs zero", usage.Record{Model: "gpt-4o", CacheHit: usage.CacheHitExact}, known, 0, false, false, false},
		{"semantic hit costs zero", usage.Record{Model: "gpt-4o", CacheHit: usage.CacheHitSemantic}, known, 0, false, false, false},
		{"withheld live response is billed", usage.Record{Model: "gpt", TargetModel: "gpt-4o", Withheld: true, WithheldReason: "plugin_blocked: judge", Status: 403}, known, 0.0125, true, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.rec
			r.CostUSD, r.PromptTokens = 42, 42 // Bill overwrites stale values
			table.Bill(&r, tc.u)
			if math.Abs(r.CostUSD-tc.wantCost) > 1e-12 {
				t.Errorf("cost = %v, want %v", r.CostUSD, tc.wantCost)
			}
			if hasTokens := r.PromptTokens != 0 || r.CompletionTokens != 0; hasTokens != tc.wantTokens {
				t.Errorf("tokens = %d/%d", r.PromptTokens, r.CompletionTokens)
			}
			if r.UsageUnknown != tc.wantUnknown || r.Unpriced != tc.wantUnpriced {
				t.Errorf("usage_unknown %v unpriced %v", r.UsageUnknown, r.Unpriced)
			}
		})
	}
	var none *usage.PriceTable
	r := usage.Record{Model: "m"}
	none.Bill(&r, known)
	if !r.Unpriced || r.CostUSD != 0 {
		t.Errorf("nil table: %+v", r)
	}
}

func TestValidatePrices(t *testing.T) {
	tests := []struct {
		name   string
		prices []usage.ModelPrice
		want   []string
	}{
		{"valid", []usage.ModelPrice{{Model: "a", InputPerMTok: 1, OutputPerMTok: 2, CachedInputPerMTok: ptr(0.5)}, {Model: "b"}}, nil},
		{"errors", []usage.ModelPrice{
			{Model: "", InputPerMTok: -1},
			{Model: "a", OutputPerMTok: math.Inf(1)},
			{Model: "a", CachedInputPerMTok: ptr(math.NaN())},
		}, []string{
			"model_prices[0].model: must not be empty",
			"model_prices[0].input_per_mtok: must be a finite number >= 0, got -1",
			"model_prices[1].output_per_mtok: must be a finite number >= 0, got +Inf",
			`model_prices[2].model: duplicate price for "a" (also model_prices[1])`,
			"model_prices[2].cached_input_per_mtok: must be a finite number >= 0, got NaN",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, err := range usage.ValidatePrices("model_prices", tc.prices) {
				var fe *usage.FieldError
				if !errors.As(err, &fe) {
					t.Errorf("not a FieldError: %v", err)
				}
				got = append(got, err.Error())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("errors =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestRecordJSONKeys(t *testing.T) {
	b, err := json.Marshal(usage.Record{Withheld: true, WithheldReason: "guardrail_blocked: r", Error: "x"})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"cache_hit", "cached_tokens", "completion_tokens", "cost_usd", "error", "key_id", "latency_ms", "model",
		"prompt_tokens", "provider", "request_id", "status", "stream", "target_model", "ts", "ttft_ms", "unpriced",
		"usage_unknown", "withheld", "withheld_reason"}
	if !slices.Equal(keys, want) {
		t.Errorf("keys = %v\nwant %v", keys, want)
	}
}
