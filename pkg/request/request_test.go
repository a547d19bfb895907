package request_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"rolter.dev/pkg/request"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantErr   error
		model     string
		hasModel  bool
		stream    bool
		rewritten string // body after WithModel("up")
	}{
		{name: "plain", body: `{"model":"m","messages":[]}`, model: "m", hasModel: true, rewritten: `{"model":"up","messages":[]}`},
		{name: "whitespace and later model", body: " {\n \"stream\" : true , \"model\" : \"m\" }", model: "m", hasModel: true, stream: true, rewritten: " {\n \"stream\" : true , \"model\" : \"up\" }"},
		{name: "nested model is not the model", body: `{"x":{"model":"inner"},"model":"outer"}`, model: "outer", hasModel: true, rewritten: `{"x":{"model":"inner"},"model":"up"}`},
		{name: "escaped key", body: `{"\u006dodel":"m"}`, model: "m", hasModel: true, rewritten: `{"\u006dodel":"up"}`},
		{name: "strings with braces", body: `{"a":"}{\"","model":"m\"q"}`, model: `m"q`, hasModel: true, rewritten: `{"a":"}{\"","model":"up"}`},
		{name: "no model", body: `{"messages":[1]}`, rewritten: `{"model":"up","messages":[1]}`},
		{name: "empty object", body: `{}`, rewritten: `{"model":"up"}`},
		{name: "non-string model", body: `{"model":5}`, rewritten: `{"model":"up"}`},
		{name: "stream false", body: `{"stream":false,"model":"m"}`, model: "m", hasModel: true, rewritten: `{"stream":false,"model":"up"}`},
		{name: "error: not json", body: `{"model":`, wantErr: request.ErrInvalidJSON},
		{name: "error: trailing garbage", body: `{"model":"m"} x`, wantErr: request.ErrInvalidJSON},
		{name: "error: array", body: `[1,2]`, wantErr: request.ErrNotObject},
		{name: "error: empty", body: ``, wantErr: request.ErrInvalidJSON},
		{name: "stream null", body: `{"model":"m","stream":null}`, model: "m", hasModel: true, rewritten: `{"model":"up","stream":null}`},
		{name: "other keys may repeat", body: `{"model":"m","n":1,"n":2}`, model: "m", hasModel: true, rewritten: `{"model":"up","n":1,"n":2}`},
		{name: "nested case variants are not read", body: `{"x":{"MODEL":"a","model":"b"},"model":"m"}`, model: "m", hasModel: true, rewritten: `{"x":{"MODEL":"a","model":"b"},"model":"up"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := request.Parse([]byte(tc.body))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.Model != tc.model || b.HasModel != tc.hasModel || b.Stream != tc.stream {
				t.Fatalf("got model=%q has=%v stream=%v", b.Model, b.HasModel, b.Stream)
			}
			if got := string(b.WithModel("up")); got != tc.rewritten {
				t.Fatalf("WithModel = %s, want %s", got, tc.rewritten)
			}
		})
	}
}

// TestParseRefusesWhatUpstreamsReadOtherwise: the fields the gateway routes
// on must mean the same to every upstream. A second model or stream member
// (an exact repeat, which some decoders take the first of, or a key that
// differs only in case, which Go's encoding/json matches to the same field)
// and a stream that is not a boolean (which lax decoders such as vLLM's
// pydantic models read as true) are refused with a FieldError naming the
// field.
func TestParseRefusesWhatUpstreamsReadOtherwise(t *testing.T) {
	tests := []struct{ name, body, field string }{
		{"model twice", `{"model":"m","model":"n"}`, "model"},
		{"model in upper case too", `{"model":"m","MODEL":"evil"}`, "model"},
		{"model in another case first", `{"Model":"evil","model":"m"}`, "model"},
		{"model escaped and cased", `{"model":"m","\u004dodel":"evil"}`, "model"},
		{"only a case variant", `{"Model":"m"}`, "model"},
		{"non-string model twice", `{"model":1,"MODEL":"m"}`, "model"},
		{"stream twice", `{"model":"m","stream":false,"stream":true}`, "stream"},
		{"stream in upper case", `{"model":"m","stream":false,"STREAM":true}`, "stream"},
		{"stream with a long s", "{\"model\":\"m\",\"\u017ftream\":true}", "stream"},
		{"stream as a string", `{"model":"m","stream":"true"}`, "stream"},
		{"stream as a number", `{"model":"m","stream":1}`, "stream"},
		{"stream as an object", `{"model":"m","stream":{}}`, "stream"},
		{"stream as an array", `{"model":"m","stream":[true]}`, "stream"},
		{"stream_options twice", `{"model":"m","stream_options":{"include_usage":true},"stream_options":{}}`, "stream_options"},
		{"stream_options in another case", `{"model":"m","Stream_Options":{"include_usage":true}}`, "stream_options"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := request.Parse([]byte(tc.body))
			var fe *request.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("err = %v, want a FieldError on %q", err, tc.field)
			}
		})
	}
}

// TestStreamUsage: what the client asked of a stream's usage, read as vLLM
// reads stream_options, and the body that asks the upstream for it: the
// option set, continuous usage removed, its other members and the rest of
// the body kept, the model still rewritable.
func TestStreamUsage(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		asked  bool
		canAsk bool
		want   string // stream_options after WithStreamUsage, "" when it may not ask
	}{
		{name: "no option", body: `{"model":"m","stream":true}`, canAsk: true, want: `{"include_usage":true}`},
		{name: "not a stream", body: `{"model":"m"}`},
		{name: "asked", body: `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, asked: true},
		{name: "present, include_usage absent: not asked", body: `{"stream":true,"stream_options":{},"model":"m"}`, canAsk: true, want: `{"include_usage":true}`},
		{name: "declined", body: `{"stream":true,"stream_options":{"include_usage":false},"model":"m"}`, canAsk: true, want: `{"include_usage":true}`},
		{name: "null option", body: `{"stream":true,"stream_options":null,"model":"m"}`, canAsk: true, want: `{"include_usage":true}`},
		{name: "null include_usage", body: `{"stream":true,"stream_options":{"include_usage":null},"model":"m"}`, canAsk: true, want: `{"include_usage":true}`},
		{name: "continuous usage without usage is removed",
			body:   `{"model":"m","stream_options":{"continuous_usage_stats":true,"include_usage":false,"x":[1]},"stream":true}`,
			canAsk: true, want: `{"x":[1],"include_usage":true}`},
		{name: "escaped keys are the keys they spell",
			body:  `{"model":"m","stream":true,"stream_options":{"\u0069nclude_usage":true}}`,
			asked: true},
		{name: "an escaped continuous usage is removed too",
			body:   `{"model":"m","stream":true,"stream_options":{ "continuous_usage_st\u0061ts" : true , "y" : "\"}" }}`,
			canAsk: true, want: `{"y" : "\"}","include_usage":true}`},
		{name: "the last duplicate counts", body: `{"model":"m","stream":true,"stream_options":{"include_usage":true,"include_usage":false}}`, canAsk: true, want: `{"include_usage":true}`},
		{name: "a string is left to the upstream", body: `{"model":"m","stream":true,"stream_options":{"include_usage":"yes"}}`},
		{name: "a non-object is left to the upstream", body: `{"model":"m","stream":true,"stream_options":[true]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := request.Parse([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if b.IncludeUsage != tc.asked || b.CanAskUsage() != tc.canAsk {
				t.Fatalf("asked %v, can ask %v; want %v, %v", b.IncludeUsage, b.CanAskUsage(), tc.asked, tc.canAsk)
			}
			if !tc.canAsk {
				return
			}
			orig := string(b.Raw)
			nb := b.WithStreamUsage()
			if string(b.Raw) != orig {
				t.Fatal("WithStreamUsage changed the original body")
			}
			var got, before map[string]json.RawMessage
			if err := json.Unmarshal(nb.Raw, &got); err != nil {
				t.Fatalf("invalid JSON %s: %v", nb.Raw, err)
			}
			_ = json.Unmarshal(b.Raw, &before)
			if string(got["stream_options"]) != tc.want {
				t.Fatalf("stream_options = %s, want %s", got["stream_options"], tc.want)
			}
			for k, v := range before {
				if k != "stream_options" && string(got[k]) != string(v) {
					t.Fatalf("%s = %s, was %s", k, got[k], v)
				}
			}
			if !nb.IncludeUsage || nb.CanAskUsage() {
				t.Fatal("the new body does not read as asking")
			}
			var up map[string]json.RawMessage
			if err := json.Unmarshal(nb.WithModel("up"), &up); err != nil || string(up["model"]) != `"up"` || string(up["stream_options"]) != tc.want {
				t.Fatalf("WithModel after WithStreamUsage: %s (%v)", nb.WithModel("up"), err)
			}
		})
	}
}

// TestStreamOptionsOfManyMembers: reading stream_options allocates nothing
// per member, so a body of a million of them costs no more than the body.
func TestStreamOptionsOfManyMembers(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"model":"m","stream":true,"stream_options":{`)
	for i := range 100000 {
		fmt.Fprintf(&b, `"k%d":0,`, i)
	}
	b.WriteString(`"include_usage":false}}`)
	raw := []byte(b.String())
	allocs := testing.AllocsPerRun(3, func() {
		p, err := request.Parse(raw)
		if err != nil || !p.CanAskUsage() {
			t.Fatalf("%v, can ask %v", err, p.CanAskUsage())
		}
	})
	if allocs > 10 {
		t.Fatalf("Parse made %v allocations for 100,000 members", allocs)
	}
}

func TestWithModelSameModelDoesNotCopy(t *testing.T) {
	raw := []byte(`{"model":"m"}`)
	b, err := request.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if out := b.WithModel("m"); &out[0] != &raw[0] {
		t.Fatal("unchanged model copied the body")
	}
}

func TestRead(t *testing.T) {
	if _, err := request.Read(strings.NewReader("12345"), 4); !errors.Is(err, request.ErrTooLarge) {
		t.Fatalf("over limit: %v", err)
	}
	b, err := request.Read(strings.NewReader("1234"), 4)
	if err != nil || string(b) != "1234" {
		t.Fatalf("at limit: %q %v", b, err)
	}
}

// FuzzParse checks the scanner against encoding/json: whatever Parse
// accepts, encoding/json reads the same model and stream, into a map (exact
// keys) as into a struct (keys matched ignoring case), and the rewritten
// body stays valid JSON with the new model.
func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"model":"m","stream":true}`, `{"a":[{"b":"}"}],"model":"x"}`, `{}`, `[]`, `{"model":"\u00e9"}`, `{"model":null}`,
		`{"model":"m","MODEL":"x"}`, `{"model":"a","model":"b"}`, `{"model":"m","stream":"true"}`, `{"model":"m","stream":1}`,
		"{\"\u017ftream\":true,\"model\":\"m\"}", `{"Stream":null,"model":"m"}`, `{"model":"m","stream":null}`,
		`{"stream_options":{"include_usage":false},"model":"m","stream":true}`, `{ "stream":true }`, `{"stream":true,"stream_options":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := request.Parse(raw)
		if err != nil {
			return
		}
		var ref map[string]json.RawMessage
		if err := json.Unmarshal(raw, &ref); err != nil {
			t.Fatalf("Parse accepted what encoding/json rejects: %v", err)
		}
		var m string
		wantHas := json.Unmarshal(ref["model"], &m) == nil && len(ref["model"]) > 0 && ref["model"][0] == '"'
		if wantHas != b.HasModel || (wantHas && m != b.Model) {
			t.Fatalf("model: got %q/%v, encoding/json %q/%v", b.Model, b.HasModel, m, wantHas)
		}
		if b.Stream != bytes.Equal(ref["stream"], []byte("true")) {
			t.Fatalf("stream: got %v, encoding/json %s", b.Stream, ref["stream"])
		}
		// A struct matches keys ignoring case: Parse accepted no key an
		// upstream decoding that way could read as another model or stream.
		var st struct {
			Model  json.RawMessage `json:"model"`
			Stream json.RawMessage `json:"stream"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(st.Model, ref["model"]) || !bytes.Equal(st.Stream, ref["stream"]) {
			t.Fatalf("a case-insensitive decoder reads model %s stream %s, Parse model %s stream %s", st.Model, st.Stream, ref["model"], ref["stream"])
		}
		// stream_options as encoding/json reads it (the last duplicate,
		// escapes decoded).
		if so := bytes.TrimSpace(ref["stream_options"]); len(so) > 0 && so[0] == '{' {
			var o map[string]json.RawMessage
			if err := json.Unmarshal(so, &o); err != nil {
				t.Fatal(err)
			}
			if want := bytes.Equal(bytes.TrimSpace(o["include_usage"]), []byte("true")); b.IncludeUsage != want {
				t.Fatalf("include_usage: got %v, encoding/json reads %s", b.IncludeUsage, o["include_usage"])
			}
		}
		if b.CanAskUsage() {
			// The rewritten body reads back as Parse reads a body that
			// asks: the same model and stream, the option asking.
			nb := b.WithStreamUsage()
			rb, err := request.Parse(nb.Raw)
			if err != nil {
				t.Fatalf("WithStreamUsage broke the body: %v\n%s", err, nb.Raw)
			}
			if rb.Model != b.Model || rb.HasModel != b.HasModel || !rb.Stream || !rb.IncludeUsage {
				t.Fatalf("WithStreamUsage: %s reads as model %q stream %v usage %v", nb.Raw, rb.Model, rb.Stream, rb.IncludeUsage)
			}
			if got, want := nb.WithModel("r"), rb.WithModel("r"); !bytes.Equal(got, want) {
				t.Fatalf("offsets after WithStreamUsage: %s, want %s", got, want)
			}
		}
		out := b.WithModel("rewritten")
		var after map[string]json.RawMessage
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("rewrite broke JSON: %v\n%s", err, out)
		}
		if !bytes.Contains(out, []byte(`"rewritten"`)) {
			t.Fatalf("rewrite lost the model: %s", out)
		}
	})
}
