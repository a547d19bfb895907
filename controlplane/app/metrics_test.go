package app_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"rolter.dev/controlplane/app"
	"rolter.dev/pkg/telemetry/metricsdoc"
)

// TestMetricsDocumented: every metric family the control plane registers
// is in docs/metrics.md with its type and labels, and the page lists no
// other.
func TestMetricsDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	rec := metricsdoc.NewRecorder(reg)
	// What Start registers itself when given no registry.
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ctx, cancel := context.WithCancel(t.Context())
	a, err := app.Start(ctx, app.Options{
		Listen: "127.0.0.1:0", EmbedEtcdDir: t.TempDir(), EmbedEtcdListen: "127.0.0.1:0",
		AdminTokens: []string{adminToken}, KeyPepper: []byte("pepper-0123456789abcdef"),
		Logger: slog.New(slog.DiscardHandler), Registerer: rec, Gatherer: reg,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := a.Wait(); err != nil {
			t.Errorf("control plane: %v", err)
		}
	}()
	_, problems, err := metricsdoc.Compare(rec, reg, filepath.Join("..", "..", "docs", "metrics.md"), "rolter-controlplane")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("docs/metrics.md: %s", p)
	}
}
