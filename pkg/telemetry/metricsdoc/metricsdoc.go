// Package metricsdoc keeps docs/metrics.md in step with the metrics each
// binary registers. Tests register a binary's collectors on a [Recorder],
// which remembers every family they describe (a labelled vector with no
// series yet included), and [Check] compares them with the binary's table in
// the page, both ways: name, type and labels.
package metricsdoc

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Family is one metric family: its name, type (counter, gauge, histogram,
// summary; empty when unknown) and variable labels.
type Family struct {
	Name   string
	Type   string
	Labels []string
}

// Recorder is a prometheus.Registerer that remembers the families of every
// collector registered through it, then registers the collector on Next.
type Recorder struct {
	Next prometheus.Registerer

	mu   sync.Mutex
	fams map[string]Family
}

var _ prometheus.Registerer = (*Recorder)(nil)

// NewRecorder returns a recorder registering on next.
func NewRecorder(next prometheus.Registerer) *Recorder {
	return &Recorder{Next: next, fams: map[string]Family{}}
}

var descRe = regexp.MustCompile(`^Desc\{fqName: "([^"]*)", .*variableLabels: \{([^}]*)\}\}$`)

// Register implements prometheus.Registerer.
func (r *Recorder) Register(c prometheus.Collector) error {
	if err := r.Next.Register(c); err != nil {
		return err
	}
	typ := typeOf(c)
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	r.mu.Lock()
	defer r.mu.Unlock()
	for d := range ch {
		m := descRe.FindStringSubmatch(d.String())
		if m == nil {
			continue // an invalid Desc: Next has refused it already
		}
		f := Family{Name: m[1], Type: typ}
		for l := range strings.SplitSeq(m[2], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
				f.Labels = append(f.Labels, l)
			}
		}
		r.fams[f.Name] = f
	}
	return nil
}

// MustRegister implements prometheus.Registerer.
func (r *Recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister implements prometheus.Registerer.
func (r *Recorder) Unregister(c prometheus.Collector) bool { return r.Next.Unregister(c) }

// typeOf is the type of a labelled vector, which has no series to gather
// before it is used; other collectors' types come from a Gather (a plain
// Histogram and Summary, or Counter and Gauge, cannot be told apart by
// their interfaces).
func typeOf(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	}
	return ""
}

// Families returns the recorded families, with the types of custom
// collectors taken from gathered (a Gather of the registry), sorted by name.
func (r *Recorder) Families(gathered []*dto.MetricFamily) []Family {
	types := map[string]string{}
	for _, mf := range gathered {
		types[mf.GetName()] = strings.ToLower(mf.GetType().String())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Family, 0, len(r.fams))
	for _, f := range r.fams {
		if f.Type == "" {
			f.Type = types[f.Name]
		}
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Standard reports whether name belongs to the client library's own
// collectors (Go runtime, process, promhttp), which the page lists as
// groups rather than one by one.
func Standard(name string) bool {
	return strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") || strings.HasPrefix(name, "promhttp_")
}

// Documented parses the metrics table of a binary's section of the page:
// the section starts at a "## " heading naming the binary in backticks,
// and its rows are | `name` | type | labels (comma-separated, "" or "—"
// for none) | meaning |.
func Documented(doc, binary string) ([]Family, error) {
	var out []Family
	in, found := false, false
	for line := range strings.Lines(doc) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "## ") {
			in = strings.Contains(line, "`"+binary+"`")
			found = found || in
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 4 {
			return nil, fmt.Errorf("%s: row %q: want | metric | type | labels | meaning |", binary, line)
		}
		f := Family{Name: strings.Trim(strings.TrimSpace(cells[0]), "`"), Type: strings.TrimSpace(cells[1])}
		for l := range strings.SplitSeq(cells[2], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" && l != "—" {
				f.Labels = append(f.Labels, l)
			}
		}
		out = append(out, f)
	}
	if !found {
		return nil, fmt.Errorf("no section \"## `%s`\"", binary)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no metric rows", binary)
	}
	return out, nil
}

// Check compares what a binary registers with what its section documents
// and returns every difference; the client library's standard families are
// not compared.
func Check(registered, documented []Family) []string {
	var problems []string
	docs := map[string]Family{}
	for _, d := range documented {
		if _, dup := docs[d.Name]; dup {
			problems = append(problems, fmt.Sprintf("`%s` is documented twice", d.Name))
		}
		docs[d.Name] = d
	}
	regs := map[string]bool{}
	for _, r := range registered {
		if Standard(r.Name) {
			continue
		}
		regs[r.Name] = true
		d, ok := docs[r.Name]
		if !ok {
			problems = append(problems, fmt.Sprintf("`%s` (%s %v) is not documented", r.Name, r.Type, r.Labels))
			continue
		}
		if r.Type != "" && d.Type != r.Type {
			problems = append(problems, fmt.Sprintf("`%s` is a %s, documented as %q", r.Name, r.Type, d.Type))
		}
		if !slices.Equal(sorted(r.Labels), sorted(d.Labels)) {
			problems = append(problems, fmt.Sprintf("`%s` has labels %v, documented %v", r.Name, r.Labels, d.Labels))
		}
	}
	for _, d := range documented {
		if !regs[d.Name] {
			problems = append(problems, fmt.Sprintf("`%s` is documented but not registered", d.Name))
		}
	}
	return problems
}

// Compare gathers g, reads the metrics reference at page (docs/metrics.md)
// and returns the families r recorded and [Check]'s differences between
// them and binary's section: what each binary's test asserts is empty.
func Compare(r *Recorder, g prometheus.Gatherer, page, binary string) (registered []Family, problems []string, err error) {
	gathered, err := g.Gather()
	if err != nil {
		return nil, nil, err
	}
	doc, err := os.ReadFile(page)
	if err != nil {
		return nil, nil, err
	}
	documented, err := Documented(string(doc), binary)
	if err != nil {
		return nil, nil, err
	}
	registered = r.Families(gathered)
	return registered, Check(registered, documented), nil
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
