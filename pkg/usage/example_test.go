package usage_test

import (
	"fmt"
	"os"
	"time"

	"rolter.dev/pkg/usage"
)

// The proxy tees a stream through an SSEParser as it passes, then bills
// and writes the record.
func ExampleSSEParser() {
	var p usage.SSEParser
	for _, chunk := range []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\ndata: {\"choices\":[],\"us",
		"age\":{\"prompt_tokens\":1000,\"completion_tokens\":100,\"prompt_tokens_details\":{\"cached_tokens\":400}}}\n\ndata: [DONE]\n\n",
	} {
		p.Write([]byte(chunk))
	}
	u := p.End()

	prices := usage.NewPriceTable([]usage.ModelPrice{{Model: "gpt-4o", InputPerMTok: 2.5, OutputPerMTok: 10, CachedInputPerMTok: new(1.25)}})
	rec := usage.Record{
		TS: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), RequestID: "req-1", Model: "gpt-4o",
		Provider: "openai", TargetModel: "gpt-4o", Status: 200, Stream: true,
		LatencyMS: usage.Millis(820 * time.Millisecond), TTFTMS: usage.Millis(95 * time.Millisecond),
	}
	prices.Bill(&rec, u)

	sink := usage.NewJSONLines(os.Stdout, usage.JSONLinesOptions{})
	sink.Write(rec)
	sink.Close()
	fmt.Printf("%.4f\n", rec.CostUSD)
	// Output:
	// {"ts":"2026-01-01T00:00:00Z","request_id":"req-1","key_id":"","model":"gpt-4o","provider":"openai","target_model":"gpt-4o","status":200,"stream":true,"prompt_tokens":1000,"completion_tokens":100,"cached_tokens":400,"cost_usd":0.003,"latency_ms":820,"ttft_ms":95,"cache_hit":"","withheld":false,"usage_unknown":false,"unpriced":false}
	// 0.0030
}
