package routing_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"rolter.dev/pkg/routing"
)

var systemPrompt = "system: You are a support assistant for ACME. " + strings.Repeat("Follow the policy carefully. ", 60)

func question(i int) string {
	return fmt.Sprintf("user: question number %d about invoice %d?", i, i*7919)
}

func cacheAware(tb testing.TB, n int) routing.Balancer {
	return newBalancer(tb, routing.Spec{Strategy: routing.CacheAware}, n)
}

// TestCacheAwareSharedSystemPromptSpreads is the #1851 regression: 24
// concurrent requests share one long system prompt and differ in their
// question. Each clears the affinity threshold on whichever replica served the
// system prompt first; with loads tracked as the proxy tracks them (counted
// at pick, released when the response ends) the load guard must spread them
// over the 3 replicas instead of sending all 24 to one.
func TestCacheAwareSharedSystemPromptSpreads(t *testing.T) {
	t.Run("sequential picks, all in flight", func(t *testing.T) {
		p := &proxy{b: cacheAware(t, 3), loads: make([]int, 3)}
		var picks []int
		for i := range 24 {
			picks = append(picks, p.send(&routing.Context{Prompt: systemPrompt + question(i)}, routing.All(3)))
		}
		c := tally(picks, 3)
		t.Logf("24 requests in flight: counts %v, picks %v", c, picks)
		// The guard lets the warm replica run at most 2 ahead of the idle
		// ones (and 50% ahead of busy ones), so 24 in flight end up 8/8/8
		// give or take the margin.
		for i, v := range c {
			if v < 6 || v > 10 {
				t.Fatalf("counts %v (replica %d has %d): want each within 6..10, picks %v", c, i, v, picks)
			}
		}
		d := p.b.(routing.DecisionCounter).Decisions()
		if d[routing.DecisionLoadSpill] == 0 || d[routing.DecisionAffinityHit] == 0 {
			t.Fatalf("decisions %v: want both affinity hits and load spills", d)
		}
	})
	t.Run("concurrent goroutines", func(t *testing.T) {
		b := cacheAware(t, 3)
		var mu sync.Mutex
		loads := make([]int, 3)
		counts := make([]int, 3)
		var picked, done sync.WaitGroup
		picked.Add(24)
		done.Add(24)
		for i := range 24 {
			go func() {
				defer done.Done()
				ctx := &routing.Context{Prompt: systemPrompt + question(i)}
				// The pick and the count it leads to are one step, as
				// if the proxy's in-flight counter were read and raised
				// atomically: otherwise picks racing on the same
				// counts make any bound a matter of scheduling. The
				// tree's Observe runs outside, concurrently with other
				// picks.
				mu.Lock()
				tg := b.Pick(ctx, slices.Clone(loads), routing.All(3))
				loads[tg]++
				counts[tg]++
				mu.Unlock()
				b.Observe(tg, ctx)
				picked.Done()
				picked.Wait() // every request is in flight before any ends
				mu.Lock()
				loads[tg]--
				mu.Unlock()
			}()
		}
		done.Wait()
		t.Logf("24 concurrent requests: counts %v", counts)
		// Observations racing with picks may be missed (a pick then
		// balances on load alone), which only spreads further: the
		// guard's bounds of the sequential case hold, give or take one.
		for i, v := range counts {
			if v < 5 || v > 11 {
				t.Fatalf("counts %v: replica %d got %d of 24", counts, i, v)
			}
		}
	})
	t.Run("waves that drain keep spreading", func(t *testing.T) {
		p := &proxy{b: cacheAware(t, 3), loads: make([]int, 3)}
		total := make([]int, 3)
		for wave := range 10 {
			var inflight []int
			for i := range 24 {
				tg := p.send(&routing.Context{Prompt: systemPrompt + question(wave*100+i)}, routing.All(3))
				inflight = append(inflight, tg)
				total[tg]++
				if i%3 == 2 { // the oldest request ends now and then
					p.finish(inflight[0])
					inflight = inflight[1:]
				}
			}
			for _, tg := range inflight {
				p.finish(tg)
			}
		}
		t.Logf("10 waves of 24: counts %v", total)
		for i, v := range total {
			if v < 40 {
				t.Fatalf("after 240 requests counts %v: replica %d starved", total, i)
			}
		}
	})
}

// TestCacheAwareConversationStaysPut: every turn of a conversation extends
// the previous turn's prompt, so it lands where the conversation started,
// even with other conversations in flight.
func TestCacheAwareConversationStaysPut(t *testing.T) {
	p := &proxy{b: cacheAware(t, 3), loads: make([]int, 3)}
	const convs, turns = 6, 8
	history := make([]string, convs)
	home := make([]int, convs)
	for c := range convs {
		history[c] = fmt.Sprintf("system: persona %d. %s", c, strings.Repeat("context ", 20))
	}
	for turn := range turns {
		var inflight []int
		for c := range convs {
			history[c] += fmt.Sprintf("\nuser: turn %d of conversation %d", turn, c)
			tg := p.send(&routing.Context{Prompt: history[c]}, routing.All(3))
			if turn == 0 {
				home[c] = tg
			} else if tg != home[c] {
				t.Fatalf("conversation %d turn %d went to %d, started on %d (loads %v)", c, turn, tg, home[c], p.loads)
			}
			history[c] += "\nassistant: an answer"
			inflight = append(inflight, tg)
			if len(inflight) > 2 { // at most 3 requests in flight
				p.finish(inflight[0])
				inflight = inflight[1:]
			}
		}
		for _, tg := range inflight {
			p.finish(tg)
		}
	}
	if c := tally(home, 3); slices.Contains(c, 0) {
		t.Fatalf("conversations started on %v: a replica got none", home)
	}
}

func TestCacheAwareEligibility(t *testing.T) {
	prompt := systemPrompt + question(1)
	warm := func(t *testing.T, n, target int) routing.Balancer {
		b := cacheAware(t, n)
		b.Observe(target, &routing.Context{Prompt: systemPrompt + question(0)})
		return b
	}
	tests := []struct {
		name  string
		warm  int
		loads []int
		el    routing.Set
		want  int
	}{
		// A replica that takes no traffic drains to an empty queue; counting
		// its zero would make the warm replica look overloaded (3 > 0+2).
		{"dead replica's empty queue does not attract the spill", 0, []int{3, 3, 0}, eligibleOf(0, 1), 0},
		{"the spill goes to the least-loaded eligible target", 0, []int{6, 3, 0}, eligibleOf(0, 1), 1},
		{"warm but ineligible replica loses its affinity", 0, []int{0, 5, 1}, eligibleOf(1, 2), 2},
		{"warm but ineligible, loads unknown: cold eligible targets take turns", 0, nil, eligibleOf(1, 2), 1},
		{"nothing eligible weighs every target", 1, []int{0, 0, 0}, routing.Set{}, 1},
		{"eligible only above n weighs every target", 2, []int{0, 0, 0}, eligibleOf(7, 100), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := warm(t, 3, tt.warm)
			if got := b.Pick(&routing.Context{Prompt: prompt}, tt.loads, tt.el); got != tt.want {
				t.Fatalf("Pick = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestCacheAwareLoadGuard pins the exact margins: the warm target (0) keeps
// the request unless its load exceeds BOTH min+abs and rel*min, strictly.
func TestCacheAwareLoadGuard(t *testing.T) {
	const maxInt = math.MaxInt
	tests := []struct {
		name     string
		abs      int
		rel      float64
		loads    []int
		want     int
		decision string
	}{
		{"loads unknown: affinity stands", 0, 0, nil, 0, routing.DecisionAffinityHit},
		{"wrong-length loads count as unknown", 0, 0, []int{9, 0, 0, 0}, 0, routing.DecisionAffinityHit},
		{"idle", 0, 0, []int{0, 0}, 0, routing.DecisionAffinityHit},
		{"2 ahead of idle is not an imbalance", 0, 0, []int{2, 0}, 0, routing.DecisionAffinityHit},
		{"3 vs 0 spills", 0, 0, []int{3, 0}, 1, routing.DecisionLoadSpill},
		{"5 vs 3: abs margin not exceeded", 0, 0, []int{5, 3}, 0, routing.DecisionAffinityHit},
		{"6 vs 3 spills", 0, 0, []int{6, 3}, 1, routing.DecisionLoadSpill},
		{"10 vs 7: only the abs margin exceeded", 0, 0, []int{10, 7}, 0, routing.DecisionAffinityHit},
		{"11 vs 7 spills", 0, 0, []int{11, 7}, 1, routing.DecisionLoadSpill},
		{"min+abs saturates instead of overflowing", 0, 0, []int{maxInt, maxInt - 1}, 0, routing.DecisionAffinityHit},
		{"huge load vs idle spills", 0, 0, []int{maxInt, 0}, 1, routing.DecisionLoadSpill},
		{"custom abs 5: 5 vs 0 pins", 5, 1.0001, []int{5, 0}, 0, routing.DecisionAffinityHit},
		{"custom abs 5: 6 vs 0 spills", 5, 1.0001, []int{6, 0}, 1, routing.DecisionLoadSpill},
		{"custom abs huge saturates", maxInt, 0, []int{maxInt, 1}, 0, routing.DecisionAffinityHit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBalancer(t, routing.Spec{Strategy: routing.CacheAware, BalanceAbs: tt.abs, BalanceRel: tt.rel}, 2)
			b.Observe(0, &routing.Context{Prompt: systemPrompt})
			if got := b.Pick(&routing.Context{Prompt: systemPrompt + question(3)}, tt.loads, routing.All(2)); got != tt.want {
				t.Fatalf("Pick = %d, want %d", got, tt.want)
			}
			d := b.(routing.DecisionCounter).Decisions()
			if d[tt.decision] != 1 {
				t.Fatalf("decisions %v, want one %s", d, tt.decision)
			}
		})
	}
}

func TestCacheAwareThresholdAndFallbacks(t *testing.T) {
	half := strings.Repeat("a", 50)
	tests := []struct {
		name      string
		threshold float64
		observe   map[int]string
		prompt    string
		loads     []int
		el        routing.Set
		want      []int
		decision  string
	}{
		{"exactly the threshold pins", 0, map[int]string{1: half}, half + strings.Repeat("b", 50), []int{0, 2, 0}, routing.All(3), []int{1}, routing.DecisionAffinityHit},
		{"just below falls back to least load, least warmed among the tied", 0, map[int]string{1: half[:49]}, half + strings.Repeat("b", 50), []int{4, 0, 0}, routing.All(3), []int{2}, routing.DecisionLeastLoad},
		{"least load, equally warm ties rotate", 0, nil, "x", []int{4, 1, 1}, routing.All(3), []int{1, 2, 1}, routing.DecisionLeastLoad},
		{"least load, a unique minimum wins", 0, map[int]string{0: "zzz"}, "x", []int{0, 1, 1}, routing.All(3), []int{0, 0}, routing.DecisionLeastLoad},
		{"custom threshold", 0.9, map[int]string{1: half}, half + strings.Repeat("b", 50), []int{3, 2, 0}, routing.All(3), []int{2}, routing.DecisionLeastLoad},
		{"best is the first strict maximum", 0, map[int]string{0: "abcdef", 2: "abcdef"}, "abcdef!", []int{0, 0, 0}, eligibleOf(2, 0), []int{0}, routing.DecisionAffinityHit},
		{"all cold, loads unknown: round robin", 0, nil, "abc", nil, routing.All(3), []int{0, 1, 2, 0}, routing.DecisionCold},
		{"round robin over eligible only", 0, nil, "", nil, eligibleOf(0, 2), []int{0, 2, 0, 2}, routing.DecisionCold},
		{"one cold target: round robin", 0, map[int]string{0: "zzz", 1: "yyy"}, "abc", nil, routing.All(3), []int{0, 1, 2}, routing.DecisionCold},
		{"all warm: least warmed, first minimum", 0, map[int]string{0: "zzz", 1: "yyy", 2: "xxx"}, "abc", nil, routing.All(3), []int{0, 0}, routing.DecisionLeastWarmed},
		{"no prompt, loads known", 0, map[int]string{0: "zzz"}, "", []int{1, 0, 2}, routing.All(3), []int{1}, routing.DecisionLeastLoad},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBalancer(t, routing.Spec{Strategy: routing.CacheAware, Threshold: tt.threshold}, 3)
			for i := range 3 {
				if s, ok := tt.observe[i]; ok {
					b.Observe(i, &routing.Context{Prompt: s})
				}
			}
			var got []int
			for range tt.want {
				got = append(got, b.Pick(&routing.Context{Prompt: tt.prompt}, tt.loads, tt.el))
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("picks %v, want %v", got, tt.want)
			}
			if d := b.(routing.DecisionCounter).Decisions(); d[tt.decision] != uint64(len(tt.want)) {
				t.Fatalf("decisions %v, want %d %s", d, len(tt.want), tt.decision)
			}
		})
	}
}

func TestCacheAwareStats(t *testing.T) {
	b := newBalancer(t, routing.Spec{Strategy: routing.CacheAware, MaxTrieNodes: 1000}, 2)
	for i := range 50 {
		b.Observe(1, &routing.Context{Prompt: systemPrompt[:400] + question(i)})
	}
	b.Observe(0, &routing.Context{Prompt: "hello"})
	b.Observe(0, &routing.Context{Prompt: "hello"}) // re-observed: no growth
	b.Observe(0, &routing.Context{})                // ignored
	b.Observe(5, &routing.Context{Prompt: "x"})     // out of range: ignored
	b.Observe(-1, &routing.Context{Prompt: "x"})
	st := b.(routing.TrieStats).TrieStats()
	if len(st) != 2 {
		t.Fatalf("TrieStats = %+v, want 2 entries", st)
	}
	if st[0] != (routing.TreeStats{Nodes: 5, Prompts: 1}) {
		t.Fatalf("target 0: %+v", st[0])
	}
	if st[1].Nodes > 1000 || st[1].Evictions == 0 || st[1].Nodes < 900 {
		t.Fatalf("target 1: %+v, want a full tree within the 1000-node ceiling and evictions", st[1])
	}
	// The shared system prompt survives eviction: a new question still pins.
	if got := b.Pick(&routing.Context{Prompt: systemPrompt[:400] + question(999)}, []int{0, 0}, routing.All(2)); got != 1 {
		t.Fatalf("Pick = %d, want 1", got)
	}
}
