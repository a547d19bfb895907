package delivery_test

import (
	"errors"
	"strings"
	"testing"

	"rolter.dev/pkg/delivery"
)

func TestDefaultsAreValid(t *testing.T) {
	cfg := baseConfig()
	if errs := cfg.Validate(); len(errs) > 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
	g := delivery.DefaultGuardrails()
	if !g.Enabled || g.MaxScanBytes != 262144 || g.StreamingPostCall != "reject" {
		t.Errorf("guardrail defaults = %+v", g)
	}
	p := delivery.DefaultPII()
	if p.Enabled || p.Direction != "request" || p.Restoration != "never" || p.Streaming != "reject" || p.TimeoutMS != 5000 || p.FailureMode != "fail_open" {
		t.Errorf("pii defaults = %+v", p)
	}
	plugins := []delivery.PluginConfig{{Name: "a"}}
	delivery.ApplyPluginDefaults(plugins)
	if plugins[0].TimeoutMS != 2000 || plugins[0].FailureMode != "fail_open" {
		t.Errorf("plugin defaults = %+v", plugins[0])
	}
	g.Rules = []delivery.GuardrailRule{{Name: "r"}}
	g.ApplyDefaults()
	if g.Rules[0].Action != "annotate" {
		t.Errorf("rule action default = %q", g.Rules[0].Action)
	}
}

func TestValidate(t *testing.T) {
	good := func() delivery.Config {
		cfg := baseConfig()
		cfg.Guardrails.Rules = []delivery.GuardrailRule{
			{Name: "email", Builtin: "email", Stage: "post_call", Action: "redact"},
			{Name: "pat", Pattern: `secret-\d+`, Stage: "pre_call", Action: "block", IncludeSystem: true},
		}
		cfg.Plugins = []delivery.PluginConfig{{Name: "judge", URL: "https://judge.internal/hook", Stage: "post_response", TimeoutMS: 2000, FailureMode: "fail_closed", AuthTokenEnv: "JUDGE_TOKEN"}}
		cfg.PII = delivery.PIIConfig{Enabled: true, URL: "http://pii:8080/sanitize", RestoreURL: "http://pii:8080/restore", Direction: "both",
			Restoration: "caller_authorized", Streaming: "passthrough", TimeoutMS: 5000, FailureMode: "fail_open", Entities: []string{"PERSON"}}
		return cfg
	}
	tests := []struct {
		name   string
		mutate func(*delivery.Config)
		want   string // "path: message" prefix of one error
	}{
		{"error: invalid regexp", func(c *delivery.Config) { c.Guardrails.Rules[1].Pattern = `(unclosed` }, "guardrails.rules[1].pattern: invalid regexp"},
		{"error: regexp matching empty", func(c *delivery.Config) { c.Guardrails.Rules[1].Pattern = `x*` }, "guardrails.rules[1].pattern: must not match the empty string"},
		{"error: builtin and pattern", func(c *delivery.Config) { c.Guardrails.Rules[0].Pattern = "x" }, "guardrails.rules[0]: builtin and pattern are mutually exclusive"},
		{"error: neither builtin nor pattern", func(c *delivery.Config) { c.Guardrails.Rules[0].Builtin = "" }, "guardrails.rules[0]: one of builtin and pattern"},
		{"error: unknown builtin", func(c *delivery.Config) { c.Guardrails.Rules[0].Builtin = "ssn" }, "guardrails.rules[0].builtin: must be one of"},
		{"error: missing stage", func(c *delivery.Config) { c.Guardrails.Rules[0].Stage = "" }, "guardrails.rules[0].stage: must be one of"},
		{"error: unknown action", func(c *delivery.Config) { c.Guardrails.Rules[0].Action = "mask" }, "guardrails.rules[0].action: must be one of"},
		{"error: duplicate rule", func(c *delivery.Config) { c.Guardrails.Rules[1].Name = "email" }, `guardrails.rules[1].name: duplicate rule "email"`},
		{"error: empty rule name", func(c *delivery.Config) { c.Guardrails.Rules[1].Name = "" }, "guardrails.rules[1].name: must not be empty"},
		{"error: long replacement", func(c *delivery.Config) { c.Guardrails.Rules[0].Replacement = strings.Repeat("é", 65) }, "guardrails.rules[0].replacement: must be at most 64 characters"},
		{"error: replacement without redact", func(c *delivery.Config) { c.Guardrails.Rules[1].Replacement = "x" }, "guardrails.rules[1].replacement: only applies"},
		{"error: include_system on post_call", func(c *delivery.Config) { c.Guardrails.Rules[0].IncludeSystem = true }, "guardrails.rules[0].include_system: only applies"},
		{"error: tool_calls on a redact rule", func(c *delivery.Config) {
			c.Guardrails.Rules[0].ToolCalls, c.Guardrails.Rules[0].Action = true, delivery.ActionRedact
		}, "guardrails.rules[0].tool_calls: applies to action"},
		{"error: max_scan_bytes", func(c *delivery.Config) { c.Guardrails.MaxScanBytes = 0 }, "guardrails.max_scan_bytes: must be > 0"},
		{"error: streaming_post_call", func(c *delivery.Config) { c.Guardrails.StreamingPostCall = "buffer" }, "guardrails.streaming_post_call: must be one of"},
		{"error: plugin url", func(c *delivery.Config) { c.Plugins[0].URL = "judge:80" }, "plugins[0].url: must be an absolute"},
		{"error: plugin url password is hidden", func(c *delivery.Config) { c.Plugins[0].URL = "ftp://u:hunter2@judge" }, `plugins[0].url: must be an absolute http:// or https:// URL, got "ftp://u:xxxxx@judge"`},
		{"error: plugin stage", func(c *delivery.Config) { c.Plugins[0].Stage = "post_call" }, "plugins[0].stage: must be one of"},
		{"error: plugin timeout", func(c *delivery.Config) { c.Plugins[0].TimeoutMS = 60001 }, "plugins[0].timeout_ms: must be in [1, 60000], got 60001"},
		{"error: plugin failure mode", func(c *delivery.Config) { c.Plugins[0].FailureMode = "open" }, "plugins[0].failure_mode: must be one of"},
		{"error: plugin env name", func(c *delivery.Config) { c.Plugins[0].AuthTokenEnv = "$TOKEN" }, "plugins[0].auth_token_env: must be an environment variable name"},
		{"error: duplicate plugin", func(c *delivery.Config) { c.Plugins = append(c.Plugins, c.Plugins[0]) }, `plugins[1].name: duplicate plugin "judge"`},
		{"error: pii url", func(c *delivery.Config) { c.PII.URL = "" }, "pii_sanitizer.url: must be an absolute"},
		{"error: pii restore url", func(c *delivery.Config) { c.PII.RestoreURL = "" }, "pii_sanitizer.restore_url: must be an absolute"},
		{"error: pii direction", func(c *delivery.Config) { c.PII.Direction = "in" }, "pii_sanitizer.direction: must be one of"},
		{"error: pii restoration without request leg", func(c *delivery.Config) { c.PII.Direction = "response" }, "pii_sanitizer.restoration: \"caller_authorized\" needs the request leg"},
		{"error: pii restoration", func(c *delivery.Config) { c.PII.Restoration = "always" }, "pii_sanitizer.restoration: must be one of"},
		{"error: pii streaming", func(c *delivery.Config) { c.PII.Streaming = "buffer" }, "pii_sanitizer.streaming: must be one of"},
		{"error: pii timeout", func(c *delivery.Config) { c.PII.TimeoutMS = -1 }, "pii_sanitizer.timeout_ms: must be in"},
		{"error: pii empty entity", func(c *delivery.Config) { c.PII.Entities = []string{""} }, "pii_sanitizer.entities[0]: must not be empty"},
	}
	if errs := func() []error { c := good(); return c.Validate() }(); len(errs) > 0 {
		t.Fatalf("good config invalid: %v", errs)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.mutate(&cfg)
			errs := cfg.Validate()
			found := false
			for _, err := range errs {
				var fe *delivery.FieldError
				if !errors.As(err, &fe) {
					t.Errorf("not a FieldError: %v", err)
				}
				if strings.HasPrefix(err.Error(), tc.want) {
					found = true
				}
			}
			if !found {
				t.Errorf("errors %v, want one starting %q", errs, tc.want)
			}
			if _, err := delivery.New(cfg, nil, nil, delivery.WithGetenv(func(string) string { return "t" })); err == nil {
				t.Error("New accepted an invalid config")
			}
		})
	}
	t.Run("a disabled sanitizer needs no urls", func(t *testing.T) {
		cfg := good()
		cfg.PII.Enabled, cfg.PII.URL, cfg.PII.RestoreURL = false, "", ""
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Errorf("errors: %v", errs)
		}
	})
}
