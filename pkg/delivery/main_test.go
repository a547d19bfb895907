package delivery_test

import (
	"net/http"
	"testing"

	"go.uber.org/goleak"

	"rolter.dev/pkg/delivery"
)

// No goroutine (test servers, writers, client connections) may outlive the
// tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// baseConfig returns a configuration with every section default.
func baseConfig() delivery.Config {
	return delivery.Config{Guardrails: delivery.DefaultGuardrails(), PII: delivery.DefaultPII()}
}

// newPolicy builds a policy from cfg (New applies the list defaults) with
// a client whose idle connections are closed when the test ends.
func newPolicy(t *testing.T, cfg delivery.Config, opts ...delivery.Option) *delivery.Policy {
	t.Helper()
	client := &http.Client{}
	t.Cleanup(client.CloseIdleConnections)
	p, err := delivery.New(cfg, client, nil, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// mustSend asserts that d is a Send and returns it.
func mustSend(t *testing.T, d delivery.Delivery) delivery.Send {
	t.Helper()
	s, ok := d.(delivery.Send)
	if !ok {
		t.Fatalf("delivery = %#v, want Send", d)
	}
	return s
}

// mustRefuse asserts that d is a Refuse with the status and code.
func mustRefuse(t *testing.T, d delivery.Delivery, status int, code string) delivery.Refuse {
	t.Helper()
	r, ok := d.(delivery.Refuse)
	if !ok {
		t.Fatalf("delivery = Send, want Refuse %d %s", status, code)
	}
	if r.Status != status || r.Code != code {
		t.Fatalf("refuse = %d %s (%q), want %d %s", r.Status, r.Code, r.Reason, status, code)
	}
	return r
}

var req = delivery.Request{RequestID: "req-1", Model: "gpt-x", Route: "gpt-x", KeyID: "key-1"}

const jsonCT = "application/json"
