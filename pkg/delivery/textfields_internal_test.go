package delivery

import (
	"encoding/json"
	"strings"
	"testing"
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
	want := map[string]string{"choices.#.message.content": `a"b`, "choices.#.message.role": "assistant", "choices.#.text": "t"}
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
}

func FuzzParseText(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"message":{"content":"x"}}]}`, `[1,"a",{"b":null}]`, `{"a":"\u00e9"}`, `-1.5E-3`, `{"a":1,}`,
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
			var v string
			if err := json.Unmarshal(body[l.start:l.end], &v); err != nil || v != l.value {
				t.Errorf("leaf %q at %d:%d decodes to %q (%v)", l.value, l.start, l.end, v, err)
			}
		}
	})
}
