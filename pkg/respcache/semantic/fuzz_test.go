package semantic_test

import (
	"bytes"
	"testing"

	"rolter.dev/pkg/respcache/canon"
	"rolter.dev/pkg/respcache/internal/testbody"
	"rolter.dev/pkg/respcache/semantic"
)

var fuzzPaths = []string{chat, messages, complete, "/v1/embeddings"}

// FuzzClassify checks that Classify never panics, is deterministic, bypasses
// anything that is not a JSON object, returns text only with a partition,
// and is blind to what must not split a partition: key order, whitespace and
// escapes (the canonical form of the body classifies the same), and the
// attribution fields user and metadata and a false stream, whatever their
// values.
func FuzzClassify(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"}],"stream":true}`,
		`{"model":"m","max_tokens":9,"system":[{"type":"text","text":"S"}],"messages":[{"role":"user","content":[{"type":"text","text":"a b"}]}]}`,
		`{"model":"m","prompt":"Once upon a time","user":"u"}`,
		`{"messages":[{"role":"user","name":"ann","content":"x"},{"role":"assistant","content":"y","tool_calls":[]}]}`,
		`{"prompt":[1,2,3]}`, `[]`, `{`,
	}
	for i, s := range seeds {
		f.Add(uint8(i), []byte(s))
	}
	f.Add(uint8(0), testbody.Chat(512))
	f.Fuzz(func(t *testing.T, p uint8, body []byte) {
		path := fuzzPaths[int(p)%len(fuzzPaths)]
		text, part, ok := semantic.Classify(path, body)
		text2, part2, ok2 := semantic.Classify(path, body)
		if text != text2 || part != part2 || ok != ok2 {
			t.Fatal("Classify is not deterministic")
		}
		if !ok {
			if text != "" || part != [32]byte{} {
				t.Fatal("a bypass returned text or a partition")
			}
		} else if text == "" {
			t.Fatal("a candidate with no text")
		}
		c, err := canon.Append(nil, body)
		if err != nil {
			if ok {
				t.Fatalf("invalid JSON classified: %q", body)
			}
			return
		}
		if ok && (len(c) == 0 || c[0] != '{') {
			t.Fatalf("a non-object classified: %q", body)
		}
		textC, partC, okC := semantic.Classify(path, c)
		if textC != text || partC != part || okC != ok {
			t.Fatalf("the canonical form classifies differently:\n%q -> %q %x %v\n%q -> %q %x %v", body, text, part, ok, c, textC, partC, okC)
		}
		if !ok {
			return
		}
		// Attribution fields and stream:false written first: a later member of
		// the same name overrides them, and either way they must not count.
		for _, extra := range []string{`"user":{"id":[1]},`, `"metadata":"x",`, `"stream":false,`} {
			i := bytes.IndexByte(body, '{')
			b := append(append(append([]byte{}, body[:i+1]...), extra...), body[i+1:]...)
			textE, partE, okE := semantic.Classify(path, b)
			if textE != text || partE != part || !okE {
				t.Fatalf("adding %s changed the classification of %q", extra, body)
			}
		}
	})
}
