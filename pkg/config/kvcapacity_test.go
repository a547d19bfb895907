package config_test

import (
	"strings"
	"testing"

	"rolter.dev/pkg/config"
)

func TestKVCapacityTokens(t *testing.T) {
	doc := func(v string) string {
		return strings.Replace(minimal, `api_base = "http://vllm-a:8000"`, `api_base = "http://vllm-a:8000"`+"\nkv_capacity_tokens = "+v, 1)
	}
	if got := compileDoc(t, minimal).Providers[0].KVCapacityTokens; got != 0 {
		t.Fatalf("unset: %d, want 0", got)
	}
	if got := compileDoc(t, doc("2097152")).Providers[0].KVCapacityTokens; got != 2097152 {
		t.Fatalf("set: %d, want 2097152", got)
	}
	for _, bad := range []string{"-1", "68719476737"} {
		cfg, err := config.Parse([]byte(doc(bad)))
		if err == nil {
			_, err = config.Compile(cfg, config.CompileOptions{})
		}
		if err == nil || !strings.Contains(err.Error(), "providers[0].kv_capacity_tokens") {
			t.Errorf("kv_capacity_tokens = %s: %v, want an error naming providers[0].kv_capacity_tokens", bad, err)
		}
	}
}
