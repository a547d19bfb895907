package metrics_test

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"rolter.dev/dataplane/internal/cpfollow"
	"rolter.dev/dataplane/internal/proxy"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/fleet"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/natstest"
	"rolter.dev/pkg/telemetry/metricsdoc"
)

const doc = `
[cache]
enabled = true

[accounting]
sink = "none"

[[providers]]
name = "a"
kind = "openai_compatible"
api_base = "http://127.0.0.1:9"

[[routes]]
model = "m"
strategy = "cache_aware"
targets = [{ provider = "a" }]
cache = { ttl_secs = 5 }
`

// TestMetricsDocumented: every metric family a proxy registers (the way
// dataplane/app assembles one, following a control plane) is in
// docs/metrics.md with its type and labels, and the page lists no other.
func TestMetricsDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	rec := metricsdoc.NewRecorder(reg)
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// With a fleet node, as with --nats (sharing is on by default).
	p := proxy.New(proxy.Options{Logger: slog.New(slog.DiscardHandler), Registerer: rec, Gatherer: reg, Fleet: fleet.NewNode(fleet.Options{})})
	cpfollow.New(cpfollow.Options{
		Addrs: []string{"127.0.0.1:1"}, Applier: p, Metrics: p.Metrics(), Registerer: rec, Logger: slog.New(slog.DiscardHandler),
	})
	// A config in use, so that the scrape-time collector reports (and
	// gives the types of) its families.
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := config.Compile(cfg, config.CompileOptions{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(snap); err != nil {
		t.Fatal(err)
	}
	// With --nats, the KV index's collector, following one provider.
	ns := natstest.Start(t)
	ix, err := kvindex.New(natstest.Connect(t, ns), []string{"a"}, kvindex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	rec.MustRegister(ix.Collector())
	fams, problems, err := metricsdoc.Compare(rec, reg, filepath.Join("..", "..", "..", "docs", "metrics.md"), "rolter-proxy")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("docs/metrics.md: %s", p)
	}
	for _, f := range fams {
		if f.Type == "" {
			t.Logf("type of %s not checked (no series)", f.Name)
		}
	}
}
