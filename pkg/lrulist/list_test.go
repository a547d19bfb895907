package lrulist_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"rolter.dev/pkg/lrulist"
)

func values(l *lrulist.List[int]) []int {
	var out []int
	for _, v := range l.All() {
		out = append(out, *v)
	}
	return out
}

func TestList(t *testing.T) {
	var l lrulist.List[int]
	if _, ok := l.Oldest(); ok || l.Len() != 0 || values(&l) != nil {
		t.Fatal("the zero list is not empty")
	}
	a, b, c := l.PushNewest(1), l.PushNewest(2), l.PushNewest(3)
	if got := values(&l); !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("pushed 1 2 3, list %v", got)
	}
	l.Touch(a)
	l.Touch(a) // already the newest
	if got := values(&l); !slices.Equal(got, []int{2, 3, 1}) {
		t.Fatalf("touched 1: %v", got)
	}
	if e, ok := l.Oldest(); !ok || e != b || *l.At(e) != 2 {
		t.Fatalf("oldest %d %v, want the handle of 2", e, ok)
	}
	*l.At(c) = 30
	l.Remove(b)
	d := l.PushNewest(4) // reuses b's slot
	if d != b {
		t.Errorf("a freed slot was not reused: handle %d, freed %d", d, b)
	}
	if got := values(&l); !slices.Equal(got, []int{30, 1, 4}) || l.Len() != 3 {
		t.Fatalf("after remove and push: %v (len %d)", got, l.Len())
	}
	for _, e := range []int32{c, a, d} {
		l.Remove(e)
	}
	if _, ok := l.Oldest(); ok || l.Len() != 0 {
		t.Fatal("emptied list not empty")
	}
}

// The list against a plain slice model under random pushes, touches and
// removals.
func TestListModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var l lrulist.List[int]
	var model []int           // values, oldest first
	handle := map[int]int32{} // value → handle
	for i := range 20000 {
		switch op := rng.IntN(3); {
		case op == 0 || len(model) == 0:
			handle[i] = l.PushNewest(i)
			model = append(model, i)
		case op == 1:
			k := rng.IntN(len(model))
			v := model[k]
			l.Touch(handle[v])
			model = append(slices.Delete(model, k, k+1), v)
		default:
			k := rng.IntN(len(model))
			v := model[k]
			l.Remove(handle[v])
			delete(handle, v)
			model = slices.Delete(model, k, k+1)
		}
		if l.Len() != len(model) {
			t.Fatalf("step %d: len %d, model %d", i, l.Len(), len(model))
		}
		if i%97 == 0 {
			if got := values(&l); !slices.Equal(got, model) {
				t.Fatalf("step %d: list %v, model %v", i, got, model)
			}
		}
	}
}

// Grow makes room once: the pushes it made room for allocate nothing.
// (AllocsPerRun calls the function once more to warm up: 2 × 1,000.)
func TestGrowThenPushAllocatesNothing(t *testing.T) {
	var l lrulist.List[int]
	l.Grow(2000)
	allocs := testing.AllocsPerRun(1, func() {
		for i := range 1000 {
			l.PushNewest(i)
		}
	})
	if allocs != 0 || l.Len() != 2000 {
		t.Fatalf("%v allocations pushing 1,000 twice after Grow(2000), %d elements", allocs, l.Len())
	}
	l.Grow(0) // nothing to make room for: a no-op
	if l.Len() != 2000 {
		t.Fatalf("Grow(0) changed the list: %d elements", l.Len())
	}
}
