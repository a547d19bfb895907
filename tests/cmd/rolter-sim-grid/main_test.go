package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two runs: on the first predicted_ttft meets every bound against the best
// of two peers (each best on a different measure), on the second it misses
// the hit rate by more than a point, the p99 by more than 5 % and the
// imbalance bound, while its mean ties the best peer's.
const gridFile = `# bin/rolter-sim --quiet --json --workload gsp --strategies peers
{"strategy":"sglang","workload":"gsp","token_hit_rate":0.80,"load_imbalance":1.1,"ttft_mean_ms":100,"ttft_p99_ms":500}
{"strategy":"dynamo","workload":"gsp","token_hit_rate":0.70,"load_imbalance":1.0,"ttft_mean_ms":90,"ttft_p99_ms":400}
{"strategy":"clairvoyant","workload":"gsp","token_hit_rate":0.99,"load_imbalance":1.0,"ttft_mean_ms":1,"ttft_p99_ms":1}
{"strategy":"predicted_ttft","workload":"gsp","token_hit_rate":0.795,"load_imbalance":1.2,"ttft_mean_ms":89,"ttft_p99_ms":419}
# bin/rolter-sim --quiet --json --workload agent --replicas 16 --parallel-prefill --strategies peers
{"strategy":"sglang","workload":"agent","token_hit_rate":0.50,"load_imbalance":1.1,"ttft_mean_ms":300,"ttft_p99_ms":900}
{"strategy":"predicted_ttft","workload":"agent","token_hit_rate":0.48,"load_imbalance":1.3,"ttft_mean_ms":300,"ttft_p99_ms":950}
`

// readText is read over text written to a file.
func readText(t *testing.T, text string) []*run {
	t.Helper()
	path := filepath.Join(t.TempDir(), "grid.jsonl")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	runs, err := read(path)
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

func TestVerdicts(t *testing.T) {
	runs := readText(t, gridFile)
	if len(runs) != 2 || runs[0].label != "gsp" || runs[1].label != "agent, replicas 16, parallel-prefill" {
		t.Fatalf("runs %d, labels %q", len(runs), []string{runs[0].label, runs[len(runs)-1].label})
	}
	// The clairvoyant oracle is no peer: its hit rate and TTFT do not count.
	if mean, p99, hit, ok := runs[0].best(); !ok || mean != 90 || p99 != 400 || hit != 0.80 {
		t.Fatalf("best peer %v / %v / %v (%v), want 90 / 400 / 0.80", mean, p99, hit, ok)
	}
	for i, want := range []verdict{{mean: true, p99: true, hit: true, imb: true}, {mean: true}} {
		rec, _ := runs[i].get(subject)
		if got, ok := judge(runs[i], rec); !ok || got != want {
			t.Errorf("run %d: verdict %+v, want %+v", i, got, want)
		}
	}
	var out bytes.Buffer
	report(&out, runs)
	if n := strings.Count(out.String(), "**no**"); n != 3 {
		t.Errorf("%d misses reported, want 3:\n%s", n, out.String())
	}
	var img bytes.Buffer
	if err := chart(&img, runs); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&img); err != nil {
		t.Fatal(err)
	}
}

func TestReadRejectsAResultBeforeItsCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(path, []byte(`{"strategy":"sglang"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := read(path); err == nil || !strings.Contains(err.Error(), "before any command") {
		t.Fatalf("err = %v", err)
	}
}

// A run through several proxies is set against the run with the same flags
// through one: plain predicted_ttft against itself, :turns=0 against plain
// predicted_ttft; a run through one proxy, or without its pair, adds no row.
func TestProxiesReport(t *testing.T) {
	const file = `# bin/rolter-sim --quiet --json --seed 2 --workload gsp --strategies predicted_ttft
{"strategy":"predicted_ttft","token_hit_rate":0.80,"ttft_mean_ms":100}
# bin/rolter-sim --quiet --json --seed 2 --workload gsp --proxies 4 --share on --strategies predicted_ttft,predicted_ttft:turns=0
{"strategy":"predicted_ttft","token_hit_rate":0.79,"ttft_mean_ms":102}
{"strategy":"predicted_ttft:turns=0","token_hit_rate":0.70,"ttft_mean_ms":125}
# bin/rolter-sim --quiet --json --seed 2 --workload agent --proxies 4 --share on --strategies predicted_ttft
{"strategy":"predicted_ttft","token_hit_rate":0.5,"ttft_mean_ms":300}
# bin/rolter-sim --quiet --json --seed 2 --workload gsp --proxies 4 --share on --share-delay 10ms --strategies predicted_ttft
{"strategy":"predicted_ttft","token_hit_rate":0.80,"ttft_mean_ms":125}
`
	runs := readText(t, file)
	var b bytes.Buffer
	proxiesReport(&b, runs)
	rows := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(rows) != 5 {
		t.Fatalf("%d lines, want a header, its rule and 3 rows:\n%s", len(rows), b.String())
	}
	for _, want := range []string{
		"| gsp, seed 2, proxies 4, shared | predicted_ttft | 102.0 (100.0) | 0.980 | 79.0 (80.0) | 0.988 | yes |",
		"| gsp, seed 2, proxies 4, shared | predicted_ttft:turns=0 | 125.0 (100.0) | 0.800 | 70.0 (80.0) | 0.875 | **no** |",
		// The fleet's settings name no one-proxy run of their own.
		"| gsp, seed 2, proxies 4, shared, share-delay 10ms | predicted_ttft | 125.0 (100.0) | 0.800 | 80.0 (80.0) | 1.000 | **no** |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("no row %q in\n%s", want, b.String())
		}
	}
}
