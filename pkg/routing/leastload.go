package routing

import "sync/atomic"

// leastLoad returns the eligible target with the lowest load.
//
// Ties: when several eligible targets share the minimum load, an atomic
// counter rotates among them (the k-th tied pick takes the (k mod t)-th of the
// t tied targets in index order), so equal-load targets, such as an idle
// route where every load is 0, share traffic instead of index 0 taking it
// all. The counter only advances on ties.
//
// Unknown loads (loads == nil or len(loads) != n): it behaves like
// round_robin over the eligible targets, with the same counter.
type leastLoad struct {
	n    int
	next atomic.Uint64
}

var _ Balancer = (*leastLoad)(nil)

func newLeastLoad(n int) *leastLoad { return &leastLoad{n: n} }

// Name implements Balancer.
func (*leastLoad) Name() string { return LeastLoad }

// Pick implements Balancer.
func (l *leastLoad) Pick(_ *Context, loads []int, eligible Set) int {
	if l.n <= 0 {
		return -1
	}
	el := eligible.OrAll(l.n)
	if len(loads) != l.n {
		return rotate(el, l.n, l.next.Add(1)-1)
	}
	best, ties := -1, 0
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			switch {
			case best < 0 || loads[i] < loads[best]:
				best, ties = i, 1
			case loads[i] == loads[best]:
				ties++
			}
		}
	}
	if ties <= 1 {
		return best
	}
	k := int((l.next.Add(1) - 1) % uint64(ties))
	lowest := loads[best]
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			if i := wi*64 + bitIndex(w); loads[i] == lowest {
				if k == 0 {
					return i
				}
				k--
			}
		}
	}
	return best // unreachable: there are ties > k members at min
}

// Observe implements Balancer; it does nothing.
func (*leastLoad) Observe(int, *Context) {}
