package delivery_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"rolter.dev/pkg/delivery"
)

// pluginServer is a webhook plugin that records what it receives and
// answers with reply.
type pluginServer struct {
	*httptest.Server
	mu    sync.Mutex
	envs  []delivery.Envelope
	auths []string
}

func newPluginServer(t *testing.T, reply func(w http.ResponseWriter, r *http.Request, env delivery.Envelope)) *pluginServer {
	t.Helper()
	ps := &pluginServer{}
	ps.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var env delivery.Envelope
		if err := json.NewDecoder(r.Body).Decode(&env); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ps.mu.Lock()
		ps.envs = append(ps.envs, env)
		ps.auths = append(ps.auths, r.Header.Get("Authorization"))
		ps.mu.Unlock()
		reply(w, r, env)
	}))
	t.Cleanup(ps.Close)
	return ps
}

// answer returns a reply function that always writes body with status.
func answer(status int, body string) func(http.ResponseWriter, *http.Request, delivery.Envelope) {
	return func(w http.ResponseWriter, _ *http.Request, _ delivery.Envelope) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

func (ps *pluginServer) calls() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.envs)
}

func (ps *pluginServer) last() delivery.Envelope {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.envs[len(ps.envs)-1]
}

func postPlugin(name, url, mode string) delivery.PluginConfig {
	return delivery.PluginConfig{Name: name, URL: url, Stage: delivery.PluginStagePostResponse, FailureMode: mode}
}

// deadURL returns the URL of a server that is no longer listening.
func deadURL(t *testing.T) string {
	t.Helper()
	s := httptest.NewServer(http.NotFoundHandler())
	u := s.URL
	s.Close()
	return u
}

const chatBody = `{"id":"c1","choices":[{"index":0,"message":{"role":"assistant","content":"hello <world>"}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`

func TestPluginActions(t *testing.T) {
	tests := []struct {
		name       string
		reply      string
		wantBody   string // "" means unchanged
		wantHeader [2]string
		wantRefuse delivery.Refuse
	}{
		{name: "allow", reply: `{"action":"allow"}`},
		{name: "allow: unknown members are ignored", reply: `{"action":"allow","version":2}`},
		{
			name:     "transform",
			reply:    `{"action":"transform","body":{"id":"c1","choices":[{"message":{"content":"rewritten"}}]}}`,
			wantBody: `{"id":"c1","choices":[{"message":{"content":"rewritten"}}]}`,
		},
		{
			name:       "annotate",
			reply:      `{"action":"annotate","headers":{"X-Policy-Score":"0.3"}}`,
			wantHeader: [2]string{"X-Policy-Score", "0.3"},
		},
		{
			name:  "block with a reason",
			reply: `{"action":"block","reason":"off-topic answer"}`,
			wantRefuse: delivery.Refuse{Status: http.StatusForbidden, Code: delivery.CodePluginBlocked,
				Message: "off-topic answer", Reason: "plugin_blocked: judge"},
		},
		{
			name:  "block without a reason",
			reply: `{"action":"block"}`,
			wantRefuse: delivery.Refuse{Status: http.StatusForbidden, Code: delivery.CodePluginBlocked,
				Message: "response withheld by plugin 'judge'", Reason: "plugin_blocked: judge"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ps := newPluginServer(t, answer(200, tc.reply))
			cfg := baseConfig()
			cfg.Plugins = []delivery.PluginConfig{postPlugin("judge", ps.URL, delivery.FailClosed)}
			p := newPolicy(t, cfg)
			body := []byte(chatBody)
			d := p.Apply(t.Context(), req, 200, "application/json; charset=utf-8", body)
			if string(body) != chatBody {
				t.Fatal("Apply modified its input")
			}
			env := ps.last()
			if env.Plugin != "judge" || env.Stage != "post_response" || env.Model != req.Model || env.Route != req.Route ||
				env.RequestID != req.RequestID || env.Status != 200 || env.ContentType != "application/json; charset=utf-8" {
				t.Errorf("envelope = %+v", env)
			}
			if string(env.Body) != chatBody {
				t.Errorf("envelope body = %s (HTML must not be escaped)", env.Body)
			}
			if tc.wantRefuse.Code != "" {
				r := mustRefuse(t, d, tc.wantRefuse.Status, tc.wantRefuse.Code)
				if r != tc.wantRefuse {
					t.Errorf("refuse = %+v, want %+v", r, tc.wantRefuse)
				}
				if p.Stats().PluginBlocks.Load() != 1 || p.Stats().Withheld.Load() != 1 {
					t.Errorf("stats: blocks %d withheld %d", p.Stats().PluginBlocks.Load(), p.Stats().Withheld.Load())
				}
				return
			}
			s := mustSend(t, d)
			want := tc.wantBody
			if want == "" {
				want = chatBody
			}
			if string(s.Body) != want {
				t.Errorf("body = %s, want %s", s.Body, want)
			}
			if tc.wantHeader[0] != "" && s.Header.Get(tc.wantHeader[0]) != tc.wantHeader[1] {
				t.Errorf("header %s = %q", tc.wantHeader[0], s.Header.Get(tc.wantHeader[0]))
			}
		})
	}
}

func TestPluginChain(t *testing.T) {
	t.Run("transforms thread through the chain in order", func(t *testing.T) {
		first := newPluginServer(t, answer(200, `{"action":"transform","body":{"step":1}}`))
		second := newPluginServer(t, answer(200, `{"action":"transform","body":{"step":2}}`))
		cfg := baseConfig()
		cfg.Plugins = []delivery.PluginConfig{postPlugin("a", first.URL, delivery.FailOpen), postPlugin("b", second.URL, delivery.FailOpen)}
		p := newPolicy(t, cfg)
		s := mustSend(t, p.Apply(t.Context(), req, 200, jsonCT, []byte(chatBody)))
		if string(second.last().Body) != `{"step":1}` {
			t.Errorf("second plugin saw %s", second.last().Body)
		}
		if string(s.Body) != `{"step":2}` {
			t.Errorf("body = %s", s.Body)
		}
		if p.Stats().PluginTransforms.Load() != 2 {
			t.Errorf("transforms = %d", p.Stats().PluginTransforms.Load())
		}
	})
	t.Run("a block stops the chain", func(t *testing.T) {
		first := newPluginServer(t, answer(200, `{"action":"block"}`))
		second := newPluginServer(t, answer(200, `{"action":"allow"}`))
		cfg := baseConfig()
		cfg.Plugins = []delivery.PluginConfig{postPlugin("a", first.URL, delivery.FailOpen), postPlugin("b", second.URL, delivery.FailOpen)}
		p := newPolicy(t, cfg)
		mustRefuse(t, p.Apply(t.Context(), req, 200, jsonCT, []byte(chatBody)), 403, delivery.CodePluginBlocked)
		if second.calls() != 0 {
			t.Error("the chain went on after a block")
		}
	})
	t.Run("plugins see the guardrails' redaction", func(t *testing.T) {
		ps := newPluginServer(t, answer(200, `{"action":"allow"}`))
		cfg := baseConfig()
		cfg.Guardrails.Rules = []delivery.GuardrailRule{rule("e", delivery.BuiltinEmail, delivery.ActionRedact)}
		cfg.Plugins = []delivery.PluginConfig{postPlugin("a", ps.URL, delivery.FailOpen)}
		p := newPolicy(t, cfg)
		mustSend(t, p.Apply(t.Context(), req, 200, jsonCT, []byte(`{"choices":[{"text":"a@example.com"}]}`)))
		if got := string(ps.last().Body); got != `{"choices":[{"text":"[REDACTED:EMAIL]"}]}` {
			t.Errorf("plugin saw %s", got)
		}
	})
	t.Run("bodies that are not JSON and non-2xx statuses skip the plugins", func(t *testing.T) {
		ps := newPluginServer(t, answer(200, `{"action":"block"}`))
		cfg := baseConfig()
		cfg.Plugins = []delivery.PluginConfig{postPlugin("a", ps.URL, delivery.FailClosed)}
		p := newPolicy(t, cfg)
		mustSend(t, p.Apply(t.Context(), req, 200, "audio/mpeg", []byte("ID3\x00binary")))
		mustSend(t, p.Apply(t.Context(), req, 429, jsonCT, []byte(`{"error":{}}`)))
		if ps.calls() != 0 {
			t.Errorf("plugin called %d times", ps.calls())
		}
	})
	t.Run("only post_response plugins run", func(t *testing.T) {
		ps := newPluginServer(t, answer(200, `{"action":"block"}`))
		cfg := baseConfig()
		cfg.Plugins = []delivery.PluginConfig{{Name: "pre", URL: ps.URL, Stage: delivery.PluginStagePreRoute, FailureMode: delivery.FailClosed}}
		p := newPolicy(t, cfg)
		mustSend(t, p.Apply(t.Context(), req, 200, jsonCT, []byte(chatBody)))
		if ps.calls() != 0 || p.Active(req) {
			t.Errorf("pre_route plugin ran (calls %d)", ps.calls())
		}
	})
	t.Run("bearer token from the environment", func(t *testing.T) {
		ps := newPluginServer(t, answer(200, `{"action":"allow"}`))
		cfg := baseConfig()
		pc := postPlugin("a", ps.URL, delivery.FailOpen)
		pc.AuthTokenEnv = "PLUGIN_TOKEN"
		cfg.Plugins = []delivery.PluginConfig{pc}
		p := newPolicy(t, cfg, delivery.WithGetenv(func(k string) string {
			if k == "PLUGIN_TOKEN" {
				return "s3cret"
			}
			return ""
		}))
		mustSend(t, p.Apply(t.Context(), req, 200, jsonCT, []byte(chatBody)))
		ps.mu.Lock()
		defer ps.mu.Unlock()
		if ps.auths[0] != "Bearer s3cret" {
			t.Errorf("Authorization = %q", ps.auths[0])
		}
	})
}

func TestPluginFailures(t *testing.T) {
	// Each server is started by the case, so unreachable can be a dead URL.
	hang := func(w http.ResponseWriter, r *http.Request, _ delivery.Envelope) { <-r.Context().Done() }
	tests := []struct {
		name  string
		url   func(t *testing.T) string
		class string
	}{
		{"unreachable", deadURL, "unreachable"},
		{"timeout", func(t *testing.T) string { return newPluginServer(t, hang).URL }, "timeout"},
		{"non-2xx", func(t *testing.T) string { return newPluginServer(t, answer(503, `{"action":"allow"}`)).URL }, "status"},
		{"malformed: not JSON", func(t *testing.T) string { return newPluginServer(t, answer(200, `allow`)).URL }, "malformed"},
		{"malformed: unknown action", func(t *testing.T) string { return newPluginServer(t, answer(200, `{"action":"explode"}`)).URL }, "malformed"},
		{"malformed: transform without body", func(t *testing.T) string { return newPluginServer(t, answer(200, `{"action":"transform"}`)).URL }, "malformed"},
		{"malformed: annotate outside x-", func(t *testing.T) string {
			return newPluginServer(t, answer(200, `{"action":"annotate","headers":{"Content-Length":"1"}}`)).URL
		}, "malformed"},
	}
	for _, tc := range tests {
		for _, mode := range []string{delivery.FailOpen, delivery.FailClosed} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				cfg := baseConfig()
				pc := postPlugin("guard", tc.url(t), mode)
				pc.TimeoutMS = 100
				cfg.Plugins = []delivery.PluginConfig{pc}
				p := newPolicy(t, cfg)
				d := p.Apply(t.Context(), req, 200, jsonCT, []byte(chatBody))
				if p.Stats().PluginErrors.Load() != 1 {
					t.Errorf("plugin errors = %d", p.Stats().PluginErrors.Load())
				}
				if mode == delivery.FailOpen {
					if s := mustSend(t, d); string(s.Body) != chatBody {
						t.Errorf("body = %s", s.Body)
					}
					return
				}
				r := mustRefuse(t, d, http.StatusBadGateway, delivery.CodePluginUnavailable)
				if want := "plugin_unavailable: guard: " + tc.class; r.Reason != want {
					t.Errorf("reason = %q, want %q", r.Reason, want)
				}
			})
		}
	}
}

// A call cut because its request ended (the client hung up, a drain halted
// it) is no failure of the plugin: it is counted apart, in CallsCancelled,
// while a timeout of the same hanging plugin is an error.
func TestPluginCallCancelledIsNoError(t *testing.T) {
	arrived := make(chan struct{}, 1)
	hang := func(w http.ResponseWriter, r *http.Request, _ delivery.Envelope) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-r.Context().Done()
	}
	srv := newPluginServer(t, hang)
	for _, mode := range []string{delivery.FailOpen, delivery.FailClosed} {
		t.Run(mode, func(t *testing.T) {
			cfg := baseConfig()
			pc := postPlugin("guard", srv.URL, mode)
			pc.TimeoutMS = 60_000
			cfg.Plugins = []delivery.PluginConfig{pc}
			p := newPolicy(t, cfg)
			ctx, cancel := context.WithCancel(t.Context())
			go func() { <-arrived; cancel() }()
			p.Apply(ctx, req, 200, jsonCT, []byte(chatBody))
			if got := p.Stats().PluginErrors.Load(); got != 0 {
				t.Errorf("plugin errors = %d, want 0 for a cancelled call", got)
			}
			if got := p.Stats().CallsCancelled.Load(); got != 1 {
				t.Errorf("cancelled calls = %d, want 1", got)
			}
		})
	}
}

func TestNewReportsUnsetTokenEnv(t *testing.T) {
	cfg := baseConfig()
	cfg.Plugins = []delivery.PluginConfig{{Name: "a", URL: "http://127.0.0.1:1", Stage: delivery.PluginStagePostResponse, AuthTokenEnv: "NOT_SET_ANYWHERE"}}
	delivery.ApplyPluginDefaults(cfg.Plugins)
	_, err := delivery.New(cfg, nil, nil, delivery.WithGetenv(func(string) string { return "" }))
	var fe *delivery.FieldError
	if !errors.As(err, &fe) || fe.Path != "plugins[0].auth_token_env" {
		t.Fatalf("err = %v, want a FieldError at plugins[0].auth_token_env", err)
	}
}

func TestDecodeReply(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr bool
		want    delivery.Reply
	}{
		{name: "allow", in: `{"action":"allow"}`, want: delivery.Reply{Action: "allow"}},
		{name: "block reason cleaned", in: `{"action":"block","reason":"  bad\nanswer "}`, want: delivery.Reply{Action: "block", Reason: "badanswer"}},
		{name: "transform", in: `{"action":"transform","body":[1]}`, want: delivery.Reply{Action: "transform", Body: json.RawMessage(`[1]`)}},
		{name: "annotate", in: `{"action":"annotate","headers":{"x-a":"b"}}`, want: delivery.Reply{Action: "annotate", Headers: map[string]string{"x-a": "b"}}},
		{name: "empty", in: ``, wantErr: true},
		{name: "array", in: `[]`, wantErr: true},
		{name: "trailing data", in: `{"action":"allow"} {}`, wantErr: true},
		{name: "missing action", in: `{}`, wantErr: true},
		{name: "action case", in: `{"action":"ALLOW"}`, wantErr: true},
		{name: "transform null body", in: `{"action":"transform","body":null}`, wantErr: true},
		{name: "annotate x-rolter", in: `{"action":"annotate","headers":{"X-Rolter-Cache":"HIT"}}`, wantErr: true},
		{name: "annotate request id", in: `{"action":"annotate","headers":{"x-request-id":"1"}}`, wantErr: true},
		{name: "annotate bad name", in: `{"action":"annotate","headers":{"x-a b":"1"}}`, wantErr: true},
		{name: "annotate header injection", in: `{"action":"annotate","headers":{"x-a":"1\r\nSet-Cookie: a"}}`, wantErr: true},
		{name: "headers of wrong type", in: `{"action":"annotate","headers":{"x-a":1}}`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := delivery.DecodeReply([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if got.Action != tc.want.Action || got.Reason != tc.want.Reason || string(got.Body) != string(tc.want.Body) || len(got.Headers) != len(tc.want.Headers) {
				t.Errorf("reply = %+v, want %+v", got, tc.want)
			}
			for k, v := range tc.want.Headers {
				if got.Headers[k] != v {
					t.Errorf("header %s = %q", k, got.Headers[k])
				}
			}
		})
	}
	long := `{"action":"block","reason":"` + strings.Repeat("é", 600) + `"}`
	got, err := delivery.DecodeReply([]byte(long))
	if err != nil || len(got.Reason) > 512 || !strings.HasPrefix(got.Reason, "é") {
		t.Errorf("long reason: %d bytes, err %v", len(got.Reason), err)
	}
}

// TestHotReloadReachesCachedEntries plays the cache's part: one stored
// upstream body delivered by successive policy generations.
func TestHotReloadReachesCachedEntries(t *testing.T) {
	stored := []byte(chatBody)
	stats := &delivery.Stats{}
	before := newPolicy(t, baseConfig(), delivery.WithStats(stats))
	mustSend(t, before.Apply(t.Context(), req, 200, jsonCT, stored))

	blocker := newPluginServer(t, answer(200, `{"action":"block"}`))
	cfg := baseConfig()
	cfg.Plugins = []delivery.PluginConfig{postPlugin("new", blocker.URL, delivery.FailOpen)}
	after := newPolicy(t, cfg, delivery.WithStats(stats))
	mustRefuse(t, after.Apply(t.Context(), req, 200, jsonCT, stored), 403, delivery.CodePluginBlocked)

	transformer := newPluginServer(t, answer(200, `{"action":"transform","body":{"t":1}}`))
	cfg.Plugins = []delivery.PluginConfig{postPlugin("t", transformer.URL, delivery.FailOpen)}
	third := newPolicy(t, cfg, delivery.WithStats(stats))
	for range 2 {
		if s := mustSend(t, third.Apply(t.Context(), req, 200, jsonCT, stored)); string(s.Body) != `{"t":1}` {
			t.Errorf("body = %s", s.Body)
		}
	}
	if string(stored) != chatBody {
		t.Error("the stored entry changed")
	}
	if stats.Withheld.Load() != 1 || stats.PluginTransforms.Load() != 2 || stats.PluginBlocks.Load() != 1 {
		t.Errorf("shared stats: withheld %d transforms %d blocks %d", stats.Withheld.Load(), stats.PluginTransforms.Load(), stats.PluginBlocks.Load())
	}
}
