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

func TestVerdicts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "grid.jsonl")
	if err := os.WriteFile(path, []byte(gridFile), 0o600); err != nil {
		t.Fatal(err)
	}
	runs, err := read(path)
	if err != nil {
		t.Fatal(err)
	}
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
