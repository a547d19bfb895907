package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"rolter.dev/pkg/config"
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
			doc := fmt.Sprintf(openAuth+"[cache]\nenabled = true\n[accounting]\nsink = \"none\"\n[[providers]]\nname = \"up\"\nkind = \"openai_compatible\"\napi_base = %q\n[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"up\" }]\n%s", up.URL, tc.cache)
			cfg, err := config.Parse([]byte(doc))
			if err != nil {
				b.Fatal(err)
			}
			snap, err := config.Compile(cfg, config.CompileOptions{})
			if err != nil {
				b.Fatal(err)
			}
			p := New(Options{})
			if err := p.Apply(snap); err != nil {
				b.Fatal(err)
			}
			srv := httptest.NewServer(p)
			defer srv.Close()
			client := srv.Client()
			send := func() {
				resp, err := client.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
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
