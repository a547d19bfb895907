package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// vLLM turns an Anthropic tool_use block's input into a chat tool call's
// arguments with Python's json.dumps (messages.go); the tool call, and so
// the prompt, holds that exact text.

// pythonDumps prints a JSON object the way Python's json.dumps prints what
// json.loads made of it: keys in order, ", " and ": " between items, every
// character outside printable ASCII escaped (\u with lowercase hex,
// surrogate pairs above U+FFFF). False for what it would print otherwise
// or not at all: numbers that are not integers, repeated keys, surrogate
// escapes (Python keeps a lone one as it is), invalid UTF-8.
func pythonDumps(raw json.RawMessage) ([]byte, bool) {
	if !utf8.Valid(raw) || surrogateEscape.Match(raw) {
		return nil, false
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var b []byte
	err := dumpValue(d, &b)
	if err != nil {
		return nil, false
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return b, true
}

// errNotReproduced stops pythonDumps on a value Python prints otherwise.
var errNotReproduced = errors.New("not reproduced")

// integer matches a JSON number that Python reads as an int.
var integer = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

func dumpValue(d *json.Decoder, b *[]byte) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			*b = append(*b, '{')
			seen := map[string]bool{}
			for i := 0; d.More(); i++ {
				k, err := d.Token()
				if err != nil {
					return err
				}
				key := k.(string) // a key is always a string
				if seen[key] {
					return errNotReproduced
				}
				seen[key] = true
				if i > 0 {
					*b = append(*b, ", "...)
				}
				dumpString(b, key)
				*b = append(*b, ": "...)
				if err := dumpValue(d, b); err != nil {
					return err
				}
			}
			*b = append(*b, '}')
		case '[':
			*b = append(*b, '[')
			for i := 0; d.More(); i++ {
				if i > 0 {
					*b = append(*b, ", "...)
				}
				if err := dumpValue(d, b); err != nil {
					return err
				}
			}
			*b = append(*b, ']')
		}
		_, err := d.Token() // the closing delimiter
		return err
	case string:
		dumpString(b, v)
	case json.Number:
		s := string(v)
		if !integer.MatchString(s) {
			return errNotReproduced
		}
		if s == "-0" {
			s = "0"
		}
		*b = append(*b, s...)
	case bool:
		*b = strconv.AppendBool(*b, v)
	case nil:
		*b = append(*b, "null"...)
	}
	return nil
}

// dumpString prints s as Python's json.dumps does with ensure_ascii.
func dumpString(b *[]byte, s string) {
	*b = append(*b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			*b = append(*b, '\\', byte(r))
		case r == '\n':
			*b = append(*b, `\n`...)
		case r == '\r':
			*b = append(*b, `\r`...)
		case r == '\t':
			*b = append(*b, `\t`...)
		case r == '\b':
			*b = append(*b, `\b`...)
		case r == '\f':
			*b = append(*b, `\f`...)
		case r >= 0x20 && r < 0x7f:
			*b = append(*b, byte(r))
		case r > 0xffff:
			hi, lo := utf16.EncodeRune(r)
			*b = appendU(appendU(*b, hi), lo)
		default:
			*b = appendU(*b, r)
		}
	}
	*b = append(*b, '"')
}

func appendU(b []byte, r rune) []byte {
	const hex = "0123456789abcdef"
	return append(b, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
}
