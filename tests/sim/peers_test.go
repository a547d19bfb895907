package sim

import (
	"math/rand/v2"
	"testing"
	"time"

	"rolter.dev/tests/vllmsim"
)

func flight(msgs ...Message) *Flight {
	r := &Request{Messages: msgs, Output: 1}
	return &Flight{Req: r, Ctx: RouteContext(r, false)}
}

func userMsg(key uint64, n int) Message {
	return Message{Role: "user", Content: []Segment{{Key(key), n}}}
}

func view(loads ...int) *View {
	return &View{Loads: loads, Waiting: make([]int, len(loads)), BlockSize: 16}
}

// observe routes f to target through p, as the simulator does right after
// p.Pick(f).
func observe(p Policy, target int, f *Flight, v *View) {
	f.Target = target
	p.Observe(target, f, v)
}

func TestSGLangPolicy(t *testing.T) {
	s := newSGLang(4, rand.New(rand.NewPCG(1, 1)))
	warm := flight(userMsg(1, 400))
	s.Pick(warm, view(0, 0, 0, 0))
	observe(s, 2, warm, view(0, 0, 0, 0))
	again := flight(userMsg(1, 400), userMsg(2, 10)) // shares ~97 % of its text with warm
	for _, tc := range []struct {
		name  string
		loads []int
		want  int
	}{
		{"balanced: best match", []int{3, 0, 9, 0}, 2},
		{"abs gap 64 not exceeded", []int{0, 1, 64, 1}, 2},
		{"imbalanced: shortest queue", []int{5, 1, 70, 3}, 1},
	} {
		if got := s.Pick(again, view(tc.loads...)); got != tc.want {
			t.Errorf("%s: picked %d, want %d", tc.name, got, tc.want)
		}
	}
	// A match below 30 % of the text goes to the least-loaded worker.
	low := flight(userMsg(1, 100), userMsg(3, 400))
	if got := s.Pick(low, view(3, 1, 0, 2)); got != 2 {
		t.Errorf("low match: picked %d, want 2 (least loaded)", got)
	}
	if got := s.Pick(low, view(3, 1, 2, 0)); got != 3 {
		t.Errorf("low match: picked %d, want 3 (least loaded)", got)
	}
}

func TestAIBrixPolicy(t *testing.T) {
	a := newAIBrix(4, rand.New(rand.NewPCG(1, 1)))
	warm := flight(userMsg(1, 200))
	v := view(0, 0, 0, 0)
	a.Pick(warm, v)
	observe(a, 0, warm, v)
	again := flight(userMsg(1, 200), userMsg(2, 5))
	// Equal loads: mean 1, stddev 0, the matching pod qualifies.
	if got := a.Pick(again, view(1, 1, 1, 1)); got != 0 {
		t.Errorf("equal loads: picked %d, want 0", got)
	}
	// Loads 1,0,0,0: mean 0.25 + stddev 0.43 < 1, the match is skipped
	// for a least-loaded pod.
	if got := a.Pick(again, view(1, 0, 0, 0)); got == 0 {
		t.Error("an over-loaded matching pod was picked")
	}
	// The imbalance gate (max 20 > 2*(5+1) and gap >= 8) restricts matching
	// to the least-loaded pods.
	if got := a.Pick(again, view(20, 0, 0, 0)); got == 0 {
		t.Error("the gate did not fire")
	}
	// A pod within mean + 1 stddev keeps its match: loads 2,1,1,2 have
	// mean 1.5 and stddev 0.5.
	if got := a.Pick(again, view(2, 1, 1, 2)); got != 0 {
		t.Errorf("picked %d, want the matching pod 0 (2 <= 1.5 + 0.5)", got)
	}
}

func TestDynamoPolicy(t *testing.T) {
	d := newDynamo(2, 16, rand.New(rand.NewPCG(1, 1)))
	v := view(0, 0)
	warm := flight(userMsg(1, 320))
	d.Pick(warm, v)
	observe(d, 0, warm, v)
	d.FirstToken(warm, 0)
	d.Done(warm, 0)
	again := flight(userMsg(1, 320), userMsg(2, 16))
	if got := d.Pick(again, v); got != 0 || d.overlap[0] != 20 || d.overlap[1] != 0 {
		t.Fatalf("picked %d with overlaps %v, want 0 with 20 blocks", got, d.overlap)
	}
	// The cost: worker 0 saves 20 prefill blocks; loading it with more than
	// 20 extra active blocks moves the request to worker 1.
	busy := flight(userMsg(9, 16*30))
	d.Pick(busy, v)
	observe(d, 0, busy, v)
	d.FirstToken(busy, 0)
	if got := d.Pick(again, v); got != 1 {
		t.Fatalf("picked %d, want 1: costs %v", got, d.costs)
	}
	// Blocks expire after 120 s.
	d.Done(busy, 0)
	v.Now = 121 * time.Second
	d.Pick(again, v)
	if d.overlap[0] != 0 {
		t.Fatalf("overlap %d after the TTL", d.overlap[0])
	}
}

func TestLLMDPolicy(t *testing.T) {
	l := newLLMD(3, rand.New(rand.NewPCG(1, 1)))
	v := view(0, 0, 0)
	warm := flight(userMsg(1, 300))
	l.Pick(warm, v)
	observe(l, 1, warm, v)
	again := flight(userMsg(1, 300), userMsg(2, 20))
	// Pod 1: prefix ~0.9*2 + queue 1 + active 0 (it has the only request);
	// the others: 0 + 1 + 1. The prefix wins.
	if got := l.Pick(again, v); got != 1 {
		t.Fatalf("picked %d, want 1; scores %v", got, l.scores)
	}
	// A queue on pod 1 makes its queue score 0: 1.8 + 0 + 0 < 2.
	v.Waiting[1] = 3
	if got := l.Pick(again, v); got == 1 {
		t.Fatalf("picked the queued pod; scores %v", l.scores)
	}
	l.Done(warm, 0)
	// The LRU forgets the oldest blocks past its capacity.
	s := newLRUSet(2)
	s.add(1)
	s.add(2)
	s.add(1)
	if old, ok := s.add(3); !ok || old != 2 {
		t.Fatalf("evicted %d %v, want 2", old, ok)
	}
}

func TestOraclePolicy(t *testing.T) {
	caches := []*vllmsim.Cache{vllmsim.NewCache(16, 100, nil), vllmsim.NewCache(16, 100, nil), vllmsim.NewCache(16, 100, nil)}
	warm := flight(userMsg(1, 300))
	_, lease := caches[2].Admit(warm.Req.Tokens())
	caches[2].Release(lease)
	again := flight(userMsg(1, 300), userMsg(2, 40))
	for _, tc := range []struct {
		name   string
		greedy bool
		loads  []int
		want   int
	}{
		{"longest prefix", false, []int{1, 1, 2}, 2},
		{"guard: 4 > 1+2 and > 1.5", false, []int{1, 1, 4}, 0},
		{"greedy ignores load", true, []int{1, 1, 40}, 2},
	} {
		o := &oracle{n: 3, rng: rand.New(rand.NewPCG(1, 1)), greedy: tc.greedy, abs: oracleBalanceAbs, rel: oracleBalanceRel}
		v := &View{Loads: tc.loads, Waiting: make([]int, 3), Caches: caches, BlockSize: 16}
		if got := o.Pick(again, v); got != tc.want && !(tc.want == 0 && got == 1) {
			t.Errorf("%s: picked %d, want %d", tc.name, got, tc.want)
		}
	}
	// Nothing cached anywhere: the least loaded.
	o := &oracle{n: 3, rng: rand.New(rand.NewPCG(1, 1)), abs: 2, rel: 1.5}
	v := &View{Loads: []int{3, 0, 2}, Waiting: make([]int, 3), Caches: caches, BlockSize: 16}
	if got := o.Pick(flight(userMsg(7, 300)), v); got != 1 {
		t.Errorf("cold: picked %d, want 1", got)
	}
}
