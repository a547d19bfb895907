package routing

import (
	"math"
	"sync/atomic"
	"time"
)

// predicted_ttft on engines with a full batch: the wait for a batch slot,
// the delay a slot's holder causes, and the batch limits learned from the
// engines' counts.

// slotWaits sets wait[i], for each target i of el, to the time (ms) a
// request sent there now would wait for a batch slot, and slots[i] to its
// slots where it would wait. None until the
// engine has been seen full (requests waiting while others run: vLLM's
// max_num_seqs or its KV blocks reached); then, with s the target's slots
// (slotPlace) and k = running + waiting + 1 − s (the request's place among
// those waiting, counting the loads when they are higher: an engine's
// counts are scraped, the loads are current), the k-th of the s running
// requests to finish: k × hold / (s + 1), their remaining times spread
// evenly over hold, the mean time a request holds its slot (slotHold).
//
// Before any attempt has completed, hold is not known, and as far as the
// proxy knows a full engine could keep a request waiting for as long as
// its running requests decode, longer than any prefill: slotWaits then
// returns el without its full targets (all of el when every one is full).
// Otherwise it returns el.
//
// The prefill law cannot price this wait: it depends on how long the
// running requests decode, not on prompt tokens, and only once the batch
// is full. Without it predicted_ttft piled a group's prompts onto the
// replica holding their prefix past its batch limit (rolter-sim gsp
// --max-batch 16: TTFT mean 896 ms, p99 5,227 ms, against 236 and 4,122
// for the best peers; 205 and 1,092 with it when it was added;
// docs/routing.md).
func (t *predictedTTFT) slotWaits(el Set, loads []int, counts []engineCounts, wait, slots []float64) Set {
	if t.engine == nil {
		return el
	}
	hold := t.slotHold()
	free := el
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			k, s := t.slotPlace(i, loads, counts[i])
			if k > 0 {
				wait[i] = float64(k) * hold / float64(s+1)
				slots[i] = float64(s)
				free.Remove(i)
			}
		}
	}
	if hold > 0 || free.Empty() {
		return el
	}
	return free
}

// slotExternality is the delay that ownMS more of slot time at a full
// target (s slots, all taken) imposes on the requests that wait for its
// slots after this one. The extra time one slot is held passes to the next
// request waiting for a slot, and on along the queue: each request that
// arrives before the queue clears starts ownMS / s later on average (the
// target serves s at once). They are λ × clearMS × saturation: λ the
// fleet's mean arrivals per target and ms (as in externality), clearMS the
// time until this request has its first token (its slot wait and its own
// prefill), saturation the factor by which arrivals that keep finding the
// slots taken extend that (see slotSaturation). It is externality's
// argument for the batch slots, where queued prefill is not the
// bottleneck: in a fleet that stays full (a closed loop with more clients
// than slots) every prefill token a miss adds delays everyone after it,
// and the fastest first token for this request, at whichever replica frees
// a slot first, cost gsp at --max-batch 8 half its cache hits (87.6 % for
// the peers that wait for the holder, 40.5 % without this term, 76 % with
// it; docs/routing.md).
func slotExternality(ownMS, s, clearMS, lambda, saturation float64) float64 {
	if ownMS <= 0 || s <= 0 || saturation <= 0 {
		return 0
	}
	return ownMS / s * lambda * clearMS * saturation
}

// slotSaturation is 1 / (1 − f), f the share of first tokens over the
// rates' window (all of them until there is one) that waited for a batch
// slot, capped as utilisation is (maxUtilisation): the busy period of a
// queue whose arrivals wait that often, relative to the wait in sight, as
// in externality's 1 / (1 − ρ). 0 before any first token.
func (t *predictedTTFT) slotSaturation() float64 {
	b := t.means()
	n, free := t.firstN.Load(), t.freeN.Load()
	if n-b.firstN > 0 {
		n, free = n-b.firstN, free-b.freeN
	}
	if n <= 0 {
		return 0
	}
	f := min(max(1-float64(free)/float64(n), 0), maxUtilisation)
	return 1 / (1 - f)
}

// slotPlace returns a new request's place k among those waiting for a
// batch slot at target i (0: it would run at once) and the target's slots
// s, learned from the engine's counts (c, read for this pick): once requests have been seen
// waiting there while others ran, the most requests seen running there;
// for a target not seen full yet, the most seen running at any target that
// was (a fleet's replicas share their engine arguments), unless more than
// that already run at this one. The most ever seen running, not the
// running count while some waited: a request can wait one scheduler step
// with slots free, and a scrape that catches it must not set a limit below
// the real one (which the avoided replica would then never disprove). So
// a limit that shrinks with the KV cache is not seen: the slot wait then
// counts from the larger one. (A replica caught so before it ever ran more
// still gets too low a limit, raised as soon as it runs more.) While all its slots run, the engine's
// waiting requests beyond those this balancer marked are marked
// (markWaiting).
func (t *predictedTTFT) slotPlace(i int, loads []int, c engineCounts) (k, s int64) {
	if !c.ok {
		return 0, 0
	}
	waiting, running := c.waiting, c.running
	most := raise(&t.maxRunning[i], int64(running))
	if waiting > 0 && running > 0 && !t.seenFull[i].Load() {
		t.seenFull[i].Store(true)
	}
	if t.seenFull[i].Load() {
		s = most
		raise(&t.anySlots, s)
	} else if s = t.anySlots.Load(); s <= 0 || most > s {
		return 0, 0
	}
	if f := t.slotPend[i].Load(); int64(running) >= s && int64(waiting) > f && t.pendCount[i].Load() > f {
		t.markWaiting(i, waiting)
	}
	occupied := int64(running + waiting)
	if len(loads) == t.n {
		// The loads are current, the scrape is not. What the engine
		// counted beyond what the loads held then (the loads less this
		// balancer's own dispatches and completions since: through one
		// proxy, nothing) fades to what it usually does as its slots
		// turn over, one every hold / (s + 1) on average (staleExcess).
		load := int64(loads[i])
		if hold := t.slotHold(); hold > 0 {
			then := load - t.flights[i].since(c.at)
			excess := staleExcess(&t.slotExcess[i], float64(max(occupied-then, 0)), c.age, hold/float64(s+1))
			occupied = load + int64(math.Round(excess))
		}
		occupied = max(occupied, load)
	}
	return max(occupied+1-s, 0), s
}

// raise sets *a to v if v is larger and returns the larger of the two
// (a maximum kept without a lock).
func raise(a *atomic.Int64, v int64) int64 {
	for {
		old := a.Load()
		if v <= old {
			return old
		}
		if a.CompareAndSwap(old, v) {
			return v
		}
	}
}

// slotWaiter reports whether a request sent to target now (engine counts
// c) waits for a batch slot.
func (t *predictedTTFT) slotWaiter(target int, c engineCounts) bool {
	k, _ := t.slotPlace(target, nil, c)
	return k > 0
}

// markWaiting marks as waiting for a batch slot the newest of target i's
// pending requests, up to the engine's waiting count: they were sent before
// the engine was known to be full (the first to overflow it, or while its
// limit shrank with its KV cache), and their wait is not prefill.
func (t *predictedTTFT) markWaiting(i, waiting int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now, marked := t.now(), 0
	for int64(waiting) > t.slotPend[i].Load() {
		var newest *Context
		var e pendingPrefill
		for k, v := range t.pending[i] {
			if !v.slot && (newest == nil || v.seq > e.seq) {
				newest, e = k, v
			}
		}
		if newest == nil {
			break
		}
		e.slot = true
		t.pending[i][newest] = e
		t.slotPend[i].Add(1)
		marked++
	}
	// Those marked waited for a slot since they were sent, not for
	// prefill, but a scrape up to an interval old marks them late, and
	// until then they kept i's busy spell open: a spell that only they
	// kept open ended when the last request that prefilled there left.
	// Counted busy until the mark, a cold burst's overflow (the batch
	// limit not yet seen) made a target look saturated for the whole
	// rates' window, and the follow-up wait kept every new prefix off it:
	// rolter-sim gsp on 32 replicas at --max-batch 4, TTFT mean 267 ->
	// 200 ms (128 with live counts). Not once a peer is heard: the
	// engine's waiting count then holds the peers' requests too, the
	// marks are a guess, and the same run through 4 sharing proxies was
	// 4 % slower over five seeds (docs/routing.md, counts as old as their
	// scrape).
	if marked > 0 && !t.heardPeer() && t.prefilling(i) <= 0 {
		if since := t.busySince[i].Load(); since >= 0 {
			t.endSpellLocked(i, since, min(max(t.lastLeave[i].Load(), since), int64(now)))
		}
	}
	t.busyLocked(i, now)
}

// slotHold is the mean time (ms) a request holds its batch slot: from
// admission, its prefill (the TTFT of those that did not wait for a slot)
// and its decode (mean latency − mean TTFT), over the rates' window (see
// windowMean); 0 before both are known.
func (t *predictedTTFT) slotHold() float64 {
	b := t.means()
	done, okDone := windowMean(t.doneSum.Load(), t.doneN.Load(), b.done, b.doneN)
	first, okFirst := windowMean(t.firstSum.Load(), t.firstN.Load(), b.first, b.firstN)
	free, okFree := windowMean(t.freeSum.Load(), t.freeN.Load(), b.free, b.freeN)
	if !okDone || !okFirst || !okFree {
		return 0
	}
	return (max(done-first, 0) + free) / float64(time.Millisecond)
}
