package routing

import (
	"encoding/binary"
	"hash/fnv"
	"math"
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
// a fleet order themselves for each request by a hash of its prompt's
// opening, the same order at every proxy (rendezvous hashing), and the one
// in place j waits j turns, long enough to hear the picks of those before
// it. The order being the prompt's, the requests of a burst that share a
// new prefix are placed first by one proxy, and the others follow its copy
// instead of making their own. A turn is two queue intervals (turnGap).
//
// A request is in a burst when another reached its proxy less than a turn
// before it, or when most of the proxy's arrivals do (bursty: then a lone
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
	// arrivals counts the requests Defer saw with peers, inBurst those of
	// them within a turn of the one before (over the rates' window: see
	// bursty).
	arrivals, inBurst atomic.Int64
}

// bursty reports whether more than half of this proxy's arrivals over the
// rates' window came within a turn of another: its traffic comes in
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

// turnKeyBytes is how much of a prompt's opening orders the proxies for
// it: past a chat template's fixed opening (a few dozen bytes) into the
// request's own text, and within the system prompt that a group of
// requests shares (gsp's: 2,048 tokens).
const turnKeyBytes = 512

// SetReportInterval implements [ReportPacer].
func (t *predictedTTFT) SetReportInterval(d time.Duration) {
	t.turns.reportEvery.Store(int64(max(d, 0)))
}

// turnGap is how long a proxy's turn in a burst lasts: two of the fleet's
// queue intervals (else, without the fleet's pacing, two of the measured
// report gaps; 0: unknown). A pick made just after a report leaves with
// the next one, an interval later, and reaches the peers after the trip,
// which the second interval covers (a NATS hop on a LAN is well under a
// millisecond, the default queue interval 5 ms). The interval, not the
// measured gap: a peer with nothing queued skips its reports, which
// lengthens the gaps between them but not the wait for its next tick.
func (t *predictedTTFT) turnGap() time.Duration {
	gap := t.turns.reportEvery.Load()
	if gap <= 0 {
		gap = t.reportGap.Load()
	}
	return 2 * time.Duration(gap)
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
	inBurst := last >= 0 && int64(now)-last < int64(turn)
	t.turns.arrivals.Add(1)
	if inBurst {
		t.turns.inBurst.Add(1)
	}
	if turn <= 0 || !inBurst && !t.bursty() {
		return 0
	}
	j := turnOf(ctx, rank, size)
	if j == 0 {
		return 0
	}
	el := eligible.OrAll(t.n)
	if el.Len() <= 1 {
		return 0
	}
	wait := time.Duration(j) * turn
	m := t.law()
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
	if !ok || t.blindPickCost(el.Len(), size, service) <= float64(wait)/float64(time.Millisecond) {
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

// blindPickCost is what a request picked now expects to lose to peers'
// picks made blind around it (ms): the peers receive about as many
// requests as this proxy does around each of its own (concurrent: its own
// arrivals within a report gap either side, about a turn), (size − 1) ×
// concurrent in all; each lands on this request's target with probability
// 1/targets, and one that does costs it a request's mean service. Short
// prompts at a high steady rate are in a burst by the arrival gate alone
// (one arrival every few milliseconds), but a blind pick costs them less
// than a turn's wait (rolter-sim unique with 512-token prompts at 120
// requests a second through 4 proxies: 0.82× of one proxy's TTFT mean
// waiting, 0.91× with this gate, 0.91× blind).
func (t *predictedTTFT) blindPickCost(targets, size int, service float64) float64 {
	if targets <= 1 {
		return 0
	}
	peers := float64(size-1) * loadFloat(&t.concurrent)
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

// turnOf is this proxy's place, among size proxies, in ctx's order: how
// many of the others rank ctx's prompt opening higher (rendezvous hashing,
// the same at every proxy).
func turnOf(ctx *Context, rank, size int) int {
	h := fnv.New64a()
	switch {
	case ctx.Prompt != "":
		h.Write([]byte(ctx.Prompt[:min(len(ctx.Prompt), turnKeyBytes)]))
	case len(ctx.TokenIDs) > 0:
		var b [4]byte
		for _, id := range ctx.TokenIDs[:min(len(ctx.TokenIDs), turnKeyBytes/4)] {
			binary.LittleEndian.PutUint32(b[:], id)
			h.Write(b[:])
		}
	}
	key := h.Sum64()
	mine, j := turnScore(key, rank), 0
	for p := range size {
		if s := turnScore(key, p); p != rank && (s > mine || s == mine && p < rank) {
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
