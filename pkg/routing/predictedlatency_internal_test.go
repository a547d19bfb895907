package routing

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestPromptTokens(t *testing.T) {
	tests := []struct {
		name string
		ctx  *Context
		want int
	}{
		{"nil", nil, 0},
		{"nothing", &Context{}, 0},
		{"token ids first", &Context{TokenIDs: []uint32{1, 2, 3}, PromptLen: 4000, Prompt: "abcdefgh"}, 3},
		{"then the whole prompt length", &Context{TokenIDs: []uint32{}, PromptLen: 4003, Prompt: "abcdefgh"}, 1000},
		{"then the bounded text", &Context{Prompt: "abcdefghi"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := promptTokens(tt.ctx); got != tt.want {
				t.Fatalf("promptTokens = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestLatencyModelConverges: NLMS recovers a linear latency law from noisy
// samples and predicts nothing before PredictorMinSamples.
func TestLatencyModelConverges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	truth := func(depth, tokens int) float64 { return 80 + 25*float64(depth) + 40*float64(tokens)/1000 }
	var m *latencyModel
	for k := range 20000 {
		if k < PredictorMinSamples {
			if _, ok := m.predict(features(1, 1000)); ok {
				t.Fatalf("predicts after %d samples", k)
			}
		}
		d, tok := rng.IntN(10), rng.IntN(8000)
		m = m.learn(features(d, tok), truth(d, tok)*(0.95+0.1*rng.Float64()))
	}
	for _, c := range []struct{ depth, tokens int }{{0, 0}, {3, 2000}, {9, 7000}} {
		got, ok := m.predict(features(c.depth, c.tokens))
		if want := truth(c.depth, c.tokens); !ok || math.Abs(got-want) > 0.1*want {
			t.Errorf("predict(%d, %d) = %.1f, %v; want ≈%.1f", c.depth, c.tokens, got, ok, want)
		}
	}
	// Coefficients stay clamped whatever the input.
	for range 100 {
		m = m.learn(features(1e9, 1e12), 1e18)
	}
	for _, w := range m.w {
		if math.Abs(w) > PredictorMaxCoefficient {
			t.Fatalf("coefficient %v beyond the clamp", w)
		}
	}
}
