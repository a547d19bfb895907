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
	base := fmt.Sprintf("[[providers]]\nname = \"a\"\nkind = \"openai_compatible\"\napi_base = %q\n", up.URL)
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
