package canon_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"rolter.dev/pkg/respcache/canon"
)

func TestAppend(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"whitespace removed", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\" : { } } ", `{"a":[1,2],"b":{}}`},
		{"keys sorted", `{"b":1,"a":2,"c":3}`, `{"a":2,"b":1,"c":3}`},
		{"keys sorted recursively", `{"z":{"y":1,"x":[{"q":1,"p":2}]},"a":0}`, `{"a":0,"z":{"x":[{"p":2,"q":1}],"y":1}}`},
		{"keys sorted by bytes", `{"é":1,"z":2,"Z":3,"":4}`, `{"":4,"Z":3,"z":2,"é":1}`},
		{"duplicate keys: last wins", `{"a":1,"b":2,"a":3}`, `{"a":3,"b":2}`},
		{"duplicate keys written differently", `{"\u0061":1,"a":2}`, `{"a":2}`},
		{"duplicate keys, later written escaped", `{"a":1,"\u0061":2}`, `{"a":2}`},
		{"duplicate keys nested", `{"o":{"k":1,"k":[1,{"x":1,"x":2}]}}`, `{"o":{"k":[1,{"x":2}]}}`},
		{"numbers as written", `[1.0,1,1e0,-0,0.10,1E+2,12345678901234567890123]`, `[1.0,1,1e0,-0,0.10,1E+2,12345678901234567890123]`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"top-level scalar", ` "x" `, `"x"`},
		{"escaped letter decoded", `"\u00e9"`, `"é"`},
		{"raw letter kept", `"é"`, `"é"`},
		{"escaped ascii decoded", `"\u0041\u0062"`, `"Ab"`},
		{"solidus unescaped", `"a\/b"`, `"a/b"`},
		{"short escapes kept", `"\"\\\b\f\n\r\t"`, `"\"\\\b\f\n\r\t"`},
		{"unicode escapes of short escapes", `"\u0022\u005c\u0008\u000C\u000a\u000D\u0009"`, `"\"\\\b\f\n\r\t"`},
		{"other control characters lowercase", `"\u0000\u001F\u000B"`, `"\u0000\u001f\u000b"`},
		{"DEL and line separators raw", `"\u007f\u2028\u2029"`, "\"\x7f\u2028\u2029\""},
		{"html characters raw", `"\u003c\u003e\u0026"`, `"<>&"`},
		{"surrogate pair combined", `"\ud83d\ude00\uD83D\uDE00"`, `"😀😀"`},
		{"lone high surrogate kept escaped", `"\uD800x"`, `"\ud800x"`},
		{"lone low surrogate kept escaped", `"\uDC00"`, `"\udc00"`},
		{"high surrogate then non-low escape", `"\ud800\u0041"`, `"\ud800A"`},
		{"two high surrogates", `"\ud800\ud800"`, `"\ud800\ud800"`},
		{"invalid utf-8 copied", "\"\xff\xfe\"", "\"\xff\xfe\""},
		{"escaped key decoded", `{"\u006b":"v"}`, `{"k":"v"}`},
		{"empty containers", `[{},[],""]`, `[{},[],""]`},
		{"one-member object", `{ "a" : { "c":1, "b":2 } }`, `{"a":{"b":2,"c":1}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := canon.Append(nil, []byte(tc.in))
			if err != nil {
				t.Fatalf("Append(%q): %v", tc.in, err)
			}
			if string(got) != tc.want {
				t.Fatalf("Append(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
			again, err := canon.Append(nil, got)
			if err != nil || !bytes.Equal(again, got) {
				t.Fatalf("not idempotent: %q -> %q (%v)", got, again, err)
			}
		})
	}
}

func TestAppendErrors(t *testing.T) {
	deep := strings.Repeat("[", canon.MaxDepth+1) + strings.Repeat("]", canon.MaxDepth+1)
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"error: empty", ``, canon.ErrSyntax},
		{"error: only whitespace", "  \n", canon.ErrSyntax},
		{"error: trailing comma in object", `{"a":1,}`, canon.ErrSyntax},
		{"error: trailing comma in array", `[1,]`, canon.ErrSyntax},
		{"error: leading zero", `01`, canon.ErrSyntax},
		{"error: bare minus", `-`, canon.ErrSyntax},
		{"error: fraction without digits", `1.`, canon.ErrSyntax},
		{"error: exponent without digits", `1e+`, canon.ErrSyntax},
		{"error: unterminated string", `"abc`, canon.ErrSyntax},
		{"error: raw control character", "\"a\nb\"", canon.ErrSyntax},
		{"error: bad escape", `"\x"`, canon.ErrSyntax},
		{"error: short unicode escape", `"\u12"`, canon.ErrSyntax},
		{"error: non-hex unicode escape", `"\u12g4"`, canon.ErrSyntax},
		{"error: trailing garbage", `{} {}`, canon.ErrSyntax},
		{"error: unquoted key", `{a:1}`, canon.ErrSyntax},
		{"error: missing colon", `{"a" 1}`, canon.ErrSyntax},
		{"error: truncated literal", `tru`, canon.ErrSyntax},
		{"error: single quotes", `'a'`, canon.ErrSyntax},
		{"error: too deep", deep, canon.ErrTooDeep},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if json.Valid([]byte(tc.in)) {
				t.Fatalf("test input %q is valid for encoding/json", tc.in)
			}
			dst := []byte("keep")
			got, err := canon.Append(dst, []byte(tc.in))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Append(%q) error = %v, want %v", tc.in, err, tc.want)
			}
			if string(got) != "keep" {
				t.Fatalf("dst changed on error: %q", got)
			}
		})
	}
}

func TestMaxDepthAccepted(t *testing.T) {
	in := strings.Repeat("[", canon.MaxDepth) + strings.Repeat("]", canon.MaxDepth)
	if !json.Valid([]byte(in)) {
		t.Fatal("encoding/json rejects MaxDepth nesting")
	}
	if _, err := canon.Append(nil, []byte(in)); err != nil {
		t.Fatalf("Append at MaxDepth: %v", err)
	}
}

// TestMaxValues: a document of MaxValues values is indexed; one more is
// ErrTooMany (a body of tiny values must not cost many times its size),
// and the Doc parses the next document as usual.
func TestMaxValues(t *testing.T) {
	at := "[" + strings.Repeat("0,", canon.MaxValues-2) + "0]" // the array and its elements
	over := "[" + strings.Repeat("0,", canon.MaxValues-1) + "0]"
	var d canon.Doc
	if err := d.Parse([]byte(at)); err != nil {
		t.Fatalf("MaxValues values: %v", err)
	}
	if err := d.Parse([]byte(over)); !errors.Is(err, canon.ErrTooMany) {
		t.Fatalf("MaxValues+1 values: %v, want ErrTooMany", err)
	}
	if err := d.Parse([]byte(`{"a":[1,2]}`)); err != nil || d.Root().Kind() != canon.Object {
		t.Fatalf("the Doc after ErrTooMany: %v", err)
	}
	if err := canon.Write(io.Discard, []byte(over)); !errors.Is(err, canon.ErrTooMany) {
		t.Fatalf("Write: %v, want ErrTooMany", err)
	}
}

func TestWriteMatchesAppend(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{"small", []byte(`{"b":[1,2,{"d":"x","c":null}],"a":"\u00e9"}`)},
		{"larger than the flush size", chatBody(200 << 10)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, err := canon.Append(nil, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := canon.Write(&buf, tc.in); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Fatalf("Write and Append differ: %d vs %d bytes", buf.Len(), len(want))
			}
		})
	}
	if err := canon.Write(&bytes.Buffer{}, []byte(`{`)); !errors.Is(err, canon.ErrSyntax) {
		t.Fatalf("Write of invalid JSON: %v", err)
	}
}

func TestValue(t *testing.T) {
	var d canon.Doc
	src := []byte(`{"role":"user","r\u006fle":"assistant","n":[1,"two",{"x":true}],"s":"caf\u00e9 \ud800"}`)
	if err := d.Parse(src); err != nil {
		t.Fatal(err)
	}
	root := d.Root()
	if root.Kind() != canon.Object || root.Len() != 4 {
		t.Fatalf("root kind %v len %d", root.Kind(), root.Len())
	}
	role, ok := root.Lookup("role")
	if !ok || !role.TextEqual("assistant") || role.TextEqual("user") {
		t.Fatalf("Lookup(role) = %q, %v; want the last member", role.Raw(), ok)
	}
	if _, ok := root.Lookup("missing"); ok {
		t.Fatal("Lookup(missing) found something")
	}
	n, _ := root.Lookup("n")
	var kinds []canon.Kind
	for e := range n.Elements() {
		kinds = append(kinds, e.Kind())
	}
	if want := []canon.Kind{canon.Number, canon.String, canon.Object}; !equalKinds(kinds, want) {
		t.Fatalf("elements %v, want %v", kinds, want)
	}
	s, _ := root.Lookup("s")
	if got := s.Text(); got != "café \uFFFD" {
		t.Fatalf("Text = %q", got)
	}
	keys := 0
	for k := range root.Members() {
		if k.Kind() != canon.String {
			t.Fatalf("key kind %v", k.Kind())
		}
		keys++
	}
	if keys != 4 {
		t.Fatalf("Members yielded %d keys", keys)
	}
	got := root.AppendCanonicalFunc(nil, func(key []byte, _ canon.Value) bool { return string(key) != "n" })
	if want := `{"role":"assistant","s":"café \ud800"}`; string(got) != want {
		t.Fatalf("AppendCanonicalFunc = %s, want %s", got, want)
	}
	if (canon.Value{}).Kind() != canon.Invalid || (canon.Value{}).Len() != 0 {
		t.Fatal("zero Value is not Invalid")
	}
}

func equalKinds(a, b []canon.Kind) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
