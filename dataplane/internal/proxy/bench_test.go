package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkCacheHitPath compares a request answered from the in-process
// exact cache with the same request forwarded to an instant upstream,
// through the whole proxy over loopback HTTP.
func BenchmarkCacheHitPath(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`)
	}))
	defer up.Close()
	body := `{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("be brief. ", 100) + `"},{"role":"user","content":"hello"}]}`
	for _, tc := range []struct {
		name  string
		cache string
	}{
		{"uncached", ""},
		{"exact_hit", "[routes.cache]\nttl_secs = 600\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p := New(Options{})
			applyDoc(b, p, fmt.Sprintf(openAuth+"[cache]\nenabled = true\n[accounting]\nsink = \"none\"\n[[providers]]\nname = \"up\"\nkind = \"openai_compatible\"\napi_base = %q\n[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"up\" }]\n%s", up.URL, tc.cache))
			url, client := serveProxy(b, p, false)
			send := func() {
				resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			send() // warm the cache and the connections
			b.ReportAllocs()
			for b.Loop() {
				send()
			}
		})
	}
}

// BenchmarkStreamRelay measures a streamed answer of 50 SSE events relayed
// through the whole proxy, over HTTP/1.1 and over HTTP/2 (one TLS
// connection multiplexing the parallel clients' streams), from an instant
// upstream: the proxy's per-event cost, the client write deadline's
// included.
func BenchmarkStreamRelay(b *testing.B) {
	event := "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"}}]}\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for range 50 {
			_, _ = io.WriteString(w, event)
			f.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`
	for _, h2 := range []bool{false, true} {
		b.Run(protoName(h2), func(b *testing.B) {
			p := New(Options{Logger: slog.New(slog.DiscardHandler)})
			applyDoc(b, p, fmt.Sprintf(openAuth+"[accounting]\nsink = \"none\"\n[[providers]]\nname = \"up\"\nkind = \"openai_compatible\"\napi_base = %q\n[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"up\" }]\n", up.URL))
			url, client := serveProxy(b, p, h2)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		})
	}
}

// BenchmarkHostileBody sends 8 MiB bodies made of the smallest JSON values
// through a proxy that reads the most of a body: its route caches answers,
// redacts e-mail addresses before the call (a pre_call guardrail) and
// routes on predicted TTFT. B/op is what one such body costs the proxy
// beyond its bytes (docs/benchmarks.md): the parsers that index a body
// are bounded (canon.MaxValues, the guardrails' texts, the tokenizer's
// objects), so it stays a few times the body, not hundreds.
func BenchmarkHostileBody(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	defer up.Close()
	const size = 8 << 20
	fill := func(head, item, tail string) string {
		return head + strings.Repeat(item, (size-len(head)-len(tail))/len(item)) + tail
	}
	p := New(Options{})
	applyDoc(b, p, fmt.Sprintf(openAuth+"[cache]\nenabled = true\n[accounting]\nsink = \"none\"\n"+
		"[guardrails]\n[[guardrails.rules]]\nname = \"e\"\nbuiltin = \"email\"\nstage = \"pre_call\"\naction = \"redact\"\n"+
		"[[providers]]\nname = \"up\"\nkind = \"openai_compatible\"\napi_base = %q\n"+
		"[[routes]]\nmodel = \"m\"\nstrategy = \"predicted_ttft\"\ntargets = [{ provider = \"up\" }]\n[routes.cache]\nttl_secs = 600\n", up.URL))
	url, client := serveProxy(b, p, false)
	for _, tc := range []struct{ name, path, body string }{
		{"numbers", "/v1/chat/completions", fill(`{"model":"m","messages":[{"role":"user","content":"hi"}],"x":[`, `0,`, `0]}`)},
		{"messages", "/v1/chat/completions", fill(`{"model":"m","messages":[`, `{"role":"user","content":""},`, `{"role":"user","content":"hi"}]}`)},
		{"prompts", "/v1/completions", fill(`{"model":"m","prompt":[`, `"",`, `""]}`)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Post(url+tc.path, "application/json", strings.NewReader(tc.body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}
