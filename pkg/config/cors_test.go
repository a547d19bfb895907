package config_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"rolter.dev/pkg/config"
)

// TestCORSDefaultsAreVLLMs: without a [server.cors] table the proxy answers
// browsers as vLLM does by default, any origin and the headers a preflight
// asks for, without credentials; allowed_origins = [] turns CORS off and
// stays empty (it does not fall back to the default).
func TestCORSDefaultsAreVLLMs(t *testing.T) {
	tests := []struct {
		name, doc string
		want      config.CORS
	}{
		{"absent table", "", config.CORS{AllowedOrigins: []string{"*"}, AllowedHeaders: []string{"*"}, MaxAgeSecs: 600}},
		{"off", "[server.cors]\nallowed_origins = []\n", config.CORS{AllowedOrigins: []string{}, AllowedHeaders: []string{"*"}, MaxAgeSecs: 600}},
		{"listed origins, credentials", "[server.cors]\nallowed_origins = [\"https://app.example\"]\nallow_credentials = true\nmax_age_secs = 0\n",
			config.CORS{AllowedOrigins: []string{"https://app.example"}, AllowedHeaders: []string{"*"}, AllowCredentials: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(tc.doc + minimal))
			if err != nil {
				t.Fatal(err)
			}
			snap, err := config.Compile(cfg, config.CompileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := snap.Server.CORS; !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("server.cors = %#v, want %#v", got, tc.want)
			}
		})
	}
}

// TestCORSValidation: every bad [server.cors] value is refused with its
// field path, and the origins browsers really send pass.
func TestCORSValidation(t *testing.T) {
	tests := []struct {
		name, cors string
		path, msg  string // "" = valid
	}{
		{"ok: origins with ports, IPv6, an extension", `allowed_origins = ["https://app.example", "http://localhost:5173", "http://[::1]:3000", "chrome-extension://abcdefghijklmnop"]`, "", ""},
		{"ok: listed headers", `allowed_origins = ["https://a.example"]` + "\n" + `allowed_headers = ["Authorization", "Content-Type", "x-session-id"]`, "", ""},
		{"ok: off", `allowed_origins = []` + "\n" + `allowed_headers = []`, "", ""},
		{"ok: credentials with listed origins", `allowed_origins = ["https://a.example"]` + "\n" + `allow_credentials = true`, "", ""},
		{"error: credentials with any origin", `allow_credentials = true`, "server.cors.allow_credentials", `allowed_origins = ["*"]`},
		{"error: a trailing slash", `allowed_origins = ["https://a.example/"]`, "server.cors.allowed_origins[0]", "no path"},
		{"error: a path", `allowed_origins = ["https://a.example", "https://b.example/app"]`, "server.cors.allowed_origins[1]", "no path"},
		{"error: no scheme", `allowed_origins = ["a.example"]`, "server.cors.allowed_origins[0]", "scheme://host"},
		{"error: the default port", `allowed_origins = ["https://a.example:443"]`, "server.cors.allowed_origins[0]", `write "https://a.example"`},
		{"error: a bad port", `allowed_origins = ["http://a.example:99999"]`, "server.cors.allowed_origins[0]", "port"},
		{"error: a wildcard subdomain", `allowed_origins = ["https://*.a.example"]`, "server.cors.allowed_origins[0]", "wildcard"},
		{"error: null", `allowed_origins = ["null"]`, "server.cors.allowed_origins[0]", "sandboxed"},
		{"error: star among origins", `allowed_origins = ["https://a.example", "*"]`, "server.cors.allowed_origins[1]", "only entry"},
		{"error: no headers while on", `allowed_headers = []`, "server.cors.allowed_headers", "must not be empty"},
		{"error: not a header name", `allowed_headers = ["Content Type"]`, "server.cors.allowed_headers[0]", "header name"},
		{"error: star among headers", `allowed_headers = ["*", "Authorization"]`, "server.cors.allowed_headers[0]", "only entry"},
		{"error: max age past a day", `max_age_secs = 86401`, "server.cors.max_age_secs", "[0, 86400]"},
		{"error: negative max age", `max_age_secs = -1`, "server.cors.max_age_secs", "[0, 86400]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte("[server.cors]\n" + tc.cors + "\n" + minimal))
			if err != nil {
				t.Fatal(err)
			}
			err = cfg.Validate()
			if tc.path == "" {
				if err != nil {
					t.Fatalf("valid [server.cors] refused: %v", err)
				}
				return
			}
			var fe *config.FieldError
			if !errors.As(err, &fe) || fe.Path != tc.path || !strings.Contains(fe.Msg, tc.msg) {
				t.Fatalf("got %v, want a %s error mentioning %q", err, tc.path, tc.msg)
			}
		})
	}
}
