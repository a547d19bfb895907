package delivery

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseTextAgreesWithEncodingJSON(t *testing.T) {
	for _, in := range []string{
		`{}`, `[]`, `""`, `0`, `-0.5e+10`, `true`, ` null `, `{"a":[1,{"b":"c"}]}`,
		`{"a":"\u00e9\ud83d\ude00\"\\\/\b\f\n\r\t"}`, "{\"a\":\"\xff\"}",
		``, ` `, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[1 2]`, `01`, `1.`, `.5`, `1e`, `+1`, `-`,
		`tru`, `nul`, `"abc`, `"\x"`, `"\u12"`, "\"a\x01\"", `{} {}`, `{}x`, `[` + strings.Repeat("[", 10001) + strings.Repeat("]", 10002),
	} {
		_, err := parseText([]byte(in))
		if (err == nil) != json.Valid([]byte(in)) {
			t.Errorf("parseText(%q) err = %v, json.Valid = %v", in, err, json.Valid([]byte(in)))
		}
	}
}

func TestParseTextLeaves(t *testing.T) {
	body := `{"choices":[{"message":{"content":"a\"b","role":"assistant"}},{"text":"t"}],"deep":{"a":{"b":{"c":{"d":{"e":{"f":{"g":"too deep"}}}}}}}}`
	d, err := parseText([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, l := range d.leaves {
		var parts []string
		for _, p := range l.path {
			if p.idx >= 0 {
				parts = append(parts, "#")
			} else {
				parts = append(parts, p.key)
			}
		}
		got[strings.Join(parts, ".")] = l.value
		if raw := body[l.start:l.end]; !strings.HasPrefix(raw, `"`) || !strings.HasSuffix(raw, `"`) {
			t.Errorf("range %d:%d = %q", l.start, l.end, raw)
		}
	}
	want := map[string]string{"choices.#.message.content": `a"b`, "choices.#.text": "t"}
	if len(got) != len(want) {
		t.Errorf("leaves = %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if idx := d.responseTexts(); len(idx) != 2 || d.leaves[idx[1]].path[1].idx != 1 {
		t.Errorf("responseTexts = %v", idx)
	}
	if role := d.owner(&d.leaves[0], 3).role; role != "assistant" {
		t.Errorf("the message's role = %q, want assistant", role)
	}
}

// TestParseTextBounded: what parseText records is bounded by the texts of
// a body, not by its size. A body of a million strings off the texts'
// paths records nothing; one of more texts than maxTextLeaves, or more
// containers on their paths than maxTextContainers, records up to the
// bound, says it truncated, and is still validated whole.
func TestParseTextBounded(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		leaves     int
		truncated  bool
	}{
		{"strings off the paths", `{"messages":[{"role":"user","content":"hi","name":[` + strings.Repeat(`"",`, 1<<20) + `""]}],"metadata":{"a":[[` + strings.Repeat(`"x",`, 1<<10) + `"y"]]}}`, 1, false},
		{"more texts than the bound", `{"prompt":[` + strings.Repeat(`"",`, maxTextLeaves) + `"last"]}`, maxTextLeaves, true},
		{"more containers than the bound", `{"messages":[` + strings.Repeat(`{},`, maxTextContainers) + `{"content":"last"}]}`, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := parseText([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if len(d.leaves) != tc.leaves || d.truncated != tc.truncated || len(d.conts) > maxTextContainers {
				t.Errorf("%d leaves, %d containers, truncated %v; want %d leaves, truncated %v", len(d.leaves), len(d.conts), d.truncated, tc.leaves, tc.truncated)
			}
			if _, err := parseText([]byte(tc.body[:len(tc.body)-1])); err == nil {
				t.Error("a truncated document parsed")
			}
		})
	}
}

func FuzzParseText(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"message":{"content":"x"}}]}`, `[1,"a",{"b":null}]`, `{"a":"\u00e9"}`, `-1.5E-3`, `{"a":1,}`,
		`{"content":[{"type":"tool_use","input":{"a":["b",{"c":1}]}},{"input":[]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		d, err := parseText(body)
		if (err == nil) != json.Valid(body) {
			t.Fatalf("parseText err = %v, json.Valid = %v", err, json.Valid(body))
		}
		if err != nil {
			return
		}
		for _, l := range d.leaves {
			if l.raw {
				if raw := body[l.start:l.end]; string(raw) != l.value || !json.Valid(raw) {
					t.Errorf("raw leaf %q at %d:%d is %q", l.value, l.start, l.end, raw)
				}
				continue
			}
			var v string
			if err := json.Unmarshal(body[l.start:l.end], &v); err != nil || v != l.value {
				t.Errorf("leaf %q at %d:%d decodes to %q (%v)", l.value, l.start, l.end, v, err)
			}
		}
	})
}

// FuzzUnescapeJSON: a tool call's text with its escapes decoded reads as
// encoding/json decodes the same string (of valid UTF-8: a tool call's text
// is, once decoded from its document), and text without a backslash is left
// as it is.
func FuzzUnescapeJSON(f *testing.F) {
	for _, s := range []string{`bob\u0040example\u002ecom`, `a\"b\\c\/d\n`, `\ud83d\ude00 \ud83d x`, `\u12`, `\q`, `tail\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := unescapeJSON(s)
		if !strings.Contains(s, `\`) && got != s {
			t.Fatalf("unescapeJSON(%q) = %q, want it unchanged", s, got)
		}
		var want string
		if !utf8.ValidString(s) || json.Unmarshal([]byte(`"`+s+`"`), &want) != nil {
			return // not the inside of a JSON string: no reference
		}
		if got != want {
			t.Fatalf("unescapeJSON(%q) = %q, encoding/json %q", s, got, want)
		}
	})
}
