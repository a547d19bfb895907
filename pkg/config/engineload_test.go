package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"rolter.dev/pkg/config"
)

func TestEngineLoad(t *testing.T) {
	if snap := compileDoc(t, minimal); snap.Providers[0].EngineLoad != nil {
		t.Fatal("engine load on without a [providers.engine_load] table")
	}
	tests := []struct {
		name, doc, url string
		interval       time.Duration
		stale          time.Duration
	}{
		{"empty table: defaults", minimal + "[providers.engine_load]\n",
			"http://vllm-a:8000/metrics", 500 * time.Millisecond, 1500 * time.Millisecond},
		{"stale follows the interval", minimal + "[providers.engine_load]\ninterval_ms = 100\n",
			"http://vllm-a:8000/metrics", 100 * time.Millisecond, 300 * time.Millisecond},
		{"every key", minimal + "[providers.engine_load]\npath = \"/x/metrics\"\ninterval_ms = 50\nstale_ms = 50\n",
			"http://vllm-a:8000/x/metrics", 50 * time.Millisecond, 50 * time.Millisecond},
		{"api_base with /v1 and a trailing slash", strings.Replace(minimal, "http://vllm-a:8000", "http://vllm-a:8000/v1/", 1) + "[providers.engine_load]\n",
			"http://vllm-a:8000/metrics", 500 * time.Millisecond, 1500 * time.Millisecond},
		{"api_base with a path prefix", strings.Replace(minimal, "http://vllm-a:8000", "https://gw.example/replica-a", 1) + "[providers.engine_load]\n",
			"https://gw.example/replica-a/metrics", 500 * time.Millisecond, 1500 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			el := compileDoc(t, tc.doc).Providers[0].EngineLoad
			if el == nil {
				t.Fatal("engine load off")
			}
			if el.URL != tc.url || el.Interval != tc.interval || el.Stale != tc.stale {
				t.Errorf("got %+v, want %s every %v, stale after %v", *el, tc.url, tc.interval, tc.stale)
			}
		})
	}
}

func TestEngineLoadRejected(t *testing.T) {
	el := func(lines string) string { return minimal + "[providers.engine_load]\n" + lines }
	tests := []struct {
		name, doc, want string
	}{
		{"interval below the minimum", el("interval_ms = 49\n"),
			"providers[0].engine_load.interval_ms: must be in [50, 3600000], got 49"},
		{"negative interval", el("interval_ms = -1\n"),
			"providers[0].engine_load.interval_ms: must be in [50, 3600000], got -1"},
		{"stale shorter than the interval", el("interval_ms = 1000\nstale_ms = 999\n"),
			"providers[0].engine_load.stale_ms: must be in [interval_ms (1000), 3600000], got 999"},
		{"negative stale", el("stale_ms = -5\n"),
			"providers[0].engine_load.stale_ms: must be in [interval_ms (500), 3600000], got -5"},
		{"stale too long", el("stale_ms = 3600001\n"),
			"providers[0].engine_load.stale_ms: must be in [interval_ms (500), 3600000], got 3600001"},
		{"relative path", el("path = \"metrics\"\n"),
			`providers[0].engine_load.path: must be an absolute path (starting with /, no query), got "metrics"`},
		{"path with a query", el("path = \"/metrics?x=1\"\n"),
			`providers[0].engine_load.path: must be an absolute path`},
		{"hosted provider", strings.Replace(minimal, "openai_compatible", "openai", 1) + "[providers.engine_load]\n",
			`providers[0].engine_load: only applies to kind "openai_compatible"`},
		{"unknown key", el("intervall_ms = 100\n"),
			`providers[0].engine_load.intervall_ms: unknown key (did you mean "interval_ms"?)`},
		{"wrong type", el("interval_ms = \"1s\"\n"),
			"providers[0].engine_load.interval_ms: expected an integer, got a string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(tc.doc))
			if err == nil {
				err = cfg.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			var fe *config.FieldError
			if !errors.As(err, &fe) {
				t.Errorf("not a *FieldError: %T", err)
			}
		})
	}
}
