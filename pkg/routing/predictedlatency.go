package routing

import (
	"math"
	"sync/atomic"
	"time"
)

// Latency model constants (the reference predictor's, #853).
const (
	// PredictorMinSamples is how many successful requests a target's model
	// needs before it predicts.
	PredictorMinSamples = 8
	// PredictorStep is the NLMS step size.
	PredictorStep = 0.15
	// PredictorEpsilon regularises the NLMS normalisation.
	PredictorEpsilon = 1e-3
	// PredictorMaxCoefficient bounds every coefficient to ±this.
	PredictorMaxCoefficient = 600_000.0
)

// Weights of predicted_latency's scoring stack.
const (
	predictedLatencyWeight = 1.0
	predictedLoadWeight    = 0.25
)

// predictedLatency routes to the target with the lowest predicted latency.
//
// Model, one per target, learned online by normalised LMS from successful
// requests only ([Learner]):
//
//	latency_ms ≈ w0 + w1*queue_depth + w2*(prompt_tokens/1000)
//
// With x = (1, queue_depth, prompt_tokens/1000) and y the observed latency in
// ms: e = y - w·x; w += STEP * e * x / (EPSILON + |x|²), each coefficient
// clamped to ±MAX_COEFFICIENT (STEP 0.15, EPSILON 1e-3, MAX 600000). A model
// predicts max(0, w·x) once it has MIN_SAMPLES (8) samples, and nothing
// before. prompt_tokens = len(TokenIDs) when present, else PromptLen/4, else
// len(Prompt)/4 (PromptLen covers the whole prompt past the 32 KiB cut, tool
// traffic included).
//
// Pick over the eligible set E (every target when none is eligible), with
// queue_depth = loads[i] (0 when loads are unknown):
//
//	score(i) = 1.0 * rank(i) + 0.25 * least_load(i)
//
// rank is lower-is-better over the predictions p(i) of E: a prediction <= 0
// or none is unknown; if no member is known, or all known predictions are
// equal, every member ranks 1; otherwise a known one ranks
// 1 - (p(i) - min)/(max - min) and an unknown one 0.5. least_load is the
// pipeline's (1 - load/max(max load, 1), all 1 when loads are unknown). The
// argmax wins, ties (within 1e-6) broken uniformly at random. So a target
// predicted fastest wins unless load says otherwise by more than the ranking
// gap, and with no predictions the least-loaded target wins.
//
// Concurrency: each target's model is an immutable value behind an
// atomic.Pointer; Pick only loads pointers (no lock, no allocation) and Learn
// swaps in an updated copy with compare-and-swap.
type predictedLatency struct {
	n         int
	models    []atomic.Pointer[latencyModel]
	decisions [2]atomic.Uint64 // predicted, unpredicted
	intn      func(n int) int
}

// latencyModel is one target's NLMS state; it is never modified once
// published.
type latencyModel struct {
	w       [3]float64
	samples int
}

var (
	_ Balancer        = (*predictedLatency)(nil)
	_ Learner         = (*predictedLatency)(nil)
	_ DecisionCounter = (*predictedLatency)(nil)
)

func newPredictedLatency(n int, intn func(int) int) *predictedLatency {
	return &predictedLatency{n: n, models: make([]atomic.Pointer[latencyModel], n), intn: intn}
}

// Name implements Balancer.
func (*predictedLatency) Name() string { return PredictedLatency }

// promptTokens estimates the prompt's token count.
func promptTokens(ctx *Context) int {
	switch {
	case ctx == nil:
		return 0
	case len(ctx.TokenIDs) > 0:
		return len(ctx.TokenIDs)
	case ctx.PromptLen > 0:
		return ctx.PromptLen / 4
	}
	return len(ctx.Prompt) / 4
}

func features(queueDepth, tokens int) [3]float64 {
	return [3]float64{1, float64(queueDepth), float64(tokens) / 1000}
}

// predict returns the model's latency estimate in ms, or false when it has
// too few samples.
func (m *latencyModel) predict(x [3]float64) (float64, bool) {
	if m == nil || m.samples < PredictorMinSamples {
		return 0, false
	}
	return max(0, m.w[0]*x[0]+m.w[1]*x[1]+m.w[2]*x[2]), true
}

// learn returns m updated by one NLMS step towards y (m may be nil).
func (m *latencyModel) learn(x [3]float64, y float64) *latencyModel {
	next := &latencyModel{samples: 1}
	if m != nil {
		*next = *m
		next.samples++
	}
	e := y - (next.w[0]*x[0] + next.w[1]*x[1] + next.w[2]*x[2])
	norm := PredictorEpsilon + x[0]*x[0] + x[1]*x[1] + x[2]*x[2]
	for j := range next.w {
		w := next.w[j] + PredictorStep*e*x[j]/norm
		next.w[j] = max(-PredictorMaxCoefficient, min(PredictorMaxCoefficient, w))
	}
	return next
}

// Pick implements Balancer.
func (p *predictedLatency) Pick(ctx *Context, loads []int, eligible Set) int {
	if p.n <= 0 {
		return -1
	}
	el := eligible.OrAll(p.n)
	if el.Len() == 1 {
		return el.Nth(0, p.n)
	}
	known := len(loads) == p.n
	tokens := promptTokens(ctx)
	var pbuf, sbuf [MaxTargets]float64
	pred, scores := pbuf[:p.n], sbuf[:p.n]
	lo, hi, anyKnown := math.Inf(1), math.Inf(-1), false
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			depth := 0
			if known {
				depth = loads[i]
			}
			if v, ok := p.models[i].Load().predict(features(depth, tokens)); ok && v > 0 {
				pred[i] = v
				lo, hi, anyKnown = min(lo, v), max(hi, v), true
			}
		}
	}
	if anyKnown {
		p.decisions[0].Add(1)
	} else {
		p.decisions[1].Add(1)
	}
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			i := wi*64 + bitIndex(w)
			switch {
			case !anyKnown || lo >= hi:
				scores[i] = predictedLatencyWeight
			case pred[i] > 0:
				scores[i] = predictedLatencyWeight * (1 - (pred[i]-lo)/(hi-lo))
			default:
				scores[i] = predictedLatencyWeight * 0.5
			}
		}
	}
	addLeastLoad(scores, el, loads, p.n, predictedLoadWeight)
	return argmax(el, scores, p.intn)
}

// Observe implements Balancer; the model learns only from successes, through
// Learn.
func (*predictedLatency) Observe(int, *Context) {}

// Learn implements [Learner]: one NLMS step for target with the request's
// queue depth at pick time and its latency. A target out of range or a
// negative latency is ignored.
func (p *predictedLatency) Learn(target int, ctx *Context, queueDepth int, latency time.Duration) {
	if target < 0 || target >= p.n || latency < 0 {
		return
	}
	x := features(queueDepth, promptTokens(ctx))
	y := float64(latency) / float64(time.Millisecond)
	for {
		old := p.models[target].Load()
		if p.models[target].CompareAndSwap(old, old.learn(x, y)) {
			return
		}
	}
}

// Decisions implements [DecisionCounter].
func (p *predictedLatency) Decisions() map[string]uint64 {
	return map[string]uint64{
		DecisionPredicted:   p.decisions[0].Load(),
		DecisionUnpredicted: p.decisions[1].Load(),
	}
}
