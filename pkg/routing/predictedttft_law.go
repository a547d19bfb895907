package routing

import (
	"math"
)

// The latency law of predicted_ttft: its inputs, the least-squares fit
// over every target's first tokens, and how it forgets.

// law returns the fleet's latency law (the least-squares fit over every
// target's first tokens), or the unit law before it has
// PredictorMinSamples of them with a determined own-work weight. One fit
// pools every target: on a homogeneous fleet per-target fits differ by
// noise alone, and that noise steered traffic (rolter-sim unique: imbalance
// 1.64 with per-target laws, 1.03 pooled; docs/routing.md).
func (t *predictedTTFT) law() ttftLaw {
	if m := t.fleet.Load(); m != nil {
		return *m
	}
	return t.unitLaw
}

func (m *ttftLaw) predict(x [lawFeatures]float64) float64 {
	var y float64
	for i, v := range x {
		y += m.w[i] * v
	}
	return y
}

// The inputs of predicted_ttft's latency law, by index: 1, the requests
// ahead, the queued prefill tokens ahead (thousands), this request's own
// uncached tokens (thousands), and the output tokens (thousands) of an
// answer that arrived whole (see WholeAnswer; 0 for a first token, and in
// every prediction). Queued and own work have their own weights: an
// engine that prefills one request at a time (vLLM's token budget per
// step) charges both, one that prefills every request on its own (vllmsim)
// only the own, and the fit learns which. The decode weight lets the
// latency of a whole answer teach the rest: its first token is that
// latency less the decode, which the fit separates.
const (
	lawBase = iota
	lawAhead
	lawQueued
	lawOwn
	lawDecode
	lawFeatures
)

// ttftLaw is predicted_ttft's latency law: TTFT (ms) = w·x.
type ttftLaw struct {
	w       [lawFeatures]float64
	samples int
}

// lawFit accumulates the normal equations of the least-squares fit of
// y = w·x, each sample weighted lawKeep^k after k later ones (mass: Σ
// weights; n: samples added).
type lawFit struct {
	xx   [lawFeatures][lawFeatures]float64
	xy   [lawFeatures]float64
	yy   float64
	mass float64
	n    int
}

// The law forgets: a sample's weight halves about every 0.69 × lawMemory
// later samples (exponential forgetting, as in recursive least squares).
// Pooled since the first, a fit a week old followed a change of the engines
// (an upgrade, a new GPU, another model behind the route) only as 1/n.
// 16,384 samples fit the law's four weights many times over and change no
// judged count (4,096 neither, with a little more movement: the settings'
// hit rate −0.08 point on average); docs/routing.md, the law forgets.
const (
	lawMemory = 16384
	lawKeep   = 1 - 1.0/lawMemory
)

func (f *lawFit) add(x [lawFeatures]float64, y float64) {
	for r := range x {
		for c := range x {
			f.xx[r][c] = f.xx[r][c]*lawKeep + x[r]*x[c]
		}
		f.xy[r] = f.xy[r]*lawKeep + x[r]*y
	}
	f.yy = f.yy*lawKeep + y*y
	f.mass = f.mass*lawKeep + 1
	f.n++
}

// solve returns the least-squares weights, none negative (every input of
// the law is work that can only delay a first token; an unconstrained fit
// on a few noisy samples gave own prefill a negative weight, so the replica
// without the prefix looked fastest), with a ridge of 1e-9 of the mean
// diagonal so that a feature that never varied (no queue yet) gets weight 0
// instead of a singular system; false when there is nothing to fit. The
// constraint is met by refitting without the most negative weight until
// none is left (the active-set idea of Lawson and Hanson's NNLS).
func (f *lawFit) solve() ([lawFeatures]float64, bool) {
	var active [lawFeatures]bool
	for i := range active {
		active[i] = true
	}
	for {
		w, ok := f.solveActive(active)
		if !ok {
			return w, false
		}
		worst := -1
		for i, v := range w {
			if active[i] && v < 0 && (worst < 0 || v < w[worst]) {
				worst = i
			}
		}
		if worst < 0 {
			return w, true
		}
		active[worst] = false
	}
}

// solveActive solves the normal equations with the inactive features'
// weights held at 0.
func (f *lawFit) solveActive(active [lawFeatures]bool) ([lawFeatures]float64, bool) {
	a, ok := f.normal(active)
	if !ok {
		return [lawFeatures]float64{}, false
	}
	b := f.xy
	for i := range b {
		if !active[i] {
			b[i] = 0
		}
	}
	return gauss(a, b)
}

// normal returns the normal matrix with the ridge, the inactive features'
// rows and columns replaced by the identity's.
func (f *lawFit) normal(active [lawFeatures]bool) ([lawFeatures][lawFeatures]float64, bool) {
	a := f.xx
	var trace float64
	for i := range a {
		trace += a[i][i]
	}
	inputs := float64(lawFeatures)
	if a[lawDecode][lawDecode] == 0 {
		inputs-- // no whole answer: the decode input is not there
	}
	ridge := 1e-9 * trace / inputs
	if ridge <= 0 {
		return a, false
	}
	for i := range a {
		if !active[i] {
			a[i] = [lawFeatures]float64{}
			for r := range a {
				a[r][i] = 0
			}
			a[i][i] = 1
			continue
		}
		a[i][i] += ridge
	}
	return a, true
}

// determined reports whether the samples determine weight k of the fit w:
// it exceeds twice its standard error (the conventional 95 % level). A law
// fitted before the own prefill ever varied (the first first tokens are
// often all cache hits) has an own-work weight that is noise, often 0, and
// would route as if prefill were free.
func (f *lawFit) determined(w [lawFeatures]float64, k int) bool {
	var active [lawFeatures]bool
	p := 0
	for i, v := range w {
		active[i] = v != 0
		if active[i] {
			p++
		}
	}
	if !active[k] || f.mass <= float64(p) {
		return false
	}
	rss := f.yy
	for i := range w {
		rss -= 2 * w[i] * f.xy[i]
		for j := range w {
			rss += w[i] * f.xx[i][j] * w[j]
		}
	}
	a, ok := f.normal(active)
	if !ok {
		return false
	}
	var e [lawFeatures]float64
	e[k] = 1
	inv, ok := gauss(a, e)
	if !ok || inv[k] <= 0 {
		return false
	}
	se := math.Sqrt(max(rss, 0) / (f.mass - float64(p)) * inv[k])
	return w[k] > 2*se
}

// gauss solves a·w = b by Gaussian elimination with partial pivoting.
func gauss(a [lawFeatures][lawFeatures]float64, b [lawFeatures]float64) ([lawFeatures]float64, bool) {
	for c := range lawFeatures {
		p := c
		for r := c + 1; r < lawFeatures; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		a[c], a[p] = a[p], a[c]
		b[c], b[p] = b[p], b[c]
		if a[c][c] == 0 {
			return [lawFeatures]float64{}, false
		}
		for r := c + 1; r < lawFeatures; r++ {
			k := a[r][c] / a[c][c]
			for j := c; j < lawFeatures; j++ {
				a[r][j] -= k * a[c][j]
			}
			b[r] -= k * b[c]
		}
	}
	var w [lawFeatures]float64
	for r := lawFeatures - 1; r >= 0; r-- {
		v := b[r]
		for j := r + 1; j < lawFeatures; j++ {
			v -= a[r][j] * w[j]
		}
		w[r] = v / a[r][r]
	}
	for _, v := range w {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return [lawFeatures]float64{}, false
		}
	}
	return w, true
}

// fit adds the sample (x, y ms) to the law. The law replaces the unit law
// once it is fitted and its own-work weight (the engine's prefill rate,
// which the pick and the served credit rest on) is determined; a later fit
// that is not keeps the last one that was.
func (t *predictedTTFT) fit(x [lawFeatures]float64, y float64) {
	t.fitMu.Lock()
	defer t.fitMu.Unlock()
	pooled := &t.pooled
	pooled.add(x, y)
	if pooled.n >= PredictorMinSamples {
		if w, ok := pooled.solve(); ok && pooled.determined(w, lawOwn) {
			t.fleet.Store(&ttftLaw{w: w, samples: pooled.n})
		}
	}
}
