package filewatch_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"rolter.dev/dataplane/internal/filewatch"
	"rolter.dev/dataplane/internal/proxy"
)

func TestHotReload(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)
	base := fmt.Sprintf("[server]\nrequire_auth = false\n[[providers]]\nname = \"a\"\nkind = \"openai_compatible\"\napi_base = %q\n", up.URL)
	route := func(model string) string {
		return fmt.Sprintf("[[routes]]\nmodel = %q\ntargets = [{ provider = \"a\" }]\n", model)
	}
	path := filepath.Join(t.TempDir(), "rolter.toml")
	write := func(s string) {
		t.Helper()
		// Write then rename, as editors and ConfigMaps do.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(base + route("m1"))

	p := proxy.New(proxy.Options{})
	w := filewatch.New(path, p, p.Metrics(), slog.New(slog.DiscardHandler))
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	status := func(model string) int {
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"`+model+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if status("m1") != 200 || status("m2") != 404 {
		t.Fatal("initial config not served")
	}

	// Add a route: served without restart.
	write(base + route("m1") + route("m2"))
	waitFor(t, func() bool { return status("m2") == 200 })
	v1 := p.Snapshot().Version

	// Break the file: the old config keeps serving and the failure counts.
	write(base + route("m1") + route("m2") + "[[routes]]\nmodel = \"m3\"\ntargets = [{ provider = \"ghost\" }]\n")
	waitFor(t, func() bool { return testutil.ToFloat64(p.Metrics().ConfigFailures) == 1 })
	if p.Snapshot().Version != v1 || status("m1") != 200 || status("m2") != 200 || status("m3") != 404 {
		t.Fatal("a broken file replaced the running config")
	}

	// Fix it: the new config applies.
	write(base + route("m3"))
	waitFor(t, func() bool { return status("m3") == 200 })
	if status("m1") != 404 {
		t.Fatal("removed route still served")
	}
	if got := testutil.ToFloat64(p.Metrics().ConfigReloads); got != 2 {
		t.Fatalf("reloads = %v, want 2", got)
	}
}

// start loads path into a new proxy, serves it and runs the watcher.
func start(t *testing.T, path string) (*proxy.Proxy, *filewatch.Watcher, string) {
	t.Helper()
	p := proxy.New(proxy.Options{})
	w := filewatch.New(path, p, p.Metrics(), slog.New(slog.DiscardHandler))
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return p, w, srv.URL
}

func upstreamOK(t *testing.T) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)
	return up.URL
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func statusOf(t *testing.T, url, key string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// An empty (or truncated to nothing) file routes nothing: refused at start
// and on reload, where the running config keeps serving.
func TestEmptyConfigIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rolter.toml")
	writeFile(t, path, "")
	p := proxy.New(proxy.Options{})
	err := filewatch.New(path, p, p.Metrics(), slog.New(slog.DiscardHandler)).Load()
	if err == nil || !strings.Contains(err.Error(), "no routes") {
		t.Fatalf("start with an empty file: %v, want a no-routes error", err)
	}

	good := fmt.Sprintf("[server]\nrequire_auth = false\n[[providers]]\nname = \"a\"\nkind = \"openai_compatible\"\napi_base = %q\n[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"a\" }]\n", upstreamOK(t))
	writeFile(t, path, good)
	p, _, url := start(t, path)
	v := p.Snapshot().Version
	writeFile(t, path, "")
	waitFor(t, func() bool { return testutil.ToFloat64(p.Metrics().ConfigFailures) == 1 })
	if p.Snapshot().Version != v || statusOf(t, url, "") != 200 {
		t.Fatal("an emptied file replaced the running config")
	}
}

// A reload that drops every [[virtual_keys]] table leaves the gateway
// closed: neither a request without a key nor the revoked key gets through.
func TestDroppingTheLastKeyKeepsTheGatewayClosed(t *testing.T) {
	base := fmt.Sprintf("[[providers]]\nname = \"a\"\nkind = \"openai_compatible\"\napi_base = %q\n[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"a\" }]\n", upstreamOK(t))
	const secret = "sk-rolter-team-a-0000000000"
	path := filepath.Join(t.TempDir(), "rolter.toml")
	writeFile(t, path, base+"[[virtual_keys]]\nname = \"team-a\"\nkey = \""+secret+"\"\n")
	p, _, url := start(t, path)
	if statusOf(t, url, secret) != 200 || statusOf(t, url, "") != 401 {
		t.Fatal("initial keyed config not served")
	}
	v := p.Snapshot().Version
	writeFile(t, path, base)
	waitFor(t, func() bool { return p.Snapshot().Version != v })
	if s := statusOf(t, url, ""); s != 401 {
		t.Errorf("no key after the last key was removed: %d, want 401", s)
	}
	if s := statusOf(t, url, secret); s != 401 {
		t.Errorf("revoked key: %d, want 401", s)
	}
	// Only an explicit require_auth = false opens it.
	writeFile(t, path, "[server]\nrequire_auth = false\n"+base)
	waitFor(t, func() bool { return statusOf(t, url, "") == 200 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
