package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rolter.dev/pkg/config"
)

const minimal = `
[[providers]]
name = "vllm-a"
kind = "openai_compatible"
api_base = "http://vllm-a:8000"

[[routes]]
model = "llama"
targets = [{ provider = "vllm-a" }]
`

func TestExampleConfigCompiles(t *testing.T) {
	cfg, _, err := config.Load(filepath.Join("..", "..", "rolter.example.toml"))
	if err != nil {
		t.Fatalf("example config: %v", err)
	}
	snap, err := config.Compile(cfg, config.CompileOptions{})
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	if snap.Route("llama-3.1-8b") == nil {
		t.Fatal("example route missing")
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := config.Parse([]byte(minimal + `
[providers.kv_events]
endpoint = "tcp://vllm-a:5557"

[routes.cache]
[routes.cache.semantic]
provider = "vllm-a"
model = "emb"
`))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := config.Compile(cfg, config.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"server.max_body_bytes", snap.Server.MaxBodyBytes, int64(32 << 20)},
		{"retry.max_retries", snap.Retry.MaxRetries, 2},
		{"retry.base_backoff_ms", snap.Retry.BaseBackoffMS, 100},
		{"retry.max_backoff_ms", snap.Retry.MaxBackoffMS, 2000},
		{"cooldown.base_secs", snap.Cooldown.BaseSecs, 5},
		{"cooldown.max_secs", snap.Cooldown.MaxSecs, 300},
		{"breaker.enabled", snap.Breaker.Enabled, false},
		{"breaker.failure_threshold", snap.Breaker.FailureThreshold, 5},
		{"breaker.open_secs", snap.Breaker.OpenSecs, 30},
		{"health.interval_secs", snap.Health.IntervalSecs, 10},
		{"health.timeout_secs", snap.Health.TimeoutSecs, 2},
		{"timeouts.connect_secs", snap.Timeouts.ConnectSecs, 10},
		{"timeouts.request_secs", snap.Timeouts.RequestSecs, 60},
		{"timeouts.idle_secs", snap.Timeouts.IdleSecs, 120},
		{"cache.default_ttl_secs", snap.Cache.DefaultTTLSecs, 60},
		{"cache.namespace", snap.Cache.Namespace, "rolter:cache"},
		{"cache.max_entry_bytes", snap.Cache.MaxEntryBytes, int64(1 << 20)},
		{"routes[0].strategy", snap.Routes[0].Strategy, "round_robin"},
		{"routes[0].targets[0].weight", snap.Routes[0].Targets[0].Weight, 1},
		{"routes[0].targets[0].model", snap.Routes[0].Targets[0].Model, "llama"},
		{"routes[0].cache.enabled", snap.Routes[0].Cache.Enabled, true},
		{"routes[0].cache.ttl", snap.Routes[0].Cache.TTL, 60 * time.Second},
		{"routes[0].cache.semantic.threshold", snap.Routes[0].Cache.Semantic.Threshold, 0.92},
		{"routes[0].cache.semantic.max_candidates", snap.Routes[0].Cache.Semantic.MaxCandidates, 256},
		{"providers[0].kv_events.topic", snap.Providers[0].KVEvents.Topic, ""}, // vLLM's default
		{"providers[0].kv_events.max_blocks", snap.Providers[0].KVEvents.MaxBlocks, 1_000_000},
		{"providers[0].kv_events.stale_secs", snap.Providers[0].KVEvents.StaleSecs, 30},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestExplicitZeroIsKept(t *testing.T) {
	cfg, err := config.Parse([]byte("[cooldown]\nbase_secs = 0\n[retry]\nmax_retries = 0\n" + minimal))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cooldown.BaseSecs != 0 || cfg.Retry.MaxRetries != 0 {
		t.Fatalf("explicit zeros replaced by defaults: %+v %+v", cfg.Cooldown, cfg.Retry)
	}
}

// An explicitly empty topic is the empty topic (vLLM's default), not
// replaced by a default; a set topic is kept as written.
func TestKVTopicKeepsExplicitValue(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`topic = ""`, ""},
		{`topic = "kv-events"`, "kv-events"},
		{``, config.DefaultKVTopic},
	} {
		cfg, err := config.Parse([]byte(minimal + "[providers.kv_events]\nendpoint = \"tcp://vllm-a:5557\"\n" + tc.line + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Providers[0].KVEvents.Topic; got != tc.want {
			t.Errorf("%q: topic = %q, want %q", tc.line, got, tc.want)
		}
	}
}

func TestErrorsNameFieldPaths(t *testing.T) {
	tests := []struct {
		name string
		toml string
		want []string
	}{
		{"error: unknown top-level key", "bogus = 1\n" + minimal, []string{"bogus: unknown key"}},
		{"error: unknown key in array element", minimal + "\n[[routes]]\nmodel = \"m2\"\ntargets = [{ provider = \"vllm-a\", wieght = 2 }]\n",
			[]string{`routes[1].targets[0].wieght: unknown key (did you mean "weight"?)`}},
		{"error: wrong type", "[server]\nmax_body_bytes = \"big\"\n" + minimal, []string{"server.max_body_bytes: expected an integer, got a string"}},
		{"error: wrong type in a map", minimal + "[routes.balancer]\nscorers = { prefix_cache = \"high\" }\n", []string{"routes[0].balancer.scorers.prefix_cache: expected a number, got a string"}},
		{"error: syntax", "[[providers]\n", []string{"line 1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.toml))
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestValidateReportsEveryFailure(t *testing.T) {
	doc := `
[server]
metrics_path = "metrics"
[retry]
base_backoff_ms = 500
max_backoff_ms = 100

[[providers]]
name = "vllm-a"
kind = "tgi"
api_base = "vllm-a:8000"
api_key = "x"
api_key_env = "Y"
[providers.kv_events]
endpoint = "http://x"

[[providers]]
name = "vllm-a"
kind = "openai"
api_base = "https://api.openai.com"

[[routes]]
model = "m"
strategy = "fastest"
targets = [{ provider = "vllm-a" }, { provider = "vllm-z" }, { provider = "vllm-a", weight = 0 }]

[[routes]]
model = "m"
targets = []
[routes.cache]
ttl_secs = -1
[routes.cache.semantic]
provider = "nope"
threshold = 1.5

[routes.balancer]
threshold = 1.5
scorers = { prefix = 1.0, least_load = -1.0 }

[[virtual_keys]]
name = "k"
key = "short"
models = ["ghost"]
providers = ["nope"]
`
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	err = cfg.Validate()
	if err == nil {
		t.Fatal("want validation errors")
	}
	want := []string{
		`server.metrics_path: must start with /, got "metrics"`,
		"retry.max_backoff_ms: must be >= retry.base_backoff_ms (500), got 100",
		`providers[0].kind: unknown kind "tgi"`,
		`providers[0].api_base: must be an absolute http:// or https:// URL, got "vllm-a:8000"`,
		"providers[0]: set at most one of api_key, api_key_env and api_key_file",
		`providers[0].kv_events.endpoint: must be a tcp:// or ipc:// ZMQ endpoint, got "http://x"`,
		`providers[1].name: duplicate provider "vllm-a" (also providers[0])`,
		`routes[0].strategy: unknown strategy "fastest"`,
		`routes[0].targets[1].provider: unknown provider "vllm-z"`,
		"routes[0].targets[2].weight: must be >= 1, got 0",
		`routes[1].model: duplicate route "m" (also routes[0])`,
		"routes[1].targets: must have at least one target",
		"routes[1].cache.ttl_secs: must be >= 0, got -1",
		`routes[1].cache.semantic.provider: unknown provider "nope"`,
		"routes[1].cache.semantic.model: must not be empty",
		"routes[1].cache.semantic.threshold: must be in (0, 1], got 1.5",
		"routes[1].balancer.threshold: must be in [0, 1], got 1.5",
		"routes[1].balancer.scorers.prefix: unknown scorer",
		"routes[1].balancer.scorers.least_load: must be >= 0, got -1",
		"virtual_keys[0].key: must be at least 16 characters",
		`virtual_keys[0].models[0]: unknown route "ghost"`,
		`virtual_keys[0].providers[0]: unknown provider "nope"`,
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in:\n%v", w, err)
		}
	}
	var fe *config.FieldError
	if !errors.As(err, &fe) {
		t.Errorf("errors are not *FieldError: %T", err)
	}
}

func TestCompileResolvesSecrets(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte("file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := `
[[providers]]
name = "a"
kind = "openai"
api_base = "https://a.example/"
api_key_env = "A_KEY"
[[providers]]
name = "b"
kind = "anthropic"
api_base = "https://b.example"
api_key_file = "` + keyFile + `"
[[routes]]
model = "m"
targets = [{ provider = "a" }, { provider = "b", model = "claude" }]
[[virtual_keys]]
name = "team"
key_env = "TEAM_KEY"
models = ["m"]
providers = ["a"]
[[virtual_keys]]
name = "old"
key = "sk-rolter-expired-000000"
expires_at = 2020-01-01T00:00:00Z
[[virtual_keys]]
name = "off"
key = "sk-rolter-disabled-00000"
disabled = true
`
	env := map[string]string{"A_KEY": "env-secret", "TEAM_KEY": "sk-rolter-team-0123456789"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := config.Compile(cfg, config.CompileOptions{LookupEnv: lookup})
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Provider("a").APIKey; got != "env-secret" {
		t.Errorf("env key = %q", got)
	}
	if got := snap.Provider("b").APIKey; got != "file-secret" {
		t.Errorf("file key = %q", got)
	}
	if got := snap.Provider("a").APIBase; got != "https://a.example" {
		t.Errorf("api_base not trimmed: %q", got)
	}
	if got := snap.Provider("b").AnthropicVersion; got != "2023-06-01" {
		t.Errorf("anthropic_version default = %q", got)
	}
	now := time.Now()
	k, err := snap.Authenticate("sk-rolter-team-0123456789", now)
	if err != nil || k.ID != "team" || !k.AllowsModel("m") || k.AllowsModel("x") || !k.AllowsProvider("a") || k.AllowsProvider("b") {
		t.Fatalf("team key: %+v %v", k, err)
	}
	for _, secret := range []string{"sk-rolter-expired-000000", "sk-rolter-disabled-00000", "sk-rolter-unknown-000000"} {
		if _, err := snap.Authenticate(secret, now); !errors.Is(err, config.ErrKeyInvalid) {
			t.Errorf("%s: err = %v, want ErrKeyInvalid", secret, err)
		}
	}
	if _, err := snap.Authenticate("", now); !errors.Is(err, config.ErrKeyMissing) {
		t.Errorf("empty secret: %v", err)
	}
	if snap.Open() {
		t.Error("snapshot with keys is open")
	}

	// A missing env var is a compile error with its path.
	_, err = config.Compile(cfg, config.CompileOptions{LookupEnv: func(string) (string, bool) { return "", false }})
	if err == nil || !strings.Contains(err.Error(), `providers[0].api_key_env: environment variable "A_KEY" is not set`) {
		t.Errorf("missing env: %v", err)
	}
}

func TestSnapshotHoldsNoSecretOfKeys(t *testing.T) {
	cfg, err := config.Parse([]byte(minimal + "[[virtual_keys]]\nname = \"k\"\nkey = \"sk-rolter-plaintext-secret\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := config.Compile(cfg, config.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(fmtAll(snap), "sk-rolter-plaintext-secret") {
		t.Fatal("snapshot retains the key secret")
	}
}

func TestKeyDigest(t *testing.T) {
	pepper := []byte("pepper-of-the-control-plane")
	secret := "sk-rolter-digest-only-secret"
	digest := config.DigestKey(pepper, secret).String()
	tests := []struct {
		name    string
		key     string
		wantErr string
	}{
		{name: "ok: digest authenticates the secret", key: "key_digest = \"" + digest + "\"\n"},
		{name: "error: digest not hex", key: "key_digest = \"" + strings.Repeat("zz", 32) + "\"\n", wantErr: "virtual_keys[0].key_digest: must be hex"},
		{name: "error: digest too short", key: "key_digest = \"abcd\"\n", wantErr: "virtual_keys[0].key_digest: must be 64 hex characters, got 4"},
		{name: "error: digest and key", key: "key_digest = \"" + digest + "\"\nkey = \"" + secret + "\"\n", wantErr: "virtual_keys[0]: set one of key, key_env and key_digest, not several"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(minimal + "[server]\nkey_pepper = \"" + string(pepper) + "\"\n[[virtual_keys]]\nname = \"k\"\n" + tc.key))
			if err != nil {
				t.Fatal(err)
			}
			snap, err := config.Compile(cfg, config.CompileOptions{LookupEnv: func(string) (string, bool) { return "", false }})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if k, err := snap.Authenticate(secret, time.Now()); err != nil || k.ID != "k" {
				t.Fatalf("authenticate: %v, %v", k, err)
			}
			if _, err := snap.Authenticate(secret+"x", time.Now()); err == nil {
				t.Fatal("a wrong secret authenticated")
			}
		})
	}
	if a, b := config.PepperCheck(pepper), config.PepperCheck([]byte("other")); a == b || len(a) != 16 {
		t.Errorf("pepper checks %q and %q", a, b)
	}
}
