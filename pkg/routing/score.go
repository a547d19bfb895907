package routing

// tieEpsilon is how close two weighted scores must be to count as a tie.
const tieEpsilon = 1e-6

// argmax returns the member of el with the greatest score. A score more than
// tieEpsilon above the best so far starts a new best; one within tieEpsilon
// of it joins the ties, and the winner among the ties is uniform (reservoir
// sampling with intn, Spec.IntN). el must not be empty and scores must cover
// it.
func argmax(el Set, scores []float64, intn func(int) int) int {
	pick, best, ties := -1, 0.0, 0
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			s := scores[i]
			switch {
			case pick < 0 || s > best+tieEpsilon:
				pick, best, ties = i, s, 1
			case s >= best-tieEpsilon:
				ties++
				if intn(ties) == 0 {
					pick = i
				}
			}
		}
	}
	return pick
}

// addLeastLoad adds w * (1 - load/max) to the score of each member of el,
// where max is the greatest load over el (at least 1) and negative loads
// count as 0; with loads unknown (len(loads) != n) every member gets w.
func addLeastLoad(scores []float64, el Set, loads []int, n int, w float64) {
	if w == 0 {
		return
	}
	if len(loads) != n {
		for wi, word := range el.w {
			for ; word != 0; word &= word - 1 {
				scores[wi*64+bitIndex(word)] += w
			}
		}
		return
	}
	top := 1
	for wi, word := range el.w {
		for ; word != 0; word &= word - 1 {
			top = max(top, loads[wi*64+bitIndex(word)])
		}
	}
	for wi, word := range el.w {
		for ; word != 0; word &= word - 1 {
			i := wi*64 + bitIndex(word)
			scores[i] += w * (1 - float64(max(loads[i], 0))/float64(top))
		}
	}
}
