package canon_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"unicode/utf8"

	"rolter.dev/pkg/respcache/canon"
	"rolter.dev/pkg/respcache/internal/testbody"
)

func chatBody(size int) []byte { return testbody.Chat(size) }

// FuzzAppend checks the canonicalizer against encoding/json:
//   - it accepts exactly what json.Valid accepts (within MaxDepth);
//   - its output is valid JSON that encoding/json decodes to the same value;
//   - it is idempotent;
//   - every serialisation of the decoded value, with keys in any order, any
//     whitespace and any choice of escapes, has the same canonical form.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `""`, `0`, `-1.5e+10`, `true`, `null`,
		`{"b":1,"a":[1,2,{"d":null,"c":"x"}]}`,
		`{"a":1,"a":2}`, `{"\u0061":1,"a":2}`,
		`"\ud83d\ude00 \ud800 \udc00 \u00e9 \/ \u001f"`,
		"\"\xff\"",
		` { "model" : "m" , "messages" : [ { "role" : "user" , "content" : "hi" } ] } `,
		`[1,]`, `{"a":}`, `01`,
	} {
		f.Add([]byte(s))
	}
	f.Add(chatBody(256))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := canon.Append(nil, data)
		valid := json.Valid(data)
		if errors.Is(err, canon.ErrTooDeep) {
			return // deeper than encoding/json accepts too, or right at it
		}
		if valid != (err == nil) {
			t.Fatalf("json.Valid = %v but Append error = %v for %q", valid, err, data)
		}
		if err != nil {
			return
		}
		if !json.Valid(got) {
			t.Fatalf("canonical form is not valid JSON: %q -> %q", data, got)
		}
		orig, canonical := decode(t, data), decode(t, got)
		if !reflect.DeepEqual(orig, canonical) {
			t.Fatalf("canonical form decodes differently:\n in %q\nout %q", data, got)
		}
		again, err := canon.Append(nil, got)
		if err != nil || !bytes.Equal(again, got) {
			t.Fatalf("not idempotent: %q -> %q (%v)", got, again, err)
		}

		// Re-serialise the decoded value in two random ways.
		h := fnv.New64a()
		h.Write(data)
		seed := h.Sum64()
		p1 := shuffled(orig, rand.New(rand.NewPCG(seed, 1)))
		p2 := shuffled(orig, rand.New(rand.NewPCG(seed, 2)))
		c1, err1 := canon.Append(nil, p1)
		c2, err2 := canon.Append(nil, p2)
		if err1 != nil || err2 != nil {
			t.Fatalf("re-serialised value rejected: %v, %v (%q, %q)", err1, err2, p1, p2)
		}
		if !bytes.Equal(c1, c2) {
			t.Fatalf("key order or spelling changed the canonical form:\n%q -> %q\n%q -> %q", p1, c1, p2, c2)
		}
		// Without lone surrogates or invalid UTF-8 (which encoding/json
		// replaces by U+FFFD and the canonical form keeps), the decoded value
		// holds everything, so its canonical form is the original's.
		if utf8.Valid(got) && !bytes.Contains(got, []byte(`\ud`)) && !bytes.Equal(c1, got) {
			t.Fatalf("canonical form differs from the re-serialised value's:\n%q -> %q\n%q -> %q", data, got, p1, c1)
		}
	})
}

func decode(t *testing.T, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", data, err)
	}
	return v
}

// shuffled serialises v with its object keys in a random order, random
// whitespace, and each string character escaped at random.
func shuffled(v any, r *rand.Rand) []byte {
	var b []byte
	var w func(v any)
	space := func() {
		for range r.IntN(3) {
			b = append(b, " \t\r\n"[r.IntN(4)])
		}
	}
	str := func(s string) {
		b = append(b, '"')
		for _, c := range s {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', byte(c))
			case c < 0x20 || r.IntN(4) == 0:
				if c >= 0x10000 {
					hi, lo := 0xD800+(c-0x10000)>>10, 0xDC00+(c-0x10000)&0x3FF
					b = append(b, `\u`+strconv.FormatInt(int64(hi), 16)+`\u`+strconv.FormatInt(int64(lo), 16)...)
				} else {
					b = append(b, `\u`...)
					hex := strconv.FormatInt(int64(c), 16)
					for range 4 - len(hex) {
						b = append(b, '0')
					}
					b = append(b, hex...)
				}
			default:
				b = utf8.AppendRune(b, c)
			}
		}
		b = append(b, '"')
	}
	w = func(v any) {
		space()
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			b = append(b, '{')
			for i, k := range keys {
				if i > 0 {
					b = append(b, ',')
				}
				space()
				str(k)
				space()
				b = append(b, ':')
				w(v[k])
			}
			space()
			b = append(b, '}')
		case []any:
			b = append(b, '[')
			for i, e := range v {
				if i > 0 {
					b = append(b, ',')
				}
				w(e)
			}
			space()
			b = append(b, ']')
		case string:
			str(v)
		case json.Number:
			b = append(b, v...)
		case bool:
			b = strconv.AppendBool(b, v)
		case nil:
			b = append(b, "null"...)
		}
		space()
	}
	w(v)
	return b
}
