// Command rolter-outage kills and restarts each component of a small rolter
// deployment on loopback, one at a time, under a steady request load, and
// reports what the proxy did: requests failed from the kill until the
// component is back and working, the time from the restart until then, and
// whether precise routing was used meanwhile. docs/operations.md's
// "component down" table records its figures.
//
//	make build && (cd pkg && go build -o ../bin/nats-server github.com/nats-io/nats-server/v2)
//	go run ./tests/cmd/rolter-outage --bin bin --down 3s
//
// The deployment: redis-server, nats-server, an etcd (a rolter-controlplane
// with --embed-etcd, used only as the etcd server), a control plane on that
// etcd, two vllmsim replicas publishing KV events, a kvwatcher and a proxy
// following the control plane (both with --snapshot-cache; the proxy with
// --routing-state, written every second), the proxy killed last. One request in
// eight is a stream of 150 tokens (the replicas answer 20 ms a token), each
// read to its end and classed complete (its data: [DONE]), cut and told (an
// error event or a broken body: the client can tell) or cut silently (a
// clean end without [DONE], which must never happen). The replica is
// stopped three times: killed (SIGKILL), shut down (SIGTERM, which ends
// its running streams cleanly and at once), and frozen (SIGSTOP, then
// SIGCONT: its connections open and silent meanwhile). Route "m" runs
// --strategy (predicted_ttft, the default for routes with KV events, unless
// told) over the replicas; route "c" is served through the Redis response
// cache. The requests carry no token ids, as an SDK's do, so the proxy asks
// a replica's /tokenize for them, unless --token-ids sends the
// x-rolter-vllm-token-ids header. Every port is on 127.0.0.1 from
// --base-port.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"rolter.dev/tests/vllmsim"
)

type proc struct {
	name string
	args []string
	env  []string
	cmd  *exec.Cmd
	log  *os.File
}

type rig struct {
	bin, work string
	base      int
	procs     map[string]*proc
	adminTok  string
	nodeTok   string
}

func (r *rig) port(i int) string { return "127.0.0.1:" + strconv.Itoa(r.base+i) }

func (r *rig) start(p *proc) error {
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Env = append(os.Environ(), p.env...)
	if p.log == nil {
		f, err := os.OpenFile(filepath.Join(r.work, p.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		p.log = f
	}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	p.cmd = cmd
	return nil
}

func (r *rig) kill(name string, sig syscall.Signal) {
	p := r.procs[name]
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(sig)
		_ = p.cmd.Wait()
	}
	p.cmd = nil
}

func (r *rig) stopAll() {
	for name := range r.procs {
		r.kill(name, syscall.SIGKILL)
	}
}

func get(url string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric sums the samples of name (with labels containing sub) in a
// Prometheus text page; -1 when absent.
func metric(page, name, sub string) float64 {
	sum, found := 0.0, false
	sc := bufio.NewScanner(strings.NewReader(page))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') || !strings.Contains(line, sub) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum, found = sum+v, true
		}
	}
	if !found {
		return -1
	}
	return sum
}

// tokenizeFailed counts the requests whose token ids no replica's
// /tokenize gave in time (they were routed on the approximate state).
func tokenizeFailed(page string) float64 {
	n := 0.0
	for _, outcome := range []string{"timeout", "error", "none"} {
		n += max(0, metric(page, "rolter_tokenize_total", `outcome="`+outcome+`"`))
	}
	return n
}

type result struct {
	at, end  time.Time // sent, and answered whole or cut
	route    string
	code     int
	provider string
	cache    string
	stream   streamEnd
}

// streamEnd is how a stream's body ended (zero for a request that is not
// a stream).
type streamEnd int

const (
	notStream streamEnd = iota
	streamComplete
	// streamCutTold: an error event, or a body that broke off.
	streamCutTold
	// streamCutSilent: a clean end without data: [DONE], a cut stream
	// passing for a complete one.
	streamCutSilent
)

// readStream reads a stream to its end and classes it.
func readStream(body io.Reader) streamEnd {
	b, err := io.ReadAll(body)
	switch {
	case err != nil || bytes.Contains(b, []byte(`data: {"error"`)):
		return streamCutTold
	case bytes.HasSuffix(b, []byte("data: [DONE]\n\n")):
		return streamComplete
	}
	return streamCutSilent
}

// load sends rate requests a second until ctx ends, alternating routes.
type load struct {
	mu      sync.Mutex
	results []result
}

func (l *load) run(ctx context.Context, proxy string, rate int, sendIDs bool) {
	prompts := make([]string, 8)
	tokens := make([]string, 8)
	for i := range prompts {
		var b strings.Builder
		for j := 0; b.Len() < 2400; j++ {
			fmt.Fprintf(&b, "prompt%d word%d ", i, j)
		}
		prompts[i] = b.String()
		var ids []string
		for _, t := range vllmsim.Tokenize(prompts[i]) {
			ids = append(ids, strconv.FormatUint(uint64(t), 10))
		}
		tokens[i] = strings.Join(ids, ",")
	}
	client := http.Client{Timeout: 5 * time.Second}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Mostly repeated prompts (precise routing sends each to the
		// replica holding it), a quarter through the response cache, one
		// in eight a new prompt (no replica holds it: spread by load), and
		// one in eight a stream, alternately of a repeated prompt, cycling
		// through them, and of a new one. Repeated streams go where their
		// prompts live, which both replicas run some of until one restarts
		// empty and the other holds them all; new streams' ties go by index
		// size, to the emptied replica then, but with new prompts alone
		// this fixed pattern could lock them in phase: every new stream on
		// one replica, none left to cut on the other.
		route, prompt, toks := "m", prompts[n%len(prompts)], tokens[n%len(prompts)]
		stream := n%8 == 1
		switch {
		case n%4 == 3:
			route = "c"
		case stream && (n/8)%2 == 0:
			prompt, toks = prompts[(n/16)%len(prompts)], tokens[(n/16)%len(prompts)]
		case stream || n%8 == 6:
			prompt = fmt.Sprintf("fresh prompt %d %s", n, prompts[0][:400])
			var ids []string
			for _, t := range vllmsim.Tokenize(prompt) {
				ids = append(ids, strconv.FormatUint(uint64(t), 10))
			}
			toks = strings.Join(ids, ",")
		}
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, route, prompt)
			if stream {
				body = fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":150,"stream":true}`, route, prompt)
			}
			req, _ := http.NewRequest(http.MethodPost, proxy+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if sendIDs {
				req.Header.Set("X-Rolter-Vllm-Token-Ids", toks)
			}
			res := result{at: time.Now(), route: route}
			if resp, err := client.Do(req); err == nil {
				if stream && resp.StatusCode == http.StatusOK {
					res.stream = readStream(resp.Body)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				res.code, res.provider, res.cache = resp.StatusCode, resp.Header.Get("X-Rolter-Provider"), resp.Header.Get("X-Rolter-Cache")
			}
			res.end = time.Now()
			l.mu.Lock()
			l.results = append(l.results, res)
			l.mu.Unlock()
		})
	}
}

// servedBy reports whether provider answered a request sent after t.
func (l *load) servedBy(provider string, t time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.results {
		if r.at.After(t) && r.code == http.StatusOK && r.provider == provider {
			return true
		}
	}
	return false
}

// between counts the requests in flight at some time from from to to (a
// stream sent before the kill may be cut by it) and sent after since (the
// previous outage's recovery: a request it caught, a stream on a frozen
// replica waiting out the client's timeout, is that outage's): all of
// them, those that failed (not a 200, or a stream cut, told or not), and
// the streams cut silently.
func (l *load) between(since, from, to time.Time) (total, failed, silent int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.results {
		if r.end.Before(from) || r.at.After(to) || r.at.Before(since) {
			continue
		}
		total++
		if r.code != http.StatusOK || r.stream == streamCutTold || r.stream == streamCutSilent {
			failed++
		}
		if r.stream == streamCutSilent {
			silent++
		}
	}
	return total, failed, silent
}

// explain prints, when a wait failed, what the proxy sent where and what it
// thinks of the replicas.
func explain(proxy string) {
	_, page := get(proxy + "/metrics")
	for line := range strings.SplitSeq(page, "\n") {
		for _, name := range []string{"rolter_target_requests_total", "rolter_predicted_ttft_silent_seconds", "rolter_predicted_ttft_law_fitted",
			"rolter_provider_healthy", "rolter_target_inflight_requests", "rolter_cooldowns_tripped_total", "rolter_breaker"} {
			if strings.HasPrefix(line, name) {
				fmt.Fprintln(os.Stderr, line)
			}
		}
	}
}

func waitFor(what string, within time.Duration, cond func() bool) (time.Time, error) {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func main() {
	bin := flag.String("bin", "bin", "directory of the built binaries (make build) and nats-server")
	base := flag.Int("base-port", 27000, "first loopback port used")
	rate := flag.Int("rate", 20, "requests per second sent to the proxy")
	down := flag.Duration("down", 3*time.Second, "how long each component stays down")
	within := flag.Duration("within", 60*time.Second, "give up on a recovery after this long")
	only := flag.String("only", "", "comma-separated components to test (default: all)")
	strategy := flag.String("strategy", "predicted_ttft", "route m's strategy: predicted_ttft or precise_cache_aware (the strategies that read KV events)")
	sendIDs := flag.Bool("token-ids", false, "send the x-rolter-vllm-token-ids header (default: none, as an SDK; the proxy asks /tokenize)")
	prefillTPS := flag.Float64("prefill-tps", 0, "the replicas' prefill speed in uncached prompt tokens per second (vllmsim --prefill-tps; 0 = free, so predicted_ttft's latency law seldom fits)")
	flag.Parse()
	if _, ok := preciseOutcome[*strategy]; !ok {
		fmt.Fprintf(os.Stderr, "rolter-outage: --strategy %q does not read KV events\n", *strategy)
		os.Exit(2)
	}
	o := options{strategy: *strategy, sendIDs: *sendIDs, prefillTPS: *prefillTPS}
	if err := run(*bin, *base, *rate, *down, *within, *only, o); err != nil {
		fmt.Fprintln(os.Stderr, "rolter-outage:", err)
		os.Exit(1)
	}
}

// preciseOutcome is, per strategy that reads KV events, the
// rolter_routing_decisions_total outcome of a pick the events decided.
var preciseOutcome = map[string]string{"predicted_ttft": "precise", "precise_cache_aware": "scored"}

// options are route m's strategy (a key of preciseOutcome), whether the
// load sends token ids, and the replicas' prefill speed.
type options struct {
	strategy   string
	sendIDs    bool
	prefillTPS float64
}

func run(bin string, base, rate int, down, within time.Duration, only string, o options) error {
	bin, _ = filepath.Abs(bin)
	work, err := os.MkdirTemp("", "rolter-outage-")
	if err != nil {
		return err
	}
	r := &rig{bin: bin, work: work, base: base, procs: map[string]*proc{}, adminTok: "outage-admin-0123456789", nodeTok: "outage-node-0123456789"}
	defer r.stopAll()
	b := func(name string) string { return filepath.Join(bin, name) }
	redisPort := strconv.Itoa(base + 1)
	etcdURL := "http://" + r.port(3)
	cp, nats, proxy, kvw := r.port(5), r.port(2), "http://"+r.port(10), "http://"+r.port(11)
	tokens := []string{"ROLTER_ADMIN_TOKENS=" + r.adminTok, "ROLTER_NODE_TOKENS=" + r.nodeTok, "ROLTER_KEY_PEPPER=outage-pepper-0123456789"}
	tps := strconv.FormatFloat(o.prefillTPS, 'f', -1, 64)
	for _, p := range []*proc{
		{name: "redis", args: []string{"redis-server", "--port", redisPort, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}},
		{name: "nats", args: []string{b("nats-server"), "-a", "127.0.0.1", "-p", strconv.Itoa(base + 2)}},
		{name: "etcd", args: []string{b("rolter-controlplane"), "--dev", "--embed-etcd", filepath.Join(work, "etcd"), "--embed-etcd-listen", r.port(3), "--listen", r.port(4)}, env: tokens},
		{name: "controlplane", args: []string{b("rolter-controlplane"), "--dev", "--etcd", etcdURL, "--listen", cp, "--metrics-listen", r.port(12)}, env: tokens},
		{name: "replica-a", args: []string{b("vllmsim"), "--listen", r.port(6), "--model", "sim-model", "--itl", "20ms", "--prefill-tps", tps, "--kv-events", "tcp://" + r.port(7)}},
		{name: "replica-b", args: []string{b("vllmsim"), "--listen", r.port(8), "--model", "sim-model", "--itl", "20ms", "--prefill-tps", tps, "--kv-events", "tcp://" + r.port(9)}},
		{name: "kvwatcher", args: []string{b("rolter-kvwatcher"), "--controlplane", cp, "--token", r.nodeTok, "--nats", "nats://" + nats,
			"--snapshot-cache", filepath.Join(work, "kvwatcher-snapshot.json"), "--metrics-listen", r.port(11)}},
		{name: "proxy", args: []string{b("rolter-proxy"), "--controlplane", cp, "--token", r.nodeTok, "--nats", "nats://" + nats,
			"--snapshot-cache", filepath.Join(work, "proxy-snapshot.json"), "--listen", r.port(10),
			"--routing-state", filepath.Join(work, "proxy-routing.state"), "--routing-state-interval", "1s"}, env: tokens},
	} {
		r.procs[p.name] = p
		if err := r.start(p); err != nil {
			return err
		}
		if p.name == "controlplane" {
			if _, err := waitFor("config applied", within, func() bool { return r.apply(cp, redisPort, o.strategy, 1) == nil }); err != nil {
				return err
			}
		}
	}
	fmt.Printf("work dir (logs): %s\n", work)
	fresh := func() float64 {
		_, page := get(proxy + "/metrics")
		return metric(page, "rolter_kvindex_fresh", "")
	}
	// heard: the proxy hears the watcher for both providers. A view is
	// fresh only once its engine sent an event since the watcher started,
	// and a replica serving only prompts it holds (this load's repeats,
	// one output token) sends none: after a watcher restart its view stays
	// not fresh until a new prompt goes there, which under predicted_ttft
	// can take a minute (it scores that replica on its approximate index
	// meanwhile). So health asks for one fresh view, not both.
	heard := func() bool {
		_, page := get(proxy + "/metrics")
		return metric(page, "rolter_kvindex_watcher_silent", "") == 0
	}
	healthy := func() bool {
		code, _ := get(proxy + "/readyz")
		return code == http.StatusOK && heard() && fresh() >= 1
	}
	// A view is fresh once its engine sent an event: start the load first.
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{}
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx, proxy, rate, o.sendIDs) }()
	defer func() { cancel(); <-done }()
	if _, err := waitFor("the deployment healthy", within, healthy); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // warm the replicas' caches and the response cache

	version := 1
	type check struct {
		name      string
		recovered func() bool
		proc      string         // the process stopped: name unless set
		sig       syscall.Signal // how: SIGKILL unless set
	}
	cacheHits := func() float64 { _, page := get(proxy + "/metrics"); return metric(page, "rolter_cache_hits_total", "") }
	var hitsAtRestart float64
	var restartedAt time.Time
	// watcherEpoch is the epoch the proxy's view of vllm-a follows.
	watcherEpoch := func() string {
		_, page := get(proxy + "/metrics")
		for line := range strings.SplitSeq(page, "\n") {
			if strings.HasPrefix(line, `rolter_kvindex_watcher_info{epoch="`) && strings.Contains(line, `provider="vllm-a"`) {
				return strings.SplitN(line, `"`, 3)[1]
			}
		}
		return ""
	}
	epochBefore, freshBefore := "", 0.0
	checks := []check{
		{name: "controlplane", recovered: func() bool {
			_, page := get(proxy + "/metrics")
			_, kpage := get(kvw + "/metrics")
			return metric(page, "rolter_controlplane_connected", "") == 1 && strings.Contains(kpage, "rolter_kvwatcher_providers 2")
		}},
		{name: "etcd", recovered: func() bool { version++; return r.apply(cp, redisPort, o.strategy, version) == nil }},
		{name: "nats", recovered: func() bool { return heard() && fresh() >= freshBefore }},
		{name: "kvwatcher", recovered: func() bool { return heard() && fresh() >= 1 && watcherEpoch() != epochBefore }},
		{"replica-a", func() bool { return l.servedBy("vllm-a", restartedAt) }, "", 0},
		{"replica-a-term", func() bool { return l.servedBy("vllm-a", restartedAt) }, "replica-a", syscall.SIGTERM},
		// Frozen, not dead: its connections stay open, nothing answers;
		// it continues (SIGCONT) instead of restarting.
		{"replica-a-stop", func() bool { return l.servedBy("vllm-a", restartedAt) }, "replica-a", syscall.SIGSTOP},
		{name: "redis", recovered: func() bool { return cacheHits() > hitsAtRestart }},
		// The proxy itself: everything sent to it while it is down fails
		// (one proxy; behind an L4 balancer the others take it), and the
		// streams it ran are cut, never silently. It restarts from its
		// --snapshot-cache and --routing-state.
		{name: "proxy", recovered: func() bool {
			code, _ := get(proxy + "/readyz")
			return code == http.StatusOK && (l.servedBy("vllm-a", restartedAt) || l.servedBy("vllm-b", restartedAt))
		}},
	}
	precise := `outcome="` + preciseOutcome[o.strategy] + `"`
	var prevRecovered time.Time // the previous outage's end
	fmt.Printf("\n%-15s %9s %9s %8s %13s %18s %15s %12s\n", "component", "down_for", "requests", "failed", "recovered_in", "precise_while_down", "tokenize_failed", "silent_cuts")
	for _, c := range checks {
		if only != "" && !strings.Contains(","+only+",", ","+c.name+",") {
			continue
		}
		if _, err := waitFor("healthy before "+c.name, within, healthy); err != nil {
			return err
		}
		proc, sig := cmp.Or(c.proc, c.name), cmp.Or(c.sig, syscall.SIGKILL)
		if proc == "replica-a" {
			// Out of the cooldown an earlier outage left it in, and running
			// streams (the only requests that last), so that stopping it
			// cuts some.
			since := time.Now()
			if _, err := waitFor("vllm-a running streams before "+c.name, within, func() bool {
				_, page := get("http://" + r.port(6) + "/metrics")
				return l.servedBy("vllm-a", since) && metric(page, "vllm:num_requests_running", "") >= 2
			}); err != nil {
				explain(proxy)
				return err
			}
		}
		_, page := get(proxy + "/metrics")
		scoredBefore := metric(page, "rolter_routing_decisions_total", precise)
		tokFailedBefore := tokenizeFailed(page)
		epochBefore, freshBefore = watcherEpoch(), fresh()
		t0 := time.Now()
		if sig == syscall.SIGSTOP {
			_ = r.procs[proc].cmd.Process.Signal(sig)
		} else {
			r.kill(proc, sig)
		}
		time.Sleep(down)
		_, page = get(proxy + "/metrics")
		scoredDuring := metric(page, "rolter_routing_decisions_total", precise) - scoredBefore
		tokFailed := tokenizeFailed(page) - tokFailedBefore
		if proc == "proxy" { // its counters went with it
			scoredDuring, tokFailed = 0, 0
		}
		hitsAtRestart = cacheHits()
		t1 := time.Now()
		restartedAt = t1
		if sig == syscall.SIGSTOP {
			_ = r.procs[proc].cmd.Process.Signal(syscall.SIGCONT)
		} else if err := r.start(r.procs[proc]); err != nil {
			return err
		}
		t2, err := waitFor(c.name+" recovered", within, c.recovered)
		if err != nil {
			explain(proxy)
			return err
		}
		total, failed, silent := l.between(prevRecovered, t0, t2)
		prevRecovered = t2
		fmt.Printf("%-15s %9s %9d %8d %13s %18.0f %15.0f %12d\n", c.name, down, total, failed, t2.Sub(t1).Round(10*time.Millisecond), scoredDuring, tokFailed, silent)
	}
	if log, err := os.ReadFile(filepath.Join(work, "proxy.log")); err == nil && strings.Contains(string(log), "read back what it had learned") {
		fmt.Println("\nthe restarted proxy read back its routing state (--routing-state)")
	}
	ends := l.streamEnds()
	fmt.Printf("\nstreams: %d complete, %d cut and told, %d cut silently\n", ends[streamComplete], ends[streamCutTold], ends[streamCutSilent])
	return nil
}

// streamEnds counts the streams by how they ended.
func (l *load) streamEnds() map[streamEnd]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[streamEnd]int{}
	for _, r := range l.results {
		n[r.stream]++
	}
	return n
}

// apply applies the config (version n: a comment changes) through rolterctl.
func (r *rig) apply(cp, redisPort, strategy string, n int) error {
	a, b := r.port(6), r.port(8)
	doc := fmt.Sprintf(`# version %d
[server]
require_auth = false
[accounting]
sink = "none"
[cache]
enabled = true
redis_url = "redis://127.0.0.1:%s"
[[providers]]
name = "vllm-a"
kind = "openai_compatible"
api_base = "http://%s"
[providers.kv_events]
endpoint = "tcp://%s"
[[providers]]
name = "vllm-b"
kind = "openai_compatible"
api_base = "http://%s"
[providers.kv_events]
endpoint = "tcp://%s"
[[routes]]
model = "m"
strategy = %q
targets = [{ provider = "vllm-a", model = "sim-model" }, { provider = "vllm-b", model = "sim-model" }]
[[routes]]
model = "c"
targets = [{ provider = "vllm-a", model = "sim-model" }, { provider = "vllm-b", model = "sim-model" }]
cache = { ttl_secs = 600 }
`, n, redisPort, a, r.port(7), b, r.port(9), strategy)
	path := filepath.Join(r.work, "rolter.toml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(r.bin, "rolterctl"), "apply", "-f", path)
	cmd.Env = append(os.Environ(), "ROLTER_CONTROLPLANE="+cp, "ROLTER_TOKEN="+r.adminTok)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("rolterctl apply: %v: %s", err, out)
	}
	return nil
}
