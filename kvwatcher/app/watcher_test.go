package app

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"rolter.dev/kvwatcher/zmtptest"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/kvevents"
	"rolter.dev/pkg/natstest"
)

const topic = "kv@pod-a@sim-model"

func kvProvider(name, endpoint string) Provider {
	return Provider{Name: name, KV: &KVSpec{Endpoint: endpoint, Topic: topic, Mode: ModeConnect, Model: "sim-model", MaxBlocks: 1000, Stale: 2 * time.Second}}
}

func newPub(t *testing.T) *zmtptest.Pub {
	t.Helper()
	p, err := zmtptest.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func send(t *testing.T, p *zmtptest.Pub, fr ...[]byte) {
	t.Helper()
	if err := p.Send(fr...); err != nil {
		t.Fatal(err)
	}
}

func TestSequenceHandling(t *testing.T) {
	s := natstest.Start(t)
	pub := newPub(t)
	r := startWatcher(t, natstest.Connect(t, s), StaticSource{kvProvider("p", pub.Endpoint())})
	ix := newIndex(t, natstest.Connect(t, s), "p")
	if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	a := newChain("sim-model", 4, 16, 100)
	ids := a.ids()

	// The first sequence seen is a baseline, not a gap.
	send(t, pub, frames(topic, 7, encodeBatch(t, a.stored(0, 2)))...)
	eventually(t, "baseline batch", func() bool { return ix.Fresh("p") && ix.PrefixMatch("p", ids) == 2 })
	// A continuation run links to its parent.
	send(t, pub, frames(topic, 8, encodeBatch(t, a.stored(2, 4)))...)
	eventually(t, "continuation", func() bool { return ix.PrefixMatch("p", ids) == 4 })

	// Malformed messages are counted and skipped.
	send(t, pub, []byte(topic), []byte{0, 0, 0, 0, 0, 0, 0})            // 2 frames
	send(t, pub, []byte(topic), []byte{0, 0, 0, 0, 0, 0, 9}, []byte{1}) // 7-byte sequence
	send(t, pub, frames(topic, 9, []byte{0xc1})...)                     // undecodable payload
	eventually(t, "malformed counted", func() bool {
		return r.counter(t, "rolter_kvwatcher_malformed_total", "reason", "frames") == 2 &&
			r.counter(t, "rolter_kvwatcher_malformed_total", "reason", "payload") == 1
	})
	if r.counter(t, "rolter_kvwatcher_stream_failures_total", "reason", "gap") != 0 {
		t.Fatal("a gap was counted before any")
	}

	// A removal removes.
	send(t, pub, frames(topic, 10, encodeBatch(t, a.removed(3, 4)))...)
	eventually(t, "removal", func() bool { return ix.PrefixMatch("p", ids) == 3 })

	// A gap without replay: cleared, neutral until AllBlocksCleared.
	send(t, pub, frames(topic, 12, encodeBatch(t, a.stored(3, 4)))...)
	eventually(t, "neutral after the gap", func() bool { return !ix.Fresh("p") && ix.PrefixMatch("p", ids) == 0 })
	send(t, pub, frames(topic, 13, encodeBatch(t, a.stored(0, 1)))...) // ignored while desynced
	send(t, pub, frames(topic, 14, encodeBatch(t, &kvevents.AllBlocksCleared{}, a.stored(0, 1)))...)
	eventually(t, "synced after the engine's clear", func() bool { return ix.Fresh("p") && ix.PrefixMatch("p", ids) == 1 })
	if got := r.counter(t, "rolter_kvwatcher_skipped_total", "reason", "desynced"); got != 2 { // the gap's batch and the next
		t.Errorf("batches skipped while desynced = %v, want 2", got)
	}

	// The sequence going back (a restarted publisher) clears.
	send(t, pub, frames(topic, 0, encodeBatch(t, newChain("sim-model", 1, 16, 900).stored(0, 1)))...)
	eventually(t, "cleared by the restart", func() bool { return ix.PrefixMatch("p", ids) == 0 })
	if got := r.counter(t, "rolter_kvwatcher_stream_failures_total", "reason", "restart"); got != 1 {
		t.Errorf("restarts = %v", got)
	}
	if !ix.Fresh("p") {
		t.Error("a restart at sequence 0 is a complete baseline: want fresh")
	}
}

func TestReconnectClears(t *testing.T) {
	s := natstest.Start(t)
	pub := newPub(t)
	ep := pub.Endpoint()
	startWatcher(t, natstest.Connect(t, s), StaticSource{kvProvider("p", ep)})
	ix := newIndex(t, natstest.Connect(t, s), "p")
	if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	a := newChain("sim-model", 2, 16, 100)
	send(t, pub, frames(topic, 5, encodeBatch(t, a.stored(0, 2)))...)
	eventually(t, "stored", func() bool { return ix.PrefixMatch("p", a.ids()) == 2 })
	pub.Close()
	eventually(t, "cleared on disconnect", func() bool { return ix.PrefixMatch("p", a.ids()) == 0 && !ix.Fresh("p") })

	// The publisher comes back on the same port: a new baseline.
	pub2, err := zmtptest.Listen(ep)
	if err != nil {
		t.Fatal(err)
	}
	defer pub2.Close()
	if err := pub2.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	send(t, pub2, frames(topic, 0, encodeBatch(t, a.stored(0, 1)))...)
	eventually(t, "new stream", func() bool { return ix.Fresh("p") && ix.PrefixMatch("p", a.ids()) == 1 })
}

func TestBindMode(t *testing.T) {
	s := natstest.Start(t)
	src := StaticSource{
		{Name: "a", KV: &KVSpec{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@a@m", Mode: ModeBind, Model: "m", MaxBlocks: 100, Stale: 2 * time.Second}},
		{Name: "b", KV: &KVSpec{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@b@m", Mode: ModeBind, Model: "m", MaxBlocks: 100, Stale: 2 * time.Second}},
	}
	r := startWatcher(t, natstest.Connect(t, s), src)
	ix := newIndex(t, natstest.Connect(t, s), "a", "b")
	var ep string
	eventually(t, "bound", func() bool { var ok bool; ep, ok = r.w.BoundEndpoint("tcp://127.0.0.1:0"); return ok })
	pa, err := zmtptest.Dial(ep)
	if err != nil {
		t.Fatal(err)
	}
	defer pa.Close()
	pb, err := zmtptest.Dial(ep)
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	ca, cb := newChain("m", 2, 16, 1), newChain("m", 3, 16, 2)
	eventually(t, "subscriptions", func() bool { return pa.Subscribers() == 1 && pb.Subscribers() == 1 })
	send(t, pa, frames("kv@a@m", 3, encodeBatch(t, ca.stored(0, 2)))...)
	send(t, pb, frames("kv@b@m", 9, encodeBatch(t, cb.stored(0, 3)))...)
	send(t, pb, frames("kv@nobody@m", 0, encodeBatch(t, cb.stored(0, 3)))...)
	eventually(t, "both providers", func() bool {
		return ix.PrefixMatch("a", ca.ids()) == 2 && ix.PrefixMatch("b", cb.ids()) == 3
	})
	if ix.PrefixMatch("a", cb.ids()) != 0 || ix.PrefixMatch("b", ca.ids()) != 0 {
		t.Error("a provider got another's blocks")
	}
	eventually(t, "unknown topic counted", func() bool { return r.counter(t, "rolter_kvwatcher_unknown_topic_total") == 1 })
	// A publisher's disconnect clears its provider only.
	pa.Close()
	eventually(t, "a cleared", func() bool { return ix.PrefixMatch("a", ca.ids()) == 0 })
	if ix.PrefixMatch("b", cb.ids()) != 3 {
		t.Error("b lost its state")
	}
}

func TestLMCache(t *testing.T) {
	var body atomic.Value
	body.Store(`{"occupancy": 0.25, "cache_available": true}`)
	status := atomic.Int32{}
	status.Store(200)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write([]byte(body.Load().(string)))
	}))
	defer srv.Close()
	s := natstest.Start(t)
	r := startWatcher(t, natstest.Connect(t, s), StaticSource{{Name: "lm", LM: &LMSpec{Endpoint: srv.URL, Refresh: 20 * time.Millisecond, Stale: 300 * time.Millisecond}}})
	ix := newIndex(t, natstest.Connect(t, s), "lm")
	occ := func() (float64, bool, bool) { return ix.Occupancy("lm") }
	eventually(t, "occupancy", func() bool { o, a, f := occ(); return f && a && o == 0.25 })
	body.Store(`{"occupancy": 7}`) // clamped, available by default
	eventually(t, "clamped", func() bool { o, a, f := occ(); return f && a && o == 1 })
	body.Store(`{"occupancy": 0.5, "cache_available": false}`)
	eventually(t, "unavailable", func() bool { o, a, f := occ(); return f && !a && o == 0.5 })
	body.Store(`{"occupancy": "x"}`)
	eventually(t, "stale after failures", func() bool { _, _, f := occ(); return !f })
	if r.counter(t, "rolter_kvwatcher_lmcache_refresh_failures_total", "reason", "body") == 0 {
		t.Error("failures not counted")
	}
	status.Store(503)
	body.Store(`{"occupancy": 0.1}`)
	time.Sleep(60 * time.Millisecond)
	if _, _, f := occ(); f {
		t.Error("a 503 refreshed the occupancy")
	}
}

func TestProvidersFollowConfig(t *testing.T) {
	s := natstest.Start(t)
	p1, p2 := newPub(t), newPub(t)
	src := newChanSource()
	r := startWatcher(t, natstest.Connect(t, s), src)
	ix := newIndex(t, natstest.Connect(t, s), "p")
	src.set(t, kvProvider("p", p1.Endpoint()))
	if err := p1.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	a, b := newChain("sim-model", 2, 16, 1), newChain("sim-model", 2, 16, 2)
	send(t, p1, frames(topic, 0, encodeBatch(t, a.stored(0, 2)))...)
	eventually(t, "p1's blocks", func() bool { return ix.PrefixMatch("p", a.ids()) == 2 })

	// A changed endpoint replaces the subscription: the old one ends.
	src.set(t, kvProvider("p", p2.Endpoint()))
	if err := p2.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the old subscription ends", func() bool { return p1.Subscribers() == 0 })
	eventually(t, "the old state is cleared", func() bool { return ix.PrefixMatch("p", a.ids()) == 0 })
	send(t, p2, frames(topic, 0, encodeBatch(t, b.stored(0, 2)))...)
	eventually(t, "p2's blocks", func() bool { return ix.Fresh("p") && ix.PrefixMatch("p", b.ids()) == 2 })

	// A removed provider stops and goes neutral.
	src.set(t)
	eventually(t, "the subscription ends", func() bool { return p2.Subscribers() == 0 })
	eventually(t, "neutral", func() bool { return !ix.Fresh("p") })
	if got := r.counter(t, "rolter_kvwatcher_providers"); got != 0 {
		t.Errorf("providers gauge = %v", got)
	}
}

func TestFromConfig(t *testing.T) {
	cfg, err := config.Parse([]byte(`
[[providers]]
name = "a"
kind = "openai_compatible"
api_base = "http://127.0.0.1:8001"
[providers.kv_events]
endpoint = "tcp://vllm-a:5557"
data_parallel_size = 4
data_parallel_hosts = ["vllm-a", "vllm-a2"]

[[providers]]
name = "b"
kind = "openai_compatible"
api_base = "http://127.0.0.1:8002"
[providers.kv_events]
endpoint = "tcp://*:5557"
topic = "kv@b@llama"
[providers.lmcache]
endpoint = "http://127.0.0.1:9000/occupancy"

[[providers]]
name = "plain"
kind = "openai_compatible"
api_base = "http://127.0.0.1:8003"

[[routes]]
model = "llama"
targets = [{ provider = "a", model = "sim-model" }, { provider = "b" }]

[[routes]]
model = "other"
targets = [{ provider = "a", model = "adapter-1" }]
`))
	if err != nil {
		t.Fatal(err)
	}
	got, warnings := FromConfig(cfg)
	want := []Provider{
		{Name: "a", KV: &KVSpec{Endpoint: "tcp://vllm-a:5557", Topic: config.DefaultKVTopic, Mode: ModeConnect, Model: "sim-model",
			MaxBlocks: config.DefaultKVMaxBlocks, Stale: config.DefaultKVStaleSecs * time.Second, DataParallelSize: 4,
			DataParallelHosts: []string{"vllm-a", "vllm-a2"}}},
		{Name: "b", KV: &KVSpec{Endpoint: "tcp://*:5557", Topic: "kv@b@llama", Mode: ModeBind, Model: "llama",
			MaxBlocks: config.DefaultKVMaxBlocks, Stale: config.DefaultKVStaleSecs * time.Second, DataParallelSize: 1},
			LM: &LMSpec{Endpoint: "http://127.0.0.1:9000/occupancy", Refresh: config.DefaultLMCacheRefresh * time.Second, Stale: config.DefaultLMCacheStaleSecs * time.Second}},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d providers, want %d", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("provider %d:\n got %+v %+v\nwant %+v %+v", i, got[i].KV, got[i].LM, want[i].KV, want[i].LM)
		}
	}
	if len(warnings) != 1 {
		t.Errorf("warnings = %q, want one about provider a's two models", warnings)
	}
}

func TestDefaultMode(t *testing.T) {
	tests := []struct {
		endpoint string
		want     Mode
	}{
		{"tcp://*:5557", ModeBind},
		{"tcp://0.0.0.0:5557", ModeBind},
		{"tcp://[::]:5557", ModeBind},
		{"tcp://vllm-a:5557", ModeConnect},
		{"tcp://10.0.0.3:5557", ModeConnect},
		{"ipc:///tmp/kv.sock", ModeConnect},
	}
	for _, tc := range tests {
		if got := DefaultMode(tc.endpoint); got != tc.want {
			t.Errorf("DefaultMode(%q) = %q, want %q", tc.endpoint, got, tc.want)
		}
	}
}

func TestFileSourceFollowsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rolter.toml")
	write := func(endpoint string) {
		t.Helper()
		data := `
[[providers]]
name = "a"
kind = "openai_compatible"
api_base = "http://127.0.0.1:8001"
[providers.kv_events]
endpoint = "` + endpoint + `"
`
		replace(t, path, data)
	}
	write("tcp://a:1")
	got := make(chan []Provider, 8)
	var failures atomic.Int32
	src := &FileSource{Path: path, Interval: 10 * time.Millisecond, OnResult: func(err error) {
		if err != nil {
			failures.Add(1)
		}
	}}
	ctx := t.Context()
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(l []Provider) { got <- l }) }()
	next := func() []Provider {
		t.Helper()
		select {
		case l := <-got:
			return l
		case <-time.After(5 * time.Second):
			t.Fatal("no update")
			return nil
		}
	}
	if l := next(); len(l) != 1 || l[0].KV.Endpoint != "tcp://a:1" {
		t.Fatalf("first list %+v", l)
	}
	time.Sleep(20 * time.Millisecond) // a distinct modification time
	replace(t, path, "[[providers]]\nname = 1\n")
	eventually(t, "the invalid file is reported", func() bool { return failures.Load() > 0 })
	write("tcp://b:2")
	if l := next(); len(l) != 1 || l[0].KV.Endpoint != "tcp://b:2" {
		t.Fatalf("reloaded list %+v", l)
	}
	// Run stops with the test's context; make sure it does.
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// replace writes the file whole, as editors and ConfigMaps do (write
// then rename), so the watcher never sees it half written.
func replace(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// A file rewritten in place is empty between its truncation and its write:
// the watcher refuses that state and keeps following the providers it has,
// instead of dropping them all until the next poll.
func TestFileSourceKeepsProvidersWhileTheFileIsRewritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rolter.toml")
	doc := func(endpoint string) string {
		return "[[providers]]\nname = \"a\"\nkind = \"openai_compatible\"\napi_base = \"http://127.0.0.1:8001\"\n" +
			"[providers.kv_events]\nendpoint = \"" + endpoint + "\"\n"
	}
	if err := os.WriteFile(path, []byte(doc("tcp://a:1")), 0o644); err != nil {
		t.Fatal(err)
	}
	got := make(chan []Provider, 8)
	results := make(chan error, 64)
	src := &FileSource{Path: path, Interval: 5 * time.Millisecond, OnResult: func(err error) { results <- err }}
	done := make(chan error, 1)
	go func() { done <- src.Run(t.Context(), func(l []Provider) { got <- l }) }()
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	if l := <-got; len(l) != 1 || l[0].KV.Endpoint != "tcp://a:1" {
		t.Fatalf("first list %+v", l)
	}
	if err := <-results; err != nil {
		t.Fatalf("first load: %v", err)
	}
	// The first half of an in-place rewrite: the file truncated.
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-results:
		if err == nil {
			t.Fatalf("the empty file was accepted; update: %+v", <-got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the truncated file was not noticed")
	}
	select {
	case l := <-got:
		t.Fatalf("the empty file replaced the providers with %+v", l)
	default:
	}
	// The second half: the new content.
	if err := os.WriteFile(path, []byte(doc("tcp://b:2")), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got:
		if len(l) != 1 || l[0].KV.Endpoint != "tcp://b:2" {
			t.Fatalf("rewritten list %+v", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the rewritten file was not loaded")
	}
}

// A publisher whose topic is not the configured one (vLLM's default topic is
// "") is counted and logged instead of being filtered out in silence, and
// its events are not indexed.
func TestTopicMismatchIsCounted(t *testing.T) {
	s := natstest.Start(t)
	pub := newPub(t)
	r := startWatcher(t, natstest.Connect(t, s), StaticSource{kvProvider("p", pub.Endpoint())})
	ix := newIndex(t, natstest.Connect(t, s), "p")
	if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	a := newChain("sim-model", 4, 16, 100)
	send(t, pub, frames("", 0, encodeBatch(t, a.stored(0, 2)))...)
	send(t, pub, frames("kv@pod-b@sim-model", 1, encodeBatch(t, a.stored(0, 2)))...)
	eventually(t, "mismatches counted", func() bool {
		return r.counter(t, "rolter_kvwatcher_skipped_total", "reason", "topic") == 2
	})
	if ix.PrefixMatch("p", a.ids()) != 0 {
		t.Fatal("events under another topic were indexed")
	}
	send(t, pub, frames(topic, 2, encodeBatch(t, a.stored(0, 2)))...)
	eventually(t, "the right topic indexed", func() bool { return ix.PrefixMatch("p", a.ids()) == 2 })
}

// FuzzParseLMCache: an occupancy answer comes from outside; whatever its
// body, parseLMCache refuses it with a reason or returns an occupancy in
// [0, 1].
func FuzzParseLMCache(f *testing.F) {
	for _, s := range []string{`{"occupancy":0.5}`, `{"occupancy":2,"cache_available":false}`, `{"occupancy":null}`, `{"occupancy":1e999}`, `[]`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		res, reason, err := parseLMCache(body)
		if (err == nil) != (reason == "") {
			t.Fatalf("err %v with reason %q", err, reason)
		}
		if err == nil && !(res.occupancy >= 0 && res.occupancy <= 1) {
			t.Fatalf("occupancy %v", res.occupancy)
		}
	})
}
