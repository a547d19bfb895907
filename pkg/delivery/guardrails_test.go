package delivery_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"rolter.dev/pkg/delivery"
)

func rule(name, builtin, action string) delivery.GuardrailRule {
	return delivery.GuardrailRule{Name: name, Builtin: builtin, Stage: delivery.StagePostCall, Action: action}
}

func TestOutputGuardrails(t *testing.T) {
	redactEmail := []delivery.GuardrailRule{rule("no-email", delivery.BuiltinEmail, delivery.ActionRedact)}
	tests := []struct {
		name       string
		rules      []delivery.GuardrailRule
		maxScan    int
		status     int
		ct         string
		body       string
		wantBody   string // exact bytes when set; "" means unchanged
		wantHeader map[string]string
		wantRefuse string // refusal code
	}{
		{
			name:  "redact: chat content only, tool arguments and other fields kept byte for byte",
			rules: redactEmail,
			body: `{"id":"x@example.com", "choices":[{"index":0,"message":{"role":"assistant","content":"Mail <b>bob@example.com</b> now",` +
				`"tool_calls":[{"id":"c1","type":"function","function":{"name":"send","arguments":"{\"to\":\"bob@example.com\"}"}}]},` +
				`"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}`,
			wantBody: `{"id":"x@example.com", "choices":[{"index":0,"message":{"role":"assistant","content":"Mail <b>[REDACTED:EMAIL]</b> now",` +
				`"tool_calls":[{"id":"c1","type":"function","function":{"name":"send","arguments":"{\"to\":\"bob@example.com\"}"}}]},` +
				`"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}`,
			wantHeader: map[string]string{delivery.HeaderGuardrailRedacted: "no-email"},
		},
		{
			name:     "redact: every choice",
			rules:    redactEmail,
			body:     `{"choices":[{"message":{"content":"a@example.com"}},{"message":{"content":"b@example.com"}}]}`,
			wantBody: `{"choices":[{"message":{"content":"[REDACTED:EMAIL]"}},{"message":{"content":"[REDACTED:EMAIL]"}}]}`,
		},
		{
			name:     "redact: chat content parts",
			rules:    redactEmail,
			body:     `{"choices":[{"message":{"content":[{"type":"text","text":"a@example.com"},{"type":"image_url","text":"b@example.com"}]}}]}`,
			wantBody: `{"choices":[{"message":{"content":[{"type":"text","text":"[REDACTED:EMAIL]"},{"type":"image_url","text":"b@example.com"}]}}]}`,
		},
		{
			name:     "redact: completions text",
			rules:    []delivery.GuardrailRule{rule("no-phone", delivery.BuiltinPhone, delivery.ActionRedact)},
			body:     `{"object":"text_completion","choices":[{"text":"call 555-123-4567","index":0}]}`,
			wantBody: `{"object":"text_completion","choices":[{"text":"call [REDACTED:PHONE]","index":0}]}`,
		},
		{
			name:  "redact: anthropic text blocks, whatever the key order, not tool input",
			rules: redactEmail,
			body: `{"type":"message","content":[{"type":"text","text":"a@example.com"},{"text":"c@example.com","type":"text"},` +
				`{"type":"tool_use","id":"t","name":"x","input":{"text":"a@example.com"}}],"stop_reason":"end_turn"}`,
			wantBody: `{"type":"message","content":[{"type":"text","text":"[REDACTED:EMAIL]"},{"text":"[REDACTED:EMAIL]","type":"text"},` +
				`{"type":"tool_use","id":"t","name":"x","input":{"text":"a@example.com"}}],"stop_reason":"end_turn"}`,
		},
		{
			name:     "redact: responses output_text",
			rules:    []delivery.GuardrailRule{rule("no-card", delivery.BuiltinPaymentCard, delivery.ActionRedact)},
			body:     `{"object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"4111 1111 1111 1111"}]}]}`,
			wantBody: `{"object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"[REDACTED:CARD]"}]}]}`,
		},
		{
			name:  "redact: the reasoning of a chat answer, under either name",
			rules: redactEmail,
			body: `{"choices":[{"message":{"role":"assistant","content":"done","reasoning_content":"the user is a@example.com"}},` +
				`{"message":{"role":"assistant","content":null,"reasoning":"b@example.com"}}]}`,
			wantBody: `{"choices":[{"message":{"role":"assistant","content":"done","reasoning_content":"the user is [REDACTED:EMAIL]"}},` +
				`{"message":{"role":"assistant","content":null,"reasoning":"[REDACTED:EMAIL]"}}]}`,
		},
		{
			name:  "redact: anthropic thinking blocks, not their signature",
			rules: redactEmail,
			body: `{"type":"message","content":[{"type":"thinking","thinking":"mail a@example.com","signature":"a@example.com"},` +
				`{"type":"redacted_thinking","data":"b@example.com"},{"type":"text","text":"ok"}]}`,
			wantBody: `{"type":"message","content":[{"type":"thinking","thinking":"mail [REDACTED:EMAIL]","signature":"a@example.com"},` +
				`{"type":"redacted_thinking","data":"b@example.com"},{"type":"text","text":"ok"}]}`,
		},
		{
			name:  "redact: responses reasoning text and summaries, not a function call's arguments",
			rules: redactEmail,
			body: `{"object":"response","output":[{"type":"reasoning","summary":[{"type":"summary_text","text":"a@example.com"}],` +
				`"content":[{"type":"reasoning_text","text":"b@example.com"}]},{"type":"function_call","name":"f","arguments":"{\"to\":\"c@example.com\"}"}]}`,
			wantBody: `{"object":"response","output":[{"type":"reasoning","summary":[{"type":"summary_text","text":"[REDACTED:EMAIL]"}],` +
				`"content":[{"type":"reasoning_text","text":"[REDACTED:EMAIL]"}]},{"type":"function_call","name":"f","arguments":"{\"to\":\"c@example.com\"}"}]}`,
		},
		{
			name:       "block: an api token in the reasoning refuses",
			rules:      []delivery.GuardrailRule{rule("tok", delivery.BuiltinAPIToken, delivery.ActionBlock)},
			body:       `{"choices":[{"message":{"content":"I cannot share it.","reasoning_content":"the key is AKIAIOSFODNN7EXAMPLE"}}]}`,
			wantRefuse: delivery.CodeGuardrailBlocked,
		},
		{
			name: "block: tool_calls rules read the calls (chat arguments), the others do not",
			rules: []delivery.GuardrailRule{rule("plain", delivery.BuiltinAPIToken, delivery.ActionBlock),
				{Name: "calls", Builtin: delivery.BuiltinAPIToken, Stage: delivery.StagePostCall, Action: delivery.ActionBlock, ToolCalls: true}},
			body:       `{"choices":[{"message":{"content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"fetch","arguments":"{\"url\":\"https://x.example/?k=AKIAIOSFODNN7EXAMPLE\"}"}}]}}]}`,
			wantRefuse: delivery.CodeGuardrailBlocked,
		},
		{
			name: "annotate: tool_calls rules read Responses function calls and Anthropic tool_use input, redact rules never",
			rules: []delivery.GuardrailRule{rule("r", delivery.BuiltinEmail, delivery.ActionRedact),
				{Name: "a", Builtin: delivery.BuiltinEmail, Stage: delivery.StagePostCall, Action: delivery.ActionAnnotate, ToolCalls: true}},
			body: `{"content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"t","name":"mail","input":{"to":["a@example.com"],"n":1}}],` +
				`"output":[{"type":"function_call","name":"f","arguments":"{\"to\":\"b@example.com\"}"}]}`,
			wantHeader: map[string]string{delivery.HeaderGuardrailMatched: "a", delivery.HeaderGuardrailRedacted: ""},
		},
		{
			// An injected agent told to spell what it sends out with JSON
			// escapes: the tool decodes them, so the rule must too.
			name: "block: a tool call's JSON escapes are read decoded (chat arguments, Anthropic tool_use input)",
			rules: []delivery.GuardrailRule{{Name: "calls", Builtin: delivery.BuiltinEmail, Stage: delivery.StagePostCall,
				Action: delivery.ActionBlock, ToolCalls: true}},
			body:       `{"choices":[{"message":{"content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"send","arguments":"{\"to\":\"bob\\u0040example.com\"}"}}]}}]}`,
			wantRefuse: delivery.CodeGuardrailBlocked,
		},
		{
			name: "block: an Anthropic tool_use input with an escaped email",
			rules: []delivery.GuardrailRule{{Name: "calls", Builtin: delivery.BuiltinEmail, Stage: delivery.StagePostCall,
				Action: delivery.ActionBlock, ToolCalls: true}},
			body:       `{"content":[{"type":"tool_use","id":"t","name":"mail","input":{"to":"bob\u0040example\u002ecom"}}]}`,
			wantRefuse: delivery.CodeGuardrailBlocked,
		},
		{
			name:       "annotate: without tool_calls, calls are not read",
			rules:      []delivery.GuardrailRule{rule("a", delivery.BuiltinEmail, delivery.ActionAnnotate)},
			body:       `{"content":[{"type":"tool_use","id":"t","name":"mail","input":{"to":"a@example.com"}}]}`,
			wantHeader: map[string]string{delivery.HeaderGuardrailMatched: ""},
		},
		{
			name:  "redact: api token with a custom replacement",
			rules: []delivery.GuardrailRule{{Name: "tok", Builtin: delivery.BuiltinAPIToken, Stage: delivery.StagePostCall, Action: delivery.ActionRedact, Replacement: "<key>"}},
			body:  `{"choices":[{"message":{"content":"use sk-proj-abc123DEF456ghi789JKL012mno345"}}]}`,
			// SetEscapeHTML(false): the replacement is not \u003c-escaped.
			wantBody: `{"choices":[{"message":{"content":"use <key>"}}]}`,
		},
		{
			name:       "redact: pattern rules in order, each on the previous output",
			rules:      []delivery.GuardrailRule{{Name: "p1", Pattern: `secret-\d+`, Stage: delivery.StagePostCall, Action: delivery.ActionRedact}, {Name: "p2", Pattern: `\[REDACTED\]`, Stage: delivery.StagePostCall, Action: delivery.ActionRedact, Replacement: "#"}},
			body:       `{"choices":[{"text":"secret-42 and secret-7"}]}`,
			wantBody:   `{"choices":[{"text":"# and #"}]}`,
			wantHeader: map[string]string{delivery.HeaderGuardrailRedacted: "p1, p2"},
		},
		{
			name:     "redact: max_scan_bytes leaves the tail as it is",
			rules:    redactEmail,
			maxScan:  16,
			body:     `{"choices":[{"text":"a@example.com and b@example.com"}]}`,
			wantBody: `{"choices":[{"text":"[REDACTED:EMAIL] and b@example.com"}]}`,
		},
		{
			name:     "redact: the scan budget spans choices",
			rules:    redactEmail,
			maxScan:  14,
			body:     `{"choices":[{"text":"a@example.com"},{"text":"b@example.com"}]}`,
			wantBody: `{"choices":[{"text":"[REDACTED:EMAIL]"},{"text":"b@example.com"}]}`,
		},
		{
			name:  "embeddings have no text: unchanged",
			rules: redactEmail,
			body:  `{"object":"list","data":[{"object":"embedding","embedding":[0.1,0.2],"index":0}],"model":"a@example.com","usage":{"prompt_tokens":2,"total_tokens":2}}`,
		},
		{
			name:       "block: payment card refuses",
			rules:      []delivery.GuardrailRule{rule("no-cards", delivery.BuiltinPaymentCard, delivery.ActionBlock)},
			body:       `{"choices":[{"message":{"content":"your card 4111-1111-1111-1111"}}]}`,
			wantRefuse: delivery.CodeGuardrailBlocked,
		},
		{
			name:       "block: beats an earlier redact rule",
			rules:      []delivery.GuardrailRule{rule("r", delivery.BuiltinEmail, delivery.ActionRedact), rule("b", delivery.BuiltinEmail, delivery.ActionBlock)},
			body:       `{"choices":[{"message":{"content":"a@example.com"}}]}`,
			wantRefuse: delivery.CodeGuardrailBlocked,
		},
		{
			name:  "block: a luhn-invalid number passes",
			rules: []delivery.GuardrailRule{rule("no-cards", delivery.BuiltinPaymentCard, delivery.ActionBlock)},
			body:  `{"choices":[{"message":{"content":"order 4111-1111-1111-1112"}}]}`,
		},
		{
			name:       "annotate: header names the rule, body unchanged",
			rules:      []delivery.GuardrailRule{rule("has-email", delivery.BuiltinEmail, "")},
			body:       `{"choices":[{"message":{"content":"a@example.com"}}]}`,
			wantHeader: map[string]string{delivery.HeaderGuardrailMatched: "has-email"},
		},
		{
			name:  "pre_call rules do not apply to responses",
			rules: []delivery.GuardrailRule{{Name: "pre", Builtin: delivery.BuiltinEmail, Stage: delivery.StagePreCall, Action: delivery.ActionBlock}},
			body:  `{"choices":[{"message":{"content":"a@example.com"}}]}`,
		},
		{
			name:   "non-2xx passes unchanged",
			rules:  []delivery.GuardrailRule{rule("b", delivery.BuiltinEmail, delivery.ActionBlock)},
			status: 500,
			body:   `{"error":{"message":"a@example.com"},"choices":[{"text":"a@example.com"}]}`,
		},
		{
			name:  "event stream passes unchanged",
			rules: []delivery.GuardrailRule{rule("b", delivery.BuiltinEmail, delivery.ActionBlock)},
			ct:    "text/event-stream; charset=utf-8",
			body:  "data: {\"choices\":[{\"delta\":{\"content\":\"a@example.com\"}}]}\n\n",
		},
		{
			name:  "not JSON passes unchanged",
			rules: []delivery.GuardrailRule{rule("b", delivery.BuiltinEmail, delivery.ActionBlock)},
			body:  `a@example.com`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Guardrails.Rules = tc.rules
			if tc.maxScan > 0 {
				cfg.Guardrails.MaxScanBytes = tc.maxScan
			}
			p := newPolicy(t, cfg)
			status, ct := tc.status, tc.ct
			if status == 0 {
				status = 200
			}
			if ct == "" {
				ct = jsonCT
			}
			body := []byte(tc.body)
			d := p.Apply(t.Context(), req, status, ct, body)
			if string(body) != tc.body {
				t.Fatal("Apply modified its input")
			}
			if tc.wantRefuse != "" {
				r := mustRefuse(t, d, http.StatusForbidden, tc.wantRefuse)
				if r.Reason != "guardrail_blocked: "+tc.rules[len(tc.rules)-1].Name {
					t.Errorf("reason = %q", r.Reason)
				}
				if strings.ContainsAny(r.Reason+r.Message, "@0123456789") {
					t.Errorf("refusal carries content: %q / %q", r.Reason, r.Message)
				}
				if p.Stats().GuardrailOutputBlocks.Load() != 1 || p.Stats().Withheld.Load() != 1 {
					t.Errorf("blocks = %d, withheld = %d", p.Stats().GuardrailOutputBlocks.Load(), p.Stats().Withheld.Load())
				}
				return
			}
			s := mustSend(t, d)
			want := tc.wantBody
			if want == "" {
				want = tc.body
			}
			if string(s.Body) != want {
				t.Errorf("body =\n%s\nwant\n%s", s.Body, want)
			}
			if ct == jsonCT && json.Valid(body) && !json.Valid(s.Body) {
				t.Errorf("body is not valid JSON: %s", s.Body)
			}
			for k, v := range tc.wantHeader {
				if got := s.Header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestOutputGuardrailRedactKeepsEscapesValid(t *testing.T) {
	cfg := baseConfig()
	cfg.Guardrails.Rules = []delivery.GuardrailRule{rule("e", delivery.BuiltinEmail, delivery.ActionRedact)}
	p := newPolicy(t, cfg)
	body := []byte(`{"choices":[{"message":{"content":"caf\u00e9 \"x@example.com\"\n\ttab \ud83d\ude00 </script>"}}]}`)
	s := mustSend(t, p.Apply(t.Context(), req, 200, jsonCT, body))
	var got struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	if err := json.Unmarshal(s.Body, &got); err != nil {
		t.Fatalf("invalid JSON %s: %v", s.Body, err)
	}
	if want := "café \"[REDACTED:EMAIL]\"\n\ttab 😀 </script>"; got.Choices[0].Message.Content != want {
		t.Errorf("content = %q, want %q", got.Choices[0].Message.Content, want)
	}
	if p.Stats().GuardrailOutputRedactions.Load() != 1 {
		t.Errorf("redactions = %d", p.Stats().GuardrailOutputRedactions.Load())
	}
}

// TestGuardRequestPastTheRecordedTexts: texts past the most parseText
// records are not scanned, as texts past max_scan_bytes are not, and the
// scan counts as truncated.
func TestGuardRequestPastTheRecordedTexts(t *testing.T) {
	cfg := baseConfig()
	cfg.Guardrails.Rules = []delivery.GuardrailRule{{Name: "e", Builtin: delivery.BuiltinEmail, Stage: delivery.StagePreCall, Action: delivery.ActionRedact}}
	p := newPolicy(t, cfg)
	body := `{"prompt":["a@example.com"` + strings.Repeat(`,""`, 1<<16) + `,"b@example.com"]}`
	g, refuse := p.GuardRequest(req, []byte(body))
	if refuse != nil {
		t.Fatal(refuse)
	}
	if s := string(g.Body); !strings.HasPrefix(s, `{"prompt":["[REDACTED:EMAIL]",""`) || !strings.HasSuffix(s, `,"b@example.com"]}`) {
		t.Errorf("body starts %.40s, ends %s", s, s[len(s)-20:])
	}
	if n := p.Stats().GuardrailScanTruncations.Load(); n != 1 {
		t.Errorf("scan truncations = %d, want 1", n)
	}
}

func TestOutputGuardrailsDisabled(t *testing.T) {
	cfg := baseConfig()
	cfg.Guardrails.Enabled = false
	cfg.Guardrails.Rules = []delivery.GuardrailRule{rule("b", delivery.BuiltinEmail, delivery.ActionBlock)}
	p := newPolicy(t, cfg)
	mustSend(t, p.Apply(t.Context(), req, 200, jsonCT, []byte(`{"choices":[{"text":"a@example.com"}]}`)))
	if p.Active(req) {
		t.Error("Active with guardrails disabled")
	}
}

func TestGuardRequest(t *testing.T) {
	pre := func(name, builtin, action string, system bool) delivery.GuardrailRule {
		return delivery.GuardrailRule{Name: name, Builtin: builtin, Stage: delivery.StagePreCall, Action: action, IncludeSystem: system}
	}
	tests := []struct {
		name       string
		rules      []delivery.GuardrailRule
		body       string
		wantBody   string
		wantRefuse bool
	}{
		{
			name:  "chat: user and assistant turns redacted, system kept without include_system",
			rules: []delivery.GuardrailRule{pre("e", delivery.BuiltinEmail, delivery.ActionRedact, false)},
			body: `{"model":"m","messages":[{"role":"system","content":"ops@example.com"},{"role":"user","content":"I am a@example.com"},` +
				`{"role":"assistant","content":[{"type":"text","text":"b@example.com"}]}],"user":"u@example.com"}`,
			wantBody: `{"model":"m","messages":[{"role":"system","content":"ops@example.com"},{"role":"user","content":"I am [REDACTED:EMAIL]"},` +
				`{"role":"assistant","content":[{"type":"text","text":"[REDACTED:EMAIL]"}]}],"user":"u@example.com"}`,
		},
		{
			name:     "chat: include_system redacts the system and developer turns too",
			rules:    []delivery.GuardrailRule{pre("e", delivery.BuiltinEmail, delivery.ActionRedact, true)},
			body:     `{"messages":[{"content":"ops@example.com","role":"developer"},{"role":"user","content":"x"}]}`,
			wantBody: `{"messages":[{"content":"[REDACTED:EMAIL]","role":"developer"},{"role":"user","content":"x"}]}`,
		},
		{
			name:     "anthropic: top-level system only with include_system",
			rules:    []delivery.GuardrailRule{pre("e", delivery.BuiltinEmail, delivery.ActionRedact, false)},
			body:     `{"system":[{"type":"text","text":"ops@example.com"}],"messages":[{"role":"user","content":[{"type":"text","text":"a@example.com"},{"type":"image","source":{"data":"a@example.com"}}]}]}`,
			wantBody: `{"system":[{"type":"text","text":"ops@example.com"}],"messages":[{"role":"user","content":[{"type":"text","text":"[REDACTED:EMAIL]"},{"type":"image","source":{"data":"a@example.com"}}]}]}`,
		},
		{
			name:     "completions: prompt array",
			rules:    []delivery.GuardrailRule{pre("p", delivery.BuiltinPhone, delivery.ActionRedact, false)},
			body:     `{"prompt":["call 555-123-4567","x"]}`,
			wantBody: `{"prompt":["call [REDACTED:PHONE]","x"]}`,
		},
		{
			name:     "responses: input items and instructions",
			rules:    []delivery.GuardrailRule{pre("e", delivery.BuiltinEmail, delivery.ActionRedact, false)},
			body:     `{"instructions":"ops@example.com","input":[{"role":"user","content":[{"type":"input_text","text":"a@example.com"}]}]}`,
			wantBody: `{"instructions":"ops@example.com","input":[{"role":"user","content":[{"type":"input_text","text":"[REDACTED:EMAIL]"}]}]}`,
		},
		{
			name:  "anthropic: tool results (a string or text blocks), not the tool_use input nor other blocks' content",
			rules: []delivery.GuardrailRule{pre("e", delivery.BuiltinEmail, delivery.ActionRedact, false)},
			body: `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"read","input":{"path":"a@example.com"}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"owner: a@example.com"},` +
				`{"content":[{"type":"text","text":"b@example.com"},{"type":"image","text":"c@example.com"}],"type":"tool_result","tool_use_id":"t2"},` +
				`{"type":"other","content":"d@example.com"}]}]}`,
			wantBody: `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"read","input":{"path":"a@example.com"}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"owner: [REDACTED:EMAIL]"},` +
				`{"content":[{"type":"text","text":"[REDACTED:EMAIL]"},{"type":"image","text":"c@example.com"}],"type":"tool_result","tool_use_id":"t2"},` +
				`{"type":"other","content":"d@example.com"}]}]}`,
		},
		{
			name:  "chat: tool messages, not the tool call's arguments",
			rules: []delivery.GuardrailRule{pre("e", delivery.BuiltinEmail, delivery.ActionRedact, false)},
			body: `{"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"q\":\"a@example.com\"}"}}]},` +
				`{"role":"tool","tool_call_id":"c","content":"b@example.com"}]}`,
			wantBody: `{"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"q\":\"a@example.com\"}"}}]},` +
				`{"role":"tool","tool_call_id":"c","content":"[REDACTED:EMAIL]"}]}`,
		},
		{
			name:  "responses: function call outputs (a string or input_text parts), not the call's arguments",
			rules: []delivery.GuardrailRule{pre("e", delivery.BuiltinEmail, delivery.ActionRedact, false)},
			body: `{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{\"q\":\"a@example.com\"}"},` +
				`{"type":"function_call_output","call_id":"c","output":"b@example.com"},` +
				`{"output":[{"type":"input_text","text":"c@example.com"}],"type":"function_call_output","call_id":"d"},{"type":"x","output":"d@example.com"}]}`,
			wantBody: `{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{\"q\":\"a@example.com\"}"},` +
				`{"type":"function_call_output","call_id":"c","output":"[REDACTED:EMAIL]"},` +
				`{"output":[{"type":"input_text","text":"[REDACTED:EMAIL]"}],"type":"function_call_output","call_id":"d"},{"type":"x","output":"d@example.com"}]}`,
		},
		{
			name:       "block: a tool result refuses",
			rules:      []delivery.GuardrailRule{pre("tok", delivery.BuiltinAPIToken, delivery.ActionBlock, false)},
			body:       `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"AKIAIOSFODNN7EXAMPLE"}]}]}]}`,
			wantRefuse: true,
		},
		{
			name:     "embeddings: input string",
			rules:    []delivery.GuardrailRule{pre("e", delivery.BuiltinEmail, delivery.ActionRedact, false)},
			body:     `{"input":"a@example.com","model":"e"}`,
			wantBody: `{"input":"[REDACTED:EMAIL]","model":"e"}`,
		},
		{
			name:       "block refuses with 400",
			rules:      []delivery.GuardrailRule{pre("tok", delivery.BuiltinAPIToken, delivery.ActionBlock, false)},
			body:       `{"messages":[{"role":"user","content":"my key is AKIAIOSFODNN7EXAMPLE"}]}`,
			wantRefuse: true,
		},
		{
			name:  "block ignores the system turn without include_system",
			rules: []delivery.GuardrailRule{pre("tok", delivery.BuiltinAPIToken, delivery.ActionBlock, false)},
			body:  `{"messages":[{"role":"system","content":"AKIAIOSFODNN7EXAMPLE"},{"role":"user","content":"hi"}]}`,
		},
		{
			name:  "post_call rules do not apply to requests",
			rules: []delivery.GuardrailRule{rule("e", delivery.BuiltinEmail, delivery.ActionBlock)},
			body:  `{"messages":[{"role":"user","content":"a@example.com"}]}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Guardrails.Rules = tc.rules
			p := newPolicy(t, cfg)
			body := []byte(tc.body)
			g, r := p.GuardRequest(req, body)
			if string(body) != tc.body {
				t.Fatal("GuardRequest modified its input")
			}
			if tc.wantRefuse {
				if r == nil || r.Status != http.StatusBadRequest || r.Code != delivery.CodeGuardrailBlocked || r.Reason != "guardrail_blocked: tok" {
					t.Fatalf("refuse = %+v, want 400 guardrail_blocked", r)
				}
				return
			}
			if r != nil {
				t.Fatalf("refused: %+v", r)
			}
			want := tc.wantBody
			if want == "" {
				want = tc.body
			}
			if string(g.Body) != want {
				t.Errorf("body =\n%s\nwant\n%s", g.Body, want)
			}
			if g.Changed != (tc.wantBody != "") {
				t.Errorf("Changed = %v", g.Changed)
			}
		})
	}
}

func TestStreamedRequestsSkipApply(t *testing.T) {
	cfg := baseConfig()
	cfg.Guardrails.StreamingPostCall = delivery.StreamingPassthrough
	cfg.Guardrails.Rules = []delivery.GuardrailRule{rule("b", delivery.BuiltinEmail, delivery.ActionBlock)}
	p := newPolicy(t, cfg)
	r := req
	r.Stream = true
	body := `{"choices":[{"text":"a@example.com"}]}`
	if s := mustSend(t, p.Apply(t.Context(), r, 200, jsonCT, []byte(body))); string(s.Body) != body {
		t.Errorf("body = %s", s.Body)
	}
}
