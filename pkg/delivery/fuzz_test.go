package delivery_test

import (
	"encoding/json"
	"strings"
	"testing"

	"rolter.dev/pkg/delivery"
)

func FuzzDecodeReply(f *testing.F) {
	for _, s := range []string{
		`{"action":"allow"}`,
		`{"action":"block","reason":"no"}`,
		`{"action":"transform","body":{"a":[1,2,{"b":null}]}}`,
		`{"action":"annotate","headers":{"x-a":"b","X-C":"d"}}`,
		`{"action":"annotate","headers":{"x-rolter-cache":"HIT"}}`,
		`{"action":"transform","body":null}`,
		`{"action":"allow"} trailing`,
		`null`, `[]`, `"allow"`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := delivery.DecodeReply(data)
		if err != nil {
			return
		}
		switch r.Action {
		case delivery.PluginAllow:
		case delivery.PluginBlock:
			if len(r.Reason) > 512 || strings.ContainsAny(r.Reason, "\r\n\x00") {
				t.Errorf("reason not cleaned: %q", r.Reason)
			}
		case delivery.PluginTransform:
			if !json.Valid(r.Body) || string(r.Body) == "null" {
				t.Errorf("transform body %q", r.Body)
			}
		case delivery.PluginAnnotate:
			for k, v := range r.Headers {
				lk := strings.ToLower(k)
				if !strings.HasPrefix(lk, "x-") || strings.HasPrefix(lk, "x-rolter-") || strings.ContainsAny(v, "\r\n\x00") || strings.ContainsAny(k, " :\r\n") {
					t.Errorf("header %q: %q accepted", k, v)
				}
			}
		default:
			t.Errorf("action %q accepted", r.Action)
		}
	})
}

// FuzzRedactKeepsJSONValid checks that redaction of any valid JSON body
// yields valid JSON and never touches a body it does not rewrite.
func FuzzRedactKeepsJSONValid(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"message":{"content":"a@example.com"}}]}`,
		`{"choices":[{"text":"x a@b.io \u00e9 \ud83d\ude00"}], "choices":[{"text":"a@b.io"}]}`,
		`{"content":[{"text":"a@b.io","type":"text"},{"type":"text","text":"\"a@b.io\""}]}`,
		`{"output":[{"content":[{"type":"output_text","text":"a@b.io"}]}]}`,
		`{"choices":[{"message":{"content":[{"type":"text","text":"a@b.io"}]}}]}`,
		`[1, {"choices":"a@b.io"}]`,
		` {"choices" : [ { "text" : "a@b.io" } ] } `,
		`{"choices":[{"message":{"reasoning_content":"a@b.io","reasoning":"e@b.io"}}]}`,
		`{"content":[{"type":"thinking","thinking":"a@b.io","signature":"s"}]}`,
		`{"output":[{"type":"reasoning","summary":[{"type":"summary_text","text":"a@b.io"}],"content":[{"type":"reasoning_text","text":"o"}]}]}`,
	} {
		f.Add([]byte(s))
	}
	cfg := baseConfig()
	cfg.Guardrails.MaxScanBytes = 64
	cfg.Guardrails.Rules = []delivery.GuardrailRule{
		{Name: "e", Builtin: delivery.BuiltinEmail, Stage: delivery.StagePostCall, Action: delivery.ActionRedact, Replacement: `"<\>"`},
		{Name: "a", Pattern: `[aeiou]`, Stage: delivery.StagePostCall, Action: delivery.ActionRedact, Replacement: "\u2028"},
	}
	p, err := delivery.New(cfg, nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		in := string(body)
		d := p.Apply(t.Context(), req, 200, jsonCT, body)
		s, ok := d.(delivery.Send)
		if !ok {
			t.Fatalf("refused: %+v", d)
		}
		if string(body) != in {
			t.Fatal("Apply modified its input")
		}
		if !json.Valid(body) {
			if string(s.Body) != in {
				t.Errorf("invalid JSON was rewritten")
			}
			return
		}
		if !json.Valid(s.Body) {
			t.Errorf("redaction produced invalid JSON:\n%s\nfrom\n%s", s.Body, body)
		}
	})
}
