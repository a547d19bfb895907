package routing

import "sync/atomic"

// roundRobin hands out picks in turn.
//
// Exact behaviour: the k-th Pick over the balancer's life (k counted from 0
// by an atomic counter, shared by concurrent callers) returns the
// (k mod m)-th eligible target in index order, where m is the number of
// eligible targets below n (or n when none is eligible). With every target
// eligible that is k mod n, so picks cycle 0, 1, ..., n-1, 0, ... . With some
// targets ineligible the rotation runs over the eligible ones only, so each
// of them gets an equal 1/m share while the set holds: with {0,2,3} eligible
// out of 4 the picks cycle 0, 2, 3. (The "first eligible at (k+j) mod n"
// variant would hand every skipped turn to the next eligible index, giving
// that one a double share.)
type roundRobin struct {
	n    int
	next atomic.Uint64
}

var _ Balancer = (*roundRobin)(nil)

func newRoundRobin(n int) *roundRobin { return &roundRobin{n: n} }

// Name implements Balancer.
func (*roundRobin) Name() string { return RoundRobin }

// Pick implements Balancer; loads are ignored.
func (r *roundRobin) Pick(_ *Context, _ []int, eligible Set) int {
	if r.n <= 0 {
		return -1
	}
	return rotate(eligible.OrAll(r.n), r.n, r.next.Add(1)-1)
}

// Observe implements Balancer; it does nothing.
func (*roundRobin) Observe(int, *Context) {}

// rotate returns the (ticket mod m)-th member of el, m = el.Len(). el must
// hold at least one member and none at or above n (as OrAll returns).
func rotate(el Set, n int, ticket uint64) int {
	m := uint64(el.Len())
	if m == 0 {
		return -1
	}
	return el.Nth(int(ticket%m), n)
}
