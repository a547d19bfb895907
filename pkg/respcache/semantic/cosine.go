package semantic

import "math"

// Cosine returns the cosine similarity of a and b, computed in float64 and
// clamped to [-1, 1]. ok is false, and there is no match, when the lengths
// differ, a vector is empty, a norm is zero or the result is not a number
// (an infinite or NaN component).
func Cosine(a, b []float32) (sim float64, ok bool) {
	if len(a) == 0 || len(a) != len(b) {
		return 0, false
	}
	var dot, na, nb float64
	for i, x := range a {
		y := float64(b[i])
		dot += float64(x) * y
		na += float64(x) * float64(x)
		nb += y * y
	}
	if na == 0 || nb == 0 {
		return 0, false
	}
	sim = dot / (math.Sqrt(na) * math.Sqrt(nb))
	if math.IsNaN(sim) {
		return 0, false
	}
	return max(-1, min(1, sim)), true
}
