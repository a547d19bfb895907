package state_test

import (
	"reflect"
	"testing"

	"rolter.dev/controlplane/internal/state"
)

// TestVariantsRoundTrip: the canonical TOML the control plane pushes
// carries a route's variants, their own targets, strategy and balancer,
// and parses back into the config it stored.
func TestVariantsRoundTrip(t *testing.T) {
	doc := `
[[providers]]
name = "a"
kind = "openai_compatible"
api_base = "http://a:8000"
[[providers]]
name = "b"
kind = "openai_compatible"
api_base = "http://b:8000"

[[routes]]
model = "m"
strategy = "cache_aware"
targets = [{ provider = "a" }]
allow_variant_pin = true
[[routes.variants]]
name = "stable"
weight = 0
[[routes.variants]]
name = "canary"
strategy = "precise_cache_aware"
targets = [{ provider = "b", model = "m-rc", weight = 2 }]
[routes.variants.balancer]
speculative_ttl_ms = 0
scorers = { least_load = 2.0 }
`
	st := state.FromConfig(parse(t, doc), []byte("pepper-0123456789"))
	out, _, err := st.Render(state.RenderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	back := parse(t, string(out))
	if want := st.Config(); !reflect.DeepEqual(back, want) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v\n%s", back.Routes, want.Routes, out)
	}
	v := back.Routes[0].Variants
	if len(v) != 2 || *v[0].Weight != 0 || *v[1].Weight != 1 || v[1].Balancer == nil || *v[1].Balancer.SpeculativeTTLMS != 0 || !back.Routes[0].AllowVariantPin {
		t.Errorf("variants after the round trip: %+v", v)
	}
}
