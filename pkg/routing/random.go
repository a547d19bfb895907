package routing

import "math/rand/v2"

// random picks uniformly among the eligible targets. It uses the
// goroutine-safe, lock-free top-level generator of math/rand/v2.
type random struct {
	n int
}

var _ Balancer = (*random)(nil)

func newRandom(n int) *random { return &random{n: n} }

// Name implements Balancer.
func (*random) Name() string { return Random }

// Pick implements Balancer; loads are ignored.
func (r *random) Pick(_ *Context, _ []int, eligible Set) int {
	if r.n <= 0 {
		return -1
	}
	el := eligible.OrAll(r.n)
	return el.Nth(rand.IntN(el.Len()), r.n)
}

// Observe implements Balancer; it does nothing.
func (*random) Observe(int, *Context) {}
