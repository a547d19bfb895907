package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawConn dials the proxy's listener: these tests play clients that
// misbehave at the HTTP/1.1 framing level, which http.Client never does.
func rawConn(t *testing.T, url string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Generous: a missing answer fails the test instead of hanging it.
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

func readAnswer(t *testing.T, c net.Conn) (*http.Response, map[string]any) {
	t.Helper()
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("answer body: %v", err)
	}
	// Then the proxy closes the connection (it never got the whole body).
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Errorf("after the answer: %v, want the connection closed", err)
	}
	return resp, body
}

func bodyDoc(t *testing.T, server string) string {
	a := newUpstream(t, "a")
	return "[server]\n" + server + "[accounting]\nsink = \"none\"\n" + providers(a) + `
[[routes]]
model = "m"
targets = [{ provider = "p0" }]
[[virtual_keys]]
name = "k"
key = "sk-rolter-body-000000000"
`
}

// A request without a key is answered at once, whatever its body does:
// here the body never comes. Go's server would drain it before the answer.
func TestAuthFailureIsAnsweredWithoutWaitingForTheBody(t *testing.T) {
	_, srv := newTestProxy(t, bodyDoc(t, "body_read_timeout_secs = 1\n"))
	c := rawConn(t, srv.URL)
	fmt.Fprint(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n")
	resp, body := readAnswer(t, c)
	if resp.StatusCode != 401 || !resp.Close {
		t.Fatalf("status %d, close %v: %v", resp.StatusCode, resp.Close, body)
	}
}

// A body that stops arriving is cut off after server.body_read_timeout_secs
// with 408 and a closed connection.
func TestStalledBodyGets408(t *testing.T) {
	_, srv := newTestProxy(t, bodyDoc(t, "body_read_timeout_secs = 1\n"))
	c := rawConn(t, srv.URL)
	fmt.Fprint(c, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: sk-rolter-body-000000000\r\nContent-Length: 100\r\n\r\n{\"mod")
	resp, body := readAnswer(t, c)
	if resp.StatusCode != http.StatusRequestTimeout || body["type"] != "error" {
		t.Fatalf("status %d: %v, want 408 in Anthropic's shape", resp.StatusCode, body)
	}
	// The next request on a fresh connection is served as usual.
	r, b := post(t, srv.URL+"/v1/chat/completions", "sk-rolter-body-000000000", `{"model":"m"}`)
	if r.StatusCode != 200 {
		t.Fatalf("ordinary request after a stalled one: %d %s", r.StatusCode, b)
	}
}

// A client that writes its whole oversized body before it reads gets the
// 413, in the endpoint's dialect, not a connection reset: with a declared
// length and chunked.
func TestOversizedBodyWrittenBeforeReadingGets413(t *testing.T) {
	_, srv := newTestProxy(t, bodyDoc(t, "max_body_bytes = 1048576\n"))
	big := bytes.Repeat([]byte("x"), 4<<20)
	for _, tc := range []struct {
		name, path string
		chunked    bool
	}{
		{"openai length", "/v1/chat/completions", false},
		{"anthropic length", "/v1/messages", false},
		{"openai chunked", "/v1/chat/completions", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawConn(t, srv.URL)
			var req bytes.Buffer
			fmt.Fprintf(&req, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-rolter-body-000000000\r\n", tc.path)
			if tc.chunked {
				req.WriteString("Transfer-Encoding: chunked\r\n\r\n")
				for off := 0; off < len(big); off += 64 << 10 {
					fmt.Fprintf(&req, "%x\r\n", 64<<10)
					req.Write(big[off : off+64<<10])
					req.WriteString("\r\n")
				}
				req.WriteString("0\r\n\r\n")
			} else {
				fmt.Fprintf(&req, "Content-Length: %d\r\n\r\n", len(big))
				req.Write(big)
			}
			if _, err := c.Write(req.Bytes()); err != nil {
				t.Fatalf("writing the whole request: %v (the proxy reset the connection)", err)
			}
			resp, body := readAnswer(t, c)
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d: %v", resp.StatusCode, body)
			}
			if tc.path == "/v1/messages" {
				if e, _ := body["error"].(map[string]any); body["type"] != "error" || e["type"] != "request_too_large" {
					t.Errorf("not Anthropic's shape: %v", body)
				}
			} else if e, _ := body["error"].(map[string]any); e["code"] != "request_too_large" {
				t.Errorf("not OpenAI's shape: %v", body)
			}
		})
	}
}

// A body in a content coding (gzip, deflate, br…) is not decoded: the
// answer says so with 415 and Accept-Encoding: identity (RFC 9110 §15.5.16),
// instead of calling gzip bytes "not valid JSON" or forwarding a plain body
// labelled with the client's coding. identity is no coding.
func TestContentEncodingIsRefused(t *testing.T) {
	a := newUpstream(t, "a")
	_, srv := newTestProxy(t, openAuth+providers(a)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(`{"model":"m","messages":[]}`))
	_ = zw.Close()
	tests := []struct {
		name, path, encoding, body string
		status                     int
	}{
		{"gzip body", "/v1/chat/completions", "gzip", gz.String(), 415},
		{"gzip label on a plain body", "/v1/chat/completions", "gzip", `{"model":"m","messages":[]}`, 415},
		{"deflate", "/v1/completions", "deflate", `{"model":"m"}`, 415},
		{"two codings", "/v1/embeddings", "identity, gzip", `{"model":"m"}`, 415},
		{"anthropic dialect", "/v1/messages", "br", `{"model":"m"}`, 415},
		{"count_tokens", countTokensPath, "gzip", `{"model":"m"}`, 415},
		{"identity", "/v1/chat/completions", "identity", `{"model":"m","messages":[]}`, 200},
		{"identity in capitals", "/v1/chat/completions", "IDENTITY", `{"model":"m","messages":[]}`, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hits := a.hits.Load()
			resp, b := post(t, srv.URL+tc.path, "", tc.body, "Content-Encoding", tc.encoding)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.status == 200 {
				if _, h := a.last(); h.Get("Content-Encoding") != "" {
					t.Errorf("upstream got Content-Encoding %q", h.Get("Content-Encoding"))
				}
				return
			}
			if resp.Header.Get("Accept-Encoding") != "identity" || resp.Header.Get("X-Rolter-Error") != "unsupported_content_encoding" {
				t.Errorf("headers %v", resp.Header)
			}
			if tc.path == "/v1/messages" || tc.path == countTokensPath {
				var e anthropicErrorBody
				if json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.encoding) {
					t.Errorf("anthropic error shape: %s", b)
				}
			} else {
				var e openAIErrorBody
				if json.Unmarshal(b, &e) != nil || e.Error.Code != "unsupported_content_encoding" || !strings.Contains(e.Error.Message, tc.encoding) {
					t.Errorf("openai error shape: %s", b)
				}
			}
			if a.hits.Load() != hits {
				t.Error("a refused request reached the upstream")
			}
		})
	}
}

// Headers the Connection header names are hop-by-hop (RFC 9110 §7.6.1) and
// stay on their hop in both directions; the client picks neither the
// organization or project the provider's key bills nor a conditional or
// partial answer.
func TestForwardDropsHopAndClientChosenHeaders(t *testing.T) {
	a := newUpstream(t, "a")
	a.handler = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Connection", "X-Up-Hop")
		w.Header().Set("X-Up-Hop", "internal")
		w.Header().Set("X-Up-End", "kept")
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion"}`)
		return true
	}
	_, srv := newTestProxy(t, openAuth+providers(a)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	resp, b := post(t, srv.URL+"/v1/chat/completions", "", `{"model":"m","messages":[]}`,
		"Connection", "X-Client-Hop", "X-Client-Hop", "secret", "X-Client-End", "kept",
		"OpenAI-Organization", "org-other", "OpenAI-Project", "proj-other", "Range", "bytes=0-9", "If-None-Match", `"x"`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	_, h := a.last()
	for _, k := range []string{"X-Client-Hop", "Openai-Organization", "Openai-Project", "Range", "If-None-Match"} {
		if v := h.Get(k); v != "" {
			t.Errorf("upstream got %s: %q", k, v)
		}
	}
	if h.Get("X-Client-End") != "kept" {
		t.Errorf("an end-to-end header was dropped: %v", h)
	}
	if v := resp.Header.Get("X-Up-Hop"); v != "" {
		t.Errorf("client got the upstream's hop header X-Up-Hop: %q", v)
	}
	if resp.Header.Get("X-Up-End") != "kept" {
		t.Errorf("an end-to-end response header was dropped: %v", resp.Header)
	}
}

// The upstream gets the client's address appended to X-Forwarded-For, as
// httputil.ReverseProxy sends it; the other X-Forwarded-* headers pass as
// the client sent them.
func TestForwardAppendsXForwardedFor(t *testing.T) {
	a := newUpstream(t, "a")
	_, srv := newTestProxy(t, openAuth+providers(a)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\" }]\n")
	tests := []struct {
		name            string
		hdr             http.Header
		xff, host, prot string // what the upstream gets
	}{
		{"none sent", nil, "127.0.0.1", "", ""},
		{"one proxy before", http.Header{"X-Forwarded-For": {"203.0.113.7"}}, "203.0.113.7, 127.0.0.1", "", ""},
		{"two lines folded", http.Header{"X-Forwarded-For": {"203.0.113.7, 198.51.100.2", "198.51.100.9"}},
			"203.0.113.7, 198.51.100.2, 198.51.100.9, 127.0.0.1", "", ""},
		{"host and proto as sent", http.Header{"X-Forwarded-Host": {"api.example.com"}, "X-Forwarded-Proto": {"https"}},
			"127.0.0.1", "api.example.com", "https"},
		{"named by Connection: hop-by-hop", http.Header{"Connection": {"X-Forwarded-For"}, "X-Forwarded-For": {"203.0.113.7"}},
			"127.0.0.1", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"m","messages":[]}`))
			for k, vs := range tc.hdr {
				req.Header[k] = vs
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			_, h := a.last()
			if got := h.Values("X-Forwarded-For"); len(got) != 1 || got[0] != tc.xff {
				t.Errorf("upstream X-Forwarded-For %q, want [%q]", got, tc.xff)
			}
			if got := h.Get("X-Forwarded-Host"); got != tc.host {
				t.Errorf("upstream X-Forwarded-Host %q, want %q", got, tc.host)
			}
			if got := h.Get("X-Forwarded-Proto"); got != tc.prot {
				t.Errorf("upstream X-Forwarded-Proto %q, want %q", got, tc.prot)
			}
		})
	}
}
