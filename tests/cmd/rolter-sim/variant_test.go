package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestVariantsFlag: --variants runs one route split over two replica pools
// and reports each variant, in JSON and in the table.
func TestVariantsFlag(t *testing.T) {
	args := append([]string{"--workload", "gsp", "--variants", "stable=90:cache_aware@0-1,canary=10:precise_cache_aware@2"}, small...)
	var out, errb bytes.Buffer
	if err := run(append(args, "--json"), &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	sc := bufio.NewScanner(&out)
	total := 0.0
	var names []string
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		names = append(names, rec["variant"].(string))
		total += rec["requests"].(float64)
	}
	if strings.Join(names, ",") != "stable,canary" || total != 9 {
		t.Fatalf("variants %v, %v requests (want 9)", names, total)
	}
	out.Reset()
	if err := run(args, &out, &errb); err != nil || !strings.Contains(out.String(), "canary") || !strings.Contains(out.String(), "share %") {
		t.Fatalf("table: %v\n%s", err, out.String())
	}
	if err := run(append(small, "--variants", "a=1:random@0-9"), &out, &errb); err == nil {
		t.Error("a variant past the replicas accepted")
	}
}
