package vllmsim

import (
	"slices"
	"strings"
	"testing"
)

// TestOutputWordsAreOneToken guards the property the server relies on: the
// token ids of an output are Tokenize of its text, one per generated piece.
func TestOutputWordsAreOneToken(t *testing.T) {
	for _, w := range outputWords {
		if got := Tokenize(w); len(got) != 1 {
			t.Errorf("output word %q is %d tokens", w, len(got))
		}
		if got := Tokenize(" " + w); len(got) != 1 {
			t.Errorf("output piece %q is %d tokens", " "+w, len(got))
		}
	}
}

func TestGenerateIsDeterministic(t *testing.T) {
	tests := []struct {
		name string
		a, b []uint32
		same bool
	}{
		{name: "same prompt, same output", a: []uint32{1, 2, 3}, b: []uint32{1, 2, 3}, same: true},
		{name: "different prompt, different output", a: []uint32{1, 2, 3}, b: []uint32{1, 2, 4}, same: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ga, gb := generate(tc.a, 12), generate(tc.b, 12)
			if slices.Equal(ga, gb) != tc.same {
				t.Errorf("outputs %q and %q", strings.Join(ga, ""), strings.Join(gb, ""))
			}
			if len(Tokenize(strings.Join(ga, ""))) != 12 {
				t.Errorf("output %q is not 12 tokens", strings.Join(ga, ""))
			}
		})
	}
}
