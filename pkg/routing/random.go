package routing

// random picks uniformly among the eligible targets, drawing from
// Spec.IntN (by default the goroutine-safe, lock-free top-level generator of
// math/rand/v2).
type random struct {
	n    int
	intn func(n int) int
}

var _ Balancer = (*random)(nil)

func newRandom(n int, intn func(int) int) *random { return &random{n: n, intn: intn} }

// Name implements Balancer.
func (*random) Name() string { return Random }

// Pick implements Balancer; loads are ignored.
func (r *random) Pick(_ *Context, _ []int, eligible Set) int {
	if r.n <= 0 {
		return -1
	}
	el := eligible.OrAll(r.n)
	return el.Nth(r.intn(el.Len()), r.n)
}

// Observe implements Balancer; it does nothing.
func (*random) Observe(int, *Context) {}
