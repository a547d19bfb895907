package sim

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadTraceExcerpt(t *testing.T) {
	recs, err := ReadTraceFile("testdata/mooncake_excerpt.jsonl", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 6 {
		t.Fatalf("%d records, want 6 (the blank line skipped)", len(recs))
	}
	want := TraceRecord{Timestamp: 250, InputLength: 2000, OutputLength: 300, HashIDs: []int64{0, 1, 2, 5}}
	if got := recs[2]; got.Timestamp != want.Timestamp || got.InputLength != want.InputLength ||
		got.OutputLength != want.OutputLength || len(got.HashIDs) != 4 || got.HashIDs[3] != 5 {
		t.Fatalf("record 3 = %+v, want %+v", got, want)
	}
	if limited, err := ReadTraceFile("testdata/mooncake_excerpt.jsonl", 2); err != nil || len(limited) != 2 {
		t.Fatalf("limit 2: %d records, %v", len(limited), err)
	}
}

// The arxiv excerpt (testdata/README.md) is another production trace:
// its records must be whole (one hash id per 512 tokens of input, ids that
// chain like prefixes), and the synthesized text must keep its sharing
// structure, as it does for the conversation trace.
func TestArxivExcerptTrace(t *testing.T) {
	recs, err := ReadTraceFile("testdata/mooncake_arxiv_excerpt.jsonl", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1000 {
		t.Fatalf("%d records, want 1000", len(recs))
	}
	prev := make(map[int64]int64) // hash id -> the id before it (-1: first)
	for i, r := range recs {
		if want := (r.InputLength + TraceBlockTokens - 1) / TraceBlockTokens; len(r.HashIDs) != want {
			t.Fatalf("record %d: %d hash ids for %d input tokens, want %d", i+1, len(r.HashIDs), r.InputLength, want)
		}
		for j, id := range r.HashIDs {
			before := int64(-1)
			if j > 0 {
				before = r.HashIDs[j-1]
			}
			if p, ok := prev[id]; ok && p != before {
				t.Fatalf("record %d: hash id %d follows %d, earlier %d: ids do not chain", i+1, id, before, p)
			}
			prev[id] = before
		}
	}
	tok, blk := UnboundedHitRate(TraceWorkload(recs, 0, 1, 1), 16), TraceBlockHitRate(recs)
	if math.Abs(tok-blk) > 0.03 {
		t.Fatalf("token hit rate %.3f, block hit rate %.3f", tok, blk)
	}
}

func TestReadTraceErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, msg string }{
		{"not json", "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n{oops}\n", "line 2"},
		{"no blocks", `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}`, "no hash_ids"},
		{"no input", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}`, "input_length"},
		{"time goes back", "{\"timestamp\": 9, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n" +
			"{\"timestamp\": 8, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n", "before"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(tc.in), 0)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.msg)
			}
		})
	}
}

// The excerpt's unbounded hit rates, worked out by hand.
func TestTraceUnboundedHitRateHandmade(t *testing.T) {
	recs, err := ReadTraceFile("testdata/mooncake_excerpt.jsonl", 0)
	if err != nil {
		t.Fatal(err)
	}
	// Blocks: [0 1 2] 0/3, [0 3 4] 1/3, [0 1 2 5] 3/4, [6 7] 0/2,
	// [0 3 4 8 9] 3/5, [6] 1/1: 8 of 18.
	if got := TraceBlockHitRate(recs); math.Abs(got-8.0/18) > 1e-12 {
		t.Fatalf("block hit rate %v, want 8/18", got)
	}
	// Tokens, 16 per cache block, each prompt framed by the chat template's
	// "<|user|>" (5 tokens) and "<|assistant|>" (6 tokens):
	//   [0 3 4] shares 5+512 tokens with [0 1 2]: 32 blocks = 512 tokens;
	//   [0 1 2 5] shares 5+1500 with [0 1 2] (its partial block 2): 1504;
	//   [0 3 4 8 9] shares 5+1300 with [0 3 4]: 1296;
	//   [6] shares 5+512 with [6 7]: 512.
	if hdr("user") != 5 || hdr("assistant") != 6 {
		t.Fatalf("template markers of %d and %d tokens", hdr("user"), hdr("assistant"))
	}
	w := TraceWorkload(recs, 0, 1, 1)
	want := float64(512+1504+1296+512) / float64(1500+1300+2000+700+2500+512+6*11)
	if got := UnboundedHitRate(w, 16); math.Abs(got-want) > 1e-12 {
		t.Fatalf("token hit rate %v, want %v", got, want)
	}
}

// A trace that hashes smaller blocks shares at that granularity: two
// records agreeing on their first two 32-token blocks share 64 tokens, and
// each prompt keeps its input_length whether its blocks cover more or less.
func TestTraceWorkloadSmallBlocks(t *testing.T) {
	recs := []TraceRecord{
		{Timestamp: 0, InputLength: 100, OutputLength: 1, HashIDs: []int64{1, 2, 3}},
		{Timestamp: 5, InputLength: 70, OutputLength: 1, HashIDs: []int64{1, 2, 4}},
	}
	w := TraceWorkload(recs, 32, 1, 1)
	for i, s := range w.Sessions {
		if got := s.Turns[0].Messages[0].Tokens(); got != recs[i].InputLength {
			t.Fatalf("record %d: %d tokens, want %d", i, got, recs[i].InputLength)
		}
	}
	a, b := PromptTokens(w.Sessions[0].Turns[0].Messages), PromptTokens(w.Sessions[1].Turns[0].Messages)
	if c := commonPrefix(a, b); c != hdr("user")+64 {
		t.Fatalf("records sharing two 32-token blocks share %d tokens", c)
	}
	whole := TraceWorkload(recs, 0, 1, 1).Sessions
	if c := commonPrefix(PromptTokens(whole[0].Turns[0].Messages), PromptTokens(whole[1].Turns[0].Messages)); c != hdr("user")+70 {
		t.Fatalf("with 512-token blocks the second record (70 tokens, all in block 1) shares %d tokens", c)
	}
}

func TestTraceWorkload(t *testing.T) {
	recs, err := ReadTraceFile("testdata/mooncake_excerpt.jsonl", 0)
	if err != nil {
		t.Fatal(err)
	}
	w := TraceWorkload(recs, 0, 2, 1)
	if w.Concurrency != 0 || len(w.Sessions) != len(recs) {
		t.Fatalf("concurrency %d, %d sessions", w.Concurrency, len(w.Sessions))
	}
	for i, s := range w.Sessions {
		r := recs[i]
		m := s.Turns[0].Messages
		if len(m) != 1 || m[0].Tokens() != r.InputLength || len(m[0].Content) != len(r.HashIDs) {
			t.Fatalf("record %d: %d tokens in %d segments", i, m[0].Tokens(), len(m[0].Content))
		}
		if want := time.Duration(r.Timestamp) * time.Millisecond / 2; s.Start != want {
			t.Fatalf("record %d starts at %v, want %v (speedup 2)", i, s.Start, want)
		}
		if s.Turns[0].Output != max(r.OutputLength, 1) {
			t.Fatalf("record %d: output %d", i, s.Turns[0].Output)
		}
	}
	// Equal ids give equal text: [6 7] and [6] share block 6's 512 words.
	a, b := PromptTokens(w.Sessions[3].Turns[0].Messages), PromptTokens(w.Sessions[5].Turns[0].Messages)
	if c := commonPrefix(a, b); c != hdr("user")+512 {
		t.Fatalf("records sharing block 6 share %d tokens", c)
	}
	// Different seeds give different text for the same ids.
	other := TraceWorkload(recs, 0, 1, 2)
	if commonPrefix(PromptTokens(other.Sessions[0].Turns[0].Messages), PromptTokens(w.Sessions[0].Turns[0].Messages)) > 10 {
		t.Fatal("the block text does not depend on the seed")
	}
}

// sharedTrace finds ../shared/traces beside the repository root (the
// directory holding go.work).
func sharedTrace(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("no go.work above the test directory: cannot locate ../shared/traces")
		}
		dir = parent
	}
	path := filepath.Join(dir, "..", "shared", "traces", "mooncake_conversation_trace.jsonl")
	if _, err := os.Stat(path); err != nil {
		t.Skipf("the shared Mooncake trace is not at %s (%v): skipping the full-trace check", path, err)
	}
	return path
}

func TestSharedMooncakeTrace(t *testing.T) {
	path := sharedTrace(t)
	recs, err := ReadTraceFile(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 12031 {
		t.Fatalf("%d records, want 12031", len(recs))
	}
	if got := TraceBlockHitRate(recs); math.Abs(got-0.3664) > 0.0001 {
		t.Fatalf("unbounded block hit rate %.4f, want 0.3664 (the published 36.64 %%)", got)
	}
	span := time.Duration(recs[len(recs)-1].Timestamp) * time.Millisecond
	if span < 55*time.Minute || span > 62*time.Minute {
		t.Fatalf("the trace spans %v, want about an hour", span)
	}
	// The synthesized text keeps the sharing structure: on its first 300
	// requests the token-level unbounded hit rate tracks the block level.
	head := recs[:300]
	tok, blk := UnboundedHitRate(TraceWorkload(head, 0, 1, 1), 16), TraceBlockHitRate(head)
	if math.Abs(tok-blk) > 0.03 {
		t.Fatalf("first 300 requests: token hit rate %.3f, block hit rate %.3f", tok, blk)
	}
}

// ReadTrace takes files from anywhere: whatever it accepts holds only
// records the replay can use (hash ids, a positive input length, times in
// order), and each replays as a prompt of its input_length at any block
// size.
func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1, 2]}`+"\n"+
		`{"timestamp": 7, "input_length": 3000, "output_length": 0, "hash_ids": [1]}`), 32)
	f.Add([]byte("\n  \n{\"timestamp\": 1}\n"), 512)
	f.Add([]byte(`{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [9]}`+"\n"+`{"timestamp": 4, "input_length": 1, "output_length": 1, "hash_ids": [9]}`), 0)
	f.Fuzz(func(t *testing.T, data []byte, blockTokens int) {
		recs, err := ReadTrace(strings.NewReader(string(data)), 0)
		if err != nil {
			return
		}
		for i, r := range recs {
			if len(r.HashIDs) == 0 || r.InputLength <= 0 || r.OutputLength < 0 || (i > 0 && r.Timestamp < recs[i-1].Timestamp) {
				t.Fatalf("record %d accepted: %+v", i, r)
			}
			if r.InputLength > 1<<20 || len(recs) > 64 {
				return // the replay below materialises nothing, but keep each run small
			}
		}
		w := TraceWorkload(recs, blockTokens%4096, 1, 1)
		for i, s := range w.Sessions {
			if got := s.Turns[0].Messages[0].Tokens(); got != recs[i].InputLength {
				t.Fatalf("record %d replays %d tokens, want %d", i, got, recs[i].InputLength)
			}
		}
	})
}
