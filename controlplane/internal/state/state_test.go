package state_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"rolter.dev/controlplane/internal/state"
	"rolter.dev/pkg/config"
)

const full = `
[server]
require_auth = true
[retry]
max_retries = 0
[[providers]]
name = "vllm-a"
kind = "openai_compatible"
api_base = "http://vllm-a:8000"
[providers.kv_events]
endpoint = "tcp://vllm-a:5557"
[providers.lmcache]
endpoint = "http://lmcache-a:9000/v1/occupancy"

[[providers]]
name = "openai"
kind = "openai"
api_base = "https://api.openai.com"
api_key_env = "OPENAI_API_KEY"

[[providers]]
name = "inline"
kind = "anthropic"
api_base = "https://api.anthropic.com"
api_key = "sk-ant-inline-secret"

[[routes]]
model = "org/llama 3.1"
strategy = "pipeline"
targets = [{ provider = "vllm-a", weight = 3 }, { provider = "openai", model = "gpt-4o-mini" }]
[routes.balancer]
threshold = 0.75
scorers = { prefix_cache = 2.0, least_load = 1.0 }
[routes.cache]
ttl_secs = 0
per_key = true
[routes.cache.semantic]
provider = "openai"
model = "text-embedding-3-small"

[[virtual_keys]]
name = "team-a"
key = "sk-rolter-team-a-secret-value"
models = ["org/llama 3.1"]
expires_at = 2027-01-01T00:00:00Z
cache = false

[[virtual_keys]]
name = "from-env"
key_env = "TEAM_B_KEY"
disabled = true
`

func parse(t *testing.T, doc string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestRenderRoundTrips: what the control plane pushes parses back, with
// the same pkg/config code, into exactly the config it stored.
func TestRenderRoundTrips(t *testing.T) {
	example, err := os.ReadFile(filepath.Join("..", "..", "..", "rolter.example.toml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, doc := range map[string]string{"full": full, "example": string(example), "empty": ""} {
		t.Run(name, func(t *testing.T) {
			st := state.FromConfig(parse(t, doc), []byte("pepper-0123456789"))
			out, hash, err := st.Render(state.RenderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			back := parse(t, string(out))
			if want := st.Config(); !reflect.DeepEqual(back, want) {
				t.Errorf("round trip differs:\n got %+v\nwant %+v\n%s", back, want, out)
			}
			again, hash2, _ := state.FromConfig(back, nil).Render(state.RenderOptions{})
			if string(again) != string(out) || hash != hash2 {
				t.Error("rendering is not deterministic")
			}
			enc, err := st.Encode()
			if err != nil {
				t.Fatal(err)
			}
			dec, err := state.Decode(enc)
			if err != nil {
				t.Fatal(err)
			}
			if diff := state.Diff(st, dec); len(diff) != 0 {
				t.Errorf("encode/decode changed %v", diff)
			}
		})
	}
}

// TestNoSecretLeavesFromConfig: inline key secrets become digests before
// anything is stored, and kvwatchers get neither keys nor inline API keys.
func TestNoSecretLeavesFromConfig(t *testing.T) {
	st := state.FromConfig(parse(t, full), []byte("pepper-0123456789"))
	enc, err := st.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for id, b := range enc {
		if strings.Contains(string(b), "team-a-secret") {
			t.Errorf("stored %s holds the key secret", id)
		}
	}
	k, _ := st.Key("team-a")
	if k.Key != "" || k.KeyDigest != config.DigestKey([]byte("pepper-0123456789"), "sk-rolter-team-a-secret-value").String() {
		t.Errorf("key: %+v", k)
	}
	out, _, err := st.Render(state.RenderOptions{NoKeys: true, NoInlineSecrets: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"sk-ant-inline-secret", "key_digest", "virtual_keys"} {
		if strings.Contains(string(out), secret) {
			t.Errorf("kvwatcher snapshot holds %q", secret)
		}
	}
}

func TestDiffAndCheck(t *testing.T) {
	a := state.FromConfig(parse(t, full), []byte("p"))
	b := a.Clone()
	r, _ := b.Route("org/llama 3.1")
	r.Strategy = "random"
	b.PutRoute(r)
	b.Delete(state.ID{Kind: state.KindKey, Name: "from-env"})
	p, _ := b.Provider("inline")
	p.APIKey = "sk-ant-changed"
	b.PutProvider(p)
	got := state.Diff(a, b)
	want := []state.Change{
		{ID: state.ID{Kind: state.KindProvider, Name: "inline"}, Action: state.Changed,
			Fields: []state.FieldChange{{Path: "api_key", Before: `"<redacted>"`, After: `"<redacted>"`}}},
		{ID: state.ID{Kind: state.KindRoute, Name: "org/llama 3.1"}, Action: state.Changed,
			Fields: []state.FieldChange{{Path: "strategy", Before: `"pipeline"`, After: `"random"`}}},
		{ID: state.ID{Kind: state.KindKey, Name: "from-env"}, Action: state.Removed},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("diff:\n got %+v\nwant %+v", got, want)
	}

	b.Delete(state.ID{Kind: state.KindProvider, Name: "openai"})
	err := b.Check()
	for _, w := range []string{
		`routes["org/llama 3.1"].targets[1].provider: unknown provider "openai"`,
		`routes["org/llama 3.1"].cache.semantic.provider: unknown provider "openai"`,
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("check: missing %q in %v", w, err)
		}
	}
	if err := a.Check(); err != nil {
		t.Errorf("check of a valid state: %v", err)
	}
}
