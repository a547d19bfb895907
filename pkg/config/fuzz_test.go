package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"rolter.dev/pkg/config"
)

func fmtAll(v any) string { return fmt.Sprintf("%+v", v) }

// FuzzParse feeds arbitrary documents through decode, validation and
// compilation: every outcome must be a value or an error, never a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte(minimal))
	if b, err := os.ReadFile(filepath.Join("..", "..", "rolter.example.toml")); err == nil {
		f.Add(b)
	}
	f.Add([]byte("[[routes]]\ntargets = [{weight = -9223372036854775808}]\n"))
	f.Add([]byte("[server]\nmax_body_bytes = 1e400\n"))
	f.Add([]byte("[server.cors]\nallowed_origins = [\"https://a.example:8443\", \"http://[::1]:3000\"]\nallowed_headers = [\"Authorization\"]\nallow_credentials = true\nmax_age_secs = 0\n"))
	f.Add([]byte("[server.cors]\nallowed_origins = []\nallowed_headers = []\n"))
	f.Add([]byte("[[virtual_keys]]\nexpires_at = 1979-05-27\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse(data)
		if err != nil {
			return
		}
		if cfg.Validate() != nil {
			return
		}
		empty := func(string) (string, bool) { return "", false }
		noFile := func(string) ([]byte, error) { return nil, os.ErrNotExist }
		_, _ = config.Compile(cfg, config.CompileOptions{LookupEnv: empty, ReadFile: noFile})
	})
}
