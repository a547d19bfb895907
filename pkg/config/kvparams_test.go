package config_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"rolter.dev/pkg/config"
)

func compileDoc(t *testing.T, doc string) *config.Snapshot {
	t.Helper()
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := config.Compile(cfg, config.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestSpeculativeTTL(t *testing.T) {
	tests := []struct {
		name, balancer string
		want           time.Duration
	}{
		{"no balancer table: default", "", 5 * time.Second},
		{"absent key: default", "[routes.balancer]\nthreshold = 0.5\n", 5 * time.Second},
		{"set", "[routes.balancer]\nspeculative_ttl_ms = 2500\n", 2500 * time.Millisecond},
		{"zero turns speculation off", "[routes.balancer]\nspeculative_ttl_ms = 0\n", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := minimal + tc.balancer
			snap := compileDoc(t, doc)
			r := snap.Routes[0]
			if r.SpeculativeTTL != tc.want {
				t.Errorf("SpeculativeTTL = %v, want %v", r.SpeculativeTTL, tc.want)
			}
			// The compiled balancer holds no pointer: two compiles of one
			// document print the same (the proxy fingerprints routes so).
			if r.Balancer.SpeculativeTTLMS != nil {
				t.Error("compiled Balancer.SpeculativeTTLMS is set")
			}
			again := compileDoc(t, doc).Routes[0]
			if a, b := fmt.Sprintf("%+v", r.Balancer), fmt.Sprintf("%+v", again.Balancer); a != b {
				t.Errorf("two compiles print differently: %s vs %s", a, b)
			}
		})
	}
}

func TestDataParallelSize(t *testing.T) {
	kv := func(lines string) string {
		return minimal + "[providers.kv_events]\n" + lines
	}
	snap := compileDoc(t, kv("endpoint = \"tcp://vllm-a:5557\"\n"))
	if got := snap.Providers[0].KVEvents.DataParallelSize; got != 1 {
		t.Errorf("default data_parallel_size = %d, want 1", got)
	}
	snap = compileDoc(t, kv("endpoint = \"tcp://vllm-a:5557\"\nreplay_endpoint = \"tcp://vllm-a:5600\"\ndata_parallel_size = 4\n"))
	if got := snap.Providers[0].KVEvents.DataParallelSize; got != 4 {
		t.Errorf("data_parallel_size = %d, want 4", got)
	}
	compileDoc(t, kv("endpoint = \"tcp://*:5557\"\nmode = \"bind\"\ndata_parallel_size = 2\n"))
	snap = compileDoc(t, kv("endpoint = \"tcp://node-a:5557\"\ndata_parallel_size = 4\ndata_parallel_hosts = [\"node-a\", \"10.0.0.2\"]\n"))
	if got := snap.Providers[0].KVEvents.DataParallelHosts; !slices.Equal(got, []string{"node-a", "10.0.0.2"}) {
		t.Errorf("data_parallel_hosts = %q", got)
	}
}

func TestSignalWeights(t *testing.T) {
	snap := compileDoc(t, minimal+"[routes.balancer]\nsignal_weight = 2\nload_weight = 0.25\n")
	if b := snap.Routes[0].Balancer; b.SignalWeight != 2 || b.LoadWeight != 0.25 {
		t.Fatalf("compiled weights %v, %v", b.SignalWeight, b.LoadWeight)
	}
}

func TestKVParamsRejected(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"error: negative ttl", minimal + "[routes.balancer]\nspeculative_ttl_ms = -1\n",
			"routes[0].balancer.speculative_ttl_ms: must be in [0, 600000], got -1"},
		{"error: huge ttl", minimal + "[routes.balancer]\nspeculative_ttl_ms = 600001\n",
			"routes[0].balancer.speculative_ttl_ms: must be in [0, 600000], got 600001"},
		{"error: ttl of the wrong type", minimal + "[routes.balancer]\nspeculative_ttl_ms = \"5s\"\n",
			"routes[0].balancer.speculative_ttl_ms: expected an integer"},
		{"error: negative load weight", minimal + "[routes.balancer]\nload_weight = -0.5\n",
			"routes[0].balancer.load_weight: must be in [0, 1e6], got -0.5"},
		{"error: signal weight not a number", minimal + "[routes.balancer]\nsignal_weight = nan\n",
			"routes[0].balancer.signal_weight: must be in [0, 1e6], got NaN"},
		{"error: negative dp size", minimal + "[providers.kv_events]\nendpoint = \"tcp://a:5557\"\ndata_parallel_size = -2\n",
			"providers[0].kv_events.data_parallel_size: must be in [1, 256], got -2"},
		{"error: dp size too large", minimal + "[providers.kv_events]\nendpoint = \"tcp://a:5557\"\ndata_parallel_size = 257\n",
			"providers[0].kv_events.data_parallel_size: must be in [1, 256], got 257"},
		{"error: dp over ipc", minimal + "[providers.kv_events]\nendpoint = \"ipc:///tmp/kv\"\ndata_parallel_size = 2\n",
			`providers[0].kv_events.endpoint: with data_parallel_size 2 must be tcp://HOST:PORT`},
		{"error: dp ports past 65535", minimal + "[providers.kv_events]\nendpoint = \"tcp://a:65535\"\ndata_parallel_size = 2\n",
			`providers[0].kv_events.endpoint: with data_parallel_size 2 must be tcp://HOST:PORT with PORT in [1, 65534]`},
		{"error: dp hosts do not divide the ranks", minimal + "[providers.kv_events]\nendpoint = \"tcp://a:5557\"\ndata_parallel_size = 3\ndata_parallel_hosts = [\"a\", \"b\"]\n",
			`providers[0].kv_events.data_parallel_hosts: 2 hosts cannot each run the same number of data_parallel_size 3 ranks`},
		{"error: dp hosts in bind mode", minimal + "[providers.kv_events]\nendpoint = \"tcp://*:5557\"\ndata_parallel_size = 2\ndata_parallel_hosts = [\"a\", \"b\"]\n",
			`providers[0].kv_events.data_parallel_hosts: only applies in connect mode`},
		{"error: dp host with a port", minimal + "[providers.kv_events]\nendpoint = \"tcp://a:5557\"\ndata_parallel_size = 2\ndata_parallel_hosts = [\"a\", \"b:5557\"]\n",
			`providers[0].kv_events.data_parallel_hosts[1]: must be a host name or address (no port), got "b:5557"`},
		{"error: empty dp host", minimal + "[providers.kv_events]\nendpoint = \"tcp://a:5557\"\ndata_parallel_size = 2\ndata_parallel_hosts = [\"\", \"b\"]\n",
			`providers[0].kv_events.data_parallel_hosts[0]: must be a host name or address`},
		{"error: dp replay over ipc", minimal + "[providers.kv_events]\nendpoint = \"tcp://a:5557\"\nreplay_endpoint = \"ipc:///tmp/r\"\ndata_parallel_size = 2\n",
			`providers[0].kv_events.replay_endpoint: with data_parallel_size 2`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(tc.doc))
			if err == nil {
				err = cfg.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if strings.Contains(tc.name, "wrong type") {
				return
			}
			var fe *config.FieldError
			if !errors.As(err, &fe) {
				t.Errorf("not a *FieldError: %T", err)
			}
		})
	}
}
