package routing_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/routing"
)

func consistentHash(tb testing.TB, n int) routing.Balancer {
	return newBalancer(tb, routing.Spec{Strategy: routing.ConsistentHash}, n)
}

func TestConsistentHashKeys(t *testing.T) {
	const n = 8
	longSystem := strings.Repeat("shared system prompt ", 2000) // well past 32 KiB in the real context
	tests := []struct {
		name string
		a, b *routing.Context
		same bool
	}{
		{"same session", &routing.Context{SessionKey: "s1"}, &routing.Context{SessionKey: "s1"}, true},
		{
			"session wins over digest and prompt",
			&routing.Context{SessionKey: "s1", Prompt: "a", HasDigest: true, PromptDigest: 1},
			&routing.Context{SessionKey: "s1", Prompt: "b", HasDigest: true, PromptDigest: 2},
			true,
		},
		{
			"digest wins over prompt",
			&routing.Context{Prompt: "a", HasDigest: true, PromptDigest: 42},
			&routing.Context{Prompt: "b", HasDigest: true, PromptDigest: 42},
			true,
		},
		{
			"a digest is the prompt's own hash",
			&routing.Context{Prompt: "the whole prompt"},
			&routing.Context{Prompt: "the whole", PromptLen: 16, HasDigest: true, PromptDigest: xxh3.HashString("the whole prompt")},
			true,
		},
		{"same prompt text", &routing.Context{Prompt: longSystem + "q"}, &routing.Context{Prompt: longSystem + "q"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := consistentHash(t, n)
			x := b.Pick(tt.a, nil, routing.All(n))
			for range 5 {
				if y := b.Pick(tt.b, []int{9, 9, 9, 9, 9, 9, 9, 9}, routing.All(n)); (x == y) != tt.same {
					t.Fatalf("picks %d and %d, want same=%v", x, y, tt.same)
				}
			}
			// A second balancer (another proxy, or after a restart) builds
			// the same ring.
			if y := consistentHash(t, n).Pick(tt.a, nil, routing.All(n)); y != x {
				t.Fatalf("a fresh balancer picks %d, the first %d", y, x)
			}
		})
	}
}

// TestConsistentHashDigestSpreads: requests that share a long system prompt
// (so their bounded Prompt text is identical) but differ after it, or only in
// an attached image or tool result, have different digests and spread over
// the ring; hashing the bounded text would send them all to one target.
func TestConsistentHashDigestSpreads(t *testing.T) {
	const n, reqs = 8, 400
	b := consistentHash(t, n)
	bounded := strings.Repeat("x", 32<<10)
	withDigest, withoutDigest := make([]int, 0, reqs), make([]int, 0, reqs)
	for i := range reqs {
		digest := xxh3.HashString(fmt.Sprintf("%s / question %d / image %d", bounded, i, i))
		withDigest = append(withDigest, b.Pick(&routing.Context{Prompt: bounded, PromptLen: 40 << 10, HasDigest: true, PromptDigest: digest}, nil, routing.All(n)))
		withoutDigest = append(withoutDigest, b.Pick(&routing.Context{Prompt: bounded, PromptLen: 40 << 10}, nil, routing.All(n)))
	}
	for i, c := range tally(withDigest, n) {
		if c < reqs/n/3 {
			t.Fatalf("with digests: target %d got %d of %d: %v", i, c, reqs, tally(withDigest, n))
		}
	}
	if c := tally(withoutDigest, n); slices.Max(c) != reqs {
		t.Fatalf("without digests the bounded text is one key: counts %v", c)
	}
}

// TestConsistentHashStability: taking one target out of the eligible set
// moves only the keys that target held, and spreads them over the others;
// every other key stays where it was.
func TestConsistentHashStability(t *testing.T) {
	const n, keys = 8, 4000
	b := consistentHash(t, n)
	ctx := func(k int) *routing.Context { return &routing.Context{SessionKey: fmt.Sprintf("session-%d", k)} }
	base := make([]int, keys)
	for k := range keys {
		base[k] = b.Pick(ctx(k), nil, routing.All(n))
	}
	for i, c := range tally(base, n) {
		if c < keys/n*6/10 || c > keys/n*14/10 { // 160 points per target: shares within ±40%
			t.Fatalf("all eligible: target %d holds %d of %d keys: %v", i, c, keys, tally(base, n))
		}
	}
	for out := range n {
		el := routing.All(n)
		el.Remove(out)
		moved := make([]int, n)
		for k := range keys {
			got := b.Pick(ctx(k), nil, el)
			switch {
			case got == out:
				t.Fatalf("target %d ineligible but picked for key %d", out, k)
			case base[k] != out && got != base[k]:
				t.Fatalf("without %d: key %d moved %d -> %d", out, k, base[k], got)
			case base[k] == out:
				moved[got]++
			}
		}
		receivers := 0
		for _, c := range moved {
			if c > 0 {
				receivers++
			}
		}
		if receivers < n/2 {
			t.Fatalf("without %d its keys went to only %d targets: %v", out, receivers, moved)
		}
	}
	// Only target 3 eligible: every key goes there.
	for k := range 100 {
		if got := b.Pick(ctx(k), nil, eligibleOf(3)); got != 3 {
			t.Fatalf("only 3 eligible: key %d -> %d", k, got)
		}
	}
}

func TestConsistentHashNoKeyRoundRobin(t *testing.T) {
	b := consistentHash(t, 4)
	var got []int
	for range 6 {
		got = append(got, b.Pick(&routing.Context{}, nil, eligibleOf(1, 3)))
	}
	if want := []int{1, 3, 1, 3, 1, 3}; !slices.Equal(got, want) {
		t.Fatalf("no key: picks %v, want %v", got, want)
	}
	if got := b.Pick(nil, nil, routing.All(4)); got < 0 || got >= 4 {
		t.Fatalf("nil context: Pick = %d", got)
	}
}
