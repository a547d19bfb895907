package delivery_test

import (
	"net/http"
	"testing"

	"rolter.dev/pkg/delivery"
)

func TestStreamDecision(t *testing.T) {
	post := rule("no-email", delivery.BuiltinEmail, delivery.ActionRedact)
	pre := delivery.GuardrailRule{Name: "pre", Builtin: delivery.BuiltinEmail, Stage: delivery.StagePreCall, Action: delivery.ActionBlock}
	pii := func(direction, restoration, streaming string) func(*delivery.Config) {
		return func(c *delivery.Config) {
			c.PII = delivery.PIIConfig{Enabled: true, URL: "http://pii/s", RestoreURL: "http://pii/r", Direction: direction,
				Restoration: restoration, Streaming: streaming, TimeoutMS: 100, FailureMode: delivery.FailOpen}
		}
	}
	tests := []struct {
		name     string
		cfg      func(*delivery.Config)
		optIn    bool
		wantCode string // "" means allowed
	}{
		{name: "nothing configured", cfg: func(*delivery.Config) {}},
		{name: "post_call rule, streaming_post_call reject", cfg: func(c *delivery.Config) { c.Guardrails.Rules = []delivery.GuardrailRule{post} }, wantCode: delivery.CodeGuardrailStreaming},
		{name: "post_call rule, passthrough", cfg: func(c *delivery.Config) {
			c.Guardrails.Rules = []delivery.GuardrailRule{post}
			c.Guardrails.StreamingPostCall = delivery.StreamingPassthrough
		}},
		{name: "only pre_call rules", cfg: func(c *delivery.Config) { c.Guardrails.Rules = []delivery.GuardrailRule{pre} }},
		{name: "guardrails disabled", cfg: func(c *delivery.Config) {
			c.Guardrails.Rules = []delivery.GuardrailRule{post}
			c.Guardrails.Enabled = false
		}},
		{name: "fail_open post_response plugin is skipped", cfg: func(c *delivery.Config) {
			c.Plugins = []delivery.PluginConfig{postPlugin("p", "http://plugin", delivery.FailOpen)}
		}},
		{name: "fail_closed post_response plugin", cfg: func(c *delivery.Config) {
			c.Plugins = []delivery.PluginConfig{postPlugin("a", "http://plugin", delivery.FailOpen), postPlugin("p", "http://plugin", delivery.FailClosed)}
		}, wantCode: delivery.CodePluginStreaming},
		{name: "fail_closed pre_route plugin", cfg: func(c *delivery.Config) {
			c.Plugins = []delivery.PluginConfig{{Name: "p", URL: "http://plugin", Stage: delivery.PluginStagePreRoute, FailureMode: delivery.FailClosed}}
		}},
		{name: "pii request leg only", cfg: pii(delivery.DirectionRequest, delivery.RestorationNever, delivery.StreamingReject)},
		{name: "pii response leg, reject", cfg: pii(delivery.DirectionResponse, delivery.RestorationNever, delivery.StreamingReject), wantCode: delivery.CodePIIStreaming},
		{name: "pii both, reject", cfg: pii(delivery.DirectionBoth, delivery.RestorationNever, delivery.StreamingReject), wantCode: delivery.CodePIIStreaming},
		{name: "pii response leg, passthrough", cfg: pii(delivery.DirectionResponse, delivery.RestorationNever, delivery.StreamingPassthrough)},
		{name: "pii trusted_downstream restore, reject", cfg: pii(delivery.DirectionRequest, delivery.RestorationTrustedDownstream, delivery.StreamingReject), wantCode: delivery.CodePIIStreaming},
		{name: "pii caller_authorized without opt-in", cfg: pii(delivery.DirectionRequest, delivery.RestorationCallerAuthorized, delivery.StreamingReject)},
		{name: "pii caller_authorized with opt-in", cfg: pii(delivery.DirectionRequest, delivery.RestorationCallerAuthorized, delivery.StreamingReject), optIn: true, wantCode: delivery.CodePIIStreaming},
		{name: "pii disabled", cfg: func(c *delivery.Config) {
			pii(delivery.DirectionBoth, delivery.RestorationNever, delivery.StreamingReject)(c)
			c.PII.Enabled = false
		}},
		{name: "guardrail first when every stage would refuse", cfg: func(c *delivery.Config) {
			c.Guardrails.Rules = []delivery.GuardrailRule{post}
			c.Plugins = []delivery.PluginConfig{postPlugin("p", "http://plugin", delivery.FailClosed)}
			pii(delivery.DirectionResponse, delivery.RestorationNever, delivery.StreamingReject)(c)
		}, wantCode: delivery.CodeGuardrailStreaming},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			tc.cfg(&cfg)
			p := newPolicy(t, cfg)
			r := req
			r.Stream = true
			r.PIIRestoreOptIn = tc.optIn
			allow, refuse := p.StreamDecision(r)
			if tc.wantCode == "" {
				if !allow {
					t.Fatalf("refused: %+v", refuse)
				}
				return
			}
			if allow || refuse.Status != http.StatusBadRequest || refuse.Code != tc.wantCode {
				t.Fatalf("allow %v, refuse %+v, want 400 %s", allow, refuse, tc.wantCode)
			}
			if p.Stats().Withheld.Load() != 0 {
				t.Error("a stream refused up front counted as withheld")
			}
		})
	}
	var nilPolicy *delivery.Policy
	if allow, _ := nilPolicy.StreamDecision(req); !allow {
		t.Error("nil policy refused a stream")
	}
}
