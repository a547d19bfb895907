package config_test

import (
	"errors"
	"strings"
	"testing"

	"rolter.dev/pkg/config"
)

// An empty or truncated file parses and validates (every section has
// defaults) but routes nothing: CheckRoutes refuses it.
func TestCheckRoutesRefusesAConfigWithoutRoutes(t *testing.T) {
	for _, doc := range []string{"", "[server]\nlisten = \":9000\"\n", "[[providers]]\nname = \"a\"\nkind = \"openai_compatible\"\napi_base = \"http://a:8000\"\n"} {
		cfg, err := config.Parse([]byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		err = cfg.CheckRoutes()
		var fe *config.FieldError
		if !errors.As(err, &fe) || fe.Path != "routes" || !strings.Contains(fe.Msg, "no routes") {
			t.Errorf("%q: CheckRoutes = %v, want a routes field error", doc, err)
		}
	}
	cfg, err := config.Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.CheckRoutes(); err != nil {
		t.Errorf("minimal config: %v", err)
	}
}

func TestListenIsValidatedWithItsPath(t *testing.T) {
	for addr, ok := range map[string]bool{
		":8080": true, "127.0.0.1:0": true, "[::1]:8080": true, "localhost:80": true,
		"8080": false, "127.0.0.1": false, ":http-alt": false, ":99999": false, "": false, "a:b:c": false,
	} {
		cfg, err := config.Parse([]byte("[server]\nlisten = \"" + addr + "\"\n" + minimal))
		if err != nil {
			t.Fatal(err)
		}
		err = cfg.Validate()
		if ok {
			if err != nil {
				t.Errorf("listen %q: %v", addr, err)
			}
			continue
		}
		var fe *config.FieldError
		if !errors.As(err, &fe) || fe.Path != "server.listen" {
			t.Errorf("listen %q: got %v, want a server.listen error", addr, err)
		}
	}
}

// An absent require_auth is true: a config without keys is closed unless it
// says require_auth = false, so dropping the last key never opens it.
func TestNoKeysIsClosedUnlessRequireAuthIsFalse(t *testing.T) {
	for doc, open := range map[string]bool{
		minimal: false,
		"[server]\nrequire_auth = true\n" + minimal:  false,
		"[server]\nrequire_auth = false\n" + minimal: true,
	} {
		cfg, err := config.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		snap, err := config.Compile(cfg, config.CompileOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if snap.Open() != open || snap.KeyCount() != 0 {
			t.Errorf("%q: Open() = %v, want %v", doc, snap.Open(), open)
		}
	}
	withKey := "[server]\nrequire_auth = false\n" + minimal + "[[virtual_keys]]\nname = \"k\"\nkey = \"sk-rolter-0123456789abcdef\"\n"
	cfg, err := config.Parse([]byte(withKey))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := config.Compile(cfg, config.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Open() {
		t.Error("require_auth = false with a key configured: open; keys always apply")
	}
}

func TestBodyLimitsAreValidated(t *testing.T) {
	cfg, err := config.Parse([]byte("[server]\nbody_read_timeout_secs = 0\nmax_discard_bytes = -1\n" + minimal))
	if err != nil {
		t.Fatal(err)
	}
	err = cfg.Validate()
	for _, path := range []string{"server.body_read_timeout_secs", "server.max_discard_bytes"} {
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("want an error at %s, got %v", path, err)
		}
	}
}

// server.client_write_timeout_ms defaults to 30 s and must be a positive
// number of milliseconds, at most an hour; a bad value is refused with its
// path and value, a duration string with its path.
func TestClientWriteTimeoutIsValidated(t *testing.T) {
	tests := []struct {
		name string
		line string // under [server]; "" leaves the key out
		want int    // the value in use; 0 when refused
		err  string // what the error says, besides the path
	}{
		{name: "absent: the default", want: config.DefaultClientWriteTimeoutMS},
		{name: "a short one", line: "client_write_timeout_ms = 200", want: 200},
		{name: "the maximum", line: "client_write_timeout_ms = 3600000", want: config.MaxClientWriteTimeoutMS},
		{name: "error: zero", line: "client_write_timeout_ms = 0", err: "must be in [1, 3600000], got 0"},
		{name: "error: negative", line: "client_write_timeout_ms = -5", err: "got -5"},
		{name: "error: over an hour", line: "client_write_timeout_ms = 3600001", err: "got 3600001"},
		{name: "error: a duration string", line: `client_write_timeout_ms = "30s"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte("[server]\n" + tc.line + "\n" + minimal))
			if err == nil {
				err = cfg.Validate()
			}
			if tc.want != 0 {
				if err != nil {
					t.Fatal(err)
				}
				if got := cfg.Server.ClientWriteTimeoutMS; got != tc.want {
					t.Fatalf("client_write_timeout_ms = %d, want %d", got, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "server.client_write_timeout_ms") || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("got %v, want an error at server.client_write_timeout_ms saying %q", err, tc.err)
			}
		})
	}
}

// timeouts.idle_secs defaults to 2 minutes; 0 turns the bound off, and a
// negative value or one over a day is refused with its path and value.
func TestIdleTimeoutIsValidated(t *testing.T) {
	tests := []struct {
		name string
		line string // under [timeouts]; "" leaves the key out
		want int    // the value in use
		err  string // what the error says, besides the path; "" when accepted
	}{
		{name: "absent: the default", want: config.DefaultIdleSecs},
		{name: "zero: no bound", line: "idle_secs = 0", want: 0},
		{name: "the maximum", line: "idle_secs = 86400", want: config.MaxIdleSecs},
		{name: "error: negative", line: "idle_secs = -1", err: "must be in [0, 86400], got -1"},
		{name: "error: over a day", line: "idle_secs = 86401", err: "got 86401"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte("[timeouts]\n" + tc.line + "\n" + minimal))
			if err == nil {
				err = cfg.Validate()
			}
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got := cfg.Timeouts.IdleSecs; got != tc.want {
					t.Fatalf("idle_secs = %d, want %d", got, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "timeouts.idle_secs") || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("got %v, want an error at timeouts.idle_secs saying %q", err, tc.err)
			}
		})
	}
}
