package routing_test

import (
	"testing"

	"rolter.dev/pkg/routing"
)

// newBalancer builds a balancer from spec with n targets of weight 1 when
// spec.Weights is nil, failing the test on error.
func newBalancer(tb testing.TB, spec routing.Spec, n int) routing.Balancer {
	tb.Helper()
	if spec.Weights == nil {
		spec.Weights = make([]int, n)
		for i := range spec.Weights {
			spec.Weights[i] = 1
		}
	}
	b, err := routing.New(spec)
	if err != nil {
		tb.Fatalf("New(%+v): %v", spec, err)
	}
	if b.Name() != spec.Strategy {
		tb.Fatalf("New(%s).Name() = %q", spec.Strategy, b.Name())
	}
	return b
}

func eligibleOf(idx ...int) routing.Set {
	var s routing.Set
	for _, i := range idx {
		s.Add(i)
	}
	return s
}

func tally(picks []int, n int) []int {
	c := make([]int, n)
	for _, p := range picks {
		c[p]++
	}
	return c
}

// proxy drives a balancer the way the dataplane does: read the loads, pick,
// count the pick in flight, observe; finish later takes it out of flight.
type proxy struct {
	b     routing.Balancer
	loads []int
}

func (p *proxy) send(ctx *routing.Context, el routing.Set) int {
	t := p.b.Pick(ctx, p.loads, el)
	p.loads[t]++
	p.b.Observe(t, ctx)
	return t
}

func (p *proxy) finish(t int) { p.loads[t]-- }
