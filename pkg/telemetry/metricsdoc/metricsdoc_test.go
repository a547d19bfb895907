package metricsdoc_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"rolter.dev/pkg/telemetry/metricsdoc"
)

type custom struct{ d *prometheus.Desc }

func (c custom) Describe(ch chan<- *prometheus.Desc) { ch <- c.d }
func (c custom) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.d, prometheus.GaugeValue, 1, "x")
}

func TestRecorderAndCheck(t *testing.T) {
	reg := prometheus.NewRegistry()
	rec := metricsdoc.NewRecorder(reg)
	rec.MustRegister(
		prometheus.NewCounterVec(prometheus.CounterOpts{Name: "a_total", Help: "h"}, []string{"x", "y"}),
		prometheus.NewHistogram(prometheus.HistogramOpts{Name: "b_seconds", Help: "h {with} braces"}),
		custom{prometheus.NewDesc("c", "h", []string{"z"}, nil)},
		collectors.NewGoCollector(),
	)
	if err := rec.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "h"})); err == nil {
		t.Error("a duplicate registered")
	}
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	fams := rec.Families(got)
	var names []string
	for _, f := range fams {
		if !metricsdoc.Standard(f.Name) {
			names = append(names, f.Name+":"+f.Type+":"+strings.Join(f.Labels, ","))
		}
	}
	if want := []string{"a_total:counter:x,y", "b_seconds:histogram:", "c:gauge:z"}; !slices.Equal(names, want) {
		t.Fatalf("families %q, want %q", names, want)
	}

	doc := "# Metrics\n\n## `bin`\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n" +
		"| `a_total` | counter | `y`, `x` | … |\n| `b_seconds` | gauge | — | … |\n| `gone_total` | counter | | … |\n\n## `other`\n\n| `c` | gauge | z | … |\n"
	documented, err := metricsdoc.Documented(doc, "bin")
	if err != nil {
		t.Fatal(err)
	}
	problems := metricsdoc.Check(fams, documented)
	want := []string{"`b_seconds` is a histogram", "`c` (gauge [z]) is not documented", "`gone_total` is documented but not registered"}
	if len(problems) != len(want) {
		t.Fatalf("problems %q, want %d", problems, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(problems[i], want[i]) {
			t.Errorf("problem %q, want %q", problems[i], want[i])
		}
	}
	if _, err := metricsdoc.Documented(doc, "missing"); err == nil {
		t.Error("a missing section parsed")
	}
}
