package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr bool
		check   func(t *testing.T, c config)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, c config) {
				if c.listen != "127.0.0.1:8000" || len(c.opts.Models) != 0 || c.opts.BlockSize != 16 ||
					c.opts.CapacityBlocks != 4096 || c.opts.MaxTokensDefault != 16 || c.opts.FailRate != 0 {
					t.Errorf("config = %+v", c)
				}
			},
		},
		{
			name: "every flag",
			args: []string{"--listen", ":9000", "--model", "a,b", "--model", "c", "--ttft", "50ms", "--itl", "5ms",
				"--prefill-tps", "2000", "--fail-rate", "0.25", "--block-size", "32", "--capacity-blocks", "100",
				"--max-tokens-default", "8", "--max-model-len", "2048", "--max-num-seqs", "4", "--cache-output",
				"--seed", "7", "--log-level", "debug"},
			check: func(t *testing.T, c config) {
				o := c.opts
				if c.listen != ":9000" || !slices.Equal(o.Models, []string{"a", "b", "c"}) || o.TTFT != 50*time.Millisecond ||
					o.ITL != 5*time.Millisecond || o.PrefillTokensPerSecond != 2000 || o.FailRate != 0.25 ||
					o.BlockSize != 32 || o.CapacityBlocks != 100 || o.MaxTokensDefault != 8 || o.MaxModelLen != 2048 ||
					o.MaxNumSeqs != 4 || !o.CacheOutput || o.Seed != 7 || c.logLevel.String() != "DEBUG" {
					t.Errorf("config = %+v", c)
				}
			},
		},
		{name: "error: unknown flag", args: []string{"--nope"}, wantErr: true},
		{name: "error: bad duration", args: []string{"--ttft", "soon"}, wantErr: true},
		{name: "error: stray argument", args: []string{"serve"}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseFlags(tc.args, io.Discard)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	err := run(t.Context(), []string{"--listen", "127.0.0.1:0", "--fail-rate", "2"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "fail_rate") {
		t.Errorf("run = %v, want a fail_rate error", err)
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1) // run's result
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--model", "m1"}, pw)
		pw.Close()
	}()

	logs := bufio.NewReader(pr)
	line, err := logs.ReadString('\n')
	if err != nil {
		t.Fatalf("read log: %v", err)
	}
	_, rest, ok := strings.Cut(line, "addr=")
	if !ok {
		t.Fatalf("first log line %q has no addr", line)
	}
	addr := strings.Fields(rest)[0]
	drained := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, logs); close(drained) }()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/models", nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET /v1/models: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	client.CloseIdleConnections()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"m1"`) {
		t.Errorf("GET /v1/models = %d %s", resp.StatusCode, body)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	<-drained
}
