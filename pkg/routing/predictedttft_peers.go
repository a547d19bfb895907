package routing

import (
	"math"
	"slices"
	"time"
)

// predicted_ttft among several proxies: the queues they report to one
// another, where each proxy's home targets are, and the arrivals around a
// peer's report gap.

// arriveLocked counts an own arrival at now for concurrent: the own
// arrivals within a peer's report gap before it, twice
// (each such pair is within the gap of both); t.mu must be held.
func (t *predictedTTFT) arriveLocked(now time.Duration) {
	gap := time.Duration(t.reportGap.Load())
	if gap <= 0 {
		return
	}
	near := 0
	for k := range min(t.recentN, recentArrivals) {
		at := t.recent[(t.recentN-1-k)%recentArrivals]
		if int64(now)-at >= int64(gap) {
			break
		}
		near++
	}
	t.recent[t.recentN%recentArrivals] = int64(now)
	t.recentN++
	t.closeSum += 2 * float64(near)
	t.closeN++
	t.concurrent.Store(math.Float64bits(t.closeSum / t.closeN))
}

// gapLocked learns the peers' report gap from peer's report at now: the
// mean time between a peer's consecutive reports, those under ttl apart (a
// longer silence is an idle peer, not its interval); t.peerMu must be
// held.
func (t *predictedTTFT) gapLocked(peer string, now, ttl time.Duration) {
	last, ok := t.peerLast[peer]
	t.peerLast[peer] = now
	if !ok || now <= last || now-last >= ttl {
		return
	}
	t.gapSum += float64(now - last)
	t.gapN++
	t.reportGap.Store(int64(t.gapSum / float64(t.gapN)))
}

// heardPeer reports whether a peer's queue report has been folded: the
// balancer is one of several sharing proxies.
func (t *predictedTTFT) heardPeer() bool { return t.peerHeard.Load() >= 0 }

// LocalQueue implements [SharedQueue].
func (t *predictedTTFT) LocalQueue(target int) QueueState {
	if target < 0 || target >= t.n {
		return QueueState{LeaveAge: -1, AnswerAge: -1}
	}
	now := t.now()
	t.expireDue(now)
	t.mu.Lock()
	defer t.mu.Unlock()
	q := QueueState{Requests: int(t.pendCount[target].Load()), Tokens: int(t.pendTokens[target].Load()), LeaveAge: -1, AnswerAge: -1}
	if at := t.headAt[target].Load(); at >= 0 {
		q.HeadTokens, q.HeadAge = int(t.headTokens[target].Load()), max(now-time.Duration(at), 0)
	}
	if at := t.lastLeave[target].Load(); at >= 0 {
		q.LeaveAge = max(now-time.Duration(at), 0)
	}
	if at := t.lastBack[target].Load(); at >= 0 {
		q.AnswerAge = max(now-time.Duration(at), 0)
	}
	return q
}

// PeerQueue implements [SharedQueue].
func (t *predictedTTFT) PeerQueue(target int) QueueState {
	if target < 0 || target >= t.n {
		return QueueState{LeaveAge: -1, AnswerAge: -1}
	}
	p := t.peersAt(target, t.now())
	return QueueState{Requests: int(p.requests), Tokens: int(p.tokens), LeaveAge: -1, AnswerAge: -1}
}

// FoldPeerQueue implements [SharedQueue]: the report's ages become instants
// on this balancer's clock (the trip from the peer, a millisecond or two,
// is not subtracted).
func (t *predictedTTFT) FoldPeerQueue(peer string, target int, q QueueState, ttl time.Duration) {
	if target < 0 || target >= t.n || ttl <= 0 {
		return
	}
	now := t.now()
	t.peerHeard.Store(int64(now))
	pq := peerQueue{requests: int64(max(q.Requests, 0)), tokens: int64(max(q.Tokens, 0)),
		headTokens: int64(max(q.HeadTokens, 0)), headAt: now - max(q.HeadAge, 0), until: now + ttl}
	if q.LeaveAge >= 0 {
		raise(&t.peerLeave[target], int64(now-q.LeaveAge))
	}
	if q.AnswerAge >= 0 {
		raise(&t.lastBack[target], int64(now-q.AnswerAge))
	}
	pq.at = now
	t.peerMu.Lock()
	t.gapLocked(peer, now, ttl)
	qs := t.peerQueues[peer]
	if qs == nil {
		qs = make([]peerQueue, t.n)
		for i := range qs {
			qs[i].until = -1
		}
		t.peerQueues[peer] = qs
	}
	prev := qs[target]
	qs[target] = pq
	t.sumPeersLocked(target, now)
	t.peerMu.Unlock()
	t.mu.Lock()
	t.busyLocked(target, now) // first: a spell left by an expired report ends at its expiry
	if pq.requests > 0 {
		raise(&t.peerBusyUntil[target], int64(pq.until))
	}
	t.markUnseenLocked(target, prev, pq, now)
	t.mu.Unlock()
}

// markUnseenLocked marks the requests this balancer sent to target that a
// peer's report (pq, received at now; prev the one before it) shows may
// have had that peer's work ahead of them that no report had shown at
// their dispatch: the peer's pending there grew since its previous report
// (or, when that one has expired, from nothing one report gap ago: a peer
// does not go on reporting an empty queue), and they were sent in between.
// Their features miss that work, and they teach the law nothing
// (FirstToken): through 4 sharing proxies in rolter-sim, the law learned
// from every first token was 156-212 ms per request on the Mooncake trace
// where the engines' truth is 5 (the features missed a mean 164 ms of
// peers' work), and from these alone 5.1 (docs/routing.md, the law through
// several proxies). FoldPeerQueue calls it with t.mu held, in the same
// section that counts the report as busy time, so a pick between the two
// sees both or neither.
func (t *predictedTTFT) markUnseenLocked(target int, prev, pq peerQueue, now time.Duration) {
	from, n, tok := prev.at, prev.requests, prev.tokens
	if prev.until < now {
		n, tok = 0, 0
		from = now - time.Duration(t.reportGap.Load())
	}
	if from >= now || pq.requests <= n && pq.tokens <= tok {
		return
	}
	for k, e := range t.pending[target] {
		if e.at > from && !e.unseen {
			e.unseen = true
			t.pending[target][k] = e
		}
	}
}

// isHome reports whether target i is home to the proxy of rank among size
// (see homeTie): i mod size is rank, or with fewer targets than proxies,
// i is rank mod the targets.
func (t *predictedTTFT) isHome(i, rank, size int) bool {
	if t.n < size {
		return i == rank%t.n
	}
	return i%size == rank
}

// placeOf returns this proxy's rank among the proxies serving the route and
// their number (SetPlace; 0, 1 when alone).
func (t *predictedTTFT) placeOf() (rank, size int) {
	p := t.place.Load()
	return int(p >> 32), max(int(uint32(p)), 1)
}

// SetPlace implements [SharedQueue].
func (t *predictedTTFT) SetPlace(rank, size int) {
	if size < 1 || rank < 0 || rank >= size {
		rank, size = 0, 1
	}
	t.place.Store(uint64(rank)<<32 | uint64(size))
}

// peersAt returns what t's peers have pending at target i, summed.
func (t *predictedTTFT) peersAt(i int, now time.Duration) peerQueue {
	p := t.peerSum[i].Load()
	if p == nil {
		return peerQueue{headAt: -1}
	}
	if now > p.until {
		t.peerMu.Lock()
		t.sumPeersLocked(i, now)
		p = t.peerSum[i].Load()
		t.peerMu.Unlock()
		if p == nil {
			return peerQueue{headAt: -1}
		}
	}
	return *p
}

// sumPeersLocked recomputes peerSum[i] from the peers' unexpired reports,
// forgetting peers with none left; t.peerMu must be held.
func (t *predictedTTFT) sumPeersLocked(i int, now time.Duration) {
	sum := peerQueue{headAt: -1, until: -1}
	live := false
	for id, qs := range t.peerQueues {
		q := qs[i]
		if q.until < now {
			qs[i].until = -1
			if !slices.ContainsFunc(qs, func(q peerQueue) bool { return q.until >= now }) {
				delete(t.peerQueues, id)
				delete(t.peerLast, id)
			}
			continue
		}
		if !live || q.until < sum.until {
			sum.until = q.until
		}
		live = true
		sum.requests += q.requests
		sum.tokens += q.tokens
		if q.requests > 0 {
			at, tok := earlierHead(int64(sum.headAt), sum.headTokens, int64(q.headAt), q.headTokens)
			sum.headAt, sum.headTokens = time.Duration(at), tok
		}
	}
	if !live {
		t.peerSum[i].Store(nil)
		return
	}
	t.peerSum[i].Store(&sum)
}
