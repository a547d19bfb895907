// Package jsonesc decodes the escapes of JSON strings for the readers that
// scan a document's bytes themselves: the prompt reader (pkg/affinity) and
// the guardrails' view of a tool call (pkg/delivery).
package jsonesc

import "unicode/utf8"

// Decode decodes the escape that starts at s[i] == '\\' and returns the
// rune and the offset just after it, or -1 when s[i:] starts no escape
// (cut short, an unknown letter, \u without four hex digits). A surrogate
// pair is one rune; a lone surrogate, or a high one not followed by a low
// one, is utf8.RuneError, as encoding/json decodes it.
func Decode[T string | []byte](s T, i int) (rune, int) {
	if i+1 >= len(s) {
		return 0, -1
	}
	switch s[i+1] {
	case '"', '\\', '/':
		return rune(s[i+1]), i + 2
	case 'b':
		return '\b', i + 2
	case 'f':
		return '\f', i + 2
	case 'n':
		return '\n', i + 2
	case 'r':
		return '\r', i + 2
	case 't':
		return '\t', i + 2
	case 'u':
		r := hex4(s, i+2)
		if r < 0 {
			return 0, -1
		}
		j := i + 6
		if r >= 0xD800 && r < 0xE000 {
			if r < 0xDC00 && j+1 < len(s) && s[j] == '\\' && s[j+1] == 'u' {
				if r2 := hex4(s, j+2); r2 >= 0xDC00 && r2 < 0xE000 {
					return (r-0xD800)<<10 | (r2 - 0xDC00) + 0x10000, j + 6
				}
			}
			return utf8.RuneError, j
		}
		return r, j
	}
	return 0, -1
}

// hex4 reads four hex digits at s[i:], or returns -1.
func hex4[T string | []byte](s T, i int) rune {
	if i+4 > len(s) {
		return -1
	}
	var r rune
	for k := i; k < i+4; k++ {
		c := s[k]
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}
