package responseid

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

func TestIDsNameTheirProvider(t *testing.T) {
	a, b := Tag("vllm-0"), Tag("vllm-1")
	if a == b || a != Tag("vllm-0") || len(a) != tagLen {
		t.Fatalf("tags %q %q", a, b)
	}
	id, other := New(a), New(a)
	if id == other {
		t.Fatalf("two ids alike: %q", id)
	}
	if tag, ok := TagOf(id); !ok || tag != a {
		t.Fatalf("TagOf(%q) = %q, %v", id, tag, ok)
	}
	for _, id := range []string{
		"", "resp_0123456789abcdef0123456789abcdef", // vLLM's own
		"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b", // OpenAI's
		strings.ToUpper(id), id[:len(id)-1], id + "0", strings.Replace(id, "resp_rt", "resp_xx", 1),
		id[:len(id)-1] + "g",
	} {
		if tag, ok := TagOf(id); ok {
			t.Errorf("TagOf(%q) = %q: not an id the gateway issued", id, tag)
		}
	}
}

func TestRead(t *testing.T) {
	for _, c := range []struct {
		body string
		want Fields
	}{
		{`{"model":"m","input":"x"}`, Fields{}},
		{`{"previous_response_id":"resp_1","input":"x"}`, Fields{Previous: "resp_1"}},
		{`{"previous_response_id":null}`, Fields{}},
		{`{"previous_response_id":7}`, Fields{}},
		{`{"previous_response_id":"a","previous_response_id":"b"}`, Fields{Previous: "b"}},
		{`{"input":[{"previous_response_id":"nested"}]}`, Fields{}},
		{`{"input":"\"previous_response_id\":\"text\""}`, Fields{}},
		{`{"request_id":"mine"}`, Fields{OwnID: true}},
		{`{"request_id":null,"previous_response_id":"p"}`, Fields{Previous: "p", OwnID: true}},
		{`{"metadata":{"request_id":"x"}}`, Fields{}},
		{`{"Previous_Response_ID":"case"}`, Fields{}},
		{`{"background":true,"store":true}`, Fields{Background: true}},
		{`{"background":false}`, Fields{}},
		{`{"background":"true"}`, Fields{}},
		{`{"metadata":{"background":true}}`, Fields{}},
	} {
		if got := Read([]byte(c.body)); got != c.want {
			t.Errorf("Read(%s) = %+v, want %+v", c.body, got, c.want)
		}
	}
}

func TestWithID(t *testing.T) {
	id := New(Tag("p"))
	for _, body := range []string{`{"model":"m","input":"x"}`, `{}`, "{ }", " {\n\"a\":1}", `{"model":"m","previous_response_id":"resp_1"}`} {
		out := WithID([]byte(body), id)
		var before, after map[string]any
		if err := json.Unmarshal([]byte(body), &before); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("WithID(%s) = %s: %v", body, out, err)
		}
		if after["request_id"] != id || len(after) != len(before)+1 {
			t.Fatalf("WithID(%s) = %s", body, out)
		}
		if r := Read(out); !r.OwnID {
			t.Fatalf("Read(WithID(%s)) finds no request_id", body)
		}
	}
}

// FuzzRead holds Read to a plain decode of the top-level object for any
// valid JSON object, and WithID to adding the one member.
func FuzzRead(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","previous_response_id":"resp_x","input":"y"}`,
		`{"request_id":"r","previous_response_id":null}`,
		`{"previous_response_id":"a","previous_response_id":1}`,
		`{"input":[{"type":"message","content":"\"request_id\""}]}`,
		`{"previous_response_id":"\u00e9\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	id := New(Tag("fuzz"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) != nil || top == nil {
			return
		}
		got := Read(body)
		var want Fields
		if raw, ok := top["previous_response_id"]; ok {
			_ = json.Unmarshal(raw, &want.Previous)
		}
		_, want.OwnID = top["request_id"]
		want.Background = string(top["background"]) == "true"
		if escapedKeys(body) {
			// A key written with escapes is not looked for (documented).
			if got.Previous != "" && got.Previous != want.Previous || got.OwnID && !want.OwnID || got.Background && !want.Background {
				t.Fatalf("Read(%q) = %+v, beyond %+v", body, got, want)
			}
		} else if got != want {
			t.Fatalf("Read(%q) = %+v, want %+v", body, got, want)
		}
		if want.OwnID {
			return
		}
		out := WithID(body, id)
		var after map[string]json.RawMessage
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("WithID(%q) = %q: %v", body, out, err)
		}
		var s string
		if json.Unmarshal(after["request_id"], &s) != nil || s != id || len(after) != len(top)+1 {
			t.Fatalf("WithID(%q) = %q", body, out)
		}
	})
}

// escapedKeys reports whether a body spells some key with an escape, so
// that a byte search can miss it.
func escapedKeys(body []byte) bool { return strings.Contains(string(body), `\`) }

// BenchmarkNameResponse is what a Responses request pays the proxy for
// naming its response: Read's byte searches of the body (none of the keys
// in it, the common case), then one copy of it with the id, per attempt.
func BenchmarkNameResponse(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
		body := []byte(`{"model":"m","input":"` + strings.Repeat("a long conversation ", size/20) + `"}`)
		tag := Tag("vllm-0")
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if f := Read(body); !f.OwnID {
					_ = WithID(body, New(tag))
				}
			}
		})
	}
}
