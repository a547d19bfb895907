package routing_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"rolter.dev/pkg/routing"
)

func assign(key string, names []string, weights []int) string {
	r := routing.RankVariants(nil, key, names, weights)
	if len(r) == 0 {
		return ""
	}
	return names[r[0]]
}

// TestRankVariantsHonoursWeights: over 10,000 keys each variant's share is
// within 1.5 percentage points of its weight's share (5 standard
// deviations of a binomial at 10,000 draws, so the test fails only on a
// wrong split, not on chance: the hash is fixed and so are the keys).
func TestRankVariantsHonoursWeights(t *testing.T) {
	const n = 10_000
	for _, tc := range []struct {
		names   []string
		weights []int
	}{
		{[]string{"stable", "canary"}, []int{90, 10}},
		{[]string{"stable", "canary"}, []int{99, 1}},
		{[]string{"a", "b", "c"}, []int{50, 30, 20}},
		{[]string{"a", "b", "c", "d"}, []int{1, 1, 1, 1}},
		{[]string{"a", "b", "drained"}, []int{3, 1, 0}},
	} {
		t.Run(fmt.Sprint(tc.weights), func(t *testing.T) {
			count := map[string]int{}
			for i := range n {
				count[assign(fmt.Sprintf("session-%d", i), tc.names, tc.weights)]++
			}
			sum := 0
			for _, w := range tc.weights {
				sum += w
			}
			for i, name := range tc.names {
				want := float64(tc.weights[i]) / float64(sum)
				got := float64(count[name]) / n
				if math.Abs(got-want) > 0.015 {
					t.Errorf("%s: share %.4f, want %.4f ± 0.015", name, got, want)
				}
			}
			if count["drained"] != 0 {
				t.Errorf("a variant of weight 0 got %d keys", count["drained"])
			}
		})
	}
}

// TestRankVariantsSticky: a key always gets the same ranking, and every
// variant of positive weight is in it once.
func TestRankVariantsSticky(t *testing.T) {
	names, weights := []string{"a", "b", "c", "z"}, []int{5, 3, 2, 0}
	for i := range 1000 {
		key := fmt.Sprintf("k%d", i)
		r1 := routing.RankVariants(nil, key, names, weights)
		r2 := routing.RankVariants(make([]int, 0, 8), key, names, weights)
		if !slices.Equal(r1, r2) {
			t.Fatalf("%s: %v then %v", key, r1, r2)
		}
		s := slices.Clone(r1)
		slices.Sort(s)
		if !slices.Equal(s, []int{0, 1, 2}) {
			t.Fatalf("%s: ranking %v", key, r1)
		}
	}
	// The order of the variants in the config does not matter.
	for i := range 1000 {
		key := fmt.Sprintf("k%d", i)
		if a, b := assign(key, names, weights), assign(key, []string{"z", "c", "b", "a"}, []int{0, 2, 3, 5}); a != b {
			t.Fatalf("%s: %s, reordered %s", key, a, b)
		}
	}
}

// TestRankVariantsStableUnderWeightChange: moving 5 % of the weight from
// stable to canary moves about 5 % of 10,000 sessions, all of them from
// stable to canary; with three variants, a variant whose weight did not
// change loses sessions only to the one that gained weight.
func TestRankVariantsStableUnderWeightChange(t *testing.T) {
	const n = 10_000
	names := []string{"stable", "canary"}
	moved := 0
	for i := range n {
		key := fmt.Sprintf("session-%d", i)
		before, after := assign(key, names, []int{95, 5}), assign(key, names, []int{90, 10})
		if before != after {
			moved++
			if before != "stable" || after != "canary" {
				t.Fatalf("%s moved %s → %s", key, before, after)
			}
		}
	}
	if share := float64(moved) / n; share < 0.035 || share > 0.065 {
		t.Errorf("moved %.4f of the sessions, want 0.05 ± 0.015", share)
	}

	names = []string{"a", "b", "c"}
	movedC := 0
	for i := range n {
		key := fmt.Sprintf("session-%d", i)
		before, after := assign(key, names, []int{40, 30, 30}), assign(key, names, []int{45, 25, 30})
		switch {
		case before == after:
		case after != "a" && before != "b":
			t.Fatalf("%s moved %s → %s: only moves to a or away from b are possible", key, before, after)
		case before == "c":
			movedC++
		}
	}
	t.Logf("c (weight unchanged) lost %.4f of all sessions to a", float64(movedC)/n)
}

func BenchmarkRankVariants(b *testing.B) {
	names, weights := []string{"stable", "canary", "b"}, []int{90, 5, 5}
	out := make([]int, 0, 4)
	b.ReportAllocs()
	for b.Loop() {
		out = routing.RankVariants(out, "session-12345", names, weights)
	}
}
