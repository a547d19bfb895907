package kvwatcher_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	dpapp "rolter.dev/dataplane/app"
	"rolter.dev/kvwatcher/app"
	"rolter.dev/pkg/natstest"
)

// TestPreciseRoutingThroughTwoProxies: two replicas publish KV events, a
// watcher turns them into NATS deltas, and two real proxies route requests
// carrying token ids to the replica that holds their prefix.
func TestPreciseRoutingThroughTwoProxies(t *testing.T) {
	s := natstest.Start(t)
	a, b := newReplica(t, replicaOpts{}), newReplica(t, replicaOpts{})
	startWatcher(t, s, app.StaticSource{
		kvProvider("vllm-a", a.pub.Endpoint(), "", 5*time.Second),
		kvProvider("vllm-b", b.pub.Endpoint(), "", 5*time.Second),
	})
	a.waitSubscribers(t, 1)
	b.waitSubscribers(t, 1)
	urls := serveHTTP(t, a, b)

	cfg := twoReplicas{urls: urls, table: "kv_events", endpoints: [2]string{a.pub.Endpoint(), b.pub.Endpoint()},
		strategy: "precise_cache_aware",
		// The KV events alone decide here: a request routed before the events
		// arrived would otherwise leave a speculative copy of its prefix on the
		// wrong replica (these replicas never compute the header's tokens), tying
		// with the real one for its TTL.
		tail: "[routes.balancer]\nspeculative_ttl_ms = 0\n"}.config()
	proxies := startProxies(t, s, cfg, 2)

	// Warm two different prefixes, one on each replica.
	onA, onB := prompt("alpha", 320), prompt("bravo", 320)
	a.warm(onA)
	b.warm(onB)
	checkPreciseRouting(t, proxies, onA, onB)
}

// checkPreciseRouting: every proxy comes to route onA's tokens to vllm-a
// and onB's to vllm-b, keeps doing so, and counts those picks as scored by
// the KV signal.
func checkPreciseRouting(t *testing.T, proxies []*dpapp.App, onA, onB []uint32) {
	t.Helper()
	for _, tc := range []struct {
		tokens []uint32
		want   string
	}{{onA, "vllm-a"}, {onB, "vllm-b"}} {
		ids := make([]string, len(tc.tokens))
		for i, id := range tc.tokens {
			ids[i] = strconv.FormatUint(uint64(id), 10)
		}
		for i, p := range proxies {
			send := func() string {
				req, _ := http.NewRequest(http.MethodPost, p.URL()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x","max_tokens":1}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Rolter-Vllm-Token-Ids", strings.Join(ids, ","))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return ""
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					return ""
				}
				return resp.Header.Get("X-Rolter-Provider")
			}
			// Before the events arrive the strategy is neutral and ties go
			// to a random replica: wait for a run of 20 (chance: 2^-20).
			eventually(t, fmt.Sprintf("proxy %d routes the prefix to %s", i, tc.want), 5*time.Second, func() bool {
				for range 20 {
					if send() != tc.want {
						return false
					}
				}
				return true
			})
			// Once fresh, it stays: ten more requests all go there.
			for range 10 {
				req, _ := http.NewRequest(http.MethodPost, p.URL()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x","max_tokens":1}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Rolter-Vllm-Token-Ids", strings.Join(ids, ","))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if got := resp.Header.Get("X-Rolter-Provider"); got != tc.want {
					t.Fatalf("proxy %d sent a request for %s's prefix to %s", i, tc.want, got)
				}
			}
		}
	}
	// The picks were decided by the KV signal, not by a lucky tie.
	for i, p := range proxies {
		resp, err := http.Get(p.URL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		scored := false
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "rolter_routing_decisions_total{") && strings.Contains(line, `outcome="scored"`) {
				v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				scored = v >= 20
			}
		}
		if !scored {
			t.Fatalf("proxy %d: fewer than 20 picks scored by the KV signal", i)
		}
	}
}

// twoReplicas describes a proxy config with the providers vllm-a and
// vllm-b and one route "m" over both (each target serving the replicas'
// model).
type twoReplicas struct {
	urls      []string  // the providers' api_base
	table     string    // the providers' state table: "kv_events" or "lmcache"
	endpoints [2]string // each provider's table's endpoint
	tableMore string    // more lines of each provider's table
	strategy  string
	tail      string // appended (a [routes.balancer] table)
}

// config renders c as TOML.
func (c twoReplicas) config() string {
	var b strings.Builder
	b.WriteString("[server]\nrequire_auth = false\n[accounting]\nsink = \"none\"\n")
	for i, name := range []string{"vllm-a", "vllm-b"} {
		fmt.Fprintf(&b, "[[providers]]\nname = %q\nkind = \"openai_compatible\"\napi_base = %q\n[providers.%s]\nendpoint = %q\n%s",
			name, c.urls[i], c.table, c.endpoints[i], c.tableMore)
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = \"m\"\nstrategy = %q\ntargets = [{ provider = \"vllm-a\", model = %q }, { provider = \"vllm-b\", model = %q }]\n%s",
		c.strategy, model, model, c.tail)
	return b.String()
}

// startProxies writes cfg to a file and starts n real proxies on it that
// read KV deltas from the NATS server s.
func startProxies(t *testing.T, s *server.Server, cfg string, n int) []*dpapp.App {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rolter.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var proxies []*dpapp.App
	for range n {
		ctx, cancel := context.WithCancel(context.Background())
		p, err := dpapp.Start(ctx, dpapp.Options{ConfigPath: path, Listen: "127.0.0.1:0", Logger: logger(), NATSURL: s.ClientURL(), DrainTimeout: 5 * time.Second})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); _ = p.Wait() })
		proxies = append(proxies, p)
	}
	return proxies
}

// serveHTTP serves the replicas' HTTP APIs, returning their base URLs.
func serveHTTP(t *testing.T, rs ...*replica) []string {
	t.Helper()
	var urls []string
	for _, r := range rs {
		srv := httptest.NewServer(r.srv)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	return urls
}
