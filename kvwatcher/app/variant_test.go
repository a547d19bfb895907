package app

import (
	"testing"

	"rolter.dev/pkg/config"
)

// TestFromConfigVariantTargets: a provider reached only through a route
// variant gets the variant target's upstream model as its identity model.
func TestFromConfigVariantTargets(t *testing.T) {
	cfg, err := config.Parse([]byte(`
[[providers]]
name = "stable"
kind = "openai_compatible"
api_base = "http://127.0.0.1:8001"
[providers.kv_events]
endpoint = "tcp://stable:5557"

[[providers]]
name = "canary"
kind = "openai_compatible"
api_base = "http://127.0.0.1:8002"
[providers.kv_events]
endpoint = "tcp://canary:5557"

[[routes]]
model = "llama"
targets = [{ provider = "stable" }]
[[routes.variants]]
name = "stable"
[[routes.variants]]
name = "canary"
targets = [{ provider = "canary", model = "llama-rc" }]
`))
	if err != nil {
		t.Fatal(err)
	}
	got, warnings := FromConfig(cfg)
	if len(got) != 2 || len(warnings) != 0 {
		t.Fatalf("providers %+v, warnings %v", got, warnings)
	}
	if got[0].KV.Model != "llama" || got[1].KV.Model != "llama-rc" {
		t.Errorf("identity models %q, %q; want llama, llama-rc", got[0].KV.Model, got[1].KV.Model)
	}
}
