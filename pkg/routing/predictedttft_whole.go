package routing

import (
	"container/heap"
	"math"
	"sync/atomic"
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
		if at := t.answeredDue[d.target].Load(); at < 0 || int64(e.due) < at {
			t.answeredDue[d.target].Store(int64(e.due))
		}
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
	t.lastBack[target].Store(int64(t.now()))
	t.longWhole.add(latency)
	t.wholeN.Add(1)
	if !t.teachesNothing(&e) && outputTokens > 0 {
		x := e.x
		x[lawDecode] = float64(outputTokens-1) / 1000 // the tokens after the first
		t.fit(x, float64(latency)/float64(time.Millisecond))
	}
	t.learnRatios(e, promptTokens)
}

// answeredDueLocked finds the earliest due of target's attempts that left
// the queue at their due without an answer yet; t.mu must be held.
func (t *predictedTTFT) answeredDueLocked(target int) {
	earliest := int64(-1)
	for _, e := range t.answered[target] {
		if earliest < 0 || int64(e.due) < earliest {
			earliest = int64(e.due)
		}
	}
	t.answeredDue[target].Store(earliest)
}

// silence is how long target i has sent nothing back (no first token, no
// completion) while owing answers past their due, since the earliest of
// those dues or the latest answer there, whichever is later, beyond twice
// the longest whole answer lately (long, ms; see longestAnswer); 0 when it has
// not, and when no whole answer has come yet. It is overdue's counterpart
// for clients that do not stream: their requests leave the queue at a
// predicted first token, so a replica that froze (its connections open,
// nothing answered) showed no late head and kept drawing its prefixes'
// traffic (rolter-outage, a replica frozen for 8 s under clients 7 in 8
// of which do not stream: 5–8 requests failed against 2–3 with whole
// answers left queued; docs/routing.md). The margin is the longest answer,
// not the mean: answers are long-tailed (a prefix not cached yet, a long
// output), and against twice the mean a replica busy with one of them
// looked silent, and its prefix's next requests went elsewhere (through
// real proxies, 16 clients: 16,608 prefill tokens against 12,672).
func (t *predictedTTFT) silence(i int, now time.Duration, long float64) float64 {
	due := t.answeredDue[i].Load()
	if due < 0 || long <= 0 {
		return 0
	}
	waited := float64(int64(now)-max(due, t.lastBack[i].Load())) / float64(time.Millisecond)
	return max(0, waited-2*long)
}

// longestAnswer is the longest of a kind of answer (ns) since the latest
// rates' snapshot (see snapshotLocked) and in the step before it: over the
// latest rateStep to 2 × rateStep arrivals.
type longestAnswer struct{ cur, prev atomic.Int64 }

// add counts an answer that took d.
func (l *longestAnswer) add(d time.Duration) { raise(&l.cur, int64(d)) }

// step starts a new step (at each snapshot).
func (l *longestAnswer) step() { l.prev.Store(l.cur.Swap(0)) }

// ms is the longest (ms) over the current step and the one before; 0
// before any.
func (l *longestAnswer) ms() float64 {
	return float64(max(l.cur.Load(), l.prev.Load())) / float64(time.Millisecond)
}

// withoutQuiet returns el without its quiet targets (see quiet), or el when
// every one is. It stands in for overdue and silence while the law has no
// time scale to price a stall in: where prefill is fast, the law may never
// fit (its own-prefill weight stays within its noise), and a replica that
// froze kept drawing the traffic of the prefixes it held, which waited
// there until the client gave up (rolter-outage, a replica frozen for 8 s:
// 22–26 requests failed; docs/operations.md).
func (t *predictedTTFT) withoutQuiet(el Set, now time.Duration) Set {
	first, whole := t.longFirst.ms(), t.longWhole.ms()
	if first <= 0 && whole <= 0 {
		return el
	}
	var quiet Set
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			if i := wi*64 + bitIndex(w); t.quiet(i, now, first, whole) {
				quiet.Add(i)
			}
		}
	}
	if rest := el.without(quiet); !quiet.Empty() && !rest.Empty() {
		return rest
	}
	return el
}

// quiet reports whether target i has sent nothing back (no first token,
// no completion) for more than twice the longest wait lately (ms; see
// longestAnswer) for the answers it owes this balancer (see owed): first tokens
// (first) for the pending, whole answers (whole) for those past their due.
func (t *predictedTTFT) quiet(i int, now time.Duration, first, whole float64) bool {
	since, owesWhole := t.owed(i)
	margin := first
	if owesWhole {
		margin = max(margin, whole)
	}
	if since < 0 || margin <= 0 {
		return false
	}
	return float64(int64(now)-since)/float64(time.Millisecond) > 2*margin
}

// owed returns when target i last answered while owing this balancer an
// answer: the later of the oldest pending attempt's dispatch or the
// earliest due of those past it, and the target's latest answer (ns; -1
// when it owes none), and whether whole answers past their due are among
// the owed.
func (t *predictedTTFT) owed(i int) (since int64, whole bool) {
	oldest := t.headAt[i].Load()
	if at := t.answeredDue[i].Load(); at >= 0 {
		whole = true
		if oldest < 0 || at < oldest {
			oldest = at
		}
	}
	if oldest < 0 {
		return -1, whole
	}
	return max(oldest, t.lastBack[i].Load()), whole
}

// Silent implements [SilenceReporter].
func (t *predictedTTFT) Silent(dst []time.Duration) []time.Duration {
	now := t.now()
	t.expireDue(now)
	for i := range t.n {
		var d time.Duration
		if since, _ := t.owed(i); since >= 0 {
			d = max(0, now-time.Duration(since))
		}
		dst = append(dst, d)
	}
	return dst
}
