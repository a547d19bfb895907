package delivery_test

import (
	"context"
	"fmt"

	"rolter.dev/pkg/delivery"
)

// The proxy builds a Policy from its config and calls Apply on every
// buffered response, cached or not; the cache keeps the upstream's bytes.
func ExamplePolicy_Apply() {
	cfg := delivery.Config{Guardrails: delivery.DefaultGuardrails(), PII: delivery.DefaultPII()}
	cfg.Guardrails.Rules = []delivery.GuardrailRule{
		{Name: "no-email", Builtin: delivery.BuiltinEmail, Stage: delivery.StagePostCall, Action: delivery.ActionRedact},
		{Name: "no-cards", Builtin: delivery.BuiltinPaymentCard, Stage: delivery.StagePostCall, Action: delivery.ActionBlock},
	}
	policy, err := delivery.New(cfg, nil, nil)
	if err != nil {
		panic(err)
	}
	r := delivery.Request{RequestID: "req-1", Model: "gpt-4o", Route: "gpt-4o"}
	stored := []byte(`{"choices":[{"message":{"role":"assistant","content":"Write to ann@example.com"}}]}`)

	switch d := policy.Apply(context.Background(), r, 200, "application/json", stored).(type) {
	case delivery.Send:
		fmt.Println(string(d.Body))
		fmt.Println(d.Header.Get(delivery.HeaderGuardrailRedacted))
	case delivery.Refuse:
		fmt.Println(d.Status, d.Code)
	}

	card := []byte(`{"choices":[{"message":{"content":"4111 1111 1111 1111"}}]}`)
	if d, ok := policy.Apply(context.Background(), r, 200, "application/json", card).(delivery.Refuse); ok {
		fmt.Println(d.Status, d.Code, d.Reason)
	}
	// Output:
	// {"choices":[{"message":{"role":"assistant","content":"Write to [REDACTED:EMAIL]"}}]}
	// no-email
	// 403 guardrail_blocked guardrail_blocked: no-cards
}
