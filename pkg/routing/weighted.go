package routing

import "sync/atomic"

// maxWeight bounds a target weight so that sums and products of weights
// stay far from int64 overflow; weights are clamped to [1, maxWeight].
const maxWeight = 1 << 30

// weighted is nginx's smooth weighted round robin restricted to the eligible
// targets. Sequentially it is exactly nginx's algorithm: on each pick every
// eligible i gets current[i] += w[i]; the first strict maximum among the
// eligible wins and pays current[best] -= (sum of eligible weights). [3,1]
// with both eligible gives 0,0,1,0 repeating. An ineligible target's current
// value is left untouched, so its share goes to the others in proportion to
// their weights.
//
// Concurrency: lock-free, with O(1) atomic writes per pick in the common
// case. Instead of current[i] the state is one shared pick counter g and one
// debt[i] per target, with current[i] = g*w[i] - debt[i]. A pick takes its
// ticket g = picks.Add(1), which is "current[i] += w[i]" for every target at
// once; adds w[j] to debt[j] for each ineligible j below n to undo that
// (usually none, at most n-1); loads debt[i] of the eligible targets to find
// the first strict maximum; and adds the eligible total to debt[best]. Run
// serially this is exactly the nginx algorithm above (tests compare it pick
// by pick with a plain implementation). Every write is an atomic add, so
// racing picks never lose an update: once they finish, the state is exactly
// nginx's state for the choices they made. A racing pick may read a slightly
// stale current and choose what a serial order would have chosen a step
// earlier or later, but the chosen target pays its debt either way, so the
// error does not accumulate: shares stay exact in the long run, and the
// current values stay within a few totals of 0. Arithmetic wraps in int64
// (defined in Go), which is harmless: only g*w[i] - debt[i], which stays
// small, is ever used, and weights are clamped to [1, maxWeight].
//
// Why not a mutex around the nginx loop: it would serialise every request of
// the route on one lock held for an O(n) loop, and a goroutine preempted
// inside it (2 cores shared by many goroutines) would stall all the others.
// Here a pick costs two atomic adds and n atomic loads, and never waits.
type weighted struct {
	w     []int64 // clamped weights, one per target
	total int64   // sum of w
	picks atomic.Int64
	debt  []atomic.Int64
}

var _ Balancer = (*weighted)(nil)

func newWeighted(weights []int) *weighted {
	b := &weighted{
		w:    make([]int64, len(weights)),
		debt: make([]atomic.Int64, len(weights)),
	}
	for i, w := range weights {
		b.w[i] = int64(max(1, min(w, maxWeight)))
		b.total += b.w[i]
	}
	return b
}

// Name implements Balancer.
func (*weighted) Name() string { return Weighted }

// Pick implements Balancer; loads are ignored.
func (b *weighted) Pick(_ *Context, _ []int, eligible Set) int {
	n := len(b.w)
	if n == 0 {
		return -1
	}
	el := eligible.OrAll(n)
	g := b.picks.Add(1)
	total := b.total
	if out := All(n).without(el); !out.Empty() {
		for wi, w := range out.w {
			for ; w != 0; w &= w - 1 {
				j := wi*64 + bitIndex(w)
				b.debt[j].Add(b.w[j])
				total -= b.w[j]
			}
		}
	}
	best, bestCur := -1, int64(0)
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			if cur := g*b.w[i] - b.debt[i].Load(); best < 0 || cur > bestCur {
				best, bestCur = i, cur
			}
		}
	}
	b.debt[best].Add(total)
	return best
}

// Observe implements Balancer; it does nothing.
func (*weighted) Observe(int, *Context) {}
