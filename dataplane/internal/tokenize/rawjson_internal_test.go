package tokenize

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzObject: on any input, never a panic; on a valid JSON document, object and objects read exactly
// what json.Unmarshal reads into maps of raw values (the same keys, a
// repeated one keeping its last value, byte-equal values), and refuse what
// it refuses.
func FuzzObject(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"b":[1,{"c":"\""}],"a":"x\\"}`, `{ "k\u0065y" : null , "" : {} }`, `[{"a":1},null,{"b":"]"}]`,
		`[]`, `{}`, `"s"`, `[1]`, `[{"a":1},2]`, `{"a":"\\\\\"}"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) {
			object(doc) // must not panic, whatever it answers
			objects(doc)
			return
		}
		var want map[string]json.RawMessage
		wantErr := json.Unmarshal(doc, &want)
		got, ok := object(doc)
		if ok != (wantErr == nil) {
			t.Fatalf("object ok %v, json.Unmarshal %v", ok, wantErr)
		}
		same := func(a, b map[string]json.RawMessage) bool {
			if len(a) != len(b) || (a == nil) != (b == nil) {
				return false
			}
			for k, v := range a {
				if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
					return false
				}
			}
			return true
		}
		if ok && !same(got, want) {
			t.Fatalf("object %v, json.Unmarshal %v", got, want)
		}
		var wantList []map[string]json.RawMessage
		wantErr = json.Unmarshal(doc, &wantList)
		gotList, ok := objects(doc)
		if ok != (wantErr == nil) {
			t.Fatalf("objects ok %v, json.Unmarshal %v", ok, wantErr)
		}
		if ok {
			if len(gotList) != len(wantList) {
				t.Fatalf("objects %d, json.Unmarshal %d", len(gotList), len(wantList))
			}
			for i := range gotList {
				if !same(gotList[i], wantList[i]) {
					t.Fatalf("element %d: %v against %v", i, gotList[i], wantList[i])
				}
			}
		}
	})
}

// TestObjectCount: objects are counted outside strings only (a brace in a
// text, an escaped quote before it, do not fool it), and no further than
// the limit asks; Build leaves a body of more than maxObjects objects to
// the approximate state.
func TestObjectCount(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want int
	}{
		{`{}`, 1},
		{`[{},{"a":{"b":[{}]}}]`, 4},
		{`{"a":"{{{"}`, 1},
		{`{"a":"x\"{","b":"\\","c":{}}`, 2},
		{`["{", "}", "\\\"{"]`, 0},
		{`"{"`, 0},
	} {
		if got := objectCount([]byte(tc.doc), 100); got != tc.want {
			t.Errorf("objectCount(%s) = %d, want %d", tc.doc, got, tc.want)
		}
	}
	if got := objectCount([]byte(`[{},{},{},{},{}]`), 2); got != 3 {
		t.Errorf("objectCount with limit 2 = %d, want 3", got)
	}
	chat := func(parts int) []byte {
		return []byte(`{"model":"m","messages":[{"role":"user","content":[` + strings.Repeat(`{"type":"text","text":"a"},`, parts-1) + `{"type":"text","text":"b"}]}]}`)
	}
	// The body, the message and its parts.
	if _, _, _, ok := Build(PathChatCompletions, chat(maxObjects-2), "m"); !ok {
		t.Error("a body of maxObjects objects not built")
	}
	if _, _, _, ok := Build(PathChatCompletions, chat(maxObjects-1), "m"); ok {
		t.Error("a body of more than maxObjects objects built")
	}
}
