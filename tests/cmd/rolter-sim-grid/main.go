// Command rolter-sim-grid judges predicted_ttft on the runs of
// scripts/sim-ttft-grid.sh: it reads their JSON lines (each run introduced by
// a "# bin/rolter-sim ..." line), prints one Markdown table per run family
// with issue 13's verdict, then, for the runs through several proxies, their
// TTFT mean and hit rate against one proxy's, and with --png draws the whole
// table (run × strategy: hit rate, TTFT mean, TTFT p99, imbalance) as one
// chart.
//
//	go run ./cmd/rolter-sim-grid --png ../docs/routing-ttft.png /tmp/grid/*.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"slices"
	"strings"

	"rolter.dev/tests/sim"
)

// record is one strategy's result as rolter-sim --json prints it.
type record struct {
	Strategy  string  `json:"strategy"`
	Workload  string  `json:"workload"`
	Hit       float64 `json:"token_hit_rate"`
	Imbalance float64 `json:"load_imbalance"`
	Mean      float64 `json:"ttft_mean_ms"`
	P99       float64 `json:"ttft_p99_ms"`
	Proxies   int     `json:"proxies"`
	Share     string  `json:"share"`
}

// run is one rolter-sim invocation.
type run struct {
	cmd     string
	label   string
	records []record
}

// peers are the peers' policies the verdict compares with (not the
// clairvoyant reference, not rolter's own strategies).
var peers = []string{"sglang", "llmd_approx", "llmd_approx_bench", "llmd_precise", "dynamo", "dynamo_approx", "aibrix"}

const subject = "predicted_ttft"

func main() {
	pngPath := flag.String("png", "", "write the chart to this file")
	flag.Parse()
	var runs []*run
	for _, path := range flag.Args() {
		r, err := read(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		runs = append(runs, r...)
	}
	if len(runs) == 0 {
		fmt.Fprintln(os.Stderr, "no runs")
		os.Exit(2)
	}
	report(os.Stdout, runs)
	proxiesReport(os.Stdout, runs)
	if *pngPath != "" {
		f, err := os.Create(*pngPath)
		if err == nil {
			err = chart(f, runs)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

func read(path string) ([]*run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var runs []*run
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
		case strings.HasPrefix(line, "#"):
			cmd := strings.TrimSpace(strings.TrimPrefix(line, "#"))
			runs = append(runs, &run{cmd: cmd, label: label(cmd)})
		default:
			var rec record
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			if len(runs) == 0 {
				return nil, fmt.Errorf("%s: a result before any command line", path)
			}
			runs[len(runs)-1].records = append(runs[len(runs)-1].records, rec)
		}
	}
	return runs, sc.Err()
}

// label names a run by its workload and the flags that differ from the
// defaults.
func label(cmd string) string {
	f := strings.Fields(cmd)
	var parts []string
	for i := 0; i < len(f); i++ {
		switch f[i] {
		case "--workload":
			parts = append([]string{f[i+1]}, parts...)
			i++
		case "--quiet", "--json":
		case "--strategies", "--trace-limit": // every trace run has the same limit
			i++
		case "--share":
			if f[i+1] == "on" {
				parts = append(parts, "shared")
			}
			i++
		default:
			if strings.HasPrefix(f[i], "--") && (i+1 == len(f) || strings.HasPrefix(f[i+1], "--")) {
				parts = append(parts, strings.TrimPrefix(f[i], "--")) // a boolean flag
			} else if strings.HasPrefix(f[i], "--") {
				parts = append(parts, strings.TrimPrefix(f[i], "--")+" "+f[i+1])
				i++
			}
		}
	}
	return strings.Join(parts, ", ")
}

func (r *run) get(name string) (record, bool) {
	for _, x := range r.records {
		if x.Strategy == name {
			return x, true
		}
	}
	return record{}, false
}

// best returns the best peer values: least TTFT mean, least p99, greatest
// hit rate; ok false without peers.
func (r *run) best() (mean, p99, hit float64, ok bool) {
	for _, x := range r.records {
		if !slices.Contains(peers, x.Strategy) {
			continue
		}
		if !ok {
			mean, p99, hit, ok = x.Mean, x.P99, x.Hit, true
			continue
		}
		mean, p99, hit = min(mean, x.Mean), min(p99, x.P99), max(hit, x.Hit)
	}
	return
}

// verdict is issue 13's four checks of rec against the best peer.
type verdict struct{ mean, p99, hit, imb bool }

func judge(r *run, rec record) (verdict, bool) {
	mean, p99, hit, ok := r.best()
	if !ok {
		return verdict{}, false
	}
	return verdict{mean: rec.Mean <= mean, p99: rec.P99 <= 1.05*p99, hit: rec.Hit >= hit-0.01, imb: rec.Imbalance <= 1.25}, true
}

func mark(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

func report(w io.Writer, runs []*run) {
	fmt.Fprintln(w, "| run | strategy | hit % | TTFT mean ms | TTFT p99 ms | imbalance | best peer (hit / mean / p99) | mean ≤ | p99 ≤ 1.05× | hit ≥ −1 pt | imb ≤ 1.25 |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range runs {
		mean, p99, hit, ok := r.best()
		for _, x := range r.records {
			if !strings.HasPrefix(x.Strategy, subject) {
				continue
			}
			bp, v := "-", verdict{}
			row := fmt.Sprintf("| %s | %s | %.1f | %.0f | %.0f | %.2f |", r.label, x.Strategy, 100*x.Hit, x.Mean, x.P99, x.Imbalance)
			if ok {
				v, _ = judge(r, x)
				bp = fmt.Sprintf("%.1f / %.0f / %.0f", 100*hit, mean, p99)
				fmt.Fprintf(w, "%s %s | %s | %s | %s | %s |\n", row, bp, mark(v.mean), mark(v.p99), mark(v.hit), mark(v.imb))
			} else {
				fmt.Fprintf(w, "%s - | | | | |\n", row)
			}
		}
	}
}

// alone is cmd without its --proxies, --strategies and sharing flags
// (--share and the --share-… settings of the fleet's messages): what names
// the run through one proxy that a run through several compares with;
// several reports whether cmd runs several.
func alone(cmd string) (key string, several bool) {
	f := strings.Fields(cmd)
	var out []string
	for i := 0; i < len(f); i++ {
		switch {
		case f[i] == "--proxies":
			several = i+1 < len(f) && f[i+1] != "1"
			i++
		case f[i] == "--share", f[i] == "--strategies", strings.HasPrefix(f[i], "--share-"):
			i++
		default:
			out = append(out, f[i])
		}
	}
	return strings.Join(out, " "), several
}

// proxiesReport prints, for each run through several proxies, each
// predicted_ttft variant's TTFT mean and hit rate as fractions of one
// proxy's on the same flags (issue 13, item 4: at least 0.97). A variant
// that only changes what several proxies do (:turns=0) is compared with
// plain predicted_ttft through one. Nothing without such pairs.
func proxiesReport(w io.Writer, runs []*run) {
	single := map[string]*run{}
	for _, r := range runs {
		if key, several := alone(r.cmd); !several {
			single[key] = r
		}
	}
	header := false
	for _, r := range runs {
		key, several := alone(r.cmd)
		one, ok := single[key]
		if !several || !ok {
			continue
		}
		for _, x := range r.records {
			if !strings.HasPrefix(x.Strategy, subject) {
				continue
			}
			base, ok := one.get(x.Strategy)
			if !ok {
				base, ok = one.get(strings.TrimSuffix(x.Strategy, ":turns=0"))
			}
			if !ok || x.Mean <= 0 {
				continue
			}
			if !header {
				fmt.Fprintln(w)
				fmt.Fprintln(w, "| run | strategy | TTFT mean ms (one proxy) | one / several | hit % (one proxy) | several / one | both ≥ 0.97 |")
				fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
				header = true
			}
			ttft := base.Mean / x.Mean
			hit := 1.0
			if base.Hit > 0 {
				hit = x.Hit / base.Hit
			}
			fmt.Fprintf(w, "| %s | %s | %.1f (%.1f) | %.3f | %.1f (%.1f) | %.3f | %s |\n", r.label, x.Strategy, x.Mean, base.Mean, ttft,
				100*x.Hit, 100*base.Hit, hit, mark(ttft >= 0.97 && hit >= 0.97))
		}
	}
}

// Chart geometry.
const (
	cellW   = 70
	labelW  = 330
	rowH    = 16
	headH   = 120
	panelGp = 24
	pad     = 10
)

var (
	ink    = color.RGBA{20, 20, 20, 255}
	grid   = color.RGBA{225, 225, 225, 255}
	pass   = color.RGBA{190, 230, 190, 255}
	fail   = color.RGBA{245, 180, 170, 255}
	bestBg = color.RGBA{200, 220, 245, 255}
)

// chart draws four panels (hit %, TTFT mean, TTFT p99, imbalance), rows =
// runs, columns = strategies. predicted_ttft's cells are green where it
// meets the bound and red where it misses; the best peer's cell of
// each row is blue.
func chart(w io.Writer, runs []*run) error {
	var cols []string
	for _, r := range runs {
		for _, x := range r.records {
			if !slices.Contains(cols, x.Strategy) {
				cols = append(cols, x.Strategy)
			}
		}
	}
	type panel struct {
		name string
		val  func(record) float64
		f    string
		ok   func(verdict) bool
		best func(r *run) float64
	}
	panels := []panel{
		{"token hit rate % (pass: >= best peer - 1 point)", func(x record) float64 { return 100 * x.Hit }, "%.1f", func(v verdict) bool { return v.hit }, func(r *run) float64 { _, _, h, _ := r.best(); return 100 * h }},
		{"TTFT mean ms (pass: <= best peer)", func(x record) float64 { return x.Mean }, "%.0f", func(v verdict) bool { return v.mean }, func(r *run) float64 { m, _, _, _ := r.best(); return m }},
		{"TTFT p99 ms (pass: <= 1.05 x best peer)", func(x record) float64 { return x.P99 }, "%.0f", func(v verdict) bool { return v.p99 }, func(r *run) float64 { _, p, _, _ := r.best(); return p }},
		{"load imbalance (pass: <= 1.25)", func(x record) float64 { return x.Imbalance }, "%.2f", func(v verdict) bool { return v.imb }, nil},
	}
	panelH := rowH*(len(runs)+1) + panelGp
	width := 2*pad + labelW + cellW*len(cols)
	height := 2*pad + headH + panelH*len(panels)
	cv := sim.NewCanvas(width, height)
	text := func(x, y int, s string) { cv.Text(x, y, s, ink) }
	rect := cv.Rect
	text(pad, pad+12, "rolter-sim: predicted_ttft against the peers (scripts/sim-ttft-grid.sh; green/red: predicted_ttft meets/misses issue 13's bound; blue: best peer)")
	// Column headers, one strategy name per column, wrapped on ':' and '_'.
	for c, name := range cols {
		x := pad + labelW + c*cellW + 2
		for k, part := range wrap(name, 9) {
			text(x, pad+40+k*13, part)
		}
	}
	for p, pn := range panels {
		y0 := pad + headH + p*panelH
		text(pad, y0+12, pn.name)
		for ri, r := range runs {
			y := y0 + rowH*(ri+1)
			rect(pad, y, width-pad, y+1, grid)
			lbl := r.label
			if limit := labelW/7 - 1; len(lbl) > limit {
				lbl = lbl[:limit-1] + "~"
			}
			text(pad, y+12, lbl)
			var bestV float64
			hasBest := false
			if pn.best != nil {
				if _, _, _, ok := r.best(); ok {
					bestV, hasBest = pn.best(r), true
				}
			}
			for c, name := range cols {
				x, ok := r.get(name)
				if !ok {
					continue
				}
				cx := pad + labelW + c*cellW
				v := pn.val(x)
				switch {
				case strings.HasPrefix(name, subject):
					if vd, ok := judge(r, x); ok {
						bg := fail
						if pn.ok(vd) {
							bg = pass
						}
						rect(cx, y+1, cx+cellW-2, y+rowH, bg)
					}
				case hasBest && slices.Contains(peers, name) && fmt.Sprintf(pn.f, v) == fmt.Sprintf(pn.f, bestV):
					rect(cx, y+1, cx+cellW-2, y+rowH, bestBg)
				}
				text(cx+3, y+12, fmt.Sprintf(pn.f, v))
			}
		}
	}
	return cv.EncodePNG(w)
}

// wrap splits a strategy name into lines of at most n characters, breaking
// after ':' or '_' where it can.
func wrap(s string, n int) []string {
	var out []string
	for len(s) > n {
		cut := strings.LastIndexAny(s[:n], ":_")
		if cut <= 0 {
			cut = n - 1
		}
		out = append(out, s[:cut+1])
		s = s[cut+1:]
	}
	return append(out, s)
}
