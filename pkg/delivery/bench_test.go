package delivery_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"rolter.dev/pkg/delivery"
)

// BenchmarkApply measures the guardrail stage on a chat response whose
// assistant text is of the given size, with every builtin redacting, on
// clean and on PII-dense text.
func BenchmarkApply(b *testing.B) {
	cfg := baseConfig()
	for _, bi := range []string{delivery.BuiltinEmail, delivery.BuiltinPhone, delivery.BuiltinAPIToken, delivery.BuiltinPaymentCard} {
		cfg.Guardrails.Rules = append(cfg.Guardrails.Rules, delivery.GuardrailRule{Name: bi, Builtin: bi, Stage: delivery.StagePostCall, Action: delivery.ActionRedact})
	}
	cfg.Guardrails.MaxScanBytes = 2 << 20
	p, err := delivery.New(cfg, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	texts := map[string]string{
		// Typical output: prose and code, no personal data.
		"clean": "In 2024 the team shipped version 1.2.3 of the parser; see section 4.5 and call parse(x, 10) for details. ",
		// Pathological output: a phone number and an email in every sentence.
		"dense": "The quick brown fox (call 555-123-4567) mails fox@example.com about order 12345. ",
	}
	for _, size := range []int{4 << 10, 1 << 20} {
		for _, kind := range []string{"clean", "dense"} {
			sentence := texts[kind]
			text := strings.Repeat(sentence, size/len(sentence)+1)[:size]
			body := []byte(fmt.Sprintf(`{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":%q}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`, text))
			b.Run(fmt.Sprintf("text=%s/body=%dKiB", kind, size>>10), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					p.Apply(context.Background(), req, 200, jsonCT, body)
				}
			})
		}
	}
}
