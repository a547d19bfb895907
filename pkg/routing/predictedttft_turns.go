package routing

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Turns in a burst. Behind an L4 balancer the requests of a burst reach
// several proxies in the same instant, and each picks before it has heard
// of the others' picks: a proxy's pick reaches its peers with its next
// queue report, up to a queue interval later. Picked blind, they collide
// on the targets that look cheapest to all of them, and a new prefix that
// two proxies receive at once is prefilled on two targets.
//
// So a request that arrives in a burst waits for its turn: the proxies of
// a fleet draw an order of themselves for each time slot (two queue
// intervals per proxy: slotLength) by rendezvous hashing over the slot's index
// on a clock they share, the same order at every proxy, and the one in
// place j waits j turns, long enough to hear the picks of those before it.
// Within a slot each turn is one proxy's, so no two proxies pick blind to
// each other; the requests of a burst that share a new prefix are placed
// by the first proxy that has one, and the others follow its copy instead
// of making their own; and the slots' draws share the first place out
// fairly. A pick made in a burst does not wait for the fleet's next queue
// tick: it asks for the proxy's queue report to leave at once
// (ReportTrigger), so a turn is two of the fleet's measured trips (turnGap;
// without the trigger, two queue intervals, longer where the messages take
// more than half of one to arrive).
//
// The clock is the fleet's (Spec.FleetNow: the wall clock in production),
// set to its reference proxy's by the offset the fleet measures
// (FleetClock). Clocks that still disagree by d put about d / slot of the
// arrivals in different slots at different proxies, whose orders are then
// independent draws (docs/routing.md, a lottery per time slot: uncorrected
// clocks 100 ms apart cost more than the order per request this replaced).
//
// A request is in a burst when another reached its proxy less than two
// queue intervals before it (a turn on the ticks: tickTurn, however short
// the turns are), or when most of the proxy's arrivals do (bursty: then a lone
// one is the first of a burst whose rest its peers are receiving). It
// waits only where that may pay, on the fitted law:
//   - where what the peers' blind picks around it are expected to cost it
//     (blindPickCost) exceeds the wait;
//   - and where its best target is not cheaper than every other by a
//     request's mean service (the law's per-request and queued-token
//     weights for the mean uncached prefill): no single blind pick landing
//     there could overturn that choice.
// Before the law is fitted there is no such measure: a request that
// arrives within a turn of another waits.
//
// With more proxies than a burst has requests, most proxies receive one
// request of it, and no arrival of their own shows the burst. The peers'
// do: each proxy's arrivals ride with its queue reports; the share of this
// proxy's arrivals that had a peer's within a turn tells a burst, and the
// peers' within half a turn of each are its blind picks (fleetBursts).
//
// rolter-sim, 4 sharing proxies against one, seeds 1–5 (docs/routing.md,
// turns in a burst): gsp, whose 128 clients start in one instant, 0.93–
// 0.98× of one proxy's TTFT mean (blind 0.75–0.81×, 30 of its 64 system
// prompts prefilled on two replicas or more); the conversation trace, whose
// timestamps come in 3 s buckets, 0.975–0.999× (0.83–0.85×); the arxiv
// excerpt 0.87–0.95× (0.68–0.72×). The waits cost unique up to 4 %.

// burstTurns is predicted_ttft's state for Defer.
type burstTurns struct {
	// lastArrival is when Defer last saw a request (ns on t.now's clock,
	// -1: never).
	lastArrival atomic.Int64
	// reportEvery is the fleet's queue interval (SetReportInterval; ns, 0:
	// unknown).
	reportEvery atomic.Int64
	// trip is how late the peers hear this proxy's reports
	// (SetReportTrip; ns, 0: unknown).
	trip atomic.Int64
	// clockOffset is how far the fleet's reference clock runs ahead of
	// fleetNow (SetFleetClockOffset; ns).
	clockOffset atomic.Int64
	// arrivals counts the requests Defer saw with peers, inBurst those of
	// them within two queue intervals of the one before (over the rates' window: see
	// bursty).
	arrivals, inBurst atomic.Int64
	// settled counts this proxy's arrivals whose neighbourhood in the
	// fleet's is known (fleetBursts), near those of them with a peer's
	// arrival within a turn either side, and peersNear the peers' arrivals
	// within half a turn of them (over the rates' window).
	settled, near, peersNear atomic.Int64
	// peersReport is set once a peer reported arrivals: peers that do not
	// (an older release) leave the blind picks estimated from this
	// proxy's own arrivals.
	peersReport atomic.Bool
	fleet       fleetArrivals
	// report publishes this proxy's queue reports at once
	// (SetReportTrigger; nil: they leave on the fleet's queue ticks), for
	// the picks made up to burstUntil (ns on t.now's clock): a burst's.
	report     atomic.Pointer[func()]
	burstUntil atomic.Int64
}

// fleetArrivals holds the arrivals fleetBursts weighs (under mu; times in
// ns on t.now's clock).
type fleetArrivals struct {
	mu sync.Mutex
	// report holds the own arrivals since the last TakeArrivals, pending
	// the own arrivals, once the law is fitted, whose neighbourhood is not
	// known yet (oldest first), and peers the peers' arrivals that a
	// pending one may still have within a turn.
	report, pending, peers []int64
}

// settleAfter is how long after an arrival the peers' arrivals around it
// are known: a turn for those up to a turn after it, the wait for their
// report on the fleet's queue tick (the picks of a burst leave at once,
// other arrivals with the tick: tickTurn), and a turn for a late report.
func (t *predictedTTFT) settleAfter(turn time.Duration) time.Duration {
	return 2*turn + t.tickTurn()
}

// maxHeldArrivals bounds fleetArrivals' pending and peers: past it a
// proxy's own arrivals are not weighed and a peer's are dropped (its
// arrivals already a burst by then).
const maxHeldArrivals = 4096

// fleetBursts records an own arrival at now (weighed once the law is
// fitted) and settles the own arrivals whose neighbourhood is known. It
// returns whether more than half of those over the rates' window had a
// peer's arrival within a turn either side (bursty's measure, which a
// proxy receiving one request of each burst never meets on its own) and
// the mean number of peers' arrivals within half a turn of its own (a
// queue interval: the peers' picks that a pick cannot see and that cannot
// see it), the blind picks around each (known: false before any settled).
// Counted within a whole turn they were twice as many, and a steady stream
// waited where a blind pick costs little: rolter-sim unique, open loop at
// 60 requests a second through 4 proxies, 181 requests waited instead of
// 8, TTFT mean 149.7 against 148.3 ms.
func (t *predictedTTFT) fleetBursts(now, turn time.Duration, fitted bool) (bursty bool, peers float64, known bool) {
	f := &t.turns.fleet
	f.mu.Lock()
	if len(f.report) >= MaxReportedArrivals {
		// Nobody took them (no fleet tick yet): keep the latest half.
		f.report = append(f.report[:0], f.report[len(f.report)/2:]...)
	}
	f.report = append(f.report, int64(now))
	if fitted && len(f.pending) < maxHeldArrivals {
		f.pending = append(f.pending, int64(now))
	}
	t.settleLocked(now, turn)
	f.mu.Unlock()
	if !t.turns.peersReport.Load() {
		return false, 0, false
	}
	b := t.means()
	share, ok := windowMean(t.turns.near.Load(), t.turns.settled.Load(), b.near, b.settled)
	if !ok {
		return false, 0, false
	}
	peers, _ = windowMean(t.turns.peersNear.Load(), t.turns.settled.Load(), b.peersNear, b.settled)
	return share > 0.5, peers, true
}

// settleLocked counts the pending own arrivals older than settleTurns
// turns against the peers' around them, and forgets the peers' arrivals
// no pending one can have within a turn; t.turns.fleet.mu must be held.
func (t *predictedTTFT) settleLocked(now, turn time.Duration) {
	f := &t.turns.fleet
	horizon := int64(now - t.settleAfter(turn))
	done := 0
	for _, x := range f.pending {
		if x >= horizon {
			break
		}
		k, blind := 0, 0
		for _, p := range f.peers {
			if p > x-int64(turn) && p < x+int64(turn) {
				k++
				if p > x-int64(turn/2) && p < x+int64(turn/2) {
					blind++
				}
			}
		}
		t.turns.settled.Add(1)
		if k > 0 {
			t.turns.near.Add(1)
			t.turns.peersNear.Add(int64(blind))
		}
		done++
	}
	f.pending = append(f.pending[:0], f.pending[done:]...)
	keep := horizon
	if len(f.pending) > 0 {
		keep = min(keep, f.pending[0])
	}
	keep -= int64(turn)
	f.peers = slices.DeleteFunc(f.peers, func(p int64) bool { return p <= keep })
}

// TakeArrivals implements [SharedArrivals].
func (t *predictedTTFT) TakeArrivals(dst []time.Duration) []time.Duration {
	f := &t.turns.fleet
	now := t.now()
	f.mu.Lock()
	for _, at := range f.report {
		dst = append(dst, max(0, now-time.Duration(at)))
	}
	f.report = f.report[:0]
	f.mu.Unlock()
	return dst
}

// FoldPeerArrivals implements [SharedArrivals]. The ages are as on
// receipt: the fleet adds the trip since the peer's report (pkg/fleet).
func (t *predictedTTFT) FoldPeerArrivals(ages []time.Duration) {
	turn := t.turnGap()
	if turn <= 0 || len(ages) == 0 {
		return
	}
	t.turns.peersReport.Store(true)
	f := &t.turns.fleet
	now := t.now()
	f.mu.Lock()
	for _, age := range ages {
		if len(f.peers) >= maxHeldArrivals {
			break
		}
		f.peers = append(f.peers, int64(now-max(age, 0)))
	}
	t.settleLocked(now, turn)
	f.mu.Unlock()
}

// bursty reports whether more than half of this proxy's arrivals over the
// rates' window came within two queue intervals of another: its traffic comes in
// bursts (a trace's same-instant buckets), so an arrival with none before
// it is, more likely than not, the first of one, whose other requests its
// peers are receiving. With 4 proxies a bucket of ~9 requests leaves each
// proxy 2 or 3, and the first of them, picked at once, collided with the
// other proxies' firsts (docs/routing.md, turns in a burst).
func (t *predictedTTFT) bursty() bool {
	b := t.means()
	share, ok := windowMean(t.turns.inBurst.Load(), t.turns.arrivals.Load(), b.inBurst, b.burstArrivals)
	return ok && share > 0.5
}

// SetReportInterval implements [ReportPacer].
func (t *predictedTTFT) SetReportInterval(d time.Duration) {
	t.turns.reportEvery.Store(int64(max(d, 0)))
}

// turnGap is how long a proxy's turn in a burst lasts: long enough for
// its picks to reach the peers before the next proxy's turn begins. Where
// the fleet publishes a burst's picks at once (SetReportTrigger) that is a
// trip, with as much again for its jitter (the trip is a smoothed mean),
// and at least a trip and a fifth of the queue interval (promptSlack);
// before the trip is measured, or without the trigger, tickTurn. 0:
// unknown.
func (t *predictedTTFT) turnGap() time.Duration {
	tick := t.tickTurn()
	if trip := time.Duration(t.turns.trip.Load()); trip > 0 && t.turns.report.Load() != nil {
		return min(tick, max(2*trip, trip+t.promptSlack()))
	}
	return tick
}

// promptSlack is the least a turn allows beyond the trip of a report sent
// at once: a fifth of the fleet's queue interval, 1 ms at the default 5
// ms. A busy machine schedules the proxy's and its peers' goroutines late
// by about that, which the trip measured on a LAN (well under a
// millisecond) does not show; an operator whose machines or network are
// slower lengthens the interval, and the turns with it.
func (t *predictedTTFT) promptSlack() time.Duration {
	gap := t.turns.reportEvery.Load()
	if gap <= 0 {
		gap = t.reportGap.Load()
	}
	return time.Duration(gap) / 5
}

// tickTurn is a turn where the picks leave with the fleet's queue reports
// on its ticks: long enough for a pick made just after a report to leave
// with the next one, an interval later, and reach the peers a trip after
// that, with a trip to spare (the peers' arrivals, placed by their ages on
// receipt, may be late by the trip's jitter). That is two of the fleet's
// queue intervals while the trip is at most half of one (a NATS hop on a
// LAN is well under a millisecond, the default interval 5 ms), and an
// interval and two trips beyond (a fleet across zones). Without the
// fleet's pacing, two of the measured report gaps; 0: unknown. The
// interval, not the measured gap: a peer with nothing queued skips its
// reports, which lengthens the gaps between them but not the wait for its
// next tick.
func (t *predictedTTFT) tickTurn() time.Duration {
	gap := t.turns.reportEvery.Load()
	if gap <= 0 {
		gap = t.reportGap.Load()
	}
	trip := time.Duration(t.turns.trip.Load())
	return max(2*time.Duration(gap), time.Duration(gap)+2*trip)
}

// SetFleetClockOffset implements [FleetClock].
func (t *predictedTTFT) SetFleetClockOffset(d time.Duration) {
	t.turns.clockOffset.Store(int64(d))
}

// SetReportTrigger implements [ReportTrigger].
func (t *predictedTTFT) SetReportTrigger(report func()) {
	if report == nil {
		t.turns.report.Store(nil)
		return
	}
	t.turns.report.Store(&report)
}

// reportBurstPick publishes this proxy's queue reports at once if now is
// within a burst (see Defer), so that a pick made in its turn reaches the
// peers before the next turn begins.
func (t *predictedTTFT) reportBurstPick(now time.Duration) {
	if r := t.turns.report.Load(); r != nil && int64(now) <= t.turns.burstUntil.Load() {
		(*r)()
	}
}

// SetReportTrip implements [ReportPacer].
func (t *predictedTTFT) SetReportTrip(d time.Duration) {
	t.turns.trip.Store(int64(max(d, 0)))
}

// Defer implements [Deferrer]: how long ctx waits for its turn (see Turns
// in a burst above); 0 alone, outside a burst, for the first in the
// request's order, where the peers' blind picks cost less than the wait
// and where none could change its choice.
func (t *predictedTTFT) Defer(ctx *Context, loads []int, eligible Set) time.Duration {
	rank, size := t.placeOf()
	if t.n <= 1 || size <= 1 || ctx == nil {
		return 0
	}
	turn := t.turnGap()
	now := t.now()
	last := t.turns.lastArrival.Swap(int64(now))
	inBurst := last >= 0 && int64(now)-last < int64(t.tickTurn())
	t.turns.arrivals.Add(1)
	if inBurst {
		t.turns.inBurst.Add(1)
	}
	if turn <= 0 {
		return 0
	}
	m := t.law()
	fleetBursty, peers, known := t.fleetBursts(now, turn, m != t.unitLaw)
	if !inBurst && !t.bursty() && !fleetBursty {
		return 0
	}
	// The picks until the burst's last turn has passed leave at once; and
	// so, as the burst shows, does the first of it, picked alone before.
	if until, was := int64(now+time.Duration(size)*turn), t.turns.burstUntil.Load(); until > was {
		t.turns.burstUntil.Store(until)
		if int64(now) > was {
			t.reportBurstPick(now)
		}
	}
	j := turnOf(t.fleetNow()+time.Duration(t.turns.clockOffset.Load()), t.slotLength(turn, size), rank, size)
	if j == 0 {
		return 0
	}
	el := eligible.OrAll(t.n)
	if el.Len() <= 1 {
		return 0
	}
	wait := time.Duration(j) * turn
	if m == t.unitLaw {
		// No measure yet of what a blind pick costs, and the share of
		// arrivals in bursts is the first instant's own: only a
		// request in a burst waits.
		if !inBurst {
			return 0
		}
		return wait
	}
	service, ok := t.meanService(&m)
	if !known {
		peers = float64(size-1) * loadFloat(&t.concurrent)
	}
	if !ok || blindPickCost(el.Len(), peers, service) <= float64(wait)/float64(time.Millisecond) {
		return 0
	}
	var mbuf, pbuf [MaxTargets]float64
	match, pred := mbuf[:t.n], pbuf[:t.n]
	c := t.costs(ctx, loads, el, t.loadScale(loads, false), match, pred)
	if margin(pred, c.el, c.best) >= service {
		return 0
	}
	return wait
}

// blindPickCost is what a request picked now expects to lose to the peers'
// picks made blind around it (ms): peers of them (the peers' arrivals
// within half a turn either side of this proxy's, as fleetBursts measured
// them; before it has, (size − 1) × concurrent: the peers receive about
// as many requests as this proxy does around each of its own, concurrent
// being its own arrivals within a report gap either side, about a turn),
// each landing on this request's target with probability 1/targets, where
// it costs a request's mean service. Short prompts at a high steady rate are
// in a burst by the arrival gate alone (one arrival every few
// milliseconds), but a blind pick costs them less than a turn's wait
// (rolter-sim unique with 512-token prompts at 120 requests a second
// through 4 proxies: 0.82× of one proxy's TTFT mean waiting, 0.91× with
// this gate, 0.91× blind).
func blindPickCost(targets int, peers, service float64) float64 {
	if targets <= 1 {
		return 0
	}
	return (1 - math.Pow(1-1/float64(targets), peers)) * service
}

// margin is how much less the cheapest target of el costs than the next
// cheapest: 0 when several cost the least, +Inf when there is no other.
func margin(pred []float64, el Set, best float64) float64 {
	second, ties := math.Inf(1), 0
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			switch p := pred[wi*64+bitIndex(w)]; {
			case p <= best:
				ties++
			case p < second:
				second = p
			}
		}
	}
	if ties > 1 {
		return 0
	}
	return second - best
}

// slotLength is how long one order of the proxies lasts: a turn per proxy,
// the turn taken as two of the fleet's queue intervals, which its proxies
// share, not the turn set by this proxy's measured trip (turnGap), which
// differs a little from proxy to proxy: slots of different lengths
// would be numbered differently at different proxies, and their orders
// drawn apart. turn stands in while the interval is unknown.
func (t *predictedTTFT) slotLength(turn time.Duration, size int) time.Duration {
	if every := time.Duration(t.turns.reportEvery.Load()); every > 0 {
		turn = 2 * every
	}
	return time.Duration(size) * turn
}

// turnOf is this proxy's place, among size proxies, in the order drawn
// for the time slot of length slot that fleetNow is in (counted from the
// fleet clock's zero): how many of the others rank the slot higher
// (rendezvous hashing, the same at every proxy).
func turnOf(fleetNow, slot time.Duration, rank, size int) int {
	n := uint64(fleetNow / slot)
	mine, j := turnScore(n, rank), 0
	for p := range size {
		if s := turnScore(n, p); p != rank && (s > mine || s == mine && p < rank) {
			j++
		}
	}
	return j
}

// turnScore is proxy p's rendezvous score for key (SplitMix64's finalizer
// over the pair).
func turnScore(key uint64, p int) uint64 {
	z := key ^ (uint64(p)+1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
