package vllmsim_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"rolter.dev/tests/vllmsim"
)

func TestTokenize(t *testing.T) {
	tests := []struct {
		name string
		text string
		want int // number of tokens
	}{
		{name: "empty text has no token", text: "", want: 0},
		{name: "white space only has no token", text: " \t\n ", want: 0},
		{name: "one word is one token", text: "hello", want: 1},
		{name: "words split on spaces", text: "hello big world", want: 3},
		{name: "punctuation is a token of its own", text: "hi, you!", want: 4},
		{name: "long word is cut every 6 runes", text: "abcdefghijklm", want: 3},
		{name: "digits join letters", text: "gpt4o", want: 1},
		{name: "chat markup", text: "<|user|>\nhi\n", want: 6},
		{name: "non-ASCII letters are letters", text: "héllo wörld", want: 2},
		{name: "invalid UTF-8 byte is a token", text: "a\xffb", want: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := vllmsim.Tokenize(tc.text)
			if len(got) != tc.want {
				t.Fatalf("Tokenize(%q) = %v, want %d tokens", tc.text, got, tc.want)
			}
			for _, id := range got {
				if id >= 1<<31 {
					t.Errorf("token id %d >= 2^31", id)
				}
			}
			if again := vllmsim.Tokenize(tc.text); !slices.Equal(got, again) {
				t.Errorf("Tokenize is not deterministic: %v then %v", got, again)
			}
		})
	}
}

func TestTokenizeDistinguishesPieces(t *testing.T) {
	a, b := vllmsim.Tokenize("cache"), vllmsim.Tokenize("cachf")
	if slices.Equal(a, b) {
		t.Fatalf("different words share ids: %v", a)
	}
	if got, want := vllmsim.Tokenize("x  y"), vllmsim.Tokenize("x y"); !slices.Equal(got, want) {
		t.Errorf("white space runs should not matter: %v vs %v", got, want)
	}
}

func TestRenderChat(t *testing.T) {
	msgs := []vllmsim.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}
	tests := []struct {
		name   string
		addGen bool
		want   string
	}{
		{name: "with generation prompt", addGen: true, want: "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"},
		{name: "without generation prompt", addGen: false, want: "<|system|>\nbe brief\n<|user|>\nhi\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := vllmsim.RenderChat(msgs, tc.addGen); got != tc.want {
				t.Errorf("RenderChat = %q, want %q", got, tc.want)
			}
		})
	}
	if got, want := vllmsim.ChatPrompt(msgs), vllmsim.RenderChat(msgs, true); got != want {
		t.Errorf("ChatPrompt = %q, want %q", got, want)
	}
}

func TestChatPromptTokensExtendPreviousTurn(t *testing.T) {
	turn1 := []vllmsim.Message{{Role: "user", Content: "what is a cache"}}
	turn2 := append(slices.Clone(turn1),
		vllmsim.Message{Role: "assistant", Content: "a fast store"},
		vllmsim.Message{Role: "user", Content: "and a block"})
	t1 := vllmsim.Tokenize(vllmsim.RenderChat(turn1, false))
	t2 := vllmsim.Tokenize(vllmsim.ChatPrompt(turn2))
	if !slices.Equal(t2[:len(t1)], t1) {
		t.Fatalf("turn 2 tokens do not start with turn 1 tokens")
	}
}

// FuzzTokenize checks Tokenize's documented properties on any input: ids
// below 2^31, and concatenation across white space.
func FuzzTokenize(f *testing.F) {
	f.Add("hello world", "again")
	f.Add("<|user|>\n", "héllo\xff")
	f.Add("", "abcdefghijklmnop")
	f.Fuzz(func(t *testing.T, a, b string) {
		ta, tb := vllmsim.Tokenize(a), vllmsim.Tokenize(b)
		joined := vllmsim.Tokenize(a + " " + b)
		if !slices.Equal(joined, append(slices.Clone(ta), tb...)) {
			t.Fatalf("Tokenize(a+\" \"+b) = %v, want %v + %v", joined, ta, tb)
		}
		for _, id := range joined {
			if id >= 1<<31 {
				t.Fatalf("token id %d >= 2^31", id)
			}
		}
	})
}

func BenchmarkTokenize(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		text := strings.Repeat("The quick brown fox, jumping over lazy dogs! ", size/45+1)[:size]
		b.Run(fmt.Sprintf("text=%dKiB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				vllmsim.Tokenize(text)
			}
		})
	}
}
