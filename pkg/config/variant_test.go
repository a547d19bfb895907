package config_test

import (
	"errors"
	"strings"
	"testing"

	"rolter.dev/pkg/config"
)

const twoProviders = `
[[providers]]
name = "vllm-a"
kind = "openai_compatible"
api_base = "http://vllm-a:8000"

[[providers]]
name = "vllm-b"
kind = "openai_compatible"
api_base = "http://vllm-b:8000"
`

func TestVariantsCompile(t *testing.T) {
	snap := compileDoc(t, twoProviders+`
[[routes]]
model = "llama"
strategy = "cache_aware"
targets = [{ provider = "vllm-a" }]
[routes.balancer]
threshold = 0.7

[[routes.variants]]
name = "stable"
weight = 90

[[routes.variants]]
name = "canary"
weight = 10
strategy = "least_load"
targets = [{ provider = "vllm-b", model = "llama-rc" }]
[routes.variants.balancer]
speculative_ttl_ms = 0

[[routes.variants]]
name = "drained"
weight = 0
`)
	r := snap.Routes[0]
	if len(r.Variants) != 3 {
		t.Fatalf("variants = %+v", r.Variants)
	}
	stable, canary, drained := r.Variant("stable"), r.Variant("canary"), r.Variant("drained")
	// What a variant leaves out, it takes from the route.
	if stable.Weight != 90 || stable.Strategy != "cache_aware" || stable.Balancer.Threshold != 0.7 ||
		len(stable.Targets) != 1 || stable.Targets[0].Provider.Name != "vllm-a" || stable.Targets[0].Model != "llama" {
		t.Errorf("stable = %+v", stable)
	}
	if canary.Weight != 10 || canary.Strategy != "least_load" || canary.Balancer.Threshold != 0 || canary.SpeculativeTTL != 0 ||
		len(canary.Targets) != 1 || canary.Targets[0].Provider.Name != "vllm-b" || canary.Targets[0].Model != "llama-rc" || canary.Targets[0].Weight != 1 {
		t.Errorf("canary = %+v", canary)
	}
	if drained.Weight != 0 || r.Variant("nope") != nil || r.AllowVariantPin {
		t.Errorf("drained = %+v, pin %v", drained, r.AllowVariantPin)
	}
}

func TestVariantsNeedNoRouteTargets(t *testing.T) {
	snap := compileDoc(t, twoProviders+`
[[routes]]
model = "llama"
allow_variant_pin = true
[[routes.variants]]
name = "a"
targets = [{ provider = "vllm-a" }]
[[routes.variants]]
name = "b"
targets = [{ provider = "vllm-b" }]
`)
	r := snap.Routes[0]
	if len(r.Targets) != 0 || r.Variant("a").Weight != config.DefaultVariantWeight || r.Variant("b").Strategy != config.DefaultStrategy || !r.AllowVariantPin {
		t.Errorf("route = %+v", r)
	}
}

func TestVariantsValidation(t *testing.T) {
	route := func(body string) string { return twoProviders + "[[routes]]\nmodel = \"llama\"\n" + body }
	tests := []struct {
		name, doc string
		want      []string // field path: message fragment
	}{
		{"no targets anywhere", route("[[routes.variants]]\nname = \"a\"\n"),
			[]string{"routes[0].variants[0].targets: must have at least one target"}},
		{"duplicate name", route("targets = [{ provider = \"vllm-a\" }]\n[[routes.variants]]\nname = \"a\"\n[[routes.variants]]\nname = \"a\"\n"),
			[]string{`routes[0].variants[1].name: duplicate variant "a" (also routes[0].variants[0])`}},
		{"empty and bad names", route("targets = [{ provider = \"vllm-a\" }]\n[[routes.variants]]\nname = \"\"\n[[routes.variants]]\nname = \"a b\"\n"),
			[]string{"routes[0].variants[0].name: must not be empty", "routes[0].variants[1].name: must match"}},
		{"negative weight", route("targets = [{ provider = \"vllm-a\" }]\n[[routes.variants]]\nname = \"a\"\nweight = -1\n[[routes.variants]]\nname = \"b\"\n"),
			[]string{"routes[0].variants[0].weight: must be in [0, 1000000], got -1"}},
		{"weights sum to zero", route("targets = [{ provider = \"vllm-a\" }]\n[[routes.variants]]\nname = \"a\"\nweight = 0\n"),
			[]string{"routes[0].variants: the weights must sum to more than 0"}},
		{"unknown provider", route("[[routes.variants]]\nname = \"a\"\ntargets = [{ provider = \"nope\" }]\n"),
			[]string{`routes[0].variants[0].targets[0].provider: unknown provider "nope"`}},
		{"target weight", route("[[routes.variants]]\nname = \"a\"\ntargets = [{ provider = \"vllm-a\", weight = 0 }]\n"),
			[]string{"routes[0].variants[0].targets[0].weight: must be >= 1, got 0"}},
		{"unknown strategy", route("targets = [{ provider = \"vllm-a\" }]\n[[routes.variants]]\nname = \"a\"\nstrategy = \"fastest\"\n"),
			[]string{`routes[0].variants[0].strategy: unknown strategy "fastest"`}},
		{"bad balancer", route("targets = [{ provider = \"vllm-a\" }]\n[[routes.variants]]\nname = \"a\"\n[routes.variants.balancer]\nthreshold = 2.0\n"),
			[]string{"routes[0].variants[0].balancer.threshold: must be in [0, 1]"}},
		{"pin without variants", route("targets = [{ provider = \"vllm-a\" }]\nallow_variant_pin = true\n"),
			[]string{"routes[0].allow_variant_pin: only applies to a route with variants"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			err = cfg.Validate()
			if err == nil {
				t.Fatal("valid")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			var fe *config.FieldError
			if !errors.As(err, &fe) {
				t.Errorf("not a FieldError: %v", err)
			}
		})
	}
}

func TestVariantsStrictKeys(t *testing.T) {
	_, err := config.Parse([]byte(twoProviders + `
[[routes]]
model = "llama"
[[routes.variants]]
name = "a"
wieght = 3
targets = [{ provider = "vllm-a" }]
[routes.variants.balancer]
treshold = 0.5
`))
	for _, w := range []string{
		`routes[0].variants[0].wieght: unknown key (did you mean "weight"?)`,
		`routes[0].variants[0].balancer.treshold: unknown key (did you mean "threshold"?)`,
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
}
