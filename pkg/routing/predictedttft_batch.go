package routing

import (
	"math"
	"sync"
	"sync/atomic"
)

// The batch term of predicted_ttft. An engine runs every request of its
// batch in each step, and a step takes longer the more it carries (vLLM's
// attention reads every running request's KV cache), so the step that
// gives a request its first token, and every step of its prefill, are
// longer at a target running more requests. The prefill law does not see
// this: its inputs are the prefill ahead and the request's own, so a
// replica busy decoding many answers looked as fast as an idle one, and a
// popular prefix drew every request to its holder until the batch was full
// (the slot wait's limit). The balancer learns the slowdown from what the
// law leaves unexplained, each first token's residual (its TTFT less the
// law's prediction at dispatch) against the requests running at the
// target at dispatch,
//
//	residual = a + c·running   (ms)
//
// and, once c is determined (above twice its standard error and
// batchSlopeFloor), adds c·running to a target's prediction. Engines whose
// steps do not slow with the batch (rolter-sim's and vllmsim's by default)
// leave no such residual, and the term is not added.
//
// It is off once the balancer has heard a peer (batchOn): neither count
// measures the batch there. The engine's also holds the requests the peers
// sent that are still prefilling and that no report has shown yet, work
// ahead which the fit read as a slowdown (rolter-sim agent through 4
// sharing proxies: 799 -> 840 ms); the proxy's own share, learned and
// charged alone, moved decisions on a fraction of the batch (agent through
// 4 proxies with steps slowing 0.3 ms per request: 772 -> 837 ms).
// docs/routing.md, the batch term.
type batchState struct {
	mu  sync.Mutex
	fit batchFit
	law atomic.Pointer[batchLaw] // nil until c is determined
}

// batchLaw is what a pick reads of the batch fit.
type batchLaw struct {
	slope float64 // c: ms of TTFT per request running at the target
}

// batchFit accumulates the least-squares sums of residual on running, each
// sample's weight decaying by lawKeep per later sample (the law's memory).
type batchFit struct {
	mass, x, y, xx, xy, yy float64 // Σ weight, Σ w·x, Σ w·y, Σ w·x², Σ w·x·y, Σ w·y²
	n                      int
}

// batchSlopeFloor is the smallest slope the term uses: 1 µs of TTFT per
// request running, far below any engine's step growth (vLLM's is tenths of
// a millisecond per request), so that a fit of rounding noise around 0
// adds nothing.
const batchSlopeFloor = 0.001

func (f *batchFit) add(running, residual float64) {
	f.mass = f.mass*lawKeep + 1
	f.x = f.x*lawKeep + running
	f.y = f.y*lawKeep + residual
	f.xx = f.xx*lawKeep + running*running
	f.xy = f.xy*lawKeep + running*residual
	f.yy = f.yy*lawKeep + residual*residual
	f.n++
}

// solve returns the law when the slope is determined: enough samples, the
// running count varied, and c above both twice its standard error and
// batchSlopeFloor.
func (f *batchFit) solve() (*batchLaw, bool) {
	if f.n < PredictorMinSamples || f.mass <= 2 {
		return nil, false
	}
	mx, my := f.x/f.mass, f.y/f.mass
	sxx := f.xx - f.mass*mx*mx
	if sxx <= 0 {
		return nil, false
	}
	sxy := f.xy - f.mass*mx*my
	c := sxy / sxx
	rss := max(f.yy-f.mass*my*my-c*sxy, 0)
	se := math.Sqrt(rss / (f.mass - 2) / sxx)
	if math.IsNaN(c) || c < batchSlopeFloor || c <= 2*se {
		return nil, false
	}
	return &batchLaw{slope: c}, true
}

// batchOn reports whether the batch term learns and charges: while the
// balancer has heard no peer (see batchState).
func (t *predictedTTFT) batchOn() bool { return !t.heardPeer() }

// learn adds one first token's residual against the requests running at
// its target at dispatch.
func (b *batchState) learn(running, residual float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fit.add(running, residual)
	if l, ok := b.fit.solve(); ok {
		b.law.Store(l)
	} else {
		b.law.Store(nil)
	}
}

// cost is the batch term for a target running running requests (ms), 0
// without a law.
func (l *batchLaw) cost(running float64) float64 {
	if l == nil {
		return 0
	}
	return l.slope * running
}

// runningAt is the number of requests running at target i: this
// balancer's own requests there past their first token, and where the
// engine's count is scraped, what it showed beyond them, as old as the
// scrape (staleExcess, turning over as running requests leave, one hold
// each): the own requests at the scrape are the own now less the
// dispatches and first tokens since (flights, pendLog). Through one proxy
// the count is then the engine's now, not as it was up to an interval
// ago (rolter-sim agent: TTFT mean 852 -> 812 ms, the mean with live
// counts; docs/routing.md, counts as old as their scrape).
func (t *predictedTTFT) runningAt(i int, c engineCounts) float64 {
	inflight, pend := t.inflight[i].Load(), t.pendCount[i].Load()
	own := max(inflight-pend, 0)
	if !c.ok {
		return float64(own)
	}
	then := max((inflight-t.flights[i].since(c.at))-(pend-t.pendLog[i].since(c.at)), 0)
	turn := t.slotHold()
	if turn <= 0 {
		turn = t.typicalFirst()
	}
	return float64(own) + staleExcess(&t.runExcess[i], float64(max(int64(c.running)-then, 0)), c.age, turn)
}
