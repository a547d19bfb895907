package e2e_test

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// metric reads one sample (name with labels, exactly as exposed) from a
// proxy's /metrics; -1 when absent.
func metric(t testing.TB, base, series string) float64 {
	t.Helper()
	return sample(t, base, func(line string) bool { return strings.HasPrefix(line, series+" ") })
}

// sample reads the value of the first line of a proxy's /metrics that
// match accepts; -1 when none does.
func sample(t testing.TB, base string, match func(line string) bool) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !match(line) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[strings.LastIndexByte(line, ' ')+1:]), 64)
		if err != nil {
			t.Fatalf("metric %s: %v", line, err)
		}
		return v
	}
	return -1
}
