package routing

// powerOfTwo is "power of two choices": it draws two distinct eligible
// targets uniformly at random, a then b, and returns the one with the lower
// load, a on a tie. When loads are unknown (len(loads) != n) it returns a,
// which makes it uniform random. With a single eligible target it returns
// that target.
type powerOfTwo struct {
	n    int
	intn func(n int) int
}

var _ Balancer = (*powerOfTwo)(nil)

func newPowerOfTwo(n int, intn func(int) int) *powerOfTwo {
	return &powerOfTwo{n: n, intn: intn}
}

// Name implements Balancer.
func (*powerOfTwo) Name() string { return PowerOfTwo }

// Pick implements Balancer.
func (p *powerOfTwo) Pick(_ *Context, loads []int, eligible Set) int {
	if p.n <= 0 {
		return -1
	}
	el := eligible.OrAll(p.n)
	m := el.Len()
	if m == 1 {
		return el.Nth(0, p.n)
	}
	i := p.intn(m)
	j := p.intn(m - 1)
	if j >= i {
		j++ // j is uniform over the m-1 ranks other than i
	}
	a := el.Nth(i, p.n)
	if len(loads) != p.n {
		return a
	}
	if b := el.Nth(j, p.n); loads[b] < loads[a] {
		return b
	}
	return a
}

// Observe implements Balancer; it does nothing.
func (*powerOfTwo) Observe(int, *Context) {}
