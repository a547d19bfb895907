package routing

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"rolter.dev/pkg/chunkindex"
)

// A request that extends an earlier prompt gives its return time: since
// that prompt was last sent or, later, answered; the longest earlier prompt
// it extends counts, and a request extending none is new.
func TestReturnLogLearnsReturnTimes(t *testing.T) {
	r := newReturnLog()
	r.sent([]uint64{1, 2, 3}, 0)
	if _, ok := r.extendedShare(); ok {
		t.Fatal("a share before any return")
	}
	r.sent([]uint64{1, 2}, 50) // extends nothing sent whole: new
	r.answered(3, 100)
	r.sent([]uint64{1, 2, 3, 4, 5}, 400) // extends {1,2,3}, answered at 100
	r.sent([]uint64{9}, 500)
	share, ok := r.extendedShare()
	if !ok || share != 0.25 {
		t.Fatalf("extended share %v (%v), want 1 of 4 requests", share, ok)
	}
	if got := r.laterThan(300); got != 1 {
		t.Fatalf("P(return ≥ 300) = %v, want 1: the return took 300 since the answer", got)
	}
	if got := r.laterThan(301); got != 0 {
		t.Fatalf("P(return ≥ 301) = %v, want 0", got)
	}
	r.sent([]uint64{1, 2, 3, 4, 5, 6, 7}, 1000) // extends the longer {1..5}, sent at 400
	if got := r.laterThan(600); got != 0.5 {
		t.Fatalf("P(return ≥ 600) = %v, want 1 of the returns 300 and 600", got)
	}
}

// The return times are a window of the latest rateWindow, and the prompts
// remembered are bounded: one sent returnMemory prompts ago is forgotten.
func TestReturnLogIsBounded(t *testing.T) {
	r := newReturnLog()
	rng := rand.New(rand.NewPCG(1, 2))
	r.sent([]uint64{7}, 0)
	n := rateWindow + 10
	times := rng.Perm(n) // returns 1 .. n, in random order
	for k, d := range times {
		r.sent([]uint64{7, uint64(1000 + k)}, int64(d+1))
	}
	// The window holds the latest rateWindow of the returns.
	want := 0
	for _, d := range times[n-rateWindow:] {
		if d+1 >= n/2 {
			want++
		}
	}
	if got, w := r.laterThan(int64(n/2)), float64(want)/rateWindow; got != w {
		t.Fatalf("P(return ≥ %d) = %v, want %v over the latest %d", n/2, got, w, rateWindow)
	}
	if share, _ := r.extendedShare(); share != 1 {
		t.Fatalf("extended share %v, want 1: each of the latest %d extended", share, rateWindow)
	}
	for k := range returnMemory {
		r.sent([]uint64{uint64(1 << 40), uint64(1<<40 + 1 + k)}, int64(n+k))
	}
	r.sent([]uint64{7, 99}, int64(n+returnMemory))
	if share, _ := r.extendedShare(); share == 1 {
		t.Fatal("a prompt sent returnMemory prompts ago was remembered")
	}
}

// A pick pays for the followers a target will make prefill the prompt
// again because its cache turns over before they come back. Target 0
// holds the first 256 tokens of a 4,256-token prompt and has just been
// sent a cache's worth of other prompts (it keeps a prefix about 2 s);
// target 1 was filled 20 s ago and nothing since. Under the simulator's
// law the request costs 237 ms at target 0 and 267 ms at target 1 (its
// whole prefill and the waste of a second copy of the held part) before
// the forget term. When requests came back 10 s after the prompts they
// extend, a follower would find the prompt gone from target 0: 10 of the
// 31 requests extended one, 69 ms more there, and the request goes to
// target 1. When they came back within 0.5 s, both keep it long enough,
// and it stays with the prefix.
func TestPredictedTTFTForgetSendsPromptsWhereTheyAreKept(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		returnAfter time.Duration
		want        int
	}{{10 * time.Second, 1}, {500 * time.Millisecond, 0}} {
		now := time.Duration(0)
		b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1}, KVCapacityTokens: []int{1000, 1000},
			Now: func() time.Duration { return now }})
		if err != nil {
			t.Fatal(err)
		}
		p := b.(*predictedTTFT)
		send := func(target int, prompt string) {
			c := &Context{Prompt: prompt}
			p.Observe(target, c)
			p.FirstToken(target, c, 10*time.Millisecond, len(prompt)/4)
		}
		fill := func(target int) { // more than the target's 62 chunks
			for range 5 {
				send(target, randomPrompt(rng, 1024))
			}
		}
		fill(1)
		type turn struct {
			at     time.Duration
			prompt string
		}
		var turns []turn
		for k := range 10 {
			first := randomPrompt(rng, 1024)
			at := time.Second + time.Duration(k)*100*time.Millisecond
			turns = append(turns, turn{at, first}, turn{at + tc.returnAfter, first + randomPrompt(rng, 512)})
		}
		for len(turns) > 0 { // in time order
			k := 0
			for j := range turns {
				if turns[j].at < turns[k].at {
					k = j
				}
			}
			now = turns[k].at
			send(0, turns[k].prompt)
			turns = append(turns[:k], turns[k+1:]...)
		}
		now = 18 * time.Second
		fill(0)
		held := randomPrompt(rng, 1024)
		now = 19900 * time.Millisecond
		send(0, held)
		now = 20 * time.Second
		p.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples}) // the first tokens above taught nothing of it
		if got := p.Pick(&Context{Prompt: held + randomPrompt(rng, 16000)}, nil, Set{}); got != tc.want {
			t.Fatalf("requests returning after %v: picked %d, want %d", tc.returnAfter, got, tc.want)
		}
	}
}

// Behind an L4 spread a conversation's turns go through different proxies,
// and each proxy's log would see one turn in P. A proxy marks in what it
// publishes where the prompts it sent and saw answered end; its peer folds
// the rest into its index and remembers the ends, so the next turn through
// the peer is a return, timed from the answer the peer heard of.
func TestPredictedTTFTForgetHearsPeersPromptEnds(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	now := time.Second
	var queued []int
	newPeer := func() *predictedTTFT {
		b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1}, Now: func() time.Duration { return now },
			Share: func(target int, _ string) { queued = append(queued, target) }})
		if err != nil {
			t.Fatal(err)
		}
		return b.(*predictedTTFT)
	}
	a, b := newPeer(), newPeer()
	first := &Context{Prompt: randomPrompt(rng, 4000)}
	a.Observe(0, first)
	a.FirstToken(0, first, 20*time.Millisecond, 1000)
	now += time.Second
	a.Learn(0, first, 0, time.Second)
	var published []uint64
	for range queued {
		published = a.RecordLocal(0, first.Prompt, published)
	}
	if !slices.Contains(published, promptEnd) {
		t.Fatal("the published hashes mark no prompt end")
	}
	now += 100 * time.Millisecond
	b.FoldPeer(0, published)
	if got, want := b.index.Stats(0).Chunks, len(chunkindex.Hashes(nil, first.Prompt)); got != want {
		t.Fatalf("the peer's index holds %d hashes, want the prompt's %d and no mark", got, want)
	}
	now += 2 * time.Second
	b.Observe(1, &Context{Prompt: first.Prompt + randomPrompt(rng, 400)})
	if share, ok := b.returns.extendedShare(); !ok || share != 1 {
		t.Fatalf("extended share %v (%v), want the next turn through the peer to be a return", share, ok)
	}
	if got := b.returns.laterThan(int64(2 * time.Second)); got != 1 {
		t.Fatalf("P(return ≥ 2 s) = %v, want 1: 2 s since the peer heard of the answer", got)
	}
	if got := b.returns.laterThan(int64(2*time.Second + 1)); got != 0 {
		t.Fatalf("P(return > 2 s) = %v, want 0", got)
	}
}

// FuzzFoldPromptEnds feeds foldPromptEnds a peer's hashes as any bytes: what
// reaches the index is never a mark, keeps the order of the hashes no mark
// precedes, and each marked end is remembered.
func FuzzFoldPromptEnds(f *testing.F) {
	f.Add([]byte{})
	f.Add(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 7), promptEnd))
	f.Add(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 7), promptEnd), 9))
	f.Fuzz(func(t *testing.T, data []byte) {
		var chunks []uint64
		for len(data) >= 8 {
			chunks = append(chunks, binary.LittleEndian.Uint64(data))
			data = data[8:]
		}
		in := slices.Clone(chunks)
		r := newReturnLog()
		out := r.foldPromptEnds(chunks, 1)
		if !slices.Equal(chunks, in) {
			t.Fatal("the peer's hashes were changed in place")
		}
		var want, ends []uint64
		for k := 0; k < len(in); k++ {
			switch {
			case in[k] != promptEnd:
				want = append(want, in[k])
			case k+1 < len(in):
				ends = append(ends, in[k+1])
				k++
			}
		}
		if !slices.Equal(out, want) {
			t.Fatalf("folded %v, want %v", out, want)
		}
		for _, e := range ends {
			if _, ok := r.slots[e]; !ok {
				t.Fatalf("the marked end %x was not remembered", e)
			}
		}
	})
}
