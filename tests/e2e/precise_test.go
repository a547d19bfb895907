package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
	"github.com/prometheus/client_golang/prometheus"

	"rolter.dev/dataplane/app"
	kvapp "rolter.dev/kvwatcher/app"
	"rolter.dev/pkg/natstest"
	"rolter.dev/tests/vllmsim"
)

// kvFleet is n vllmsim replicas publishing their KV events over ZMQ, a
// real kvwatcher turning them into NATS deltas, and a proxy following them
// with route "m" on strategy (upstream model "sim").
type kvFleet struct {
	base     string
	replicas []*replica
	watcher  *prometheus.Registry
	// cfg and natsURL start more proxies over the same replicas and NATS.
	cfg, natsURL string
}

// storedEvents is how many BlockStored events the watcher applied for
// provider.
func (f *kvFleet) storedEvents(t testing.TB, provider string) float64 {
	t.Helper()
	return f.watcherCounter(t, "rolter_kvwatcher_events_total", map[string]string{"provider": provider, "kind": "block_stored"})
}

// watcherCounter sums the watcher's counter name over the series whose
// labels include want.
func (f *kvFleet) watcherCounter(t testing.TB, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := f.watcher.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			match := true
			for k, v := range want {
				match = match && labels[k] == v
			}
			if match {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// Replicas scrape [providers.engine_load] when the strategy reads it
// (predicted_ttft: waiting requests, KV capacity); precise_cache_aware's
// load term would otherwise see a request that ended within the last
// scrape and, at load_weight 1, outvote the cache hit this test is about.
func startKVFleet(t testing.TB, n int, strategy, extra, routeExtra string, opts vllmsim.Options) *kvFleet {
	t.Helper()
	s := natstest.Start(t)
	f := &kvFleet{}
	var providers kvapp.StaticSource
	var pubs []*vllmsim.KVPublisher
	for i := range n {
		pub, err := vllmsim.NewKVPublisher(vllmsim.KVPublisherOptions{Endpoint: "tcp://127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		o := opts
		o.Models, o.Listener = []string{"sim"}, pub
		f.replicas = append(f.replicas, startReplica(t, o))
		pubs = append(pubs, pub)
		providers = append(providers, kvapp.Provider{Name: fmt.Sprintf("vllm-%d", i), KV: &kvapp.KVSpec{
			Endpoint: pub.Endpoint(), Mode: kvapp.ModeConnect, Model: "sim", MaxBlocks: 100_000, Stale: 30 * time.Second}})
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	f.watcher = prometheus.NewRegistry()
	w, err := kvapp.New(kvapp.Options{Source: providers, NATS: nc, Logger: discard(), Registerer: f.watcher,
		Heartbeat: 100 * time.Millisecond, ReplayTimeout: time.Second, ReplayIdle: time.Second,
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; nc.Close() })
	for _, pub := range pubs {
		waitFor(t, "the watcher subscribed", func() bool { return pub.Stats().Subscribers >= 1 })
	}
	var b strings.Builder
	b.WriteString(extra)
	var targets []string
	for i, r := range f.replicas {
		fmt.Fprintf(&b, "\n[[providers]]\nname = \"vllm-%d\"\nkind = \"openai_compatible\"\napi_base = %q\n[providers.kv_events]\nendpoint = %q\n",
			i, r.url()+"/v1", pubs[i].Endpoint())
		if strategy == "predicted_ttft" {
			b.WriteString("[providers.engine_load]\ninterval_ms = 100\n")
		}
		targets = append(targets, fmt.Sprintf("{ provider = \"vllm-%d\", model = \"sim\" }", i))
	}
	fmt.Fprintf(&b, "\n[[routes]]\nmodel = \"m\"\nstrategy = %q\ntargets = [%s]\n%s", strategy, strings.Join(targets, ", "), routeExtra)
	f.cfg, f.natsURL = b.String(), s.ClientURL()
	a, _ := startProxyWith(t, f.cfg, app.Options{NATSURL: f.natsURL, NoShare: true})
	f.base = a.URL()
	return f
}

// chat sends one chat completion through the proxy with the official SDK
// (no token-ids header) and returns the provider that served it.
func (f *kvFleet) chat(t testing.TB, system, user string) string {
	t.Helper()
	provider, err := chatVia(t.Context(), f.base, system, user)
	if err != nil {
		t.Fatal(err)
	}
	return provider
}

// chatReasoning is chat with a reasoning effort, which vLLM's templates
// read (vllmsim renders it first, before the system prompt).
func (f *kvFleet) chatReasoning(t testing.TB, system, user string) string {
	t.Helper()
	provider, err := chatWith(t.Context(), f.base, system, user, shared.ReasoningEffortLow)
	if err != nil {
		t.Fatal(err)
	}
	return provider
}

// chatVia is chat through the proxy at base, for any goroutine.
func chatVia(ctx context.Context, base, system, user string) (string, error) {
	return chatWith(ctx, base, system, user, "")
}

// chatWith is chatVia with a reasoning effort, none when empty.
func chatWith(ctx context.Context, base, system, user string, effort shared.ReasoningEffort) (string, error) {
	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	var raw *http.Response
	_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:               "m",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(user)},
		MaxCompletionTokens: openai.Int(2),
		ReasoningEffort:     effort,
	}, option.WithResponseInto(&raw))
	if err != nil {
		return "", err
	}
	return raw.Header.Get("X-Rolter-Provider"), nil
}

// respond sends one Responses API request through the proxy with the
// official SDK (no token-ids header), system as its instructions and user
// as its input, and returns the provider that served it.
func (f *kvFleet) respond(t testing.TB, system, user string) string {
	t.Helper()
	client := openai.NewClient(option.WithBaseURL(f.base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	var raw *http.Response
	_, err := client.Responses.New(t.Context(), responses.ResponseNewParams{
		Model:           "m",
		Instructions:    openai.String(system),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(user)},
		MaxOutputTokens: openai.Int(2),
	}, option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	return raw.Header.Get("X-Rolter-Provider")
}

// message sends one Anthropic Messages request through the proxy with the
// official Anthropic SDK (no token-ids header), system as its system prompt
// (one text block, as Claude Code sends it, after a billing header block
// that vLLM leaves out) and user as its message, and returns the provider
// that served it.
func (f *kvFleet) message(t testing.TB, system, user string) string {
	t.Helper()
	client := anthropic.NewClient(aoption.WithBaseURL(f.base), aoption.WithAPIKey("unused"), aoption.WithMaxRetries(0))
	var raw *http.Response
	_, err := client.Messages.New(t.Context(), anthropic.MessageNewParams{
		Model:     "m",
		MaxTokens: 2,
		System:    []anthropic.TextBlockParam{{Text: "x-anthropic-billing-header: cch=" + user + ";"}, {Text: system}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(user))},
	}, aoption.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	return raw.Header.Get("X-Rolter-Provider")
}

// longSystem is a system prompt of about words words, different per seed.
func longSystem(seed string, words int) string {
	var b strings.Builder
	for i := range words {
		fmt.Fprintf(&b, "%s%d ", seed, i)
	}
	return b.String()
}

// TestPreciseRoutingForSDKClients: an OpenAI SDK chat or Responses request,
// or an Anthropic SDK Messages request, with no token-ids header goes to the replica that holds its prefix, on
// the replica's own KV events: the proxy got the token ids from the
// replica's /tokenize, and the precise decisions are counted as scored,
// not neutral.
func TestPreciseRoutingForSDKClients(t *testing.T) {
	for _, tc := range []struct{ strategy, api, scored, neutral string }{
		{"precise_cache_aware", "chat", "scored", "neutral"},
		{"predicted_ttft", "chat", "precise", "approximate"},
		{"precise_cache_aware", "responses", "scored", "neutral"},
		{"predicted_ttft", "messages", "precise", "approximate"},
		{"predicted_ttft", "chat with a reasoning effort", "precise", "approximate"},
	} {
		t.Run(tc.strategy+"/"+tc.api, func(t *testing.T) {
			// Prefill costs time (50 µs a token), as on a GPU: predicted_ttft
			// learns it from the first tokens it sees.
			// No speculation: a pick made before the events arrive would
			// leave a guessed copy of the prefix on another replica for its
			// TTL; here the engines' events alone decide.
			f := startKVFleet(t, 3, tc.strategy, openKVConfig, "[routes.balancer]\nspeculative_ttl_ms = 0\n", vllmsim.Options{PrefillTokensPerSecond: 20_000})
			decisions := func(outcome string) float64 {
				return metric(t, f.base, fmt.Sprintf(`rolter_routing_decisions_total{model="m",outcome=%q,strategy=%q,variant=""}`, outcome, tc.strategy))
			}
			send := map[string]func(testing.TB, string, string) string{"chat": f.chat, "responses": f.respond, "messages": f.message,
				"chat with a reasoning effort": f.chatReasoning}[tc.api]
			for g := range 3 {
				system := longSystem(fmt.Sprintf("g%d-", g), 400)
				// The group's first request computes its prefix wherever it
				// goes; that replica then holds it and publishes the blocks.
				want := send(t, system, "first question")
				// Until the deltas arrive a pick is a guess: wait until the
				// watcher has the blocks and then for the proxy to route a
				// run of 10 to the holder (a lucky run is 3^-10).
				waitFor(t, "the watcher has the blocks", func() bool { return f.storedEvents(t, want) > 0 })
				waitFor(t, "the proxy routes the prefix to "+want, func() bool {
					for range 10 {
						if send(t, system, "are the events in?") != want {
							return false
						}
					}
					return true
				})
				before := decisions(tc.scored)
				for q := range 5 {
					if got := send(t, system, fmt.Sprintf("question %d", q)); got != want {
						t.Fatalf("a %s request with %s's prefix went to %s", tc.api, want, got)
					}
				}
				if got := decisions(tc.scored) - before; got < 5 {
					t.Fatalf("%v of 5 picks %s", got, tc.scored)
				}
			}
			if n := metric(t, f.base, `rolter_tokenize_total{model="m",outcome="engine"}`); n < 1 {
				t.Fatalf("the replicas' /tokenize answered %v times", n)
			}
			// Every answer reported its prompt, as long as the ids.
			path := map[string]string{"responses": "/v1/responses", "messages": "/v1/messages"}[tc.api]
			if path == "" {
				path = "/v1/chat/completions"
			}
			checked := func(result string) float64 {
				return metric(t, f.base, fmt.Sprintf(`rolter_tokenize_checked_total{endpoint=%q,model="m",result=%q}`, path, result))
			}
			match, mismatch := checked("match"), checked("mismatch")
			if match < 1 || mismatch > 0 {
				t.Fatalf("ids checked against the prompt: %v match, %v mismatch", match, mismatch)
			}
			if tc.strategy == "precise_cache_aware" {
				if n := decisions(tc.neutral); n > 0 && decisions(tc.scored) < 5*n {
					t.Logf("%v neutral picks (before the events arrived)", n)
				}
			}
		})
	}
}

// TestProxiesShareSpeculatedBlocks: a predicted_ttft proxy that shares
// passes the KV blocks its pick speculated to its peer with its next queue
// report, so that the peer counts the prefix at that replica before the
// engine's events show it. Proxy A routes one chat request (the official
// SDK, no token-ids header); proxy B, which routed nothing, folds the
// request's blocks.
func TestProxiesShareSpeculatedBlocks(t *testing.T) {
	f := startKVFleet(t, 2, "predicted_ttft", openKVConfig, "", vllmsim.Options{PrefillTokensPerSecond: 20_000})
	share := app.Options{NATSURL: f.natsURL, ShareGroup: "speculation"}
	a, _ := startProxyWith(t, f.cfg, share)
	b, _ := startProxyWith(t, f.cfg, share)
	for _, u := range []string{a.URL(), b.URL()} {
		waitFor(t, "proxy sees its peer", func() bool { return metric(t, u, "rolter_fleet_peers") == 1 })
	}
	// A proxy speculates at a replica only once it knows the replica's block
	// size, which the watcher learns from the engine's first events: warm
	// both replicas up through the proxy that does not share.
	warm := 0
	waitFor(t, "both replicas have published blocks", func() bool {
		warm++
		f.chat(t, longSystem(fmt.Sprintf("warm%d-", warm), 50), "hello")
		return f.storedEvents(t, "vllm-0") > 0 && f.storedEvents(t, "vllm-1") > 0
	})
	waitFor(t, "the proxies know both block sizes", func() bool {
		return metric(t, b.URL(), `rolter_kvindex_entries{kind="resident",provider="vllm-0"}`) > 0 &&
			metric(t, b.URL(), `rolter_kvindex_entries{kind="resident",provider="vllm-1"}`) > 0 &&
			metric(t, a.URL(), `rolter_kvindex_entries{kind="resident",provider="vllm-0"}`) > 0 &&
			metric(t, a.URL(), `rolter_kvindex_entries{kind="resident",provider="vllm-1"}`) > 0
	})
	received := func() float64 { return metric(t, b.URL(), `rolter_fleet_received_total{unit="kv_blocks"}`) }
	if n := received(); n != 0 {
		t.Fatalf("B folded %v speculated blocks before A routed anything", n)
	}
	viaA := *f
	viaA.base = a.URL()
	viaA.chat(t, longSystem("shared-", 400), "first question")
	// 400 words of system prompt are hundreds of tokens: tens of blocks of 16.
	waitFor(t, "B folds A's speculated blocks", func() bool { return received() >= 10 })
}

// TestBurstTakesTurnsThroughProxies: two predicted_ttft proxies that share
// each receive, in the same instant and each just after another request,
// a chat request with the same new system prompt (the official SDK, no
// token-ids header). Picked blind, each would send it to a replica of its
// own; the proxy second in the prompt's order waits its turn, hears the
// first one's pick meanwhile, and sends its request to the same replica.
func TestBurstTakesTurnsThroughProxies(t *testing.T) {
	f := startKVFleet(t, 4, "predicted_ttft", openKVConfig, "", vllmsim.Options{PrefillTokensPerSecond: 20_000})
	// A long queue interval makes a burst long (two intervals: each
	// proxy's second request arrives within it however slow the machine)
	// and a turn too (a trip and a fifth of the interval: the first pick's
	// report, which leaves at once, reaches the other proxy within it).
	share := app.Options{NATSURL: f.natsURL, ShareGroup: "turns", ShareQueueInterval: time.Second}
	a, _ := startProxyWith(t, f.cfg, share)
	b, _ := startProxyWith(t, f.cfg, share)
	proxies := []string{a.URL(), b.URL()}
	for _, u := range proxies {
		waitFor(t, "proxy sees its peer", func() bool { return metric(t, u, "rolter_fleet_peers") == 1 })
	}
	// Speculation needs the replicas' block sizes (see
	// TestProxiesShareSpeculatedBlocks): warm every replica up through the
	// proxy that does not share.
	warm := 0
	waitFor(t, "every replica has published blocks", func() bool {
		warm++
		f.chat(t, longSystem(fmt.Sprintf("warm%d-", warm), 50), "hello")
		for i := range f.replicas {
			if f.storedEvents(t, fmt.Sprintf("vllm-%d", i)) == 0 {
				return false
			}
		}
		return true
	})
	for _, u := range proxies {
		waitFor(t, "the proxy knows every block size", func() bool {
			for i := range f.replicas {
				if metric(t, u, fmt.Sprintf(`rolter_kvindex_entries{kind="resident",provider="vllm-%d"}`, i)) <= 0 {
					return false
				}
			}
			return true
		})
	}
	system := longSystem("burst-", 400)
	// The proxies draw their order for each time slot of the wall clock
	// (two queue intervals per proxy: 4 s, from the Unix epoch): start a
	// tenth into a slot, so that both requests, a fraction of a second
	// later, fall in the same one.
	slot := int64(2 * 2 * share.ShareQueueInterval)
	time.Sleep(time.Until(time.Unix(0, (time.Now().UnixNano()/slot+1)*slot+slot/10)))
	served := make([]string, len(proxies))
	errs := make([]error, len(proxies))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k, u := range proxies {
		wg.Go(func() {
			<-start
			if _, errs[k] = chatVia(t.Context(), u, longSystem(fmt.Sprintf("before%d-", k), 20), "hi"); errs[k] == nil {
				served[k], errs[k] = chatVia(t.Context(), u, system, fmt.Sprintf("question %d", k))
			}
		})
	}
	close(start)
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("proxy %d: %v", k, err)
		}
	}
	waits := 0.0
	for _, u := range proxies {
		waits += max(metric(t, u, `rolter_routing_turn_wait_seconds_count{model="m"}`), 0)
	}
	if served[0] != served[1] || waits != 1 {
		t.Fatalf("the system prompt went to %s through one proxy and %s through the other, after %v turn waits (want one replica, one wait)", served[0], served[1], waits)
	}
}

// TestResponsesTokenizeMatchesPrompt: for each Responses form the proxy
// tokenizes, the ids the replica's /tokenize answers for the proxy's body
// are exactly the Responses request's prompt (as many as its input tokens,
// every one resident in the replica's cache), and the forms it cannot
// reproduce are never sent to /tokenize.
func TestResponsesTokenizeMatchesPrompt(t *testing.T) {
	checkTokenizedForms(t, "precise_cache_aware", "/v1/responses", `{"model":"m","max_output_tokens":1,`, []string{
		`"instructions":"alpha be brief","input":"alpha hello"`,
		`"instructions":"","input":"beta hello"`,
		`"input":[{"role":"developer","content":"gamma rules"},{"type":"message","role":"user","content":[{"type":"input_text","text":"gamma one"},{"type":"input_text","text":"gamma two"}]},` +
			`{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"gamma answer","annotations":[]}]},{"role":"user","content":"gamma again"}]`,
		`"instructions":"delta sys","input":[{"role":"system","content":[{"type":"input_text","text":"delta more"}]},{"role":"assistant","content":"delta said"},{"role":"user","content":"delta ask"}]`,
		`"input":"epsilon hello","reasoning":{"effort":"low"}`,
		`"instructions":"zeta agent","input":"zeta go","tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"n":{"type":"number","minimum":1.5}}}},` +
			`{"type":"function","name":"g","description":"zeta lookup","strict":true,"parameters":{"type":"object"}}]`,
	}, []string{
		`"input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"x"}]`,
		`"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"http://x"}]}]`,
		`"input":"hi","tools":[{"type":"web_search"}]`,
		`"input":"hi","tool_choice":"none","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]`,
	})
}

// TestMessagesTokenizeMatchesPrompt: the same for Anthropic Messages
// requests, whose prompt is their input and cached tokens.
func TestMessagesTokenizeMatchesPrompt(t *testing.T) {
	checkTokenizedForms(t, "predicted_ttft", "/v1/messages", `{"model":"m","max_tokens":1,`, []string{
		`"system":"alpha be brief","messages":[{"role":"user","content":"alpha hello"}]`,
		`"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"beta sys"},{"type":"text","text":"tem"}],` +
			`"messages":[{"role":"system","content":"atic"},{"role":"user","content":[{"type":"text","text":"beta a"},{"type":"text","text":"beta b"}]}]`,
		`"messages":[{"role":"user","content":"gamma weather?"},{"role":"assistant","content":[{"type":"thinking","thinking":"gamma hmm","signature":"s"},{"type":"text","text":"gamma calling"},` +
			`{"type":"tool_use","id":"toolu_1","name":"get","input":{"city":"Paris","days":[1,2]}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"gamma 18"},{"type":"text","text":"C"}]},{"type":"text","text":"gamma thanks"}]}],` +
			`"tools":[{"name":"get","description":"gamma weather","input_schema":{"properties":{"city":{"type":"string"}}}}]`,
		`"messages":[{"role":"user","content":"delta hi"},{"role":"assistant","content":[{"type":"tool_result","content":"delta x"},{"type":"text","text":""}]},{"role":"user","content":[]},{"role":"user","content":"delta again"}]`,
		`"messages":[{"role":"user","content":"epsilon hi"}],"output_config":{"effort":"low"},"chat_template_kwargs":{"x":1}`,
	}, []string{
		`"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://x"}},{"type":"text","text":"what?"}]}]`,
		`"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"x":1.5}}]},{"role":"user","content":"go"}]`,
	})
}

// TestChatTokenizeMatchesPrompt: the same for chat completions whose
// reasoning effort or documents reach the template beside the client's
// chat_template_kwargs.
func TestChatTokenizeMatchesPrompt(t *testing.T) {
	checkTokenizedForms(t, "predicted_ttft", "/v1/chat/completions", `{"model":"m","max_tokens":1,`, []string{
		`"messages":[{"role":"user","content":"alpha hello"}]`,
		`"messages":[{"role":"user","content":"beta hello"}],"reasoning_effort":"low"`,
		`"messages":[{"role":"user","content":"gamma hello"}],"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true,"reasoning_effort":"high"}`,
		`"messages":[{"role":"user","content":"delta hello"}],"documents":[{"title":"t","text":"delta doc"}],"chat_template_kwargs":{"x":[1]}`,
	}, []string{
		`"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x"}}]}]`,
	})
}

// TestSaltedTenantsKeepTheirPrefixes: vLLM (and vllmsim) hash a request's
// cache_salt into its prompt's first block and publish it as that block's
// extra keys. Two tenants sending one long system prompt through the
// official OpenAI SDK under two salts: the kvwatcher indexes none of their
// blocks (skipped for their extra keys), the proxy asks no /tokenize for
// them, and each tenant's requests keep to a replica of its own, where its
// repeats read its cached prefix.
func TestSaltedTenantsKeepTheirPrefixes(t *testing.T) {
	f := startKVFleet(t, 3, "predicted_ttft", openKVConfig, "", vllmsim.Options{PrefillTokensPerSecond: 20_000})
	client := openai.NewClient(option.WithBaseURL(f.base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	system := longSystem("tenant-", 400)
	served := map[string]map[string]int{}
	cachedRepeats := 0
	for i := range 6 {
		salt := []string{"tenant-a", "tenant-b"}[i%2]
		var raw *http.Response
		resp, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model:               "m",
			Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(fmt.Sprintf("question %d", i))},
			MaxCompletionTokens: openai.Int(2),
		}, option.WithJSONSet("cache_salt", salt), option.WithResponseInto(&raw))
		if err != nil {
			t.Fatal(err)
		}
		if served[salt] == nil {
			served[salt] = map[string]int{}
		}
		served[salt][raw.Header.Get("X-Rolter-Provider")]++
		if i >= 2 && resp.Usage.PromptTokensDetails.CachedTokens > 0 {
			cachedRepeats++
		}
	}
	a, b := served["tenant-a"], served["tenant-b"]
	if len(a) != 1 || len(b) != 1 || fmt.Sprint(a) == fmt.Sprint(b) || cachedRepeats != 4 {
		t.Fatalf("tenants served %v and %v, %d of 4 repeats read a cached prefix", a, b, cachedRepeats)
	}
	if n := metric(t, f.base, `rolter_tokenize_total{model="m",outcome="unsupported"}`); n != 6 {
		t.Fatalf("%v salted requests counted unsupported, want 6", n)
	}
	if f.watcherCounter(t, "rolter_kvwatcher_skipped_total", map[string]string{"reason": "extra_keys"}) == 0 {
		t.Fatal("the watcher indexed the salted blocks")
	}
}

// TestPromptLogprobsSpreadThroughProxy: requests with prompt log
// probabilities (how evaluation harnesses score prompts), which vLLM and
// vllmsim prefill whole whatever their cache holds, are not held to the
// replica of their shared few-shot prefix: one after another they spread
// over the replicas, reading nothing cached; the same prompts reading the
// cache keep to the replica that holds it.
func TestPromptLogprobsSpreadThroughProxy(t *testing.T) {
	f := startKVFleet(t, 3, "predicted_ttft", openKVConfig, "", vllmsim.Options{PrefillTokensPerSecond: 20_000})
	client := openai.NewClient(option.WithBaseURL(f.base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ask := func(system string, i int, opts ...option.RequestOption) (provider string, cached int64) {
		var raw *http.Response
		resp, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model:               "m",
			Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(fmt.Sprintf("question %d", i))},
			MaxCompletionTokens: openai.Int(2),
		}, append(opts, option.WithResponseInto(&raw))...)
		if err != nil {
			t.Fatal(err)
		}
		return raw.Header.Get("X-Rolter-Provider"), resp.Usage.PromptTokensDetails.CachedTokens
	}
	scored, cached := map[string]int{}, int64(0)
	scoring := longSystem("few-shot-", 400)
	for i := range 6 {
		p, c := ask(scoring, i, option.WithJSONSet("prompt_logprobs", 1))
		scored[p]++
		cached += c
	}
	if len(scored) < 2 || cached != 0 {
		t.Fatalf("requests with prompt log probabilities served %v, %d tokens read from a cache", scored, cached)
	}
	chatted := map[string]int{}
	chatting := longSystem("assistant-", 400)
	for i := range 6 {
		p, _ := ask(chatting, i)
		chatted[p]++
	}
	if len(chatted) != 1 {
		t.Fatalf("the same prompts reading the cache served %v, want one replica", chatted)
	}
	if n := metric(t, f.base, `rolter_tokenize_total{model="m",outcome="reads_no_cache"}`); n != 6 {
		t.Fatalf("%v requests counted reads_no_cache, want 6", n)
	}
}

// TestCompletionsTokenizeMatchesPrompt: the same for completions, whose
// prompt may come as a batch of one (LangChain's completions client).
func TestCompletionsTokenizeMatchesPrompt(t *testing.T) {
	checkTokenizedForms(t, "predicted_ttft", "/v1/completions", `{"model":"m","max_tokens":1,`, []string{
		`"prompt":"alpha once upon a time"`,
		`"prompt":["beta once upon a time"]`,
	}, []string{
		`"prompt":["gamma a","gamma b"]`,
	})
}

// checkTokenizedForms sends each form (body fields after prefix) to path
// on a one-replica fleet of strategy with one-token blocks: for the
// tokenized forms, the ids the replica's /tokenize answered for the
// proxy's body must be exactly the prompt the replica computed (as many as
// the usage's input and cached tokens, every one resident in its cache);
// the unsupported forms must never reach /tokenize and be counted.
func checkTokenizedForms(t *testing.T, strategy, path, prefix string, tokenized, unsupported []string) {
	t.Helper()
	f := startKVFleet(t, 1, strategy, openKVConfig, "", vllmsim.Options{BlockSize: 1})
	r := f.replicas[0]
	var mu sync.Mutex
	var answered [][]uint32
	r.setTokenize(func(w http.ResponseWriter, req *http.Request) {
		rec := httptest.NewRecorder()
		r.sim.ServeHTTP(rec, req)
		var ans struct{ Tokens []uint32 }
		_ = json.Unmarshal(rec.Body.Bytes(), &ans)
		mu.Lock()
		answered = append(answered, ans.Tokens)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
	send := func(form string) int {
		t.Helper()
		resp, err := http.Post(f.base+path, "application/json", strings.NewReader(prefix+form+"}"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Usage struct {
				PromptTokens         int `json:"prompt_tokens"`           // OpenAI chat and completions
				InputTokens          int `json:"input_tokens"`            // Responses, Anthropic
				CacheReadInputTokens int `json:"cache_read_input_tokens"` // Anthropic's, beside input_tokens
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, %v", resp.StatusCode, err)
		}
		return out.Usage.PromptTokens + out.Usage.InputTokens + out.Usage.CacheReadInputTokens
	}
	for i, form := range tokenized {
		promptTokens := send(form)
		mu.Lock()
		if len(answered) != i+1 {
			mu.Unlock()
			t.Fatalf("form %d: /tokenize asked %d times in all, want %d", i, len(answered), i+1)
		}
		ids := answered[i]
		mu.Unlock()
		resident := 0
		for _, h := range vllmsim.BlockHashes(ids, 1) {
			if r.sim.Cache().Has(h) {
				resident++
			}
		}
		if len(ids) == 0 || promptTokens != len(ids) || resident != len(ids) {
			t.Errorf("form %d: /tokenize %d ids, the prompt %d tokens, %d of the ids resident", i, len(ids), promptTokens, resident)
		}
	}
	for _, form := range unsupported {
		send(form)
	}
	if n := metric(t, f.base, `rolter_tokenize_total{model="m",outcome="unsupported"}`); n != float64(len(unsupported)) {
		t.Errorf("unsupported counted %v times, want %d", n, len(unsupported))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(answered) != len(tokenized) {
		t.Errorf("/tokenize asked %d times, want %d (the unsupported forms never)", len(answered), len(tokenized))
	}
}

// TestTokenizeFailureDegrades: a replica whose /tokenize fails or is slower
// than tokenize_timeout_ms costs the request nothing but precision: it is
// served, routed on the approximate state, and the failure counted.
func TestTokenizeFailureDegrades(t *testing.T) {
	f := startKVFleet(t, 2, "predicted_ttft", openKVConfig, "", vllmsim.Options{})
	for _, r := range f.replicas {
		r.setTokenize(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"object":"error","message":"tokenizer crashed"}`, http.StatusInternalServerError)
		})
	}
	if got := f.chat(t, longSystem("x", 50), "hi"); got == "" {
		t.Fatal("no provider served the request")
	}
	if n := metric(t, f.base, `rolter_tokenize_total{model="m",outcome="error"}`); n != 1 {
		t.Fatalf("error outcome counted %v times, want 1", n)
	}
	release := make(chan struct{})
	defer close(release)
	for _, r := range f.replicas {
		r.setTokenize(func(http.ResponseWriter, *http.Request) { <-release })
	}
	if got := f.chat(t, longSystem("y", 50), "hi"); got == "" {
		t.Fatal("no provider served the request")
	}
	if n := metric(t, f.base, `rolter_tokenize_total{model="m",outcome="timeout"}`); n != 1 {
		t.Fatalf("timeout outcome counted %v times, want 1", n)
	}
	if n := metric(t, f.base, `rolter_routing_decisions_total{model="m",outcome="precise",strategy="predicted_ttft",variant=""}`); n > 0 {
		t.Fatalf("%v precise picks without token ids", n)
	}
}

// TestPrefillTokensByStrategy measures, through a real proxy with the OpenAI
// SDK as the client (no token-ids header), the prefill tokens the replicas
// compute (vllm:prompt_tokens_total − vllm:prefix_cache_hits_total from
// their /metrics) for the same shared-prefix traffic under each strategy,
// at 4, 8 and 16 concurrent clients (one client alone lets least_load put
// everything on the first replica). It is a measurement, run on demand
// (docs/routing.md has the command and the figures):
// ROLTER_MEASURE_PREFILL=1. It fails if predicted_ttft computes as much as
// least_load at any concurrency, or more than cache_aware over the three.
// The SDK's requests do not stream, so the proxy's first byte is the whole
// answer; ROLTER_MEASURE_MAX_TOKENS (default 2) and ROLTER_MEASURE_ITL
// (vllmsim's time per output token, default its own) make answers long
// enough that what predicted_ttft learns as time to first token is mostly
// decoding.
func TestPrefillTokensByStrategy(t *testing.T) {
	if os.Getenv("ROLTER_MEASURE_PREFILL") == "" {
		t.Skip("a measurement: set ROLTER_MEASURE_PREFILL=1")
	}
	const replicas, groups, perGroup = 4, 12, 8
	// Prefill at 20,000 tokens/s: a group's ~1,000-token prefix costs 50 ms
	// uncached.
	opts := vllmsim.Options{CapacityBlocks: 512, PrefillTokensPerSecond: 20_000, TTFT: time.Millisecond}
	maxTokens := int64(2)
	if v := os.Getenv("ROLTER_MEASURE_MAX_TOKENS"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			t.Fatalf("ROLTER_MEASURE_MAX_TOKENS=%q: want a positive integer", v)
		}
		maxTokens = n
	}
	if v := os.Getenv("ROLTER_MEASURE_ITL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			t.Fatalf("ROLTER_MEASURE_ITL=%q: want a duration", v)
		}
		opts.ITL = d
	}
	sums := map[string]float64{}
	for _, clients := range []int{4, 8, 16} {
		computed := map[string]float64{}
		for _, strategy := range []string{"least_load", "cache_aware", "precise_cache_aware", "predicted_ttft"} {
			f := startKVFleet(t, replicas, strategy, openKVConfig, "", opts)
			// Each group shares a long system prompt; its requests arrive
			// interleaved with the other groups'.
			var jobs []func()
			for q := range perGroup {
				for g := range groups {
					system := longSystem(fmt.Sprintf("group%d-", g), 300)
					jobs = append(jobs, func() { f.chatFor(t.Context(), t, system, fmt.Sprintf("question %d of group %d", q, g), maxTokens) })
				}
			}
			next := make(chan func())
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					for j := range next {
						j()
					}
				})
			}
			for _, j := range jobs {
				next <- j
			}
			close(next)
			wg.Wait()
			total := 0.0
			for _, r := range f.replicas {
				total += metric(t, r.url(), "vllm:prompt_tokens_total{engine=\"0\",model_name=\"sim\"}") -
					metric(t, r.url(), "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"sim\"}")
			}
			computed[strategy] = total
			sums[strategy] += total
			t.Logf("clients %d  %-20s prefill tokens computed %8.0f", clients, strategy, total)
		}
		if computed["predicted_ttft"] >= computed["least_load"] {
			t.Errorf("clients %d: predicted_ttft computed %v prefill tokens, least_load %v", clients, computed["predicted_ttft"], computed["least_load"])
		}
	}
	// Over the three concurrencies (one run each is noisy: two requests of
	// a new group picked at the same moment may both prefill it).
	if sums["predicted_ttft"] > sums["cache_aware"] {
		t.Errorf("predicted_ttft computed %v prefill tokens in all, cache_aware %v", sums["predicted_ttft"], sums["cache_aware"])
	}
}

// BenchmarkTokenizeThroughProxy measures what the proxy's /tokenize call
// adds to a request's latency: the same chat (a ~4,000-token system prompt,
// a different question each time) to a precise_cache_aware route over two
// vllmsim replicas, sent with the token-ids header (no call), without it
// (the replica's /tokenize answers each), and without it for a body seen
// before (the proxy's cache answers). It reports each variant's latency
// p50 and p99 in µs.
func BenchmarkTokenizeThroughProxy(b *testing.B) {
	f := startKVFleet(b, 2, "precise_cache_aware", openKVConfig, "", vllmsim.Options{})
	system := longSystem("bench", 2000)
	client := &http.Client{}
	send := func(b *testing.B, q int, header, messages bool) time.Duration {
		path := "/v1/chat/completions"
		body := fmt.Sprintf(`{"model":"m","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, system, q)
		if messages { // the Anthropic SDK's form, converted as vLLM converts it
			path = "/v1/messages"
			body = fmt.Sprintf(`{"model":"m","max_tokens":1,"system":[{"type":"text","text":%q}],"messages":[{"role":"user","content":[{"type":"text","text":"question %d"}]}]}`, system, q)
		}
		req, _ := http.NewRequest(http.MethodPost, f.base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if header {
			ids := vllmsim.Tokenize(vllmsim.ChatPrompt([]vllmsim.Message{{Role: "system", Content: system}, {Role: "user", Content: fmt.Sprintf("question %d", q)}}))
			s := make([]string, len(ids))
			for i, id := range ids {
				s[i] = strconv.FormatUint(uint64(id), 10)
			}
			req.Header.Set("X-Rolter-Vllm-Token-Ids", strings.Join(s, ","))
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return d
	}
	q := 0
	for _, tc := range []struct {
		name                     string
		header, repeat, messages bool
	}{{"header", true, false, false}, {"tokenize", false, false, false}, {"tokenize_cached", false, true, false}, {"messages_tokenize", false, false, true}} {
		b.Run(tc.name, func(b *testing.B) {
			send(b, -1, tc.header, tc.messages) // connections warm; -1 is the repeated body
			var lat []time.Duration
			for b.Loop() {
				n := q
				if tc.repeat {
					n = -1
				} else {
					q++
				}
				lat = append(lat, send(b, n, tc.header, tc.messages))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// openKVConfig is the fleets' global config: no accounting, no keys.
const openKVConfig = "[server]\nrequire_auth = false\n[accounting]\nsink = \"none\"\n"
