package semantic_test

import (
	"math"
	"testing"

	"rolter.dev/pkg/respcache/semantic"
)

func TestCosine(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	tests := []struct {
		name   string
		a, b   []float32
		want   float64
		wantOK bool
	}{
		{"identical", []float32{1, 2, 3}, []float32{1, 2, 3}, 1, true},
		{"scaled", []float32{1, 2, 3}, []float32{2, 4, 6}, 1, true},
		{"opposite", []float32{1, -2}, []float32{-1, 2}, -1, true},
		{"orthogonal", []float32{1, 0}, []float32{0, 1}, 0, true},
		{"45 degrees", []float32{1, 0}, []float32{1, 1}, 1 / math.Sqrt2, true},
		{"tiny components do not underflow", []float32{1e-30, 1e-30}, []float32{1e-30, 1e-30}, 1, true},
		{"no match: length mismatch", []float32{1, 2}, []float32{1, 2, 3}, 0, false},
		{"no match: both empty", []float32{}, []float32{}, 0, false},
		{"no match: nil", nil, []float32{1}, 0, false},
		{"no match: both nil", nil, nil, 0, false},
		{"no match: zero norm", []float32{0, 0}, []float32{1, 1}, 0, false},
		{"no match: infinite component", []float32{inf, 1}, []float32{1, 1}, 0, false},
		{"no match: NaN component", []float32{nan, 1}, []float32{1, 1}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := semantic.Cosine(tc.a, tc.b)
			if ok != tc.wantOK || math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("Cosine = %v, %v; want %v, %v", got, ok, tc.want, tc.wantOK)
			}
			if got < -1 || got > 1 {
				t.Fatalf("Cosine = %v outside [-1, 1]", got)
			}
		})
	}
}

func TestCosineClamped(t *testing.T) {
	// Rounding can push the similarity of a vector with itself past 1.
	v := make([]float32, 1536)
	for i := range v {
		v[i] = float32(math.Sin(float64(i)*0.37)) * 0.1
	}
	for range 3 {
		got, ok := semantic.Cosine(v, v)
		if !ok || got > 1 || got < 1-1e-9 {
			t.Fatalf("Cosine(v, v) = %v, %v", got, ok)
		}
		v = append(v, 0.3)
	}
}
