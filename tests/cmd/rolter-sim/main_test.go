package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var small = []string{"--quiet", "--replicas", "3", "--gsp-groups", "3", "--gsp-prompts", "3", "--gsp-system-len", "200",
	"--gsp-question-len", "10", "--gsp-output-len", "4"}

func TestJSON(t *testing.T) {
	var out, errb bytes.Buffer
	args := append([]string{"--workload", "gsp", "--json", "--proxies", "2", "--kv-delay", "20ms",
		"--strategies", "round_robin,cache_aware:threshold=0.3,sglang,dynamo,precise_cache_aware,llmd_precise"}, small...)
	if err := run(args, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	sc := bufio.NewScanner(&out)
	var names []string
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		for _, k := range []string{"strategy", "workload", "token_hit_rate", "load_imbalance", "ttft_p50_ms", "ttft_p99_ms", "throughput_rps", "proxies", "share",
			"unbounded_hit_rate", "hit_vs_unbounded", "clairvoyant_hit_rate", "hit_vs_clairvoyant", "latency_mean_ms"} {
			if _, ok := rec[k]; !ok {
				t.Fatalf("record %v has no %q", rec, k)
			}
		}
		if rec["proxies"] != 2.0 || rec["share"] != "off" || rec["workload"] != "gsp" || rec["kv_delay_ms"] != 20.0 {
			t.Fatalf("record %v", rec)
		}
		if _, old := rec["hit_vs_oracle"]; old {
			t.Fatalf("record %v has the unnamed hit_vs_oracle", rec)
		}
		if got, want := rec["hit_vs_clairvoyant"].(float64), rec["token_hit_rate"].(float64)/rec["clairvoyant_hit_rate"].(float64); got != want {
			t.Fatalf("hit_vs_clairvoyant %v, want %v", got, want)
		}
		// The fleet's hit rate is a mean of the replicas' (weighted by
		// their prompt tokens), so it lies between theirs.
		hits, _ := rec["replica_hit_rate"].([]any)
		if len(hits) != int(rec["replicas"].(float64)) {
			t.Fatalf("replica_hit_rate %v for %v replicas", rec["replica_hit_rate"], rec["replicas"])
		}
		lo, hi := 1.0, 0.0
		for _, h := range hits {
			lo, hi = min(lo, h.(float64)), max(hi, h.(float64))
		}
		if fleet := rec["token_hit_rate"].(float64); fleet < lo-1e-9 || fleet > hi+1e-9 || lo < 0 || hi > 1 {
			t.Fatalf("fleet hit rate %v outside its replicas' %v", fleet, hits)
		}
		names = append(names, rec["strategy"].(string))
	}
	// The clairvoyant oracle is run and reported even when not listed.
	if strings.Join(names, ",") != "round_robin,cache_aware:threshold=0.3,sglang,dynamo,precise_cache_aware,llmd_precise,clairvoyant" {
		t.Fatalf("strategies %v", names)
	}
	if errb.Len() != 0 {
		t.Fatalf("stderr %q with --quiet", errb.String())
	}
}

// --share on: rolter's strategies say "on", the peers' "off" (they do not
// share); a bad value is refused.
func TestShareFlag(t *testing.T) {
	var out, errb bytes.Buffer
	args := append([]string{"--workload", "gsp", "--json", "--proxies", "3", "--share", "on", "--ramp", "100ms",
		"--strategies", "cache_aware,sglang"}, small...)
	if err := run(args, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	want := map[string]string{"cache_aware": "on", "sglang": "off", "clairvoyant": "off"}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec["share"] != want[rec["strategy"].(string)] || rec["proxies"] != 3.0 {
			t.Fatalf("record %v", rec)
		}
		delete(want, rec["strategy"].(string))
	}
	if len(want) != 0 {
		t.Fatalf("missing records for %v", want)
	}
	if err := run([]string{"--share", "maybe"}, &out, &errb); err == nil {
		t.Fatal("--share maybe accepted")
	}
}

func TestTableAndChart(t *testing.T) {
	var out, errb bytes.Buffer
	path := filepath.Join(t.TempDir(), "chart.png")
	args := append([]string{"--workload", "multiturn", "--mt-clients", "4", "--mt-rounds", "2", "--mt-request-len", "50",
		"--strategies", "all", "--png", path}, small...)
	if err := run(args, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	for _, want := range []string{"workload multiturn: 8 requests", "unbounded single-cache hit rate", "clairvoyant greedy oracle", "cache_aware", "clairvoyant (reference)", "hit %",
		"llmd_approx_bench", "dynamo_approx",
		"precise_cache_aware", "llmd_precise", "KV events after 50ms", "decisions precise_cache_aware: scored=8",
		"decisions predicted_ttft: precise=8"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatal(err)
	}
}

func TestTraceWorkloadFlag(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"--quiet", "--workload", "trace", "--trace", "../../sim/testdata/mooncake_excerpt.jsonl", "--json", "--strategies", "cache_aware"}
	if err := run(args, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	var rec map[string]any
	first, _, _ := bytes.Cut(out.Bytes(), []byte("\n"))
	if err := json.Unmarshal(first, &rec); err != nil || rec["workload"] != "trace" || rec["strategy"] != "cache_aware" {
		t.Fatalf("%v: %s", err, out.String())
	}
}

func TestErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--workload", "nope"},
		{"--strategies", "nope"},
		{"--replicas", "0"},
		{"--workload", "trace", "--trace", "/nonexistent.jsonl"},
		{"extra"},
		{"--kv-delay", "soon"},
		{"--slowdown", "1,x"},
		{"--slowdown", "0"},
		{"--slowdown", ""},
		{"--share-clock-skew", "-5ms"},
		{"--trace-block-tokens", "0"},
	} {
		var out, errb bytes.Buffer
		if err := run(append(args, "--quiet"), &out, &errb); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
