package vllmsim

import (
	"math"
	"slices"
	"strings"
	"testing"
	"unicode"
)

func TestStopAt(t *testing.T) {
	pieces := []string{"with", " in", " big", " still", " test"}
	tests := []struct {
		name      string
		stops     []string
		minTokens int
		include   bool
		wantN     int
		wantText  string
		wantStop  string // "" for none
	}{
		{name: "no stop string runs to the end", wantN: 5, wantText: "with in big still test"},
		{name: "stop string not in the output", stops: []string{"zzz"}, wantN: 5, wantText: "with in big still test"},
		{name: "cut before the stop string", stops: []string{"big"}, wantN: 3, wantText: "with in ", wantStop: "big"},
		{name: "stop string across tokens", stops: []string{"n b"}, wantN: 3, wantText: "with i", wantStop: "n b"},
		{name: "first letter match", stops: []string{"t"}, wantN: 1, wantText: "wi", wantStop: "t"},
		{name: "min_tokens skips the early matches", stops: []string{"t"}, minTokens: 3, wantN: 4, wantText: "with in big s", wantStop: "t"},
		{name: "the stop string that completes first wins", stops: []string{"still", "in b"}, wantN: 3, wantText: "with ", wantStop: "in b"},
		{name: "a tie goes to the first listed", stops: []string{"ill", "still"}, wantN: 4, wantText: "with in big st", wantStop: "ill"},
		{name: "include_stop_str_in_output keeps it", stops: []string{"n b"}, include: true, wantN: 3, wantText: "with in b", wantStop: "n b"},
		{name: "include at the very end cuts nothing", stops: []string{"big"}, include: true, wantN: 3, wantText: "with in big", wantStop: "big"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, text, stop := stopAt(pieces, tc.stops, tc.minTokens, tc.include)
			got := ""
			if stop != nil {
				got = *stop
			}
			if n != tc.wantN || text != tc.wantText || got != tc.wantStop {
				t.Errorf("stopAt = %d %q %q, want %d %q %q", n, text, got, tc.wantN, tc.wantText, tc.wantStop)
			}
		})
	}
}

// A streamed sequence never sends part of a stop string that it cuts
// later, and its deltas add up to its final text.
func TestSequenceDeltasHoldBackStopStrings(t *testing.T) {
	pieces := []string{"with", " in", " big", " still", " test"}
	for _, stops := range [][]string{nil, {"n b"}, {"still t"}, {"x", "ig s"}} {
		q := newSequence(0, pieces, true, sampling{n: 1, stop: stops})
		var sent strings.Builder
		for q.advance() {
			d := q.delta()
			sent.WriteString(d)
			if !strings.HasPrefix(q.text, sent.String()) {
				t.Fatalf("stops %q: sent %q, not a prefix of the final text %q", stops, sent.String(), q.text)
			}
		}
		if sent.String() != q.text {
			t.Errorf("stops %q: deltas %q, final text %q", stops, sent.String(), q.text)
		}
	}
}

func TestTokenTextsAndDetokenize(t *testing.T) {
	for _, text := range []string{"hello, there  world", "\tlead and trail \n", "averyverylongword!", "a\xffb", ""} {
		tokens := tokenTexts(text)
		if got, want := strings.Join(tokens, ""), strings.TrimRightFunc(text, unicode.IsSpace); got != want {
			t.Errorf("tokenTexts(%q) join to %q, want %q", text, got, want)
		}
		ids := make([]uint32, len(tokens))
		for i, tok := range tokens {
			ids[i] = Tokenize(tok)[0]
		}
		if want := Tokenize(text); !slices.Equal(ids, want) {
			t.Errorf("tokenTexts(%q) = %q, tokens of ids %v, want %v", text, tokens, ids, want)
		}
	}
	// Known pieces name their text; others read as vLLM's placeholder.
	got := detokenize(append(Tokenize("the cache, holds"), 7))
	if want := []string{"the", " cache", " ,", " holds", " token_id:7"}; !slices.Equal(got, want) {
		t.Errorf("detokenize = %q, want %q", got, want)
	}
}

// A top list starts with its token, the most likely, strictly decreasing
// after it, of distinct tokens whose probabilities sum below 1.
func TestCandidates(t *testing.T) {
	l := &logprobs{base: 42}
	for _, token := range []string{"the", " cache", "\nword"} {
		cands := l.candidates(0, 3, token, 20)
		if len(cands) != 20 || cands[0].token != token {
			t.Fatalf("candidates(%q) = %v", token, cands)
		}
		seen := map[string]bool{}
		sum := 0.0
		for i, c := range cands {
			if c.logprob >= 0 || (i > 0 && c.logprob >= cands[i-1].logprob) || seen[c.token] {
				t.Errorf("candidate %d = %+v in %v", i, c, cands)
			}
			seen[c.token] = true
			sum += math.Exp(c.logprob)
		}
		if sum >= 1 {
			t.Errorf("probabilities sum to %v", sum)
		}
		if again := l.candidates(0, 3, token, 20); !slices.Equal(again, cands) {
			t.Errorf("candidates are not deterministic")
		}
	}
}

// Stop token ids end a sequence at the first one generated, counted, its
// text left out unless include_stop_str_in_output; a stop string that
// completes earlier wins, one the stop token would complete is not looked
// for; before min_tokens tokens another word takes a stop token's place.
func TestNewSequenceStopTokens(t *testing.T) {
	ids := func(words ...string) []uint32 {
		out := make([]uint32, len(words))
		for i, w := range words {
			out[i] = pieceID(w)
		}
		slices.Sort(out)
		return out
	}
	every := make([]string, len(outputWords))
	copy(every, outputWords[:])
	tests := []struct {
		name     string
		sp       sampling
		wantN    int
		wantText string
		wantStop any
	}{
		{name: "the stop token ends it, its text left out", sp: sampling{stopTokens: ids("still")}, wantN: 4, wantText: "with in big", wantStop: pieceID("still")},
		{name: "the first stop token generated wins", sp: sampling{stopTokens: ids("test", "big")}, wantN: 3, wantText: "with in", wantStop: pieceID("big")},
		{name: "include_stop_str_in_output keeps its text", sp: sampling{stopTokens: ids("still"), includeStop: true}, wantN: 4, wantText: "with in big still", wantStop: pieceID("still")},
		{name: "a stop string that completes earlier wins", sp: sampling{stopTokens: ids("still"), stop: []string{"in b"}}, wantN: 3, wantText: "with ", wantStop: "in b"},
		{name: "a stop string the stop token completes is not looked for", sp: sampling{stopTokens: ids("still"), stop: []string{"g st"}}, wantN: 4, wantText: "with in big", wantStop: pieceID("still")},
		{name: "a stop token right at min_tokens stops", sp: sampling{stopTokens: ids("in"), minTokens: 1}, wantN: 2, wantText: "with", wantStop: pieceID("in")},
		{name: "every word a stop token: it stops at min_tokens", sp: sampling{stopTokens: ids(every...), minTokens: 3}, wantN: 3, wantText: "with in", wantStop: pieceID("big")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := newSequence(0, []string{"with", " in", " big", " still", " test"}, true, tc.sp)
			if len(q.pieces) != tc.wantN || q.text != tc.wantText || q.stop != tc.wantStop || q.finish != "stop" {
				t.Errorf("sequence = %d pieces %q, stop %v (%s); want %d %q, stop %v", len(q.pieces), q.text, q.stop, q.finish, tc.wantN, tc.wantText, tc.wantStop)
			}
		})
	}

	// Before min_tokens tokens the model samples another word where a stop
	// token would be, with the piece's leading space; the output runs on.
	sp := sampling{stopTokens: ids("with", "in"), minTokens: 2}
	q := newSequence(0, []string{"with", " in", " big", " still", " test"}, true, sp)
	for i, p := range q.pieces[:2] {
		if sp.isStopToken(pieceTokenID(p)) || !strings.HasPrefix(p, []string{"", " "}[i]) || len(Tokenize(p)) != 1 {
			t.Errorf("piece %d = %q, want another one-token word", i, p)
		}
	}
	if len(q.pieces) != 5 || q.stop != nil || q.finish != "length" || q.text != strings.Join(q.pieces, "") {
		t.Errorf("sequence = %q (%v, %s), want 5 pieces to the length limit", q.text, q.stop, q.finish)
	}
}
