package ctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"rolter.dev/controlplane/app"
	"rolter.dev/controlplane/internal/ctl"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const token = "ctl-test-admin-token-000"

func startControlPlane(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.Start(ctx, app.Options{
		Listen: "127.0.0.1:0", EmbedEtcdDir: t.TempDir(), EmbedEtcdListen: "127.0.0.1:0",
		AdminTokens: []string{token}, KeyPepper: []byte("ctl-test-pepper-0000"), Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := a.Wait(); err != nil {
			t.Error(err)
		}
	})
	return a.Addr().String()
}

type result struct {
	code           int
	stdout, stderr string
}

func run(t *testing.T, addr string, args ...string) result {
	t.Helper()
	var out, errw bytes.Buffer
	env := func(k string) string {
		switch k {
		case "ROLTER_CONTROLPLANE":
			return addr
		case "ROLTER_TOKEN":
			return token
		}
		return ""
	}
	code := ctl.Run(t.Context(), args, &out, &errw, env)
	return result{code: code, stdout: out.String(), stderr: errw.String()}
}

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const doc = `
[[providers]]
name = "a"
kind = "openai_compatible"
api_base = "http://127.0.0.1:9"

[[routes]]
model = "m1"
targets = [{ provider = "a" }]
`

func TestCommands(t *testing.T) {
	addr := startControlPlane(t)
	cfg := write(t, "rolter.toml", doc)
	bad := write(t, "bad.toml", doc+"[[routes]]\nmodel = \"m2\"\nstrategy = \"nope\"\ntargets = [{ provider = \"ghost\" }]\n")
	route := write(t, "route.toml", "[[routes]]\nmodel = \"m2\"\ntargets = [{ provider = \"a\", weight = 2 }]\n")
	empty := write(t, "empty.toml", "")

	steps := []struct {
		name     string
		args     []string
		code     int
		contains []string
	}{
		{name: "dry run shows the diff", args: []string{"apply", "-f", cfg, "--dry-run"}, code: ctl.ExitOK,
			contains: []string{`+ provider "a"`, `+ route "m1"`, "nothing applied"}},
		{name: "apply", args: []string{"apply", "-f", cfg}, code: ctl.ExitOK, contains: []string{"applied: revision"}},
		{name: "apply again changes nothing", args: []string{"apply", "-f", cfg}, code: ctl.ExitOK, contains: []string{"no changes"}},
		{name: "refused config exits 3 with paths", args: []string{"apply", "-f", bad}, code: ctl.ExitInvalid,
			contains: []string{`routes[1].strategy: unknown strategy "nope"`, `routes[1].targets[0].provider: unknown provider "ghost"`}},
		{name: "validate", args: []string{"validate", "-f", bad}, code: ctl.ExitInvalid, contains: []string{"routes[1].strategy"}},
		{name: "list routes", args: []string{"list", "routes"}, code: ctl.ExitOK, contains: []string{"MODEL", "m1", "round_robin"}},
		{name: "create route from a file", args: []string{"create", "route", "-f", route}, code: ctl.ExitOK, contains: []string{`created route "m2"`}},
		{name: "create it again conflicts", args: []string{"create", "route", "-f", route}, code: ctl.ExitConflict, contains: []string{"already exists"}},
		{name: "get route as TOML", args: []string{"get", "route", "m2"}, code: ctl.ExitOK, contains: []string{"[[routes]]", "weight = 2"}},
		{name: "stale update conflicts", args: []string{"update", "route", "-f", route, "--revision", "1"}, code: ctl.ExitConflict, contains: []string{"conflict"}},
		{name: "delete route", args: []string{"delete", "route", "m2"}, code: ctl.ExitOK, contains: []string{`deleted route "m2"`}},
		{name: "get missing exits 4", args: []string{"get", "route", "m2"}, code: ctl.ExitNotFound},
		{name: "delete a referenced provider is refused", args: []string{"delete", "provider", "a"}, code: ctl.ExitInvalid,
			contains: []string{`routes["m1"].targets[0].provider: unknown provider "a"`}},
		{name: "deleting the last route is refused", args: []string{"delete", "route", "m1"}, code: ctl.ExitInvalid, contains: []string{"routes: no routes"}},
		{name: "create key", args: []string{"keys", "create", "team-a", "--models", "m1"}, code: ctl.ExitOK, contains: []string{"sk-rolter-"}},
		{name: "disable key", args: []string{"keys", "disable", "team-a"}, code: ctl.ExitOK, contains: []string{"disabled"}},
		{name: "list keys", args: []string{"keys", "list"}, code: ctl.ExitOK, contains: []string{"team-a", "m1", "true", "digest"}},
		{name: "status", args: []string{"status"}, code: ctl.ExitOK, contains: []string{"config revision", "CONTROLPLANE", "NODE"}},
		{name: "get config", args: []string{"get", "config"}, code: ctl.ExitOK, contains: []string{"key_digest", "[[routes]]"}},
		{name: "an empty config is refused", args: []string{"apply", "-f", empty}, code: ctl.ExitInvalid, contains: []string{"routes: no routes"}},
		{name: "create a second key", args: []string{"keys", "create", "team-b"}, code: ctl.ExitOK, contains: []string{"sk-rolter-"}},
		{name: "delete says what is left", args: []string{"keys", "delete", "team-b"}, code: ctl.ExitOK,
			contains: []string{`deleted key "team-b"`, "1 key left"}},
		{name: "deleting the last key leaves the gateway closed", args: []string{"keys", "delete", "team-a"}, code: ctl.ExitOK,
			contains: []string{"0 keys left; the gateway refuses every request (server.require_auth = true)"}},
		{name: "unknown command", args: []string{"frobnicate"}, code: ctl.ExitUsage},
		{name: "wrong token", args: []string{"--token", "not-the-token-000000", "list", "routes"}, code: ctl.ExitAuth},
		{name: "no control plane", args: []string{"--controlplane", "127.0.0.1:1", "--timeout", "1s", "status"}, code: ctl.ExitUnavailable},
	}
	for _, s := range steps {
		r := run(t, addr, s.args...)
		if r.code != s.code {
			t.Errorf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", s.name, r.code, s.code, r.stdout, r.stderr)
			continue
		}
		for _, c := range s.contains {
			if !strings.Contains(r.stdout+r.stderr, c) {
				t.Errorf("%s: missing %q in\n%s%s", s.name, c, r.stdout, r.stderr)
			}
		}
	}

	// JSON output parses, and the key secret appears only at creation.
	r := run(t, addr, "-o", "json", "keys", "create", "team-b")
	var created struct {
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &created); err != nil || !strings.HasPrefix(created.Secret, "sk-rolter-") {
		t.Fatalf("keys create -o json: %v\n%s", err, r.stdout)
	}
	for _, args := range [][]string{{"-o", "json", "keys", "list"}, {"get", "config"}, {"-o", "json", "get", "key", "team-b"}} {
		if r := run(t, addr, args...); strings.Contains(r.stdout, created.Secret) || r.code != 0 {
			t.Errorf("%v: exit %d or shows the secret", args, r.code)
		}
	}
}
