package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestOnlyA200IsCached: the response cache stores and replays a 200 only.
// Any other status an upstream answers below 400 (a created resource or an
// accepted job, no content, part of one, a redirect the proxy does not
// follow, a not-modified) tells of that one exchange: each identical
// request goes upstream again and gets the upstream's own answer, JSON or
// stream. The 200 rows show the same requests do hit when they may.
func TestOnlyA200IsCached(t *testing.T) {
	tests := []struct {
		status int
		stream bool
	}{
		{200, false}, {200, true},
		{201, false}, {201, true}, {202, false}, {203, false}, {204, false},
		{206, false}, {206, true}, {301, false}, {302, false}, {304, false}, {307, false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("status=%d/stream=%v", tc.status, tc.stream), func(t *testing.T) {
			up := newUpstream(t, "up")
			up.handler = func(w http.ResponseWriter, r *http.Request) bool {
				n := up.hits.Load()
				if tc.stream {
					w.Header().Set("Content-Type", "text/event-stream")
				} else {
					w.Header().Set("Content-Type", "application/json")
				}
				if tc.status/100 == 3 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tc.status)
				if tc.status == 204 || tc.status == 304 {
					return true // no body allowed
				}
				if tc.stream {
					fmt.Fprintf(w, "data: {\"n\":%d}\n\ndata: [DONE]\n\n", n)
				} else {
					fmt.Fprintf(w, `{"n":%d}`, n)
				}
				return true
			}
			p := New(Options{})
			applyDoc(t, p, openAuth+"[cache]\nenabled = true\n"+providers(up)+
				"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n[routes.cache]\nenabled = true\nttl_secs = 600\n")
			url := newServer(t, p)
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":%v}`, tc.stream)
			// A client that does not follow redirects, to see the 3xx.
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			var got [2]string
			for i := range 2 {
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != tc.status {
					t.Fatalf("request %d: status %d, want the upstream's %d: %s", i, resp.StatusCode, tc.status, b)
				}
				got[i] = resp.Header.Get("X-Rolter-Cache") + " " + string(b)
			}
			stats := p.rt.Load().cache.cache.Stats()
			if tc.status == 200 {
				if up.hits.Load() != 1 || got[1] != "HIT "+got[0][len("MISS "):] || stats.Stores != 1 {
					t.Fatalf("a 200: upstream called %d times, answers %q, stats %+v; want one call and a hit", up.hits.Load(), got, stats)
				}
				return
			}
			if n := up.hits.Load(); n != 2 || stats.Stores != 0 || stats.Hits != 0 {
				t.Fatalf("a %d: upstream called %d times, stats %+v, answers %q; want 2 calls and nothing stored", tc.status, n, stats, got)
			}
			for i, g := range got {
				want := "MISS "
				if tc.status != 204 && tc.status != 304 {
					want += "{\"n\":" + strconv.Itoa(i+1) + "}"
					if tc.stream {
						want = "MISS data: {\"n\":" + strconv.Itoa(i+1) + "}\n\ndata: [DONE]\n\n"
					}
				}
				if g != want {
					t.Fatalf("answer %d = %q, want the upstream's own %q", i, g, want)
				}
			}
		})
	}
}
