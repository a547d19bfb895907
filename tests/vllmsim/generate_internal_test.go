package vllmsim

import (
	"slices"
	"strings"
	"testing"
	"time"
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

// StepGrowth adds its growth once per other request running, to the first
// token's step and to every later token's ITL; without it nothing is added.
func TestStepGrowthPerRequestBeside(t *testing.T) {
	s, err := New(Options{StepGrowth: 3 * time.Millisecond, ITL: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for running, want := range map[int64]time.Duration{0: 0, 1: 0, 4: 9 * time.Millisecond} {
		s.running.Store(running)
		if got := s.beside(); got != want {
			t.Fatalf("%d running: beside %v, want %v", running, got, want)
		}
	}
	flat, err := New(Options{ITL: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	flat.running.Store(9)
	if got := flat.beside(); got != 0 {
		t.Fatalf("no growth, 9 running: beside %v, want 0", got)
	}
}
