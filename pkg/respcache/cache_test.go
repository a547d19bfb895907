package respcache_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"rolter.dev/pkg/respcache"
	"rolter.dev/pkg/respcache/canon"
)

func TestMain(m *testing.M) {
	respcache.SetRedisLogger(slog.New(slog.DiscardHandler))
	// No goroutine (redis clients, server watchers) may outlive the tests.
	goleak.VerifyTestMain(m)
}

const (
	chatPath = "/v1/chat/completions"
	question = `{"role":"user","content":"What is the capital of France?"}`
	german   = `{"role":"system","content":"Answer in German."}`
	japanese = `{"role":"system","content":"Answer in Japanese."}`
	sseType  = "text/event-stream; charset=utf-8"
	stream   = "data: {\"choices\":[{\"delta\":{\"content\":\"Paris\"}}]}\n\ndata: [DONE]\n\n"
)

// constEmbedder gives every text the same embedding, so similarity alone
// would match any two requests: every semantic miss is the partition, the
// bypass or the mode check at work.
type constEmbedder struct {
	calls atomic.Int32
	err   error
}

func (e *constEmbedder) Embed(context.Context, string) ([]float32, error) {
	e.calls.Add(1)
	if e.err != nil {
		return nil, e.err
	}
	return []float32{0.6, 0.8, 0}, nil
}

// mapEmbedder embeds by the text's last word.
type mapEmbedder map[string][]float32

func (m mapEmbedder) Embed(_ context.Context, text string) ([]float32, error) {
	words := strings.Fields(text)
	if v, ok := m[words[len(words)-1]]; ok {
		return v, nil
	}
	return nil, errors.New("no embedding")
}

func jsonEntry(body string) *respcache.Entry {
	return &respcache.Entry{Status: 200, ContentType: "application/json", Body: []byte(body)}
}

func req(body string, streamFlag bool, sem *respcache.Semantic) respcache.Request {
	return respcache.Request{Path: chatPath, Route: "m", Body: []byte(body), Stream: streamFlag, TTL: time.Minute, Semantic: sem}
}

func chatBody(extra string, msgs ...string) string {
	return `{"model":"m"` + extra + `,"messages":[` + strings.Join(msgs, ",") + `]}`
}

func lookup(t *testing.T, c *respcache.Cache, r respcache.Request) *respcache.Lookup {
	t.Helper()
	l, err := c.Lookup(t.Context(), r)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return l
}

func store(t *testing.T, c *respcache.Cache, l *respcache.Lookup, e *respcache.Entry) {
	t.Helper()
	if err := c.Store(t.Context(), l, e); err != nil {
		t.Fatalf("Store: %v", err)
	}
}

type backendFactory func(t *testing.T) respcache.Backend

func backends(t *testing.T) map[string]backendFactory {
	srv := startRedis(t)
	return map[string]backendFactory{
		"memory": func(*testing.T) respcache.Backend { return respcache.NewMemory(64 << 20) },
		"redis": func(t *testing.T) respcache.Backend {
			srv.Do("FLUSHALL")
			r, err := respcache.NewRedis(srv.URL(), respcache.RedisOptions{Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			return r
		},
	}
}

func TestExact(t *testing.T) {
	body := chatBody("", question)
	tests := []struct {
		name string
		run  func(t *testing.T, c *respcache.Cache, b respcache.Backend)
	}{
		{"miss, store, hit", func(t *testing.T, c *respcache.Cache, _ respcache.Backend) {
			l := lookup(t, c, req(body, false, nil))
			if l.Hit() || l.Source != respcache.Miss {
				t.Fatalf("first lookup: %v", l)
			}
			store(t, c, l, jsonEntry(`{"answer":"Paris"}`))
			h := lookup(t, c, req(body, false, nil))
			if !h.Hit() || h.Source != respcache.ExactHit || string(h.Entry.Body) != `{"answer":"Paris"}` ||
				h.Entry.Status != 200 || h.Entry.ContentType != "application/json" {
				t.Fatalf("second lookup: %v %+v", h, h.Entry)
			}
			wantStats(t, c, respcache.Stats{Hits: 1, Misses: 1, Stores: 1})
		}},
		{"key order, whitespace and escapes hit", func(t *testing.T, c *respcache.Cache, _ respcache.Backend) {
			store(t, c, lookup(t, c, req(body, false, nil)), jsonEntry("x"))
			other := "{\n  \"messages\": [ {\"content\": \"What is the capital of Fr\\u0061nce?\", \"role\": \"user\"} ],\n  \"model\": \"m\"\n}"
			if l := lookup(t, c, req(other, false, nil)); !l.Hit() {
				t.Fatal("a reformatted body missed")
			}
		}},
		{"another body misses", func(t *testing.T, c *respcache.Cache, _ respcache.Backend) {
			store(t, c, lookup(t, c, req(body, false, nil)), jsonEntry("x"))
			for _, other := range []string{
				chatBody(`,"temperature":0`, question),
				chatBody(`,"stream":false`, question),
				chatBody("", `{"role":"user","content":"What is the capital of Spain?"}`),
			} {
				if l := lookup(t, c, req(other, false, nil)); l.Hit() {
					t.Fatalf("%s hit", other)
				}
			}
		}},
		{"scope and path separate entries", func(t *testing.T, c *respcache.Cache, _ respcache.Backend) {
			r := req(body, false, nil)
			r.Scope = "key-a"
			store(t, c, lookup(t, c, r), jsonEntry("x"))
			for _, mod := range []func(*respcache.Request){
				func(r *respcache.Request) { r.Scope = "key-b" },
				func(r *respcache.Request) { r.Scope = "" },
				func(r *respcache.Request) { r.Path = "/v1/completions" },
			} {
				o := r
				mod(&o)
				if l := lookup(t, c, o); l.Hit() {
					t.Fatalf("%+v hit", o)
				}
			}
			if l := lookup(t, c, r); !l.Hit() {
				t.Fatal("the same scope missed")
			}
		}},
		{"not stored: any status but 200, ttl zero, a second store, a hit", func(t *testing.T, c *respcache.Cache, _ respcache.Backend) {
			l := lookup(t, c, req(body, false, nil))
			// A replay repeats only an answer: not a created resource or
			// an accepted job (201, 202), no answer (204), part of one
			// (206), a redirect or a not-modified (3xx), nor an error.
			for _, status := range []int{0, 100, 201, 202, 203, 204, 206, 301, 302, 304, 307, 400, 429, 500} {
				e := jsonEntry("err")
				e.Status = status
				if err := c.Store(t.Context(), l, e); !errors.Is(err, respcache.ErrNotStorable) {
					t.Fatalf("Store of status %d: %v", status, err)
				}
				if respcache.Storable(status) {
					t.Fatalf("Storable(%d)", status)
				}
			}
			r0 := req(body, false, nil)
			r0.TTL = 0
			if err := c.Store(t.Context(), lookup(t, c, r0), jsonEntry("x")); !errors.Is(err, respcache.ErrNotStorable) {
				t.Fatalf("Store with ttl 0: %v", err)
			}
			if lookup(t, c, req(body, false, nil)).Hit() {
				t.Fatal("something was stored")
			}
			store(t, c, l, jsonEntry("x"))
			if err := c.Store(t.Context(), l, jsonEntry("y")); !errors.Is(err, respcache.ErrNotStorable) {
				t.Fatalf("second Store: %v", err)
			}
			h := lookup(t, c, req(body, false, nil))
			if err := c.Store(t.Context(), h, jsonEntry("y")); !errors.Is(err, respcache.ErrNotStorable) {
				t.Fatalf("Store on a hit: %v", err)
			}
			if err := c.Store(t.Context(), nil, jsonEntry("y")); !errors.Is(err, respcache.ErrNotStorable) {
				t.Fatalf("Store of a nil lookup: %v", err)
			}
			if got := string(lookup(t, c, req(body, false, nil)).Entry.Body); got != "x" {
				t.Fatalf("stored body %q", got)
			}
		}},
		{"not cacheable: a body that is not JSON, /v1/responses", func(t *testing.T, c *respcache.Cache, _ respcache.Backend) {
			if _, err := c.Lookup(t.Context(), req(`{"model":`, false, nil)); !errors.Is(err, respcache.ErrNotCacheable) || !errors.Is(err, canon.ErrSyntax) {
				t.Fatalf("Lookup of invalid JSON: %v", err)
			}
			r := req(`{"model":"m","input":"hi"}`, false, nil)
			r.Path = "/v1/responses"
			if _, err := c.Lookup(t.Context(), r); !errors.Is(err, respcache.ErrNotCacheable) {
				t.Fatalf("Lookup of /v1/responses: %v", err)
			}
		}},
		{"not stored: a stream of a status but 200", func(t *testing.T, c *respcache.Cache, _ respcache.Backend) {
			sb := chatBody(`,"stream":true`, question)
			for _, status := range []int{201, 202, 206} {
				l := lookup(t, c, req(sb, true, nil))
				rec := c.NewRecorder()
				rec.Write([]byte(stream))
				rec.End(nil)
				if err := c.StoreStream(t.Context(), l, status, sseType, rec); !errors.Is(err, respcache.ErrNotStorable) {
					t.Fatalf("StoreStream of status %d: %v", status, err)
				}
			}
			if lookup(t, c, req(sb, true, nil)).Hit() {
				t.Fatal("a stream of another status than 200 was stored")
			}
			wantStats(t, c, respcache.Stats{Misses: 4})
		}},
		{"an entry of a status but 200 under the key is a counted miss", func(t *testing.T, c *respcache.Cache, b respcache.Backend) {
			// The stored form (see entry.go) of a body "x" with status 201
			// (0xc9 0x01), as a rolter that stored any status below 400
			// wrote it; the same entry with status 200 (0xc8 0x01) hits.
			key, _ := respcache.ExactKey(c.Namespace(), chatPath, "", []byte(body))
			mustSet(t, b, key, []byte("rc\x01\x00\xc9\x01\x00\x01x"), time.Minute)
			if l := lookup(t, c, req(body, false, nil)); l.Hit() {
				t.Fatalf("an entry of status 201 was replayed: %+v", l.Entry)
			}
			wantStats(t, c, respcache.Stats{Misses: 1, DecodeErrors: 1})
			mustSet(t, b, key, []byte("rc\x01\x00\xc8\x01\x00\x01x"), time.Minute)
			if l := lookup(t, c, req(body, false, nil)); !l.Hit() || l.Entry.Status != 200 || string(l.Entry.Body) != "x" {
				t.Fatalf("the same entry with status 200 did not hit: %+v", l)
			}
		}},
		{"junk under the key is a counted miss", func(t *testing.T, c *respcache.Cache, b respcache.Backend) {
			key, _ := respcache.ExactKey(c.Namespace(), chatPath, "", []byte(body))
			for _, junk := range []string{"", "junk", `{"status":200,"body":[1,2]}`, "rc\x01\x00\xc8\x01"} {
				mustSet(t, b, key, []byte(junk), time.Minute)
				if l := lookup(t, c, req(body, false, nil)); l.Hit() {
					t.Fatalf("junk %q hit", junk)
				}
			}
			wantStats(t, c, respcache.Stats{Misses: 4, DecodeErrors: 4})
		}},
		{"a stream is replayed event by event", func(t *testing.T, c *respcache.Cache, _ respcache.Backend) {
			sb := chatBody(`,"stream":true`, question)
			l := lookup(t, c, req(sb, true, nil))
			rec := c.NewRecorder()
			for i := range len(stream) { // one byte per read
				rec.Write([]byte{stream[i]})
			}
			rec.End(nil)
			if err := c.StoreStream(t.Context(), l, 200, sseType, rec); err != nil {
				t.Fatal(err)
			}
			h := lookup(t, c, req(sb, true, nil))
			if !h.Hit() || !h.Entry.IsSSE() || h.Entry.ContentType != sseType {
				t.Fatalf("stream lookup: %v %+v", h, h.Entry)
			}
			var out bytes.Buffer
			if err := h.Entry.WriteBody(t.Context(), &out); err != nil || out.String() != stream {
				t.Fatalf("replay = %q, %v; want %q", out.String(), err, stream)
			}
		}},
		{"an interrupted or unfinished stream is not stored", func(t *testing.T, c *respcache.Cache, _ respcache.Backend) {
			sb := chatBody(`,"stream":true`, question)
			for _, end := range []struct {
				data string
				err  error
			}{
				{stream, errors.New("client went away")},
				{stream[:strings.Index(stream, "data: [DONE]")], nil},
			} {
				l := lookup(t, c, req(sb, true, nil))
				rec := c.NewRecorder()
				rec.Write([]byte(end.data))
				rec.End(end.err)
				if err := c.StoreStream(t.Context(), l, 200, sseType, rec); !errors.Is(err, respcache.ErrIncomplete) {
					t.Fatalf("StoreStream: %v", err)
				}
			}
			if lookup(t, c, req(sb, true, nil)).Hit() {
				t.Fatal("an incomplete stream was stored")
			}
			wantStats(t, c, respcache.Stats{Misses: 3, Incomplete: 2})
		}},
	}
	for bname, newBackend := range backends(t) {
		for _, tc := range tests {
			t.Run(bname+"/"+tc.name, func(t *testing.T) {
				b := newBackend(t)
				tc.run(t, respcache.New(b, respcache.Options{}), b)
			})
		}
	}
}

func TestTooLarge(t *testing.T) {
	c := respcache.New(respcache.NewMemory(1<<20), respcache.Options{MaxEntryBytes: 16})
	body := chatBody("", question)
	l := lookup(t, c, req(body, false, nil))
	if err := c.Store(t.Context(), l, jsonEntry(strings.Repeat("x", 17))); !errors.Is(err, respcache.ErrTooLarge) {
		t.Fatalf("Store over the cap: %v", err)
	}
	store(t, c, l, jsonEntry(strings.Repeat("x", 16)))

	sl := lookup(t, c, req(chatBody(`,"stream":true`, question), true, nil))
	rec := c.NewRecorder()
	rec.Write([]byte(stream))
	rec.End(nil)
	if err := c.StoreStream(t.Context(), sl, 200, sseType, rec); !errors.Is(err, respcache.ErrTooLarge) {
		t.Fatalf("StoreStream over the cap: %v", err)
	}
	wantStats(t, c, respcache.Stats{Misses: 2, Stores: 1, TooLarge: 2})
}

// TestSemantic runs the semantic suite with an embedder that gives every
// input the same embedding: each miss is the partition, the bypass or the
// mode check, and each hit shows the partition does not over-split.
func TestSemantic(t *testing.T) {
	rephrased := `{"role":"user","content":"Which city is France's capital?"}`
	type side struct {
		body   string
		stream bool
		mod    func(*respcache.Request)
	}
	tests := []struct {
		name      string
		stored    side
		storedSSE bool // the stored response is a stream
		asked     side
		wantHit   bool
	}{
		{"hit: same partition, other wording",
			side{body: chatBody("", german, question)}, false,
			side{body: chatBody("", german, rephrased)}, true},
		{"miss: German vs Japanese system prompt",
			side{body: chatBody("", german, question)}, false,
			side{body: chatBody("", japanese, rephrased)}, false},
		{"hit: stream false equals absent",
			side{body: chatBody(`,"stream":false`, question)}, false,
			side{body: chatBody("", rephrased)}, true},
		{"miss: stream true vs absent",
			side{body: chatBody(`,"stream":true`, question), stream: true}, true,
			side{body: chatBody("", rephrased)}, false},
		{"miss: stream true vs false",
			side{body: chatBody(`,"stream":true`, question), stream: true}, true,
			side{body: chatBody(`,"stream":false`, rephrased)}, false},
		{"hit: stream true vs true",
			side{body: chatBody(`,"stream":true`, question), stream: true}, true,
			side{body: chatBody(`,"stream":true`, rephrased), stream: true}, true},
		{"miss: different tools",
			side{body: chatBody(`,"tools":[{"type":"function","function":{"name":"a"}}]`, question)}, false,
			side{body: chatBody(`,"tools":[{"type":"function","function":{"name":"b"}}]`, rephrased)}, false},
		{"hit: same tools, keys in another order",
			side{body: chatBody(`,"tools":[{"type":"function","function":{"name":"a","strict":true}}]`, question)}, false,
			side{body: chatBody(`,"tools":[{"function":{"strict":true,"name":"a"},"type":"function"}]`, rephrased)}, true},
		{"miss: different response_format",
			side{body: chatBody(`,"response_format":{"type":"json_object"}`, question)}, false,
			side{body: chatBody(`,"response_format":{"type":"text"}`, rephrased)}, false},
		{"hit: user and metadata differ",
			side{body: chatBody(`,"user":"alice","metadata":{"a":"1"}`, question)}, false,
			side{body: chatBody(`,"user":"bob"`, rephrased)}, true},
		{"hit: key order",
			side{body: `{"temperature":0,"model":"m","messages":[` + german + `,` + question + `]}`}, false,
			side{body: `{"messages":[` + german + `,` + rephrased + `],"model":"m","temperature":0}`}, true},
		{"miss: temperature",
			side{body: chatBody(`,"temperature":0`, question)}, false,
			side{body: chatBody(`,"temperature":1`, rephrased)}, false},
		{"miss: another route",
			side{body: chatBody("", question)}, false,
			side{body: chatBody("", rephrased), mod: func(r *respcache.Request) { r.Route = "other" }}, false},
		{"miss: another scope",
			side{body: chatBody("", question), mod: func(r *respcache.Request) { r.Scope = "key-a" }}, false,
			side{body: chatBody("", rephrased), mod: func(r *respcache.Request) { r.Scope = "key-b" }}, false},
		{"miss: another variant",
			side{body: chatBody("", question), mod: func(r *respcache.Request) { r.Variant = "stable" }}, false,
			side{body: chatBody("", rephrased), mod: func(r *respcache.Request) { r.Variant = "canary" }}, false},
		{"miss: a variant vs the plain route",
			side{body: chatBody("", question), mod: func(r *respcache.Request) { r.Variant = "canary" }}, false,
			side{body: chatBody("", rephrased)}, false},
		{"hit: same variant",
			side{body: chatBody("", question), mod: func(r *respcache.Request) { r.Variant = "canary" }}, false,
			side{body: chatBody("", rephrased), mod: func(r *respcache.Request) { r.Variant = "canary" }}, true},
		{"miss: stored reply of the other mode (JSON for a stream request)",
			side{body: chatBody(`,"stream":true`, question), stream: true}, false,
			side{body: chatBody(`,"stream":true`, rephrased), stream: true}, false},
	}
	for bname, newBackend := range backends(t) {
		for _, tc := range tests {
			t.Run(bname+"/"+tc.name, func(t *testing.T) {
				c := respcache.New(newBackend(t), respcache.Options{})
				emb := &constEmbedder{}
				sem := &respcache.Semantic{Embedder: emb, Threshold: 0.92, MaxCandidates: 8}
				mk := func(s side) respcache.Request {
					r := req(s.body, s.stream, sem)
					if s.mod != nil {
						s.mod(&r)
					}
					return r
				}
				l := lookup(t, c, mk(tc.stored))
				if l.Hit() || l.Bypassed {
					t.Fatalf("first lookup: %v bypassed=%v", l, l.Bypassed)
				}
				e := jsonEntry(`{"answer":"Paris"}`)
				if tc.storedSSE {
					e = &respcache.Entry{Status: 200, ContentType: sseType, Events: [][]byte{[]byte("data: [DONE]")}}
				}
				store(t, c, l, e)
				got := lookup(t, c, mk(tc.asked))
				if got.Hit() != tc.wantHit {
					t.Fatalf("hit = %v (%v), want %v; stats %+v", got.Hit(), got, tc.wantHit, c.Stats())
				}
				if tc.wantHit && (got.Source != respcache.SemanticHit || got.Similarity < 0.9999 || got.Entry.IsSSE() != tc.asked.stream) {
					t.Fatalf("hit %v, entry %+v", got, got.Entry)
				}
				if emb.calls.Load() != 2 {
					t.Fatalf("%d embedding calls, want 2", emb.calls.Load())
				}
				want := respcache.Stats{Misses: 2, Stores: 1, SemanticStores: 1, SemanticMisses: 1}
				if tc.wantHit {
					want.SemanticHits = 1
				} else {
					want.SemanticMisses = 2
				}
				if strings.Contains(tc.name, "other mode") {
					want.SemanticModeSkips = 1
				}
				wantStats(t, c, want)
			})
		}
	}
}

func TestSemanticBypass(t *testing.T) {
	emb := &constEmbedder{}
	c := respcache.New(respcache.NewMemory(1<<20), respcache.Options{})
	sem := &respcache.Semantic{Embedder: emb, Threshold: 0.9, MaxCandidates: 8}
	image := `{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:,"}}]}`
	body := chatBody("", image)
	l := lookup(t, c, req(body, false, sem))
	if !l.Bypassed || l.Hit() {
		t.Fatalf("lookup: %v bypassed=%v", l, l.Bypassed)
	}
	store(t, c, l, jsonEntry("x"))
	if h := lookup(t, c, req(body, false, sem)); h.Source != respcache.ExactHit {
		t.Fatalf("a bypassed request did not use the exact cache: %v", h)
	}
	if emb.calls.Load() != 0 {
		t.Fatalf("%d embedding calls for a bypassed request", emb.calls.Load())
	}
	embeddings := respcache.Request{Path: "/v1/embeddings", Body: []byte(`{"model":"e","input":"x"}`), TTL: time.Minute, Semantic: sem}
	if l := lookup(t, c, embeddings); !l.Bypassed {
		t.Fatal("/v1/embeddings was not bypassed")
	}
	wantStats(t, c, respcache.Stats{Hits: 1, Misses: 2, Stores: 1, SemanticBypasses: 2})
}

func TestSemanticEmbeddingFailure(t *testing.T) {
	emb := &constEmbedder{err: errors.New("provider down")}
	c := respcache.New(respcache.NewMemory(1<<20), respcache.Options{})
	sem := &respcache.Semantic{Embedder: emb, Threshold: 0.9, MaxCandidates: 8}
	body := chatBody("", question)
	l := lookup(t, c, req(body, false, sem))
	store(t, c, l, jsonEntry("x"))
	if h := lookup(t, c, req(body, false, sem)); h.Source != respcache.ExactHit {
		t.Fatalf("exact cache unusable without embeddings: %v", h)
	}
	wantStats(t, c, respcache.Stats{Hits: 1, Misses: 1, Stores: 1, EmbeddingErrors: 1})
}

// TestSemanticSimilarity checks the threshold, the choice of the best
// candidate and the candidate window.
func TestSemanticSimilarity(t *testing.T) {
	emb := mapEmbedder{
		"north": {0, 1}, "east": {1, 0}, "northeast": {0.7071, 0.7071},
		"nne": {0.28, 0.96}, "ene": {0.96, 0.28}, "ene2": {0.9455, 0.3256}, // 19°: below the threshold to east
	}
	ask := func(word string) string {
		return chatBody("", `{"role":"user","content":"go `+word+`"}`)
	}
	c := respcache.New(respcache.NewMemory(1<<20), respcache.Options{})
	sem := &respcache.Semantic{Embedder: emb, Threshold: 0.95, MaxCandidates: 2}
	for _, w := range []string{"north", "east"} {
		store(t, c, lookup(t, c, req(ask(w), false, sem)), jsonEntry(w))
	}
	tests := []struct {
		word, want string
		sim        float64
	}{
		{"nne", "north", 0.96},
		{"ene", "east", 0.96},
		{"northeast", "", 0}, // 0.7071 to both: below the threshold
	}
	for _, tc := range tests {
		l := lookup(t, c, req(ask(tc.word), false, sem))
		if tc.want == "" {
			if l.Hit() {
				t.Fatalf("%s hit %q", tc.word, l.Entry.Body)
			}
			continue
		}
		if !l.Hit() || string(l.Entry.Body) != tc.want || l.Similarity < tc.sim-1e-3 || l.Similarity > tc.sim+1e-3 {
			t.Fatalf("%s: %v %q, want %s at %v", tc.word, l, bodyOf(l), tc.want, tc.sim)
		}
	}
	// A third entry pushes "north" out of the two-entry window.
	store(t, c, lookup(t, c, req(ask("ene2"), false, sem)), jsonEntry("ene2"))
	if l := lookup(t, c, req(ask("nne"), false, sem)); l.Hit() {
		t.Fatalf("an entry beyond max_candidates matched: %q", l.Entry.Body)
	}
	// The best of two candidates above the threshold wins.
	if l := lookup(t, c, req(ask("ene"), false, sem)); string(bodyOf(l)) != "ene2" {
		t.Fatalf("ene matched %q, want the closer ene2", bodyOf(l))
	}
}

func bodyOf(l *respcache.Lookup) []byte {
	if l.Entry == nil {
		return nil
	}
	return l.Entry.Body
}

func wantStats(t *testing.T, c *respcache.Cache, want respcache.Stats) {
	t.Helper()
	if got := c.Stats(); got != want {
		t.Fatalf("stats\n got %+v\nwant %+v", got, want)
	}
}

// flakyBackend fails while down is set, and counts the calls that reach it.
type flakyBackend struct {
	*respcache.Memory
	down  atomic.Bool
	calls atomic.Int32
}

var errDown = errors.New("backend down")

func (f *flakyBackend) Get(ctx context.Context, key string) ([]byte, bool, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return nil, false, errDown
	}
	return f.Memory.Get(ctx, key)
}

func (f *flakyBackend) Set(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	f.calls.Add(1)
	if f.down.Load() {
		return errDown
	}
	return f.Memory.Set(ctx, key, val, ttl)
}

// TestBreaker: consecutive backend failures stop the calls for a cooldown,
// and the cache recovers by itself once the backend answers.
func TestBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs bytes.Buffer
		f := &flakyBackend{Memory: respcache.NewMemory(1 << 20)}
		c := respcache.New(f, respcache.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		body := chatBody("", question)
		f.down.Store(true)
		for range 5 {
			if l := lookup(t, c, req(body, false, nil)); l.Hit() {
				t.Fatal("hit with the backend down")
			}
		}
		if f.calls.Load() != 5 {
			t.Fatalf("%d backend calls", f.calls.Load())
		}
		l := lookup(t, c, req(body, false, nil))
		if err := c.Store(context.Background(), l, jsonEntry("x")); !errors.Is(err, respcache.ErrUnavailable) {
			t.Fatalf("Store with the breaker open: %v", err)
		}
		if f.calls.Load() != 5 {
			t.Fatalf("the backend was called with the breaker open (%d calls)", f.calls.Load())
		}
		if !strings.Contains(logs.String(), "level=WARN") {
			t.Fatalf("no warning logged: %s", logs.String())
		}

		time.Sleep(time.Second) // the cooldown
		if lookup(t, c, req(body, false, nil)); f.calls.Load() != 6 {
			t.Fatalf("the backend was not tried after the cooldown (%d calls)", f.calls.Load())
		}
		if lookup(t, c, req(body, false, nil)); f.calls.Load() != 6 {
			t.Fatal("a failure right after the cooldown did not re-open the breaker")
		}

		time.Sleep(time.Second)
		f.down.Store(false)
		l = lookup(t, c, req(body, false, nil))
		store(t, c, l, jsonEntry("x"))
		if h := lookup(t, c, req(body, false, nil)); !h.Hit() {
			t.Fatal("no hit after the backend recovered")
		}
		if !strings.Contains(logs.String(), "answers again") {
			t.Fatalf("recovery not logged: %s", logs.String())
		}
		wantStats(t, c, respcache.Stats{Hits: 1, Misses: 9, Stores: 1, BackendErrors: 6, BackendSkips: 3})
	})
}

// TestBackendErrorsAreLogged: at the default level, a burst of backend
// errors logs its cause once (op and error, then once a second with the
// count in between), and the bypass line gives its duration readably.
func TestBackendErrorsAreLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs bytes.Buffer
		f := &flakyBackend{Memory: respcache.NewMemory(1 << 20)}
		c := respcache.New(f, respcache.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
		f.down.Store(true)
		for range 3 {
			lookup(t, c, req(chatBody("", question), false, nil))
		}
		if n := strings.Count(logs.String(), `"msg":"response cache backend error: served as a miss","op":"get","err":"backend down"`); n != 1 {
			t.Fatalf("%d warn lines for a burst of 3 errors:\n%s", n, logs.String())
		}
		time.Sleep(time.Second)
		lookup(t, c, req(chatBody("", question), false, nil))
		if !strings.Contains(logs.String(), `"unlogged_errors_before":2`) {
			t.Fatalf("second line does not count the errors in between:\n%s", logs.String())
		}
		for range 5 {
			lookup(t, c, req(chatBody("", question), false, nil))
		}
		if !strings.Contains(logs.String(), `"msg":"response cache backend failing: bypassing it","for":"1s"`) {
			t.Fatalf("bypass line:\n%s", logs.String())
		}
	})
}

// TestBreakerIgnoresCallerCancel: a request that gives up says nothing
// about the backend.
func TestBreakerIgnoresCallerCancel(t *testing.T) {
	f := &flakyBackend{Memory: respcache.NewMemory(1 << 20)}
	c := respcache.New(&cancelBackend{f}, respcache.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for range 10 {
		if _, err := c.Lookup(ctx, req(chatBody("", question), false, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if s := c.Stats(); s.BackendErrors != 0 || s.BackendSkips != 0 {
		t.Fatalf("cancelled lookups counted as backend failures: %+v", s)
	}
}

type cancelBackend struct{ *flakyBackend }

func (b *cancelBackend) Get(ctx context.Context, key string) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	return b.flakyBackend.Get(ctx, key)
}

// TestCacheRedisOutage: with Redis killed mid-run lookups keep answering
// (misses) within the timeout, and hits return after Redis restarts.
func TestCacheRedisOutage(t *testing.T) {
	srv := startRedis(t)
	r := newRedis(t, srv.URL())
	c := respcache.New(r, respcache.Options{})
	body := chatBody("", question)
	store(t, c, lookup(t, c, req(body, false, nil)), jsonEntry("x"))

	srv.Kill()
	for range 20 {
		start := time.Now()
		if l := lookup(t, c, req(body, false, nil)); l.Hit() {
			t.Fatal("hit with redis down")
		}
		if d := time.Since(start); d > opBound {
			t.Fatalf("lookup took %v with redis down", d)
		}
	}
	if s := c.Stats(); s.BackendErrors == 0 || s.BackendSkips == 0 {
		t.Fatalf("outage not counted: %+v", s)
	}

	srv.Restart()
	eventually(t, func() bool {
		l := lookup(t, c, req(body, false, nil))
		return l.Hit() || c.Store(t.Context(), l, jsonEntry("y")) == nil
	})
	if l := lookup(t, c, req(body, false, nil)); !l.Hit() || string(l.Entry.Body) != "y" {
		t.Fatalf("no hit after redis came back: %v", l)
	}
}

// TestExactNeverCrossesVariants: an answer stored for a request assigned to
// one variant is found by the same request of that variant only.
func TestExactNeverCrossesVariants(t *testing.T) {
	for bname, newBackend := range backends(t) {
		t.Run(bname, func(t *testing.T) {
			c := respcache.New(newBackend(t), respcache.Options{})
			body := chatBody("", question)
			ask := func(variant string) *respcache.Lookup {
				r := req(body, false, nil)
				r.Variant = variant
				return lookup(t, c, r)
			}
			store(t, c, ask("stable"), jsonEntry(`{"answer":"from stable"}`))
			if l := ask("canary"); l.Hit() {
				t.Fatalf("canary got stable's answer: %s", l.Entry.Body)
			}
			if l := ask(""); l.Hit() {
				t.Fatalf("the plain route got stable's answer: %s", l.Entry.Body)
			}
			if l := ask("stable"); !l.Hit() || string(l.Entry.Body) != `{"answer":"from stable"}` {
				t.Fatalf("stable's own lookup: %+v", l)
			}
		})
	}
}
