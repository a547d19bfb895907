package main

import (
	"testing"
	"time"
)

const wrkSample = `Running 5s test @ http://127.0.0.1:41037/v1/chat/completions
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.10ms    4.29ms  62.27ms   89.12%
    Req/Sec     6.12k     1.02k    8.39k    70.00%
  Latency Distribution
     50%    1.52ms
     75%    3.11ms
     90%    7.36ms
     99%   21.40ms
  60884 requests in 5.01s, 20.96MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:  12152.58
Transfer/sec:      4.18MB
`

func TestParseWrk(t *testing.T) {
	r, err := parseWrk([]byte(wrkSample))
	if err != nil {
		t.Fatal(err)
	}
	if r.rps != 12152.58 || r.p50 != 1520*time.Microsecond || r.p99 != 21400*time.Microsecond || r.errors != 7 {
		t.Fatalf("parsed %+v", r)
	}
	for _, bad := range []string{"", "Requests/sec: 10\n", "wrk: connection refused"} {
		if _, err := parseWrk([]byte(bad)); err == nil {
			t.Errorf("parseWrk(%q) gave no error", bad)
		}
	}
}

// FuzzParseWrk: wrk's report is outside input; any text parses or errors.
func FuzzParseWrk(f *testing.F) {
	f.Add([]byte(wrkSample))
	f.Add([]byte("Requests/sec: 1e309\n     50%    9s\n     99%   1us\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseWrk(b)
		if err == nil && (r.p50 <= 0 || r.p99 <= 0) {
			t.Fatalf("no error but latencies %v %v", r.p50, r.p99)
		}
	})
}
