package routing

import (
	"container/heap"
	"math"
	"time"
)

// Answers that come back whole. A client that does not stream gets its
// answer in one body, at completion: the proxy sees no first token. Left
// pending until then, such a request counted as queued prefill through its
// whole decode, and its end-to-end latency taught the law as if it were a
// first token (rolter-sim, every client non-streaming: all four bounds on
// 13 of the 33 judged runs, the trace's TTFT mean 28 % up; docs/routing.md).
// So, once the law is fitted, such a request leaves the queue when the law
// predicts its first token (its due, set at Observe), and its answer
// teaches the law with its output tokens as a fifth input (lawDecode), so
// that the fit separates the decode from the first token. Before the law
// has a time scale it leaves the queue at once (see Observe).

// dueItem is an attempt's predicted first token: when, at which target,
// and the attempt (its context and dispatch order, which tell a later
// attempt with the same context apart).
type dueItem struct {
	at     time.Duration
	target int
	ctx    *Context
	seq    uint64
}

// dueHeap orders dueItems by time (container/heap).
type dueHeap []dueItem

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(dueItem)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = dueItem{} // drop the context
	*h = old[:len(old)-1]
	return x
}

// pushDueLocked schedules d; t.mu must be held.
func (t *predictedTTFT) pushDueLocked(d dueItem) {
	heap.Push(&t.dues, d)
	t.nextDue.Store(int64(t.dues[0].at))
}

// expireDue takes out of the queue every attempt whose first token was due
// by now, as if it had come then (its leave at its due), and keeps it
// until its answer (WholeAnswer, Abandon). Without one due, it costs an
// atomic load.
func (t *predictedTTFT) expireDue(now time.Duration) {
	if int64(now) < t.nextDue.Load() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.dues) > 0 && t.dues[0].at <= now {
		d := heap.Pop(&t.dues).(dueItem)
		e, ok := t.pending[d.target][d.ctx]
		if !ok || e.seq != d.seq {
			continue // answered, abandoned or sent again before its due
		}
		delete(t.pending[d.target], d.ctx)
		t.pendLocked(d.target, -1, -e.tokens, e.slot, d.at)
		t.answered[d.target][d.ctx] = e
	}
	next := int64(math.MaxInt64)
	if len(t.dues) > 0 {
		next = int64(t.dues[0].at)
	}
	t.nextDue.Store(next)
}

// WholeAnswer implements [TTFTObserver]: the attempt leaves the queue if
// its due had not come yet, and its latency, with its output tokens, teaches
// the law (unless its first token would not have: see FirstToken); its
// prompt token count teaches the bytes-per-token ratios. An answer whose
// output tokens are not known teaches the law nothing: its latency cannot
// be split.
func (t *predictedTTFT) WholeAnswer(target int, ctx *Context, latency time.Duration, promptTokens, outputTokens int) {
	e, ok := t.take(target, ctx, true)
	if !ok || latency < 0 {
		return
	}
	t.wholeN.Add(1)
	if !(e.blind && t.peerHeard.Load() >= 0 || e.slot || e.unseen) && outputTokens > 0 {
		x := e.x
		x[lawDecode] = float64(outputTokens-1) / 1000 // the tokens after the first
		t.fit(x, float64(latency)/float64(time.Millisecond))
	}
	t.learnRatios(e, promptTokens)
}
