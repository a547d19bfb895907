package prefixtree_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"rolter.dev/pkg/prefixtree"
)

type insert struct {
	tenant int
	s      string
}

func matchAll(t *prefixtree.Tree, s string) []int {
	lens := make([]int, t.Tenants())
	t.Match(s, lens)
	return lens
}

func TestMatch(t *testing.T) {
	tests := []struct {
		name    string
		inserts []insert
		query   string
		want    []int
	}{
		{"empty tree", nil, "hello", []int{0, 0, 0}},
		{"empty query", []insert{{0, "abc"}}, "", []int{0, 0, 0}},
		{"exact", []insert{{1, "hello world"}}, "hello world", []int{0, 11, 0}},
		{"query longer", []insert{{1, "hello"}}, "hello world", []int{0, 5, 0}},
		{"query shorter", []insert{{1, "hello world"}}, "hell", []int{0, 4, 0}},
		{"mid-edge mismatch", []insert{{2, "hello world"}}, "help", []int{0, 0, 3}},
		{
			"one walk scores every tenant",
			[]insert{{0, "system: be brief. user: hi"}, {1, "system: be brief. user: bye"}, {2, "system: be verbose"}},
			"system: be brief. user: hi there",
			[]int{26, 24, 11},
		},
		{
			"the longest of several prompts",
			[]insert{{0, "abcdef"}, {0, "abcxyz"}, {0, "abq"}},
			"abcxy!", []int{5, 0, 0},
		},
		{
			"no terminal needed",
			[]insert{{0, "abcdef"}, {0, "abcxyz"}},
			"abc!", []int{3, 0, 0},
		},
		{"tenant out of range ignored", []insert{{3, "abc"}, {-1, "abc"}}, "abc", []int{0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := prefixtree.New(3, 0)
			for _, in := range tt.inserts {
				tr.Insert(in.tenant, in.s)
			}
			got := matchAll(tr, tt.query)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("Match(%q) = %v, want %v", tt.query, got, tt.want)
			}
			// A short lens slice is filled as far as it goes; a long one is
			// zero past Tenants().
			short := []int{-1}
			tr.Match(tt.query, short)
			if short[0] != tt.want[0] {
				t.Fatalf("Match into 1 slot = %v, want %d", short, tt.want[0])
			}
			long := []int{-1, -1, -1, -1, -1}
			tr.Match(tt.query, long)
			if long[3] != 0 || long[4] != 0 {
				t.Fatalf("Match into 5 slots = %v", long)
			}
		})
	}
}

func TestStatsAndCeiling(t *testing.T) {
	tests := []struct {
		name      string
		maxNodes  int
		inserts   []insert
		want      []prefixtree.Stats
		size      prefixtree.Size
		matchLens map[string][]int
	}{
		{
			name:      "byte nodes count distinct prefixes",
			inserts:   []insert{{0, "abcd"}, {0, "abxy"}, {1, "abcd"}},
			want:      []prefixtree.Stats{{Nodes: 6, Prompts: 2}, {Nodes: 4, Prompts: 1}},
			size:      prefixtree.Size{Nodes: 3, Bytes: 6},
			matchLens: map[string][]int{"abxz": {3, 2}},
		},
		{
			name:    "re-insert refreshes, adds nothing",
			inserts: []insert{{0, "abcd"}, {0, "abcd"}, {0, "ab"}},
			want:    []prefixtree.Stats{{Nodes: 4, Prompts: 2}, {}},
			size:    prefixtree.Size{Nodes: 2, Bytes: 4},
		},
		{
			name:     "eviction keeps shared prefixes",
			maxNodes: 12,
			// "SYSTEM/" (7) + "a1" (2) + "b2" (2) = 11; "c3" makes 13, which
			// evicts "SYSTEM/a1" only: "SYSTEM/", shared with the survivors,
			// stays.
			inserts:   []insert{{0, "SYSTEM/a1"}, {0, "SYSTEM/b2"}, {0, "SYSTEM/c3"}},
			want:      []prefixtree.Stats{{Nodes: 11, Prompts: 2, Evictions: 1}, {}},
			size:      prefixtree.Size{Nodes: 3, Bytes: 11},
			matchLens: map[string][]int{"SYSTEM/a1": {7, 0}, "SYSTEM/b2": {9, 0}, "SYSTEM/zz": {7, 0}},
		},
		{
			name:      "re-observing protects a prompt from eviction",
			maxNodes:  12,
			inserts:   []insert{{0, "SYSTEM/a1"}, {0, "SYSTEM/b2"}, {0, "SYSTEM/a1"}, {0, "SYSTEM/c3"}},
			want:      []prefixtree.Stats{{Nodes: 11, Prompts: 2, Evictions: 1}, {}},
			size:      prefixtree.Size{Nodes: 3, Bytes: 11},
			matchLens: map[string][]int{"SYSTEM/a1": {9, 0}, "SYSTEM/b2": {7, 0}},
		},
		{
			name:      "ceilings are per tenant; other tenants keep the node",
			maxNodes:  5,
			inserts:   []insert{{0, "abcde"}, {1, "abcde"}, {0, "xyz"}},
			want:      []prefixtree.Stats{{Nodes: 3, Prompts: 1, Evictions: 1}, {Nodes: 5, Prompts: 1}},
			size:      prefixtree.Size{Nodes: 2, Bytes: 8},
			matchLens: map[string][]int{"abcde": {0, 5}},
		},
		{
			name:     "a prompt above the ceiling is never resident",
			maxNodes: 4,
			inserts:  []insert{{0, "abc"}, {0, "abcdefgh"}},
			want:     []prefixtree.Stats{{Nodes: 0, Prompts: 0, Evictions: 2}, {}},
			size:     prefixtree.Size{},
		},
		{
			name:     "evicting a prefix prompt merges the chain back",
			maxNodes: 10,
			// "q" makes 11: evicting "abc" frees nothing ("abcdefgh" holds
			// it), so "xy" goes too; "abc" is left with one child and no
			// prompt, and merges into "abcdefgh".
			inserts:   []insert{{0, "abc"}, {0, "xy"}, {0, "abcdefgh"}, {0, "q"}},
			want:      []prefixtree.Stats{{Nodes: 9, Prompts: 2, Evictions: 2}, {}},
			size:      prefixtree.Size{Nodes: 2, Bytes: 9},
			matchLens: map[string][]int{"abc": {3, 0}, "xy": {0, 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := prefixtree.New(2, tt.maxNodes)
			for _, in := range tt.inserts {
				tr.Insert(in.tenant, in.s)
			}
			got := tr.AppendStats(nil)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("stats = %+v, want %+v", got, tt.want)
			}
			for i := range tt.want {
				if s := tr.Stats(i); s != tt.want[i] {
					t.Fatalf("Stats(%d) = %+v, want %+v", i, s, tt.want[i])
				}
			}
			if s := tr.Size(); s != tt.size {
				t.Fatalf("Size = %+v, want %+v", s, tt.size)
			}
			for q, want := range tt.matchLens {
				if got := matchAll(tr, q); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("Match(%q) = %v, want %v", q, got, want)
				}
			}
		})
	}
	if s := prefixtree.New(1, 0).Stats(5); s != (prefixtree.Stats{}) {
		t.Fatalf("Stats out of range = %+v", s)
	}
}

// TestCeilingHolds fills a tenant far past its ceiling with prompts that share
// a system prompt: the ceiling holds after every insert, and the system
// prompt stays resident.
func TestCeilingHolds(t *testing.T) {
	const maxNodes = 20_000
	tr := prefixtree.New(2, maxNodes)
	system := strings.Repeat("You are a helpful assistant. ", 100) // 2900 bytes
	for i := range 500 {
		tr.Insert(0, system+fmt.Sprintf("question %d: %s", i, strings.Repeat("x", i%97)))
		if s := tr.Stats(0); s.Nodes > maxNodes {
			t.Fatalf("after %d inserts: %d nodes > %d", i+1, s.Nodes, maxNodes)
		}
	}
	s := tr.Stats(0)
	if s.Evictions == 0 || s.Nodes < maxNodes/2 {
		t.Fatalf("stats %+v: want evictions and a nearly full tenant", s)
	}
	if got := matchAll(tr, system+"question 99999")[0]; got < len(system)+len("question ") {
		t.Fatalf("system prompt lost: match %d of %d", got, len(system))
	}
}

func TestConcurrentUse(t *testing.T) {
	tr := prefixtree.New(4, 3000)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			lens := make([]int, 4)
			for i := range 400 {
				p := fmt.Sprintf("system %d / user %d / %s", i%7, i, strings.Repeat("z", i%50))
				tr.Insert(g, p)
				tr.Match(p, lens)
				// Only g inserts for tenant g, so p is still resident.
				if lens[g] != len(p) {
					t.Errorf("goroutine %d: Match = %d, want %d", g, lens[g], len(p))
					return
				}
				_ = tr.Size()
				_ = tr.AppendStats(nil)
			}
		})
	}
	wg.Wait()
}

func TestMatchDoesNotAllocate(t *testing.T) {
	tr := prefixtree.New(16, 0)
	for i := range 16 {
		tr.Insert(i, fmt.Sprintf("shared system prompt, then target %d", i))
	}
	lens := make([]int, 16)
	if a := testing.AllocsPerRun(200, func() { tr.Match("shared system prompt, then target 7!", lens) }); a != 0 {
		t.Fatalf("Match: %v allocs", a)
	}
}

func TestNewClamps(t *testing.T) {
	if got := prefixtree.New(-3, -5); got.Tenants() != 0 || got.MaxNodes() != 0 {
		t.Fatalf("New(-3,-5): tenants %d, max %d", got.Tenants(), got.MaxNodes())
	}
	if got := prefixtree.New(prefixtree.MaxTenants+9, 7); got.Tenants() != prefixtree.MaxTenants || got.MaxNodes() != 7 {
		t.Fatalf("New(big): tenants %d, max %d", got.Tenants(), got.MaxNodes())
	}
}

func TestTrim(t *testing.T) {
	tr := prefixtree.New(2, 0) // unbounded between passes
	tr.Insert(0, "aaaa")
	tr.Insert(0, "bbbb")
	tr.Insert(0, "cccc")
	tr.Insert(1, "aaaa")
	if got := tr.Stats(0).Nodes; got != 12 {
		t.Fatalf("tenant 0 holds %d nodes before the pass, want 12 (no ceiling)", got)
	}
	tr.Trim(0, 8)
	if st := tr.Stats(0); st.Nodes != 8 || st.Prompts != 2 || st.Evictions != 1 {
		t.Fatalf("after Trim(0, 8): %+v, want 8 nodes, 2 prompts, 1 eviction", st)
	}
	lens := make([]int, 2)
	tr.Match("aaaa", lens)
	if lens[0] != 0 || lens[1] != 4 {
		t.Fatalf("match of the oldest prompt: %v, want [0 4] (evicted from tenant 0 only)", lens)
	}
	tr.Trim(5, 0)  // out of range: ignored
	tr.Trim(1, -1) // ignored
	if tr.Stats(1).Nodes != 4 {
		t.Fatal("an ignored Trim evicted")
	}
}
