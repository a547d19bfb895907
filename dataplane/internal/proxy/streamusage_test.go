package proxy

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// strip feeds a stream to a new usageStrip in pieces cut at cuts (byte
// offsets, ascending) and returns everything it let out.
func strip(stream []byte, cuts []int) []byte {
	var s usageStrip
	var out []byte
	prev := 0
	for _, c := range append(cuts, len(stream)) {
		out = append(out, s.next(stream[prev:c])...)
		prev = c
	}
	return append(out, s.rest()...)
}

// TestUsageStrip: the usage chunk an OpenAI stream ends with when asked
// (vLLM's final_usage_chunk: "choices":[] and a usage) is left out, however
// the upstream's writes cut the stream, with any of SSE's line endings;
// every other event passes byte for byte, usage or not.
func TestUsageStrip(t *testing.T) {
	chunk := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi \"usage\": {}"}}]}`
	usageChunk := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}}`
	tests := []struct {
		name       string
		in, want   string
		lineEnding string
	}{
		{name: "the usage chunk goes", in: chunk + "\n\n" + usageChunk + "\n\ndata: [DONE]\n\n", want: chunk + "\n\ndata: [DONE]\n\n"},
		{name: "CRLF", in: chunk + "\r\n\r\n" + usageChunk + "\r\n\r\ndata: [DONE]\r\n\r\n", want: chunk + "\r\n\r\ndata: [DONE]\r\n\r\n"},
		{name: "CR", in: chunk + "\r\r" + usageChunk + "\r\rdata: [DONE]\r\r", want: chunk + "\r\rdata: [DONE]\r\r"},
		{name: "an event field before the data", in: "event: x\n" + usageChunk + "\n\n", want: ""},
		{name: "usage on a chunk with choices stays (continuous usage, which the client asked for)",
			in:   `data: {"choices":[{"index":0}],"usage":{"prompt_tokens":1}}` + "\n\n",
			want: `data: {"choices":[{"index":0}],"usage":{"prompt_tokens":1}}` + "\n\n"},
		{name: "a null usage stays", in: `data: {"choices":[],"usage":null}` + "\n\n", want: `data: {"choices":[],"usage":null}` + "\n\n"},
		{name: "no choices member stays", in: `data: {"usage":{"prompt_tokens":1}}` + "\n\n", want: `data: {"usage":{"prompt_tokens":1}}` + "\n\n"},
		{name: "an error event stays", in: `data: {"error":{"message":"usage limit","code":500}}` + "\n\n", want: `data: {"error":{"message":"usage limit","code":500}}` + "\n\n"},
		{name: "a stream cut within an event keeps what came", in: chunk + "\n\n" + usageChunk[:40], want: chunk + "\n\n" + usageChunk[:40]},
		{name: "a stream cut after a lone CR", in: chunk + "\r", want: chunk + "\r"},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.in)
			if got := strip(in, nil); string(got) != tc.want {
				t.Fatalf("whole: got %q, want %q", got, tc.want)
			}
			cuts := make([]int, 0, len(in))
			for i := 1; i < len(in); i++ {
				cuts = append(cuts, i)
			}
			if got := strip(in, cuts); string(got) != tc.want {
				t.Fatalf("byte by byte: got %q, want %q", got, tc.want)
			}
			for range 50 {
				var cuts []int
				for i := 1; i < len(in); i++ {
					if rng.IntN(8) == 0 {
						cuts = append(cuts, i)
					}
				}
				if got := strip(in, cuts); string(got) != tc.want {
					t.Fatalf("cut at %v: got %q, want %q", cuts, got, tc.want)
				}
			}
		})
	}
}

// TestUsageStripGivesUpOnAHugeEvent: an event past usage.MaxEventBytes is
// not held any longer; the stream passes whole from then on.
func TestUsageStripGivesUpOnAHugeEvent(t *testing.T) {
	big := "data: " + strings.Repeat("x", 2<<20) + "\n\n"
	in := []byte(big + `data: {"choices":[],"usage":{"prompt_tokens":1}}` + "\n\n")
	var s usageStrip
	var out []byte
	for c := range slices.Chunk(in, 32<<10) {
		out = append(out, s.next(c)...)
	}
	out = append(out, s.rest()...)
	if !bytes.Equal(out, in) {
		t.Fatalf("got %d bytes, want the %d in", len(out), len(in))
	}
	if len(s.pending) != 0 {
		t.Fatal("still holding bytes")
	}
}

// FuzzUsageStrip: an upstream's stream through the filter, whole or cut
// anywhere, gives the same bytes; a stream that names no usage passes
// unchanged; and what comes out is what went in less whole events.
func FuzzUsageStrip(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"a\":1}}\n\ndata: [DONE]\n\n"), uint64(7))
	f.Add([]byte("data: x\r\n\r\ndata: {\"choices\":[],\"usage\":{}}\r\r\n"), uint64(3))
	f.Add([]byte("event: e\ndata: {\"choices\":[],\"usage\":{\"x\":[1]}}\n\n: comment\n\n"), uint64(1))
	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		whole := strip(in, nil)
		rng := rand.New(rand.NewPCG(seed, 0))
		var cuts []int
		for i := 1; i < len(in); i++ {
			if rng.IntN(5) == 0 {
				cuts = append(cuts, i)
			}
		}
		if got := strip(in, cuts); !bytes.Equal(got, whole) {
			t.Fatalf("cut at %v: %q, whole %q", cuts, got, whole)
		}
		if !bytes.Contains(in, usageKey) && !bytes.Equal(whole, in) {
			t.Fatalf("a stream without usage changed: %q → %q", in, whole)
		}
		// Dropping events only: the output is a subsequence of the input.
		rest := in
		for _, b := range whole {
			i := bytes.IndexByte(rest, b)
			if i < 0 {
				t.Fatalf("output %q is not taken from %q", whole, in)
			}
			rest = rest[i+1:]
		}
	})
}

// BenchmarkUsageStrip: the filter's cost per event of a stream fed one
// event per write, as vLLM writes them.
func BenchmarkUsageStrip(b *testing.B) {
	ev := []byte(`data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1796692763,"model":"sim","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	b.SetBytes(int64(len(ev)))
	b.ReportAllocs()
	var s usageStrip
	for b.Loop() {
		if len(s.next(ev)) != len(ev) {
			b.Fatal("event lost")
		}
	}
}

// TestUpstreamRefusingStreamOptions: an upstream that refuses the
// stream_options the proxy added is asked again as the client wrote it,
// and not asked for usage again; a 400 about something else reaches the
// client whole.
func TestUpstreamRefusingStreamOptions(t *testing.T) {
	up := newUpstream(t, "v")
	up.handler = func(w http.ResponseWriter, r *http.Request) bool {
		body, _ := up.last()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case body["stream_options"] != nil:
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"Unrecognized request argument supplied: stream_options","type":"invalid_request_error"}}`)
		case body["temperature"] != nil:
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"temperature: `+strings.Repeat("x", refusalPeek)+`","type":"invalid_request_error"}}`)
		default:
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
		}
		return true
	}
	_, srv := newTestProxy(t, openAuth+providers(up)+"[[routes]]\nmodel = \"m\"\ntargets = [{ provider = \"p0\", model = \"m\" }]\n")
	for i, wantHits := range []int32{2, 3} {
		resp, out := post(t, srv.URL+"/v1/chat/completions", "", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != 200 || !strings.Contains(string(out), "[DONE]") {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, out)
		}
		if got := up.hits.Load(); got != wantHits {
			t.Fatalf("request %d: the upstream was asked %d times in all, want %d", i, got, wantHits)
		}
	}
	resp, out := post(t, srv.URL+"/v1/chat/completions", "", `{"model":"m","stream":true,"temperature":9,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 400 || !strings.HasSuffix(string(out), `","type":"invalid_request_error"}}`) || len(out) < refusalPeek {
		t.Fatalf("another 400: %d, %d bytes", resp.StatusCode, len(out))
	}
}
