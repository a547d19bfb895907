package routing

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// newPlacedTTFT is a predicted_ttft balancer over n targets on the virtual
// clock *now, at place rank among size proxies whose queue interval is 5
// ms, in the fleet's first time slot (a fleet clock at 0): every request
// orders the proxies alike (see secondOfTwo).
func newPlacedTTFT(t *testing.T, now *time.Duration, n, rank, size int) *predictedTTFT {
	t.Helper()
	return newSlottedTTFT(t, now, func() time.Duration { return 0 }, n, rank, size)
}

// newSlottedTTFT is newPlacedTTFT on the fleet clock fleetNow.
func newSlottedTTFT(t *testing.T, now *time.Duration, fleetNow func() time.Duration, n, rank, size int) *predictedTTFT {
	t.Helper()
	b, err := New(Spec{Strategy: PredictedTTFT, Weights: slices.Repeat([]int{1}, n), Now: func() time.Duration { return *now }, FleetNow: fleetNow})
	if err != nil {
		t.Fatal(err)
	}
	p := b.(*predictedTTFT)
	p.SetPlace(rank, size)
	p.SetReportInterval(5 * time.Millisecond)
	return p
}

// newFittedTTFT is newPlacedTTFT over two targets at the place second of
// two, on the routing simulator's fitted law, with concurrent own arrivals
// around each, after the first token of a 16,000-byte prompt of each
// letter of served at target 0, 1, ….
func newFittedTTFT(t *testing.T, now *time.Duration, concurrent float64, served ...string) *predictedTTFT {
	t.Helper()
	p := newPlacedTTFT(t, now, 2, secondOfTwo(), 2)
	p.fleet.Store(&ttftLaw{w: simLaw.w, samples: simLaw.samples})
	p.concurrent.Store(math.Float64bits(concurrent))
	for i, r := range served {
		seen := &Context{Prompt: strings.Repeat(r, 16000)}
		p.Observe(i, seen)
		p.FirstToken(i, seen, 200*time.Millisecond, 4000)
	}
	return p
}

// In a burst the proxies take turns in the same order at every proxy: in
// each time slot of four turns, the four proxies of a fleet wait 0, 1, 2
// and 3 turns of two queue intervals, the order drawn for the slot.
func TestTurnsOrderTheProxies(t *testing.T) {
	now := time.Second
	firsts := make([]int, 4)
	ctx := &Context{Prompt: "a request " + strings.Repeat("x", 600)}
	for k := range 20 {
		// Any instant of slot k, on a fleet clock at some distance from
		// the proxies' own.
		fleet := time.Hour + time.Duration(4*k)*10*time.Millisecond + time.Duration(k%4)*time.Millisecond
		var waits []time.Duration
		first := -1
		for rank := range 4 {
			p := newSlottedTTFT(t, &now, func() time.Duration { return fleet }, 4, rank, 4)
			if d := p.Defer(&Context{Prompt: "an earlier request"}, nil, Set{}); d != 0 {
				t.Fatalf("the first request of a burst waits %v", d)
			}
			d := p.Defer(ctx, nil, Set{})
			if d == 0 {
				first = rank
			}
			waits = append(waits, d)
		}
		slices.Sort(waits)
		if want := []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}; !slices.Equal(waits, want) {
			t.Fatalf("request %d: the proxies wait %v, want %v", k, waits, want)
		}
		firsts[first]++
	}
	// The order is the slot's: over 20 slots every proxy goes first some
	// time (all on one would be 4^-19).
	if slices.Contains(firsts, 0) {
		t.Fatalf("proxies going first over 20 slots: %v", firsts)
	}
}

// Proxies whose clocks disagree agree on the slots once the fleet hands
// each the offset to its reference clock (FleetClock): four proxies with
// clocks up to 25 ms apart, each a request just inside a slot's edge by the
// reference clock, wait 0, 1, 2 and 3 turns; uncorrected, they fall in
// different slots and do not.
func TestTurnsFollowTheFleetClock(t *testing.T) {
	now := time.Second
	skews := []time.Duration{0, 25 * time.Millisecond, -9 * time.Millisecond, 13 * time.Millisecond}
	agreed := 0
	for k := range 20 {
		// The last millisecond of a 40 ms slot (an hour is 90,000 of them).
		ref := time.Hour + time.Duration(k)*40*time.Millisecond + 39*time.Millisecond
		waits := func(correct bool) []time.Duration {
			var ws []time.Duration
			for rank, skew := range skews {
				p := newSlottedTTFT(t, &now, func() time.Duration { return ref + skew }, 4, rank, 4)
				if correct {
					p.SetFleetClockOffset(-skew)
				}
				p.Defer(&Context{Prompt: "an earlier request"}, nil, Set{})
				ws = append(ws, p.Defer(&Context{Prompt: fmt.Sprintf("request %d", k)}, nil, Set{}))
			}
			slices.Sort(ws)
			return ws
		}
		if got, want := waits(true), []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}; !slices.Equal(got, want) {
			t.Fatalf("slot %d with the clocks set to the reference: waits %v, want %v", k, got, want)
		}
		if slices.Equal(waits(false), []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}) {
			agreed++
		}
	}
	if agreed == 20 {
		t.Fatal("uncorrected clocks 25 ms apart agreed on every slot's order: the test shows nothing")
	}
}

// Proxies that measured different trips take turns of different lengths,
// but their slots are the fleet's queue interval's, the same at every
// proxy, so they still agree on each slot's order: four proxies whose
// trips make turns of 10, 15, 19 and 25 ms take places 0, 1, 2 and 3.
func TestTurnsAgreeAcrossTrips(t *testing.T) {
	now := time.Second
	trips := []time.Duration{0, 5 * time.Millisecond, 7 * time.Millisecond, 10 * time.Millisecond}
	for k := range 20 {
		fleet := time.Hour + time.Duration(k)*40*time.Millisecond + 39*time.Millisecond
		var places []int
		for rank, trip := range trips {
			p := newSlottedTTFT(t, &now, func() time.Duration { return fleet }, 4, rank, 4)
			p.SetReportTrip(trip)
			p.Defer(&Context{Prompt: "an earlier request"}, nil, Set{})
			d := p.Defer(&Context{Prompt: fmt.Sprintf("request %d", k)}, nil, Set{})
			places = append(places, int(d/p.turnGap()))
		}
		slices.Sort(places)
		if !slices.Equal(places, []int{0, 1, 2, 3}) {
			t.Fatalf("slot %d: places %v, want 0, 1, 2 and 3", k, places)
		}
	}
}

// secondOfTwo is the rank, of two proxies, that comes second in the
// fleet's first time slot (newPlacedTTFT's).
func secondOfTwo() int {
	if turnOf(0, 20*time.Millisecond, 0, 2) == 0 {
		return 1
	}
	return 0
}

// Nothing waits alone, outside a burst, or before the queue interval is
// known; and the requests of one time slot order the proxies alike,
// whatever their prompts.
func TestTurnsOnlyInABurst(t *testing.T) {
	now := time.Second
	ctx := &Context{Prompt: strings.Repeat("shared system prompt ", 40)}
	rank := secondOfTwo()
	alone := newPlacedTTFT(t, &now, 2, 0, 1)
	alone.Defer(ctx, nil, Set{})
	if d := alone.Defer(ctx, nil, Set{}); d != 0 {
		t.Fatalf("a proxy alone waits %v", d)
	}
	unpaced, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1}, Now: func() time.Duration { return now }})
	if err != nil {
		t.Fatal(err)
	}
	u := unpaced.(*predictedTTFT)
	u.SetPlace(rank, 2)
	u.Defer(ctx, nil, Set{})
	if d := u.Defer(ctx, nil, Set{}); d != 0 {
		t.Fatalf("with no report interval known a request waits %v", d)
	}
	p := newPlacedTTFT(t, &now, 2, rank, 2)
	p.Defer(&Context{Prompt: "first"}, nil, Set{})
	now += 10 * time.Millisecond // a whole turn later: not a burst
	if d := p.Defer(ctx, nil, Set{}); d != 0 {
		t.Fatalf("a request a turn after the last waits %v", d)
	}
	now += 9 * time.Millisecond
	if d := p.Defer(ctx, nil, Set{}); d != 10*time.Millisecond {
		t.Fatalf("a request 9 ms after the last waits %v, want one turn (10 ms)", d)
	}
	other := &Context{Prompt: "another prompt altogether"}
	if d := p.Defer(other, nil, Set{}); d != 10*time.Millisecond {
		t.Fatalf("another request of the slot waits %v, want one turn too", d)
	}
	// A measured report gap gives way to the fleet's interval.
	p.reportGap.Store(int64(8 * time.Millisecond))
	if got := p.turnGap(); got != 10*time.Millisecond {
		t.Fatalf("turn %v with the fleet's interval known, want 10 ms", got)
	}
	u.reportGap.Store(int64(8 * time.Millisecond))
	if got := u.turnGap(); got != 16*time.Millisecond {
		t.Fatalf("turn %v from the measured gap alone, want 16 ms", got)
	}
}

// tripTurn is a measured trip and the turn it should give.
type tripTurn struct{ trip, turn time.Duration }

// expectTurns sets each trip on p in turn and checks the turn it gives.
func expectTurns(t *testing.T, p *predictedTTFT, cases []tripTurn) {
	t.Helper()
	for _, tc := range cases {
		p.SetReportTrip(tc.trip)
		if got := p.turnGap(); got != tc.turn {
			t.Fatalf("trip %v: turn %v, want %v", tc.trip, got, tc.turn)
		}
	}
}

// A turn covers the wait for the next report and the report's trip, with a
// trip to spare: two intervals while the trip is at most half of one, the
// interval and two trips beyond.
func TestTurnsCoverTheTrip(t *testing.T) {
	now := time.Second
	ctx := &Context{Prompt: strings.Repeat("shared system prompt ", 40)}
	p := newPlacedTTFT(t, &now, 2, secondOfTwo(), 2) // 5 ms interval
	expectTurns(t, p, []tripTurn{
		{0, 10 * time.Millisecond},
		{2500 * time.Microsecond, 10 * time.Millisecond},
		{5 * time.Millisecond, 15 * time.Millisecond},
		{20 * time.Millisecond, 45 * time.Millisecond},
	})
	// A request 20 ms after another is in a burst on a 45 ms turn, and
	// waits one of them.
	p.Defer(&Context{Prompt: "first"}, nil, Set{})
	now += 20 * time.Millisecond
	if d := p.Defer(ctx, nil, Set{}); d != 45*time.Millisecond {
		t.Fatalf("with a 20 ms trip a request 20 ms after the last waits %v, want one turn (45 ms)", d)
	}
}

// Where the fleet publishes a burst's picks at once (ReportTrigger), a
// turn is two measured trips, at least a trip and a millisecond, never
// longer than a turn on the fleet's ticks; and only a burst asks for
// reports (its start, which carries the pick of its first request, made
// alone before, and each pick in it), not a lone request's pick.
func TestBurstPicksReportAtOnce(t *testing.T) {
	now := time.Second
	p := newPlacedTTFT(t, &now, 2, secondOfTwo(), 2) // 5 ms interval
	reports := 0
	p.SetReportTrigger(func() { reports++ })
	expectTurns(t, p, []tripTurn{
		{0, 10 * time.Millisecond}, // not measured yet: the ticks' turn
		{300 * time.Microsecond, 1300 * time.Microsecond},
		{2 * time.Millisecond, 4 * time.Millisecond},
		{20 * time.Millisecond, 40 * time.Millisecond},
	})
	p.SetReportTrip(2 * time.Millisecond)
	lone := &Context{Prompt: "a lone request"}
	p.Defer(lone, nil, Set{})
	p.Observe(0, lone)
	if reports != 0 {
		t.Fatalf("a lone request's pick asked for %d reports", reports)
	}
	burst := &Context{Prompt: strings.Repeat("the second request of a burst ", 40)}
	d := p.Defer(burst, nil, Set{})
	if d != 4*time.Millisecond {
		t.Fatalf("the second of a burst waits %v, want one turn of two trips (4 ms)", d)
	}
	if reports != 1 {
		t.Fatalf("the burst's start asked for %d reports, want 1 (the lone pick before it, the burst's first)", reports)
	}
	now += d
	p.Observe(1, burst)
	if reports != 2 {
		t.Fatalf("the burst's pick asked for %d reports in all, want 2", reports)
	}
	now += time.Second
	late := &Context{Prompt: "a request a second later"}
	p.Defer(late, nil, Set{})
	p.Observe(0, late)
	if reports != 2 {
		t.Fatalf("a request long after the burst asked for a report (%d in all)", reports)
	}
	p.SetReportTrigger(nil)
	if got := p.turnGap(); got != 10*time.Millisecond {
		t.Fatalf("without the trigger a turn is %v, want the ticks' 10 ms", got)
	}
}

// A request waits only where a blind pick could change its choice: on the
// fitted law, a follow-up whose 4,000-token prefix one idle target holds
// costs less there than on the other by more than a request's mean service
// (5 + 50 × 4,000 / 1,000 = 205 ms), and goes at once; a new prompt, which
// costs the same on both, waits for its turn.
func TestTurnsSkipAClearChoice(t *testing.T) {
	now := time.Second
	prefix := strings.Repeat("a", 16000)
	follow := &Context{Prompt: prefix + strings.Repeat("b", 400)}
	fresh := &Context{Prompt: strings.Repeat("c", 16400)}
	for _, tc := range []struct {
		name string
		ctx  *Context
		wait bool
	}{{"follow-up", follow, false}, {"new prompt", fresh, true}} {
		p := newFittedTTFT(t, &now, 4, "a") // in a burst: blind picks would cost
		service, ok := p.meanService(&simLaw)
		if !ok {
			t.Fatal("no mean service with a request observed")
		}
		match, pred := make([]float64, 2), make([]float64, 2)
		c := p.costs(tc.ctx, nil, All(2), 1, match, pred)
		if m := margin(pred, c.el, c.best); (m < service) != tc.wait {
			t.Fatalf("%s: margin %v ms against a mean service of %v ms", tc.name, m, service)
		}
		p.Defer(&Context{Prompt: "earlier"}, nil, Set{})
		d := p.Defer(tc.ctx, nil, Set{})
		if got := d > 0; got != tc.wait {
			t.Fatalf("%s: waits %v, want a wait: %v", tc.name, d, tc.wait)
		}
	}
}

func TestTurnMargin(t *testing.T) {
	all := All(3)
	for _, tc := range []struct {
		pred []float64
		el   Set
		want float64
	}{
		{[]float64{5, 9, 7}, all, 2},
		{[]float64{5, 5, 7}, all, 0},
		{[]float64{5, 1, 7}, setOf(0, 2), 2},
	} {
		best := 5.0
		if got := margin(tc.pred, tc.el, best); got != tc.want {
			t.Fatalf("margin(%v) = %v, want %v", tc.pred, got, tc.want)
		}
	}
	var one Set
	one.Add(1)
	if got := margin([]float64{0, 3, 0}, one, 3); got < 1e300 {
		t.Fatalf("margin with one target = %v, want +Inf", got)
	}
}

// Defer runs beside Pick, Observe, FirstToken and the fleet's
// TakeArrivals and FoldPeerArrivals from many goroutines (under -race) and
// only ever asks for whole turns, at most one fewer than the proxies.
func TestTurnsConcurrent(t *testing.T) {
	var clock atomic.Int64
	clock.Store(int64(time.Second))
	b, err := New(Spec{Strategy: PredictedTTFT, Weights: []int{1, 1, 1}, Now: func() time.Duration { return time.Duration(clock.Add(int64(time.Millisecond))) }})
	if err != nil {
		t.Fatal(err)
	}
	p := b.(*predictedTTFT)
	p.SetPlace(1, 3)
	p.SetReportInterval(5 * time.Millisecond)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for k := range 100 {
				ctx := &Context{Prompt: fmt.Sprintf("request %d of %d ", k, g) + strings.Repeat("y", 500)}
				d := p.Defer(ctx, []int{1, 2, 3}, Set{})
				if d < 0 || d > 20*time.Millisecond || d%(10*time.Millisecond) != 0 {
					t.Errorf("Defer = %v, want 0, 10 or 20 ms", d)
					return
				}
				i := p.Pick(ctx, []int{1, 2, 3}, Set{})
				p.Observe(i, ctx)
				p.FirstToken(i, ctx, 50*time.Millisecond, 125)
			}
		})
	}
	// The fleet's goroutine meanwhile takes this proxy's arrivals and folds
	// its peers', until the requests are done; every arrival is taken once
	// (800 in all: fewer than MaxReportedArrivals, so none is dropped).
	done := make(chan struct{})
	var taken atomic.Int64
	var fleet sync.WaitGroup
	fleet.Go(func() {
		for {
			taken.Add(int64(len(p.TakeArrivals(nil))))
			p.FoldPeerArrivals([]time.Duration{0, time.Millisecond, 2 * time.Millisecond})
			select {
			case <-done:
				return
			default:
			}
		}
	})
	wg.Wait()
	close(done)
	fleet.Wait()
	if n := taken.Load() + int64(len(p.TakeArrivals(nil))); n != 8*100 {
		t.Fatalf("%d arrivals taken, want %d", n, 8*100)
	}
}

// On the fitted law a request waits only where a blind pick costs more
// than its wait: where this proxy's arrivals come a few at a time, the
// peers' blind picks around it are as many and likely to land on its
// target; where they come one by one (a steady rate), a turn costs more
// than the rare collision.
func TestTurnsWeighTheBlindPick(t *testing.T) {
	now := time.Second
	ctx := &Context{Prompt: strings.Repeat("d", 16400)}
	for _, tc := range []struct {
		concurrent float64
		wait       bool
	}{{4, true}, {0.02, false}} {
		p := newFittedTTFT(t, &now, tc.concurrent, "e", "h") // both targets served alike: no clear choice
		match, pred := make([]float64, 2), make([]float64, 2)
		c := p.costs(ctx, nil, All(2), 1, match, pred)
		if service, _ := p.meanService(&simLaw); margin(pred, c.el, c.best) >= service {
			t.Fatalf("margin %v ms: a clear choice, not what this test is about", margin(pred, c.el, c.best))
		}
		p.Defer(&Context{Prompt: "earlier"}, nil, Set{})
		if d := p.Defer(ctx, nil, Set{}); (d > 0) != tc.wait {
			t.Fatalf("with %v own arrivals around each: waits %v, want a wait: %v", tc.concurrent, d, tc.wait)
		}
	}
}

// A proxy whose arrivals mostly come in bursts treats one that arrives
// alone as the first of a burst (its peers are receiving the rest), once
// the law is fitted; one whose arrivals mostly come alone does not.
func TestTurnsFirstOfABurst(t *testing.T) {
	ctx := &Context{Prompt: strings.Repeat("f", 16400)}
	for _, tc := range []struct {
		perBurst int
		wait     bool
	}{{3, true}, {1, false}} {
		now := time.Second
		p := newFittedTTFT(t, &now, 4, "g")
		for b := range 10 {
			for k := range tc.perBurst {
				p.Defer(&Context{Prompt: fmt.Sprintf("burst %d request %d", b, k)}, nil, Set{})
			}
			now += time.Second
		}
		if d := p.Defer(ctx, nil, Set{}); (d > 0) != tc.wait {
			t.Fatalf("arrivals %d at a time: a lone arrival waits %v, want a wait: %v", tc.perBurst, d, tc.wait)
		}
	}
}

// With more proxies than a burst has requests, a proxy receives its
// requests one at a time, and only its peers' arrivals show that they come
// in bursts: once most of its own had peers' arrivals within a turn, a lone
// arrival waits its turn; with theirs half a second away, or before the
// peers' are known (settleTurns later), it does not.
func TestTurnsFleetBursts(t *testing.T) {
	ctx := &Context{Prompt: strings.Repeat("k", 16400)}
	for _, tc := range []struct {
		apart time.Duration
		wait  bool
	}{{0, true}, {500 * time.Millisecond, false}} {
		now := time.Second
		p := newFittedTTFT(t, &now, 0.02, "e", "h") // own arrivals one by one; no clear choice
		for b := range 10 {
			p.Defer(&Context{Prompt: fmt.Sprintf("burst %d", b)}, nil, Set{})
			ages := make([]time.Duration, 3)
			for k := range ages {
				ages[k] = time.Duration(k)*time.Millisecond + tc.apart
			}
			now += 2 * time.Millisecond // the peers' report: arrivals up to 2 ms either side
			p.FoldPeerArrivals(ages)
			now += time.Second
		}
		if got := p.TakeArrivals(nil); len(got) != 10 || got[9] != time.Second+2*time.Millisecond {
			t.Fatalf("own arrivals taken: %v, want 10, the latest %v ago", got, time.Second+2*time.Millisecond)
		}
		if d := p.Defer(ctx, nil, Set{}); (d > 0) != tc.wait {
			t.Fatalf("3 peers' arrivals %v from each own: a lone arrival waits %v, want a wait: %v", tc.apart, d, tc.wait)
		}
	}
	// Before any own arrival has settled, the peers' alone decide nothing.
	now := time.Second
	p := newFittedTTFT(t, &now, 0.02, "e", "h")
	p.FoldPeerArrivals([]time.Duration{0, 0, 0})
	if d := p.Defer(ctx, nil, Set{}); d != 0 {
		t.Fatalf("a first arrival among unsettled peers' waits %v", d)
	}
	// Arrivals nobody takes are bounded, the latest kept.
	p.TakeArrivals(nil)
	for range 3 * MaxReportedArrivals {
		now += time.Millisecond
		p.Defer(ctx, nil, Set{})
	}
	got := p.TakeArrivals(nil)
	if len(got) == 0 || len(got) > MaxReportedArrivals || got[len(got)-1] != 0 {
		t.Fatalf("arrivals kept: %d, ending %v; want at most %d, the latest now", len(got), got[max(0, len(got)-1):], MaxReportedArrivals)
	}
}
