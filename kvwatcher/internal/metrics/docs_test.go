package metrics_test

import (
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"rolter.dev/kvwatcher/internal/metrics"
	"rolter.dev/pkg/telemetry/metricsdoc"
)

// TestMetricsDocumented: every metric family the kvwatcher registers is in
// docs/metrics.md with its type and labels, and the page lists no other.
func TestMetricsDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	rec := metricsdoc.NewRecorder(reg)
	// What app.RunService registers besides the watcher's metrics.
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if _, err := metrics.New(rec); err != nil {
		t.Fatal(err)
	}
	if err := metrics.RegisterNATS(rec, func() bool { return true }); err != nil {
		t.Fatal(err)
	}
	_, problems, err := metricsdoc.Compare(rec, reg, filepath.Join("..", "..", "..", "docs", "metrics.md"), "rolter-kvwatcher")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("docs/metrics.md: %s", p)
	}
}
