package ctl_test

import (
	"strings"
	"testing"

	"rolter.dev/controlplane/internal/ctl"
)

const variantDoc = `
[[providers]]
name = "a"
kind = "openai_compatible"
api_base = "http://127.0.0.1:9"

[[providers]]
name = "b"
kind = "openai_compatible"
api_base = "http://127.0.0.1:10"

[[routes]]
model = "m1"
allow_variant_pin = true

[[routes.variants]]
name = "stable"
weight = 90
targets = [{ provider = "a" }]

[[routes.variants]]
name = "canary"
weight = 10
strategy = "least_load"
targets = [{ provider = "b", model = "m1-rc" }]
[routes.variants.balancer]
load_weight = 0.5
`

// TestVariantsThroughCtl: a route's variants go through apply, get, list
// and update like every other key of a route, and bad variants are refused
// with their field paths.
func TestVariantsThroughCtl(t *testing.T) {
	addr := startControlPlane(t)
	cfg := write(t, "rolter.toml", variantDoc)
	if r := run(t, addr, "apply", "-f", cfg); r.code != ctl.ExitOK {
		t.Fatalf("apply: %d %s%s", r.code, r.stdout, r.stderr)
	}
	if r := run(t, addr, "apply", "-f", cfg); !strings.Contains(r.stdout, "no changes") {
		t.Errorf("re-apply of the same variants changed something:\n%s", r.stdout)
	}
	r := run(t, addr, "get", "route", "m1")
	for _, want := range []string{"[[routes.variants]]", "name = 'canary'", "weight = 10", "model = 'm1-rc'", "load_weight = 0.5", "allow_variant_pin = true"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("get route lacks %q:\n%s", want, r.stdout)
		}
	}
	if r := run(t, addr, "list", "routes"); !strings.Contains(r.stdout, "stable:90[a] canary:10[b]") {
		t.Errorf("list routes:\n%s", r.stdout)
	}
	moved := write(t, "rolter.toml", strings.Replace(strings.Replace(variantDoc, "weight = 90", "weight = 75", 1), "weight = 10", "weight = 25", 1))
	if r := run(t, addr, "apply", "-f", moved, "--dry-run"); !strings.Contains(r.stdout, "variants[1].weight") {
		t.Errorf("dry run does not show the weight change:\n%s", r.stdout)
	}
	if r := run(t, addr, "apply", "-f", moved); r.code != ctl.ExitOK {
		t.Fatalf("apply moved weights: %d %s%s", r.code, r.stdout, r.stderr)
	}
	if r := run(t, addr, "get", "route", "m1"); !strings.Contains(r.stdout, "weight = 25") {
		t.Errorf("weight change not stored:\n%s", r.stdout)
	}
	bad := write(t, "route.toml", "[[routes]]\nmodel = \"m1\"\n[[routes.variants]]\nname = \"x\"\nweight = 0\ntargets = [{ provider = \"a\" }]\n[[routes.variants]]\nname = \"x\"\nweight = 0\n")
	r = run(t, addr, "update", "route", "-f", bad)
	if r.code != ctl.ExitInvalid {
		t.Fatalf("bad variants: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{`routes["m1"].variants[1].name: duplicate variant "x"`, `routes["m1"].variants: the weights must sum to more than 0`, `routes["m1"].variants[1].targets: must have at least one target`} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("update error lacks %q:\n%s", want, r.stderr)
		}
	}
}
