package routing

import (
	"math"
	"time"
)

// The fleet's rates over the latest arrivals (arrival rate, utilisation,
// novelty) and the queueing terms of predicted_ttft's cost they feed: the
// externality and the follow-up wait.

// externality is the delay that adding own ms of prefill to a target whose
// queue would then take ttft ms to clear imposes on the requests that
// arrive there meanwhile: own × λ × ttft / (1 − ρ) (an M/G/1 queue: the
// busy period the work extends lasts ttft / (1 − ρ), and every arrival in
// it waits own longer). λ is the fleet's mean arrival rate per target and ρ
// the mean share of time a target's prefill queue was busy, both since the
// first request; pooled over the targets because a target's own rate
// mostly reflects how routing treated it so far (an avoided replica looks
// idle), and the pooled figures routed better (docs/routing.md).
//
// A target whose prefill queue was not busy once over the rates' window
// received none of its arrivals, and nobody is expected to queue behind
// this request there: its externality is 0. Charged the pooled rate like
// the others, an avoided replica stayed avoided for good, the cold
// prefill that would make it a second holder of a popular prefix priced
// as if the fleet's mean traffic waited behind it (rolter-sim gsp with 2
// groups of 6,144-token system prompts and 3-token answers at 15 requests/s:
// 5 of 8 replicas never used, TTFT p99 110 ms against Dynamo's 72;
// with the rule none idle and 41 ms; docs/routing.md, a replica nobody
// uses).
//
// Until the law is fitted there is no time scale (the unit law's
// milliseconds are nominal), and when every request so far arrived in one
// instant (a burst: a load generator's clients starting together) there is
// no rate; then the arrivals so far stand in for what is still to come: as many arrivals again, of which
// the share q that were new to every target (the mean share of a prompt no
// target held, novelty) spread evenly, and the rest follow what each target
// already holds, as many at i as i has had. So i expects
// (1 − q)·arrivals(i) + q·arrivals/n later arrivals. With q ≈ 1 (many
// distinct prefixes) a holder's follower stays with it rather than copying
// the prefix to a target that will soon have new prefixes of its own; with
// q ≈ 0 (one prefix shared by everyone, e.g. agents with one system prompt)
// an idle target expects nobody and takes the next session, so the burst
// spreads instead of piling onto the first holder (docs/routing.md).
//
// For a prompt of which no target holds more than the part other requests
// share (a system prompt, or nothing), and at most one target holds that
// (countQueued), the requests expected behind it are at least those this
// balancer has queued at i now (times the fleet scale): in a steady queue
// as many arrive during a wait as were waiting at its start (Little's law).
// The pooled rate is the fleet's mean, and the one target that holds a
// popular prefix draws that prefix's traffic, far more than the mean when
// its requests come in bursts; each one's choice was right for itself (the
// holder's queue stayed shorter than copying the prefix elsewhere), and the
// queue they met grew with every one: LMBench's GMI trace at 16 replicas
// kept a family of 483 requests with a 3,136-token prefix on one replica
// all run, its requests queued 11.3 s in all against Dynamo's 3.7 s on
// three holders (TTFT mean 52.3 against 50.0 ms); with the count it has
// two (docs/routing.md, a popular prefix's queue). Once two targets hold
// the prefix a burst splits between them by their queues, and counting
// there too copied it to more (Mooncake's arxiv excerpt: hit rate down by
// up to 0.5 point, 1.3 with the approximate index alone). A prompt whose
// own history a target holds (a conversation's next turn, an agent's next
// step) is charged the pooled rate alone: the count sent follow-ups away
// from their histories, which waste then charged again (rolter-sim agent:
// TTFT mean 780 -> 827 ms).
func (t *predictedTTFT) externality(i int, ownMS, ttftMS float64, r queueRates, countQueued bool) float64 {
	if !r.started || ownMS <= 0 {
		return 0
	}
	if !r.timed {
		if r.arrivals <= 0 {
			return 0
		}
		return ownMS * ((1-r.q)*float64(t.arrivals[i].Load()) + r.q*r.arrivals/float64(t.n))
	}
	if r.rho > 0 && t.busyFrom(i, r.now, r.base) == 0 {
		return 0
	}
	behind := r.lambda * ttftMS / (1 - r.rho)
	if countQueued {
		behind = max(behind, float64(t.prefilling(i))*max(r.scale, 1))
	}
	return ownMS * behind
}

// queueRates are the pooled figures externality and followCost read, taken
// once per pick (the same for every target): whether any request was sent,
// the novelty share q and the arrivals so far, the fleet scale, and once
// the law is fitted and time has passed (timed) the mean arrival rate per
// target λ (per ms) and utilisation ρ, with the window's base and the
// pick's instant they were read over.
type queueRates struct {
	started, timed     bool
	q, arrivals, scale float64
	lambda, rho        float64
	base               *rateBase
	now                time.Duration
}

// fleetRates returns the queueRates at now.
func (t *predictedTTFT) fleetRates(now time.Duration, scale float64, fitted bool) queueRates {
	r := queueRates{scale: scale}
	base, from := t.rateFrom()
	if from < 0 {
		return r
	}
	r.started = true
	r.q, r.arrivals = t.noveltyShare(base)
	elapsed := float64(int64(now)-from) / float64(time.Millisecond)
	if elapsed <= 0 || !fitted {
		return r
	}
	var busy float64
	for j := range t.n {
		busy += t.busyFrom(j, now, base)
	}
	k := float64(t.n)
	r.timed, r.base, r.now = true, base, now
	// Once a peer has been heard the busy time counts the peers' reported
	// queues (busyLocked): it is the targets', and only the arrivals are
	// scaled. This proxy's own busy share scaled by the fleet's size, as ρ
	// was, counted the overlapping spells of several proxies up to P
	// times: under load ρ stood near its cap and the externality scattered
	// prefixes (rolter-sim agent --rate 8 through 4 proxies: 0.78× of one
	// proxy's TTFT mean with it, 1.03× without, docs/routing.md item 8).
	rhoScale := scale
	if t.heardPeer() {
		rhoScale = 1
	}
	r.rho = min(rhoScale*busy/k/float64(time.Millisecond)/elapsed, maxUtilisation)
	r.lambda = scale * r.arrivals / k / elapsed
	return r
}

// followWait is the queueing delay that the traffic this pick draws to
// target i will cause there. A request leaves its prompt at i, and the
// requests that extend it (a conversation's next turn, an agent's next
// step, the next question to a group's system prompt) follow it to i,
// since i then holds their prefix. In an M/M/1 queue each of them waits
// ρ_i/(1 − ρ_i) mean services, ρ_i being the share of time since the first
// request that i had a prefill pending (this balancer's or, as their
// reports tell, its peers'; see busyLocked); and its own work
// delays those queued at i meanwhile by b/(1 − b)² times that work (the
// marginal wait of the others, d(λ·W)/dλ less its own wait), b = ρ_i ×
// blocking being the share of time i's prefill made others queue. How many
// follow: the share of the traffic that repeats what some target held is
// 1 − q (q, the novelty, as in externality), so a request is followed by
// (1 − q)/q more on average (a chain in which each request is a follow-up
// with probability 1 − q). A mean service is what a request ahead costs,
// the law's per-request and queued-token weights for the mean uncached
// prefill; the work others wait behind is priced at the queued-token
// weight alone (on an engine that prefills every request on its own,
// vllmsim, that weight is small, and so are both parts).
//
// Without it nothing in the cost looks past the current queue, and the
// replica that first holds a prefix everyone shares (an agents' system
// prompt) takes every new session while its queue is short, then keeps
// them: rolter-sim agent with its clients starting over 5 s, imbalance 1.59
// without it, 1.48 with the followers' own waits only, 1.23 with the delay
// they cause too (16 replicas over 2 s: 1.93, 1.44, 1.20; docs/routing.md).
// The delay at ρ_i itself, not b, made a replica of vllmsim, which has
// some prefill pending 90 % of the time, cost 300 ms more per pick. Scaled
// by the fleet scale (recordLoads), as an earlier form of the term read ρ_i, this proxy's own
// share overstated one target's (multiturn through 4 proxies lost up to 5 %
// of its hit rate). follow is followCost, computed once per pick.
func (t *predictedTTFT) followWait(i int, follow followFactors, now time.Duration) float64 {
	rho, _, _ := t.busyShare(i, now)
	return follow.at(rho)
}

// busyShare returns ρ_i, target i's busy share of the time since the
// rates' base (capped at maxUtilisation), and base, for the arrivals since;
// false (ρ_i 0) before any request or at its instant.
func (t *predictedTTFT) busyShare(i int, now time.Duration) (rho float64, base *rateBase, ok bool) {
	base, from := t.rateFrom()
	if from < 0 || int64(now) <= from {
		return 0, nil, false
	}
	return min(t.busyFrom(i, now, base)/float64(int64(now)-from), maxUtilisation), base, true
}

// at is the follow-up wait at a target busy a share rho of the time (see
// followWait).
func (f followFactors) at(rho float64) float64 {
	b := rho * f.blocking
	return f.wait*rho/(1-rho) + f.delay*b/((1-b)*(1-b))
}

// followWaitRange returns followWait(i), and the same with target i's busy
// share ρ_i one standard error lower and one higher: ρ_i is its busy share
// of the time since the rates' base, read over the m requests that arrived
// there meanwhile (this balancer's, times the fleet scale, since ρ_i counts
// the peers' queues too), and like a count's its relative error is about
// 1/√m. Over the window's 1,024 arrivals a target of 16 sees about 64, so
// busy shares 12 % apart are not told apart.
func (t *predictedTTFT) followWaitRange(i int, follow followFactors, now time.Duration, scale float64) (f, lo, hi float64) {
	rho, base, ok := t.busyShare(i, now)
	if !ok {
		return 0, 0, 0
	}
	m := float64(t.arrivals[i].Load())
	if base != nil {
		m -= float64(base.arrivalsAt[i])
	}
	se := rho / math.Sqrt(max(m*max(scale, 1), 1))
	return follow.at(rho), follow.at(max(rho-se, 0)), follow.at(min(rho+se, maxUtilisation))
}

// followWaits sets followed[i] to followWait(i) for every eligible target,
// bounded where it would override what the cache saves: a target holding
// more of the prompt (match: placedAt's when the law is fitted) than the
// eligible target that holds least is charged at most the least follow-up
// wait plus follow.fallback. The followers are not bound to the target
// this pick sends the prompt to: each can go where the follow-up wait is
// least and prefill this prompt again there.
//
// Without the bound the wait's M/M/1 factors grow without limit as ρ_i
// nears 1 (b/(1 − b)² is 10⁴ at the 0.99 cap), and where every target's
// prefill queue is busy nearly all the time their differences are the
// noise in ρ_i, seconds apart, which outweighed the cache: rolter-sim gsp
// with short answers (--itl-ms 8 --gsp-output-len 64), whose queues are
// busy 93-100 % of the time, sent a group's questions away from the
// replica holding its system prompt (hit rate 81.4 against 87.6 %, TTFT
// mean 148 against SGLang's 107 ms; bounded: 87.6 %, 101 ms). Among
// targets that hold the same of the prompt (a new prompt: none of it, or
// only what every target shares) nothing is saved either way, and the
// unbounded wait is what spreads new prompts by each target's long-run
// busy share; bounded there too, the trace under heavy prefill load lost
// up to 1.2 points of hit rate (docs/routing.md, saturated prefill queues).
func (t *predictedTTFT) followWaits(el Set, follow followFactors, now time.Duration, match, followed []float64) {
	least, fewest := math.Inf(1), math.Inf(1)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			followed[i] = t.followWait(i, follow, now)
			least = min(least, followed[i])
			fewest = min(fewest, match[i])
		}
	}
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			if i := wi*64 + bitIndex(w); match[i] > fewest {
				followed[i] = min(followed[i], least+follow.fallback)
			}
		}
	}
}

// followCost returns followWait's factors at now for a request of tokens
// prompt tokens.
func (t *predictedTTFT) followCost(m *ttftLaw, now time.Duration, r queueRates, tokens int) followFactors {
	mean, ok := t.meanUncached()
	if !r.started || int64(now) <= t.start.Load() || !ok || r.arrivals <= 0 || m.w[lawOwn] <= 0 {
		return followFactors{}
	}
	q := max(r.q, 1/r.arrivals) // one novel request at least: the first
	queued := max(0, m.w[lawQueued]) * mean / 1000
	followers := (1 - q) / q
	return followFactors{wait: followers * (max(0, m.w[lawAhead]) + queued), delay: followers * queued,
		blocking: min(max(0, m.w[lawQueued])/m.w[lawOwn], 1), fallback: followers * m.w[lawOwn] * float64(max(tokens, 0)) / 1000}
}

// followFactors are followWait's factors common to every target: the
// requests that follow one, (1 − q)/q, times a mean service (wait: what each
// waits per request ahead of it) and times the mean queued work (delay:
// what each adds to the wait of those queued behind it, priced at the
// queued-token weight as in externality); and blocking, the share of a
// pending prefill's time that others queue behind (the queued-token weight
// over the own-token weight, at most 1: about 1 on an engine that prefills
// one request at a time, the routing simulator; about 0.04 on one that
// prefills requests side by side, vllmsim); and fallback, what the
// followers pay to avoid a target instead: this prompt prefilled again
// elsewhere, at the own-work weight (see followWaits). Zero before any
// request.
type followFactors struct{ wait, delay, blocking, fallback float64 }

// noveltyShare returns the mean share of a prompt that no target held, over
// the arrivals since base (nil: all so far), and their number.
func (t *predictedTTFT) noveltyShare(base *rateBase) (q, arrivals float64) {
	for j := range t.n {
		arrivals += float64(t.arrivals[j].Load())
	}
	novelty := loadFloat(&t.novelty)
	if base != nil {
		arrivals -= base.arrivals
		novelty -= base.novelty
	}
	if arrivals <= 0 {
		return 1, 0
	}
	return min(max(novelty/arrivals, 0), 1), arrivals
}

// The rates (arrival rate, utilisation, novelty) are measured over the
// latest rateWindow arrivals, not since the first: a proxy runs for weeks,
// and a replica busy an hour ago, or a fleet idle overnight, says nothing
// of now; since the first arrival, what happened was forgotten only as
// 1/t. A window of arrivals, not of time, holds as many samples at any
// load. 1,024: the judged grid keeps 26 of 33 and the longer runs gain a
// little (the trace +0.09 point of hit rate); 4,096 changes no run (none is
// that long); 256 is noise, 22 of 33 (docs/routing.md). A snapshot every
// rateStep arrivals keeps the window between rateWindow and rateWindow +
// rateStep arrivals long.
const (
	rateWindow = 1024
	rateStep   = 64
)

// rateBase is a snapshot the rates are measured from: its time (ns), the
// arrivals and Σ novelty then, each target's busy time then (ns), and the
// sums and counts behind the means (see windowMean) then.
type rateBase struct {
	at                int64
	arrivals, novelty float64
	busy              []float64
	// Each target's arrivals then, and its new prefixes (see fewestNew).
	arrivalsAt, newPrefixesAt []int64
	// Σ and count of: uncached prefill tokens (per Observe), first tokens,
	// those without a slot wait, and completions (ns).
	uncached, observes int64
	first, firstN      int64
	free, freeN        int64
	done, doneN        int64
	// Σ of the in-flight loads and own share at the picks (recordLoads).
	loads, own int64
	// Defer's arrivals with peers and those in a burst (bursty); the
	// settled own arrivals, those near a peer's and the peers' near them
	// (fleetBursts).
	burstArrivals, inBurst   int64
	settled, near, peersNear int64
}

// windowMean is (sum − base) / (n − baseN), the mean over the window, or
// sum / n when the window holds none (or there is no base yet); false when
// there is nothing at all.
func windowMean(sum, n, base, baseN int64) (float64, bool) {
	if n-baseN > 0 {
		return float64(sum-base) / float64(n-baseN), true
	}
	if n > 0 {
		return float64(sum) / float64(n), true
	}
	return 0, false
}

// rateFrom returns the rates' base (nil until the window is full) and the
// time (ns) they are measured from: its time, else the first request's (-1:
// none yet).
func (t *predictedTTFT) rateFrom() (*rateBase, int64) {
	if b := t.base.Load(); b != nil {
		return b, b.at
	}
	return nil, t.start.Load()
}

// means returns the window's base for windowMean: the zero base (every
// sample) until there is one.
func (t *predictedTTFT) means() rateBase {
	if b := t.base.Load(); b != nil {
		return *b
	}
	return rateBase{}
}

// snapshotLocked records a rateBase at now and, once rateWindow arrivals
// have passed, publishes the oldest as the base; t.mu must be held.
func (t *predictedTTFT) snapshotLocked(now time.Duration) {
	b := &rateBase{at: int64(now), novelty: t.noveltySum, busy: make([]float64, t.n),
		arrivalsAt: make([]int64, t.n), newPrefixesAt: make([]int64, t.n),
		uncached: t.uncachedSum.Load(), observes: int64(t.observes.Load()),
		first: t.firstSum.Load(), firstN: t.firstN.Load(), free: t.freeSum.Load(), freeN: t.freeN.Load(),
		done: t.doneSum.Load(), doneN: t.doneN.Load(), loads: t.loadSum.Load(), own: t.ownSum.Load(),
		burstArrivals: t.turns.arrivals.Load(), inBurst: t.turns.inBurst.Load(),
		settled: t.turns.settled.Load(), near: t.turns.near.Load(), peersNear: t.turns.peersNear.Load()}
	t.longFirst.step()
	t.longWhole.step()
	for j := range t.n {
		b.arrivalsAt[j], b.newPrefixesAt[j] = t.arrivals[j].Load(), t.newPrefixes[j].Load()
		b.arrivals += float64(b.arrivalsAt[j])
		b.busy[j] = t.busyAt(j, now)
	}
	slot := t.basesN % len(t.bases)
	if t.basesN >= len(t.bases) {
		t.base.Store(t.bases[slot])
	}
	t.bases[slot] = b
	t.basesN++
}

// busyFrom is target i's busy time (ns) from base (nil: the first
// request) to now.
func (t *predictedTTFT) busyFrom(i int, now time.Duration, base *rateBase) float64 {
	busy := t.busyAt(i, now)
	if base != nil {
		busy -= base.busy[i]
	}
	return max(busy, 0)
}

// busyAt is the time (ns) target i's prefill queue has been busy since the
// first request, up to now.
func (t *predictedTTFT) busyAt(i int, now time.Duration) float64 {
	busy := float64(t.busyTotal[i].Load())
	if since := t.busySince[i].Load(); since >= 0 {
		busy += float64(t.busyEnd(i, since, now) - since)
	}
	return busy
}

// meanUncached returns the mean uncached prefill (tokens) of the requests
// this balancer has sent, over the rates' window (see windowMean), false
// before any.
func (t *predictedTTFT) meanUncached() (float64, bool) {
	b := t.means()
	return windowMean(t.uncachedSum.Load(), int64(t.observes.Load()), b.uncached, b.observes)
}
