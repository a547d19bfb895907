package jsonesc_test

import (
	"testing"
	"unicode/utf8"

	"rolter.dev/pkg/jsonesc"
)

// TestDecode: each escape decodes to what encoding/json makes of it, the
// offset lands just after it, and what starts no escape is -1.
func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want rune
		next int
	}{
		{`\"x`, '"', 2}, {`\\`, '\\', 2}, {`\/`, '/', 2}, {`\b`, '\b', 2}, {`\f`, '\f', 2},
		{`\n`, '\n', 2}, {`\r`, '\r', 2}, {`\t`, '\t', 2},
		{`\u0040`, '@', 6}, {`\u00E9`, 'é', 6},
		{`\ud83d\ude00`, '😀', 12},
		{`\ud83d x`, utf8.RuneError, 6}, {`\ud83d\u0041`, utf8.RuneError, 6}, {`\ude00`, utf8.RuneError, 6},
		{`\q`, 0, -1}, {`\u12`, 0, -1}, {`\u12g4`, 0, -1}, {`\`, 0, -1},
	} {
		r, next := jsonesc.Decode(tc.in, 0)
		rb, nextb := jsonesc.Decode([]byte(tc.in), 0)
		if r != tc.want || next != tc.next || rb != r || nextb != next {
			t.Errorf("Decode(%q) = %q, %d (bytes: %q, %d); want %q, %d", tc.in, r, next, rb, nextb, tc.want, tc.next)
		}
	}
}
