package routing

import (
	"math/bits"
	"math/rand/v2"
	"testing"
)

// naiveSet is a reference model of Set for the property tests.
type naiveSet map[int]bool

func randomSet(rng *rand.Rand, limit int, p float64) (Set, naiveSet) {
	var s Set
	m := naiveSet{}
	for i := 0; i < limit; i++ {
		if rng.Float64() < p {
			s.Add(i)
			m[i] = true
		}
	}
	return s, m
}

func TestSetBasics(t *testing.T) {
	var s Set
	if !s.Empty() || s.Len() != 0 || s.String() != "{}" {
		t.Fatalf("zero Set = %v, Empty=%v Len=%d", s, s.Empty(), s.Len())
	}
	for _, i := range []int{-1, MaxTargets, MaxTargets + 5} {
		s.Add(i)
		if !s.Empty() || s.Has(i) {
			t.Fatalf("Add(%d) out of range changed the set: %v", i, s)
		}
		s.Remove(i) // must not panic
	}
	for _, i := range []int{0, 5, 63, 64, 200, MaxTargets - 1} {
		s.Add(i)
	}
	s.Add(5) // idempotent
	if got, want := s.String(), "{0,5,63,64,200,255}"; got != want {
		t.Fatalf("String = %s, want %s", got, want)
	}
	if s.Len() != 6 || s.Empty() {
		t.Fatalf("Len = %d, Empty = %v", s.Len(), s.Empty())
	}
	if !s.Has(63) || !s.Has(64) || s.Has(62) || s.Has(-1) || s.Has(MaxTargets) {
		t.Fatalf("Has is wrong for %v", s)
	}
	s.Remove(63)
	s.Remove(63)
	if s.Has(63) || s.Len() != 5 {
		t.Fatalf("Remove(63): %v", s)
	}
	c := s // value semantics
	c.Remove(0)
	if !s.Has(0) {
		t.Fatal("copy of a Set shares state with the original")
	}
}

func TestSetAll(t *testing.T) {
	for _, n := range []int{-3, 0, 1, 7, 63, 64, 65, 128, 200, MaxTargets, MaxTargets + 10} {
		s := All(n)
		want := min(max(n, 0), MaxTargets)
		if s.Len() != want {
			t.Fatalf("All(%d).Len() = %d, want %d", n, s.Len(), want)
		}
		for i := -1; i <= MaxTargets; i++ {
			if s.Has(i) != (i >= 0 && i < want) {
				t.Fatalf("All(%d).Has(%d) = %v", n, i, s.Has(i))
			}
		}
	}
}

func TestSetBelowOrAll(t *testing.T) {
	var s Set
	s.Add(3)
	s.Add(70)
	s.Add(130)
	tests := []struct {
		n            int
		below, orAll string
	}{
		{0, "{}", "{}"},
		{3, "{}", "{0,1,2}"},
		{4, "{3}", "{3}"},
		{70, "{3}", "{3}"},
		{71, "{3,70}", "{3,70}"},
		{256, "{3,70,130}", "{3,70,130}"},
		{1000, "{3,70,130}", "{3,70,130}"},
	}
	for _, tt := range tests {
		if got := s.Below(tt.n).String(); got != tt.below {
			t.Errorf("%v.Below(%d) = %s, want %s", s, tt.n, got, tt.below)
		}
		if got := s.OrAll(tt.n).String(); got != tt.orAll {
			t.Errorf("%v.OrAll(%d) = %s, want %s", s, tt.n, got, tt.orAll)
		}
	}
	var empty Set
	if got := empty.OrAll(5).String(); got != "{0,1,2,3,4}" {
		t.Errorf("empty.OrAll(5) = %s", got)
	}
}

func TestSetNthMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		s, m := randomSet(rng, MaxTargets, rng.Float64())
		n := rng.IntN(MaxTargets + 20)
		var members []int
		for i := 0; i < n && i < MaxTargets; i++ {
			if m[i] {
				members = append(members, i)
			}
		}
		for k := -2; k <= len(members)+2; k++ {
			want := -1
			if k >= 0 && k < len(members) {
				want = members[k]
			}
			if got := s.Nth(k, n); got != want {
				t.Fatalf("%v.Nth(%d, %d) = %d, want %d", s, k, n, got, want)
			}
		}
		if got := s.Below(n).Len(); got != len(members) {
			t.Fatalf("%v.Below(%d).Len() = %d, want %d", s, n, got, len(members))
		}
	}
}

func TestSelectBit(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 2000; trial++ {
		w := rng.Uint64() & rng.Uint64()
		if trial%7 == 0 {
			w = ^uint64(0)
		}
		k := 0
		for x := w; x != 0; x &= x - 1 {
			if got, want := selectBit(w, k), bits.TrailingZeros64(x); got != want {
				t.Fatalf("selectBit(%#x, %d) = %d, want %d", w, k, got, want)
			}
			k++
		}
	}
}

func TestSetWithout(t *testing.T) {
	a, b := All(10), Set{}
	b.Add(2)
	b.Add(9)
	b.Add(100)
	if got := a.without(b).String(); got != "{0,1,3,4,5,6,7,8}" {
		t.Fatalf("without = %s", got)
	}
}
