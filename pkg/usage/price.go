package usage

import (
	"fmt"
	"math"
)

// ModelPrice is one [[model_prices]] element: the USD price of a model per
// million tokens.
type ModelPrice struct {
	// Model is matched against "<provider>/<target model>", then the
	// target (upstream) model, then the model the client asked for.
	Model string `toml:"model"`
	// InputPerMTok prices prompt tokens not served from a provider cache.
	InputPerMTok float64 `toml:"input_per_mtok"`
	// OutputPerMTok prices completion tokens.
	OutputPerMTok float64 `toml:"output_per_mtok"`
	// CachedInputPerMTok prices prompt tokens served from the provider's
	// prompt cache; absent means InputPerMTok.
	CachedInputPerMTok *float64 `toml:"cached_input_per_mtok"`
}

// Cost returns the USD cost of u at this price: uncached prompt tokens at
// the input price (cache writes included), cached prompt tokens at the
// cached-input price, completion tokens at the output price.
func (p ModelPrice) Cost(u Usage) float64 {
	cachedPrice := p.InputPerMTok
	if p.CachedInputPerMTok != nil {
		cachedPrice = *p.CachedInputPerMTok
	}
	cached := min(u.CachedTokens, u.PromptTokens)
	return (float64(u.PromptTokens-cached)*p.InputPerMTok +
		float64(cached)*cachedPrice +
		float64(u.CompletionTokens)*p.OutputPerMTok) / 1e6
}

// FieldError is one configuration problem at one field path, for example
// `model_prices[1].input_per_mtok: must be a finite number >= 0, got -1`.
type FieldError struct {
	Path string
	Msg  string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

// ValidatePrices checks the [[model_prices]] list; path is its key
// ("model_prices"). Models must be unique and prices finite and >= 0.
func ValidatePrices(path string, prices []ModelPrice) []error {
	var errs []error
	add := func(p, format string, args ...any) {
		errs = append(errs, &FieldError{Path: p, Msg: fmt.Sprintf(format, args...)})
	}
	seen := map[string]int{}
	for i, p := range prices {
		pp := fmt.Sprintf("%s[%d]", path, i)
		if p.Model == "" {
			add(pp+".model", "must not be empty")
		} else if first, dup := seen[p.Model]; dup {
			add(pp+".model", "duplicate price for %q (also %s[%d])", p.Model, path, first)
		} else {
			seen[p.Model] = i
		}
		check := func(key string, v float64) {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				add(pp+"."+key, "must be a finite number >= 0, got %v", v)
			}
		}
		check("input_per_mtok", p.InputPerMTok)
		check("output_per_mtok", p.OutputPerMTok)
		if p.CachedInputPerMTok != nil {
			check("cached_input_per_mtok", *p.CachedInputPerMTok)
		}
	}
	return errs
}

// PriceTable looks prices up by model. It is immutable and safe for
// concurrent use; a reload builds a new one.
type PriceTable struct {
	byModel map[string]ModelPrice
}

// NewPriceTable indexes prices; a later duplicate replaces an earlier one
// (ValidatePrices rejects duplicates).
func NewPriceTable(prices []ModelPrice) *PriceTable {
	t := &PriceTable{byModel: make(map[string]ModelPrice, len(prices))}
	for _, p := range prices {
		t.byModel[p.Model] = p
	}
	return t
}

// Lookup returns the price of a response: the first of
// "<provider>/<targetModel>", targetModel and model that has one.
func (t *PriceTable) Lookup(provider, targetModel, model string) (ModelPrice, bool) {
	if t == nil {
		return ModelPrice{}, false
	}
	if provider != "" && targetModel != "" {
		if p, ok := t.byModel[provider+"/"+targetModel]; ok {
			return p, true
		}
	}
	for _, m := range []string{targetModel, model} {
		if m == "" {
			continue
		}
		if p, ok := t.byModel[m]; ok {
			return p, true
		}
	}
	return ModelPrice{}, false
}

// Bill fills r's tokens, cost_usd, usage_unknown and unpriced from u, using
// r's Provider, TargetModel and Model to find the price. A cache hit
// (r.CacheHit set) costs zero and records zero tokens: the upstream was not
// called. A response without usage is usage_unknown and costs zero. A nil
// table prices nothing.
func (t *PriceTable) Bill(r *Record, u Usage) {
	r.PromptTokens, r.CompletionTokens, r.CachedTokens, r.CostUSD = 0, 0, 0, 0
	r.UsageUnknown, r.Unpriced = false, false
	if r.CacheHit != "" {
		return
	}
	if !u.Known {
		r.UsageUnknown = true
		return
	}
	r.PromptTokens, r.CompletionTokens, r.CachedTokens = u.PromptTokens, u.CompletionTokens, u.CachedTokens
	p, ok := t.Lookup(r.Provider, r.TargetModel, r.Model)
	if !ok {
		r.Unpriced = true
		return
	}
	r.CostUSD = p.Cost(u)
}
