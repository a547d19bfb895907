package tokenize

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// A client's body is checked valid once (json.Valid in Build); its
// objects and arrays are then read in place: each member's value is a
// sub-slice of the body, never copied or checked again, so a long
// conversation costs one pass per level rather than a decode and a copy.

// object returns the members of the JSON object obj, part of a valid
// document, as raw values (sub-slices of obj); false when obj is neither
// an object nor null (a nil map, as json.Unmarshal gives). A repeated key
// keeps its last value, and a key is decoded, as json.Unmarshal does.
func object(obj []byte) (map[string]json.RawMessage, bool) {
	obj = bytes.TrimSpace(obj)
	if string(obj) == "null" {
		return nil, true
	}
	if len(obj) == 0 || obj[0] != '{' {
		return nil, false
	}
	m := map[string]json.RawMessage{}
	i := skipSpace(obj, 1)
	if i < len(obj) && obj[i] == '}' {
		return m, true
	}
	for i < len(obj) && obj[i] == '"' {
		end := skipString(obj, i)
		key := obj[i:end]
		if len(key) < 2 || key[len(key)-1] != '"' {
			return nil, false // unterminated: not a valid document after all
		}
		var k string
		if bytes.IndexByte(key, '\\') < 0 && utf8.Valid(key) {
			k = string(key[1 : len(key)-1])
		} else if json.Unmarshal(key, &k) != nil {
			return nil, false
		}
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return nil, false
		}
		i = skipSpace(obj, i+1)
		end = skipValue(obj, i)
		if end <= i {
			return nil, false
		}
		m[k] = obj[i:end:end]
		i = skipSpace(obj, end)
		if i < len(obj) && obj[i] == '}' {
			return m, true
		}
		if i >= len(obj) || obj[i] != ',' {
			return nil, false
		}
		i = skipSpace(obj, i+1)
	}
	return nil, false
}

// objects returns the elements of the JSON array arr, part of a valid
// document, each read by object (nil for null, as json.Unmarshal gives);
// false when arr is neither null nor an array of objects and nulls.
func objects(arr []byte) ([]map[string]json.RawMessage, bool) {
	if string(bytes.TrimSpace(arr)) == "null" {
		return nil, true // as json.Unmarshal
	}
	var out []map[string]json.RawMessage
	ok := elements(arr, func(v []byte) bool {
		m, ok := object(v)
		out = append(out, m)
		return ok
	})
	if !ok {
		return nil, false
	}
	return out, true
}

// elements calls fn with each element of the JSON array arr, part of a
// valid document, as a raw value; false when arr is not an array or fn
// returns false.
func elements(arr []byte, fn func(v []byte) bool) bool {
	arr = bytes.TrimSpace(arr)
	if len(arr) == 0 || arr[0] != '[' {
		return false
	}
	i := skipSpace(arr, 1)
	if i < len(arr) && arr[i] == ']' {
		return true
	}
	for i < len(arr) {
		end := skipValue(arr, i)
		if end <= i || !fn(arr[i:end:end]) {
			return false
		}
		i = skipSpace(arr, end)
		if i < len(arr) && arr[i] == ']' {
			return true
		}
		if i >= len(arr) || arr[i] != ',' {
			return false
		}
		i = skipSpace(arr, i+1)
	}
	return false
}

// maxObjects bounds the objects of a body Build converts: each is read
// into a map of its members (a few hundred bytes), so a client's megabytes
// of "{}," would cost many times their size; a real conversation has a few
// per message (its parts, its tools' schemas), thousands in all.
const maxObjects = 1 << 16

// objectCount returns how many objects the valid JSON document b holds,
// counting no further than limit+1: one pass over its bytes, strings
// skipped, nothing allocated.
func objectCount(b []byte, limit int) int {
	n := 0
	for i := 0; i < len(b) && n <= limit; {
		j := bytes.IndexAny(b[i:], `{"`)
		if j < 0 {
			break
		}
		i += j
		if b[i] == '"' {
			i = skipString(b, i)
			continue
		}
		n++
		i++
	}
	return n
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string that starts at b[i]:
// the next quote not escaped by an odd run of backslashes.
func skipString(b []byte, i int) int {
	for i++; i < len(b); {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return len(b)
		}
		j := i + q
		n := 0
		for k := j - 1; k >= i && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
		i = j + 1
	}
	return len(b)
}

// skipValue returns the index just past the value that starts at b[i]
// (i itself when nothing starts there).
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = skipString(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j
}
