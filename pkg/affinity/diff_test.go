package affinity_test

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"rolter.dev/pkg/affinity"
	"rolter.dev/pkg/chunkindex"
	"rolter.dev/pkg/routing"
)

var allPaths = []string{
	affinity.PathChatCompletions,
	affinity.PathMessages,
	affinity.PathResponses,
	affinity.PathCompletions,
	affinity.PathEmbeddings,
}

func sameContext(t *testing.T, label string, got, want routing.Context) {
	t.Helper()
	if got.Prompt != want.Prompt {
		t.Errorf("%s: Prompt =\n%.300q\nwant\n%.300q", label, got.Prompt, want.Prompt)
	}
	if got.PromptLen != want.PromptLen || got.HasDigest != want.HasDigest || got.PromptDigest != want.PromptDigest {
		t.Errorf("%s: len/has/digest = %d/%v/%#x, want %d/%v/%#x", label,
			got.PromptLen, got.HasDigest, got.PromptDigest, want.PromptLen, want.HasDigest, want.PromptDigest)
	}
}

// TestMatchesReference compares Build with the encoding/json reference over
// many generated bodies of every shape.
func TestMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1851, 32768))
	n := 6000
	if testing.Short() {
		n = 1000
	}
	var withDigest, cutCount int
	for i := range n {
		path := allPaths[i%len(allPaths)]
		g := &gen{r: r, long: i%40 == 0}
		body := g.body(path)
		if !json.Valid(body) {
			t.Fatalf("generated an invalid body: %s", body)
		}
		got := affinity.Build(path, body, nil)
		want := refBuild(path, body, nil)
		sameContext(t, path+" "+truncate(body), got, want)
		if t.Failed() {
			t.Logf("body: %s", body)
			return
		}
		if got.HasDigest {
			withDigest++
		}
		if len(got.Prompt) > affinity.MaxBytes-4 {
			cutCount++
		}
	}
	// The generator must reach the interesting cases, not only fallbacks.
	if withDigest < n/2 || cutCount == 0 {
		t.Fatalf("coverage: %d of %d bodies gave a prompt, %d were cut", withDigest, n, cutCount)
	}
	t.Logf("%d bodies, %d with a prompt, %d cut", n, withDigest, cutCount)
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

// FuzzBuild: Build never panics, its prompt is valid UTF-8 of at most
// MaxBytes, and on a valid JSON body it gives what the reference gives (its
// Prompt is a prefix of the reference's whole text).
func FuzzBuild(f *testing.F) {
	for _, c := range ruleCases {
		f.Add(pathIndex(c.path), []byte(c.body))
	}
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 40 {
		f.Add(uint8(i), (&gen{r: r}).body(allPaths[i%len(allPaths)]))
	}
	f.Add(uint8(0), []byte(`{"messages":[{"role":"user","content":"\ud83d\ude00\ud800x"}]}`))
	f.Add(uint8(1), []byte(`{"messages":[{"content":[{"type":"tool_result","content":[{"text":{"a":[1,2]}}]}],"role":"user"}],"system":"s"}`))
	f.Fuzz(func(t *testing.T, sel uint8, body []byte) {
		path := "/v1/other"
		if int(sel)%6 < len(allPaths) {
			path = allPaths[int(sel)%6]
		}
		h := http.Header{}
		h.Set("X-Session-Id", "s")
		got := affinity.Build(path, body, h)
		if !utf8.ValidString(got.Prompt) {
			t.Fatalf("prompt is not valid UTF-8: %q", got.Prompt)
		}
		if len(got.Prompt) > affinity.MaxBytes {
			t.Fatalf("prompt is %d bytes", len(got.Prompt))
		}
		if got.SessionKey != "s" {
			t.Fatalf("session key %q", got.SessionKey)
		}
		if !json.Valid(body) {
			if got.HasDigest || got.PromptLen != 0 {
				t.Fatalf("invalid JSON gave a prompt: %+v", got)
			}
			if want := affinity.RawPrompt(body); got.Prompt != want {
				t.Fatalf("invalid JSON: prompt %q, want the raw body %q", got.Prompt, want)
			}
			return
		}
		want := refBuild(path, body, h)
		sameContext(t, path, got, want)
		full, _, _, ok := refAffinity(path, body, "")
		if ok && !strings.HasPrefix(full, got.Prompt) {
			t.Fatalf("prompt %q is not a prefix of the whole text %q", got.Prompt, full)
		}
		if ok && len(full) > len(got.Prompt) {
			if got.PromptChain.Len != len(full) || !slices.Equal(got.PromptChain.Hashes, chunkindex.Hashes(nil, full)) {
				t.Fatalf("a prompt cut at %d of %d bytes carries a chain of %d", len(got.Prompt), len(full), got.PromptChain.Len)
			}
		} else if got.PromptChain.Len != 0 || got.PromptChain.Hashes != nil {
			t.Fatalf("an uncut prompt carries a chain of %d bytes", got.PromptChain.Len)
		}
		// Salted, the same prompt behind its salt's line, and its digest
		// (and past the cut, its chain) that text's.
		salted := affinity.BuildSalted(path, body, h, "s")
		if text, n, digest, ok := refAffinity(path, body, "s"); ok {
			if n != got.PromptLen || salted.PromptLen != n || salted.PromptDigest != digest || !strings.HasPrefix(text, salted.Prompt) ||
				len(text) > affinity.MaxBytes && !slices.Equal(salted.PromptChain.Hashes, chunkindex.Hashes(nil, text)) {
				t.Fatalf("salted: len %d (unsalted %d), prompt %.60q", salted.PromptLen, got.PromptLen, salted.Prompt)
			}
		} else if salted.Prompt != got.Prompt || salted.HasDigest {
			t.Fatalf("salted, a body without a prompt gave %+v", salted)
		}
	})
}

func pathIndex(path string) uint8 {
	for i, p := range allPaths {
		if p == path {
			return uint8(i)
		}
	}
	return 5
}

// TestConcurrent: pooled builders are not shared between calls.
func TestConcurrent(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	type job struct {
		path string
		body []byte
		want routing.Context
	}
	var jobs []job
	for i := range 200 {
		path := allPaths[i%len(allPaths)]
		body := (&gen{r: r, long: i%20 == 0}).body(path)
		jobs = append(jobs, job{path, body, refBuild(path, body, nil)})
	}
	done := make(chan struct{})
	for w := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for k := range 3 * len(jobs) {
				j := jobs[(k*7+w)%len(jobs)]
				if got := affinity.Build(j.path, j.body, nil); got.Prompt != j.want.Prompt || got.PromptDigest != j.want.PromptDigest {
					t.Errorf("worker %d: %s gave another context", w, j.path)
					return
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
}
