package promtext_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"rolter.dev/pkg/promtext"
)

var vllmNames = []string{"vllm:num_requests_running", "vllm:num_requests_waiting"}

func sum(t testing.TB, data string) ([]float64, []int, error) {
	t.Helper()
	sums, counts := make([]float64, 2), make([]int, 2)
	err := promtext.Sum([]byte(data), vllmNames, sums, counts)
	return sums, counts, err
}

func TestSum(t *testing.T) {
	tests := []struct {
		name           string
		data           string
		running, wait  float64
		nRun, nWaiting int
	}{
		{"empty", "", 0, 0, 0, 0},
		{"no labels", "vllm:num_requests_running 3\nvllm:num_requests_waiting 4\n", 3, 4, 1, 1},
		{"labels", `vllm:num_requests_running{engine="0",model_name="m"} 3` + "\n", 3, 0, 1, 0},
		{"empty label set", "vllm:num_requests_running{} 2\n", 2, 0, 1, 0},
		{"series summed", "vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_running{engine=\"1\"} 4.5\n", 7.5, 0, 2, 0},
		{"comments and blank lines skipped", "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\n   \nvllm:num_requests_running 1\n# EOF\n", 1, 0, 1, 0},
		{"commented-out sample skipped", "#vllm:num_requests_running 100\nvllm:num_requests_running 1\n", 1, 0, 1, 0},
		{"prefix look-alikes skipped", "vllm:num_requests_running_total 99\nvllm:num_requests_running:x 9\nvllm:num_requests_runningX 9\nvllm:num_requests_waiting_created 1e9\nvllm:num_requests_running 1\n", 1, 0, 1, 0},
		{"name as a suffix skipped", "xvllm:num_requests_running 5\n", 0, 0, 0, 0},
		{"timestamp ignored", "vllm:num_requests_running 2 1712345678901\n", 2, 0, 1, 0},
		{"float timestamp and exemplar", "vllm:num_requests_running 2 1712345678.9 # {trace_id=\"a\"} 1\n", 2, 0, 1, 0},
		{"exemplar without timestamp", "vllm:num_requests_running 2 # {trace_id=\"a\"} 1\n", 2, 0, 1, 0},
		{"tabs, CRLF and trailing blanks", "vllm:num_requests_running\t2\t\r\nvllm:num_requests_waiting  3 \r\n", 2, 3, 1, 1},
		{"no final newline", "vllm:num_requests_waiting 6", 0, 6, 0, 1},
		{"escapes and braces in label values", `vllm:num_requests_running{model_name="a\"} 99",path="C:\\x}"} 4` + "\n", 4, 0, 1, 0},
		{"exponent and sign", "vllm:num_requests_running 1e1\nvllm:num_requests_waiting +2\n", 10, 2, 1, 1},
		{"zero and negative zero", "vllm:num_requests_running 0\nvllm:num_requests_waiting -0\n", 0, 0, 1, 1},
		{"other metrics' junk ignored", "garbage line without value\nfoo{unterminated 1\nbar NaN\nvllm:num_requests_running 1\n", 1, 0, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sums, counts, err := sum(t, tc.data)
			if err != nil {
				t.Fatal(err)
			}
			if sums[0] != tc.running || sums[1] != tc.wait || counts[0] != tc.nRun || counts[1] != tc.nWaiting {
				t.Errorf("sums %v counts %v, want [%v %v] [%d %d]", sums, counts, tc.running, tc.wait, tc.nRun, tc.nWaiting)
			}
		})
	}
}

func TestSumRejects(t *testing.T) {
	tests := []struct {
		name, data string
		want       error
	}{
		{"NaN", "vllm:num_requests_running NaN\n", promtext.ErrValue},
		{"+Inf", "vllm:num_requests_waiting +Inf\n", promtext.ErrValue},
		{"-Inf", "vllm:num_requests_waiting -Inf\n", promtext.ErrValue},
		{"negative", "vllm:num_requests_running -1\n", promtext.ErrValue},
		{"huge overflows to Inf", "vllm:num_requests_running 1e400\n", promtext.ErrSyntax},
		{"no value", "vllm:num_requests_running\n", promtext.ErrSyntax},
		{"no value after labels", "vllm:num_requests_running{a=\"b\"}\n", promtext.ErrSyntax},
		{"no blank after labels", "vllm:num_requests_running{a=\"b\"}1\n", promtext.ErrSyntax},
		{"unterminated labels", "vllm:num_requests_running{a=\"b} 1\n", promtext.ErrSyntax},
		{"not a number", "vllm:num_requests_running one\n", promtext.ErrSyntax},
		{"bad timestamp", "vllm:num_requests_running 1 later\n", promtext.ErrSyntax},
		{"junk after timestamp", "vllm:num_requests_running 1 2 3\n", promtext.ErrSyntax},
		{"sum overflows", "vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\n", promtext.ErrValue},
		{"after good lines", "vllm:num_requests_running 1\nvllm:num_requests_running x\n", promtext.ErrSyntax},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := sum(t, tc.data)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), "line ") {
				t.Errorf("error %q does not name the line", err)
			}
		})
	}
}

func TestTestdata(t *testing.T) {
	tests := []struct {
		file          string
		running, wait float64
		nRun, nWait   int
	}{
		// GET /metrics of tests/vllmsim with 2 requests running and 1 waiting.
		{"vllmsim.txt", 2, 1, 1, 1},
		// vLLM-shaped, data parallel size 2, with look-alike names.
		{"vllm_dp2.txt", 12, 3, 2, 2},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			sums, counts, err := sum(t, string(b))
			if err != nil {
				t.Fatal(err)
			}
			if sums[0] != tc.running || sums[1] != tc.wait || counts[0] != tc.nRun || counts[1] != tc.nWait {
				t.Errorf("sums %v counts %v", sums, counts)
			}
			if err := promtext.Check(vllmNames, counts); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	_, counts, _ := sum(t, "vllm:num_requests_running 1\n")
	if err := promtext.Check(vllmNames, counts); err == nil || !strings.Contains(err.Error(), "vllm:num_requests_waiting") {
		t.Fatalf("Check = %v, want the missing name", err)
	}
}

func TestSumAllocatesNothing(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "vllm_dp2.txt"))
	if err != nil {
		t.Fatal(err)
	}
	sums, counts := make([]float64, 2), make([]int, 2)
	allocs := testing.AllocsPerRun(100, func() {
		if err := promtext.Sum(b, vllmNames, sums, counts); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per Sum", allocs)
	}
}

func BenchmarkSum(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("testdata", "vllmsim.txt"))
	if err != nil {
		b.Fatal(err)
	}
	sums, counts := make([]float64, 2), make([]int, 2)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		_ = promtext.Sum(data, vllmNames, sums, counts)
	}
}

// FuzzSum: any input gives sums or an error, never a panic; a successful sum
// is finite and non-negative, and counts samples only of wanted lines.
func FuzzSum(f *testing.F) {
	for _, name := range []string{"vllmsim.txt", "vllm_dp2.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("vllm:num_requests_running{a=\"\\\"}\"} 1 2 # {x=\"y\"} 3\n"))
	f.Add([]byte("vllm:num_requests_waiting NaN\n"))
	f.Add([]byte("vllm:num_requests_running{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sums, counts := make([]float64, 2), make([]int, 2)
		if err := promtext.Sum(data, vllmNames, sums, counts); err != nil {
			return
		}
		lines := strings.Count(string(data), "\n") + 1
		for i := range sums {
			if math.IsNaN(sums[i]) || math.IsInf(sums[i], 0) || sums[i] < 0 || counts[i] < 0 || counts[i] > lines {
				t.Fatalf("sums %v counts %v from %d lines", sums, counts, lines)
			}
			if counts[i] == 0 && sums[i] != 0 {
				t.Fatalf("sum %v from no sample", sums[i])
			}
		}
		if counts[0]+counts[1] > 0 && !strings.Contains(string(data), "vllm:num_requests_") {
			t.Fatal("counted a sample of no wanted name")
		}
	})
}

func TestLabels(t *testing.T) {
	data := []byte("# TYPE vllm:cache_config_info gauge\n" +
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="661",odd="a\"b,c=\"d\"",engine="0"} 1.0` + "\n" +
		`vllm:cache_config_info_x{num_gpu_blocks="9"} 1` + "\n" +
		`vllm:cache_config_info{ engine = "1" , num_gpu_blocks="7"} 1` + "\n")
	var got []string
	err := promtext.Labels(data, "vllm:cache_config_info", func(set []byte) error {
		v, ok := promtext.Label(set, "num_gpu_blocks")
		bs, _ := promtext.Label(set, "block_size")
		odd, _ := promtext.Label(set, "odd")
		got = append(got, fmt.Sprintf("%s/%v/%s/%s", v, ok, bs, odd))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{`661/true/16/a\"b,c=\"d\"`, "7/true//"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, ok := promtext.Label([]byte(`a="1"`), "b"); ok {
		t.Error("found a missing label")
	}
	for _, bad := range []string{`vllm:x{a="1" 1`, `vllm:x{a="1"}`, `vllm:x{a="1"} one`} {
		if err := promtext.Labels([]byte(bad), "vllm:x", func([]byte) error { return nil }); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// FuzzLabels: any input gives label sets or an error, never a panic; every
// label value found lies inside its set.
func FuzzLabels(f *testing.F) {
	f.Add([]byte(`vllm:cache_config_info{block_size="16",num_gpu_blocks="661",engine="0"} 1.0`), "num_gpu_blocks")
	f.Add([]byte(`vllm:cache_config_info{a="\"} 1`), "a")
	f.Add([]byte(`vllm:cache_config_info{=,"=""} 1`), "")
	f.Fuzz(func(t *testing.T, data []byte, key string) {
		_ = promtext.Labels(data, "vllm:cache_config_info", func(set []byte) error {
			if v, ok := promtext.Label(set, key); ok && !bytes.Contains(set, v) {
				t.Fatalf("value %q not in %q", v, set)
			}
			return nil
		})
	})
}
