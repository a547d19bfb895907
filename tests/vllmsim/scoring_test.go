package vllmsim_test

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"rolter.dev/tests/vllmsim"
)

// rerankResponse is vLLM's RerankResponse.
type rerankResponse struct {
	ID    string `json:"id"`
	Model string `json:"model"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
	Results []struct {
		Index    int `json:"index"`
		Document struct {
			Text *string `json:"text"`
		} `json:"document"`
		RelevanceScore float64 `json:"relevance_score"`
	} `json:"results"`
}

// scoreResponse is vLLM's ScoreResponse.
type scoreResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Data    []struct {
		Index  int     `json:"index"`
		Object string  `json:"object"`
		Score  float64 `json:"score"`
	} `json:"data"`
	Usage struct {
		PromptTokens     int  `json:"prompt_tokens"`
		TotalTokens      int  `json:"total_tokens"`
		CompletionTokens *int `json:"completion_tokens"`
	} `json:"usage"`
}

// scoringIDPattern is a scoring response's id: ServingScores' prefix
// "score" (rerank too) and a 32-digit hex id.
var scoringIDPattern = regexp.MustCompile(`^score-[0-9a-f]{32}$`)

// pairTokens is the prompt length of a (query, document) pair.
func pairTokens(q, d string) int {
	return len(vllmsim.Tokenize(q)) + len(vllmsim.Tokenize(d))
}

// keys returns the sorted keys of a JSON object.
func keys(t *testing.T, b []byte) []string {
	t.Helper()
	m := decode[map[string]json.RawMessage](t, b)
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

var rerankDocs = []string{
	"bananas are yellow fruit",
	"the router sends each request to a warm replica",
	"a router keeps a prefix cache warm",
	"",
}

const rerankQuery = "router prefix cache"

func TestRerankShapes(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	body := mustJSON(t, map[string]any{"model": "sim-model", "query": rerankQuery, "documents": rerankDocs})
	wantTokens := 0
	for _, d := range rerankDocs {
		wantTokens += pairTokens(rerankQuery, d)
	}
	for _, path := range []string{"/rerank", "/v1/rerank", "/v2/rerank"} {
		t.Run(path, func(t *testing.T) {
			b := post(t, ts, path, body, http.StatusOK)
			if got, want := keys(t, b), []string{"id", "model", "results", "usage"}; !slices.Equal(got, want) {
				t.Errorf("keys = %v, want %v", got, want)
			}
			resp := decode[rerankResponse](t, b)
			if !scoringIDPattern.MatchString(resp.ID) || resp.Model != "sim-model" {
				t.Errorf("id %q, model %q; want score-<hex> and sim-model", resp.ID, resp.Model)
			}
			if resp.Usage.PromptTokens != wantTokens || resp.Usage.TotalTokens != wantTokens {
				t.Errorf("usage = %+v, want %d prompt and total tokens", resp.Usage, wantTokens)
			}
			if len(resp.Results) != len(rerankDocs) {
				t.Fatalf("%d results, want %d", len(resp.Results), len(rerankDocs))
			}
			seen := map[int]bool{}
			for i, r := range resp.Results {
				if r.Index < 0 || r.Index >= len(rerankDocs) || seen[r.Index] {
					t.Fatalf("result %d: bad or repeated index %d", i, r.Index)
				}
				seen[r.Index] = true
				if r.Document.Text == nil || *r.Document.Text != rerankDocs[r.Index] {
					t.Errorf("result %d: document %v, want %q", i, r.Document.Text, rerankDocs[r.Index])
				}
				if want := vllmsim.RelevanceScore(rerankQuery, rerankDocs[r.Index]); r.RelevanceScore != want {
					t.Errorf("result %d: score %v, want RelevanceScore %v", i, r.RelevanceScore, want)
				}
				if r.RelevanceScore < 0 || r.RelevanceScore >= 1 {
					t.Errorf("result %d: score %v outside [0, 1)", i, r.RelevanceScore)
				}
				if i > 0 && r.RelevanceScore > resp.Results[i-1].RelevanceScore {
					t.Errorf("results not sorted by descending score: %v after %v", r.RelevanceScore, resp.Results[i-1].RelevanceScore)
				}
			}
			// The document with every query word ranks first, the ones
			// with none last.
			if resp.Results[0].Index != 2 {
				t.Errorf("top result is document %d, want 2", resp.Results[0].Index)
			}
			if last := resp.Results[len(resp.Results)-1].RelevanceScore; last >= resp.Results[1].RelevanceScore {
				t.Errorf("a document without query words scores %v, not below %v", last, resp.Results[1].RelevanceScore)
			}
			// vLLM's RerankDocument dumps multi_modal as null.
			var raw struct {
				Results []struct {
					Document map[string]json.RawMessage `json:"document"`
				} `json:"results"`
			}
			if err := json.Unmarshal(b, &raw); err != nil {
				t.Fatal(err)
			}
			if mm, ok := raw.Results[0].Document["multi_modal"]; !ok || string(mm) != "null" {
				t.Errorf("document = %v, want multi_modal null", raw.Results[0].Document)
			}
		})
	}
}

func TestRerankTopN(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	all := decode[rerankResponse](t, post(t, ts, "/rerank", mustJSON(t, map[string]any{"query": rerankQuery, "documents": rerankDocs}), http.StatusOK))
	tests := []struct {
		name string
		topN string // JSON, or "" to leave it out
		want int
	}{
		{name: "absent: all", want: 4},
		{name: "0: all", topN: "0", want: 4},
		{name: "1", topN: "1", want: 1},
		{name: "3", topN: "3", want: 3},
		{name: "beyond the documents", topN: "10", want: 4},
		{name: "integral float", topN: "2.0", want: 2},
		{name: "numeric string, as pydantic's lax mode reads it", topN: `"2"`, want: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"query":"` + rerankQuery + `","documents":` + mustJSON(t, rerankDocs)
			if tc.topN != "" {
				body += `,"top_n":` + tc.topN
			}
			resp := decode[rerankResponse](t, post(t, ts, "/v2/rerank", body+"}", http.StatusOK))
			if len(resp.Results) != tc.want {
				t.Fatalf("%d results, want %d", len(resp.Results), tc.want)
			}
			for i, r := range resp.Results {
				if r.Index != all.Results[i].Index || r.RelevanceScore != all.Results[i].RelevanceScore {
					t.Errorf("result %d = %+v, want the full ranking's %+v", i, r, all.Results[i])
				}
			}
			// top_n cuts the results, not the work: usage counts every pair.
			if resp.Usage.PromptTokens != all.Usage.PromptTokens {
				t.Errorf("usage %d, want %d", resp.Usage.PromptTokens, all.Usage.PromptTokens)
			}
		})
	}
}

func TestRerankSingleDocument(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	resp := decode[rerankResponse](t, post(t, ts, "/rerank", `{"query":"warm cache","documents":"a warm cache"}`, http.StatusOK))
	if len(resp.Results) != 1 || resp.Results[0].Index != 0 || resp.Results[0].Document.Text == nil || *resp.Results[0].Document.Text != "a warm cache" {
		t.Fatalf("results = %+v, want the one document", resp.Results)
	}
	if want := vllmsim.RelevanceScore("warm cache", "a warm cache"); resp.Results[0].RelevanceScore != want {
		t.Errorf("score %v, want %v", resp.Results[0].RelevanceScore, want)
	}
}

func TestScoreShapes(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	tests := []struct {
		name           string
		field1, field2 string
		data1, data2   any
		queries, docs  []string // the pairs, in order
	}{
		{name: "queries and documents, 1:1 strings", field1: "queries", field2: "documents",
			data1: "warm cache", data2: "the cache is warm",
			queries: []string{"warm cache"}, docs: []string{"the cache is warm"}},
		{name: "queries and items, 1:N", field1: "queries", field2: "items",
			data1: "warm cache", data2: []string{"cold data", "a warm cache", "cache"},
			queries: []string{"warm cache", "warm cache", "warm cache"}, docs: []string{"cold data", "a warm cache", "cache"}},
		{name: "data_1 and data_2, N:N", field1: "data_1", field2: "data_2",
			data1: []string{"alpha", "beta gamma"}, data2: []string{"alpha beta", "delta"},
			queries: []string{"alpha", "beta gamma"}, docs: []string{"alpha beta", "delta"}},
		{name: "text_1 and text_2, 1-element list against N", field1: "text_1", field2: "text_2",
			data1: []string{"router"}, data2: []string{"a router", "no match"},
			queries: []string{"router", "router"}, docs: []string{"a router", "no match"}},
	}
	for _, path := range []string{"/score", "/v1/score"} {
		for _, tc := range tests {
			t.Run(path+": "+tc.name, func(t *testing.T) {
				before := time.Now().Unix()
				b := post(t, ts, path, mustJSON(t, map[string]any{"model": "sim-model", tc.field1: tc.data1, tc.field2: tc.data2}), http.StatusOK)
				if got, want := keys(t, b), []string{"created", "data", "id", "model", "object", "usage"}; !slices.Equal(got, want) {
					t.Errorf("keys = %v, want %v", got, want)
				}
				resp := decode[scoreResponse](t, b)
				if !scoringIDPattern.MatchString(resp.ID) || resp.Object != "list" || resp.Model != "sim-model" {
					t.Errorf("id %q, object %q, model %q", resp.ID, resp.Object, resp.Model)
				}
				if resp.Created < before || resp.Created > time.Now().Unix() {
					t.Errorf("created %d, not now", resp.Created)
				}
				if len(resp.Data) != len(tc.docs) {
					t.Fatalf("%d scores, want %d", len(resp.Data), len(tc.docs))
				}
				wantTokens := 0
				for i, d := range resp.Data {
					if d.Index != i || d.Object != "score" {
						t.Errorf("data[%d] = %+v, want index %d, object score", i, d, i)
					}
					if want := vllmsim.RelevanceScore(tc.queries[i], tc.docs[i]); d.Score != want {
						t.Errorf("data[%d].score = %v, want %v", i, d.Score, want)
					}
					wantTokens += pairTokens(tc.queries[i], tc.docs[i])
				}
				if resp.Usage.PromptTokens != wantTokens || resp.Usage.TotalTokens != wantTokens ||
					resp.Usage.CompletionTokens == nil || *resp.Usage.CompletionTokens != 0 {
					t.Errorf("usage = %+v, want %d prompt and total tokens, 0 completion", resp.Usage, wantTokens)
				}
			})
		}
	}
}

func TestScoringDeterministic(t *testing.T) {
	_, ts1 := newServer(t, vllmsim.Options{})
	_, ts2 := newServer(t, vllmsim.Options{})
	body := `{"queries":"prefix cache","documents":["a prefix cache","the prefix","nothing here"]}`
	a := decode[scoreResponse](t, post(t, ts1, "/score", body, http.StatusOK))
	b := decode[scoreResponse](t, post(t, ts2, "/score", body, http.StatusOK))
	c := decode[scoreResponse](t, post(t, ts1, "/score", body, http.StatusOK))
	for i := range a.Data {
		if a.Data[i].Score != b.Data[i].Score || a.Data[i].Score != c.Data[i].Score {
			t.Errorf("pair %d: scores %v, %v, %v differ", i, a.Data[i].Score, b.Data[i].Score, c.Data[i].Score)
		}
	}
	if a.ID == c.ID {
		t.Errorf("two requests share the id %q", a.ID)
	}
	// More query words in the document, higher score.
	if !(a.Data[0].Score > a.Data[1].Score && a.Data[1].Score > a.Data[2].Score) {
		t.Errorf("scores %v, %v, %v not decreasing with the query words each document holds", a.Data[0].Score, a.Data[1].Score, a.Data[2].Score)
	}
	// Rerank scores the same pair the same.
	r := decode[rerankResponse](t, post(t, ts2, "/rerank", `{"query":"prefix cache","documents":["the prefix"]}`, http.StatusOK))
	if r.Results[0].RelevanceScore != a.Data[1].Score {
		t.Errorf("rerank score %v, score %v for the same pair", r.Results[0].RelevanceScore, a.Data[1].Score)
	}
	// Different pairs get different scores, even with the same overlap.
	if x, y := vllmsim.RelevanceScore("q", "apple"), vllmsim.RelevanceScore("q", "pear"); x == y {
		t.Errorf("different documents without overlap both score %v", x)
	}
}

func TestPairScore(t *testing.T) {
	tok := vllmsim.Tokenize
	tests := []struct {
		name         string
		q, dHi, dLow string
	}{
		{name: "all words beat some", q: "one two three", dHi: "three two one", dLow: "one two"},
		{name: "some beat none", q: "one two three", dLow: "four five", dHi: "three"},
		{name: "repeats count once", q: "a a a b", dHi: "a b", dLow: "a a a a a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hi, low := vllmsim.PairScore(tok(tc.q), tok(tc.dHi)), vllmsim.PairScore(tok(tc.q), tok(tc.dLow))
			if !(hi > low) {
				t.Errorf("score(%q) = %v, not above score(%q) = %v", tc.dHi, hi, tc.dLow, low)
			}
			for _, s := range []float64{hi, low} {
				if s < 0 || s >= 1 {
					t.Errorf("score %v outside [0, 1)", s)
				}
			}
		})
	}
	if s := vllmsim.PairScore(nil, nil); s < 0 || s >= 1 {
		t.Errorf("empty pair scores %v", s)
	}
}

func TestScoringOptions(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{MaxModelLen: 64})
	q, d := "alpha beta gamma", "gamma delta omega zeta eta theta"
	base := `{"query":"` + q + `","documents":["` + d + `"]`
	rerank := func(extra string) rerankResponse {
		t.Helper()
		return decode[rerankResponse](t, post(t, ts, "/rerank", base+extra+"}", http.StatusOK))
	}
	plain := rerank("")
	tests := []struct {
		name       string
		extra      string
		wantTokens int
		wantScore  float64
	}{
		{name: "max_tokens_per_doc", extra: `,"max_tokens_per_doc":2`, wantTokens: 3 + 2,
			wantScore: vllmsim.RelevanceScore(q, "gamma delta")},
		{name: "max_tokens_per_query", extra: `,"max_tokens_per_query":1`, wantTokens: 1 + 6,
			wantScore: vllmsim.RelevanceScore("alpha", d)},
		// longest_first: the longer document loses its 3 extra tokens
		// first, then each side one of the remaining 2.
		{name: "truncate_prompt_tokens, longest first", extra: `,"truncate_prompt_tokens":4`, wantTokens: 4,
			wantScore: vllmsim.RelevanceScore("alpha beta", "gamma delta")},
		{name: "truncate_prompt_tokens from the right", extra: `,"truncate_prompt_tokens":4,"truncation_side":"right"`, wantTokens: 4,
			wantScore: vllmsim.RelevanceScore(q, "gamma")},
		{name: "truncate_prompt_tokens from the left", extra: `,"truncate_prompt_tokens":4,"truncation_side":"left"`, wantTokens: 4,
			wantScore: vllmsim.RelevanceScore("", "omega zeta eta theta")},
		{name: "truncate_prompt_tokens -1 is max_model_len", extra: `,"truncate_prompt_tokens":-1`, wantTokens: 9,
			wantScore: plain.Results[0].RelevanceScore},
		{name: "padding to max_length", extra: `,"padding":"max_length"`, wantTokens: 64,
			wantScore: plain.Results[0].RelevanceScore},
		{name: "padding do_not_pad", extra: `,"padding":"do_not_pad"`, wantTokens: 9,
			wantScore: plain.Results[0].RelevanceScore},
		{name: "extra fields are ignored", extra: `,"return_documents":false,"instruction":"x","chat_template_kwargs":{"a":1},"priority":0,"request_id":"r","cache_salt":"s","user":"u","use_activation":true`, wantTokens: 9,
			wantScore: plain.Results[0].RelevanceScore},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rerank(tc.extra)
			if r.Usage.PromptTokens != tc.wantTokens {
				t.Errorf("prompt tokens %d, want %d", r.Usage.PromptTokens, tc.wantTokens)
			}
			if r.Results[0].RelevanceScore != tc.wantScore {
				t.Errorf("score %v, want %v", r.Results[0].RelevanceScore, tc.wantScore)
			}
			if r.Results[0].Document.Text == nil || *r.Results[0].Document.Text != d {
				t.Errorf("document %v, want the request's, untruncated", r.Results[0].Document.Text)
			}
		})
	}
	t.Run("use_activation false gives the logit", func(t *testing.T) {
		p := plain.Results[0].RelevanceScore
		got := rerank(`,"use_activation":false`).Results[0].RelevanceScore
		if want := math.Log(p / (1 - p)); math.Abs(got-want) > 1e-12 {
			t.Errorf("score %v, want logit(%v) = %v", got, p, want)
		}
	})
}

func TestScoringRequestID(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	for _, path := range []string{"/rerank", "/score"} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.URL+path, strings.NewReader(`{"query":"a","queries":"a","documents":["b"]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Request-Id", "trace-42")
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s %v", path, resp.StatusCode, b, err)
		}
		if id := decode[struct {
			ID string `json:"id"`
		}](t, b).ID; id != "score-trace-42" {
			t.Errorf("%s: id %q, want score-trace-42", path, id)
		}
	}
}

func TestScoringModelAndStats(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{Models: []string{"reranker", "alias"}})
	// vLLM answers with the served model's canonical name, whatever name
	// the request used.
	r := decode[rerankResponse](t, post(t, ts, "/v1/rerank", `{"model":"alias","query":"x y","documents":["x","y z"]}`, http.StatusOK))
	s := decode[scoreResponse](t, post(t, ts, "/v1/score", `{"model":"alias","text_1":"x","text_2":"x"}`, http.StatusOK))
	if r.Model != "reranker" || s.Model != "reranker" {
		t.Errorf("models %q, %q; want reranker", r.Model, s.Model)
	}
	post(t, ts, "/score", `{"model":"nope","text_1":"x","text_2":"x"}`, http.StatusNotFound)
	st := stats(t, ts)
	if st.Requests != 2 || st.ByEndpoint["/v1/rerank"] != 1 || st.ByEndpoint["/v1/score"] != 1 {
		t.Errorf("requests %d by endpoint %v; want one rerank and one score", st.Requests, st.ByEndpoint)
	}
	if want := uint64(r.Usage.PromptTokens + s.Usage.PromptTokens); st.PromptTokens != want {
		t.Errorf("prompt tokens %d, want %d", st.PromptTokens, want)
	}
	if st.Running != 0 || st.CachedPromptTokens != 0 || st.BlocksResident != 0 {
		t.Errorf("stats %+v: scoring must not touch the engine's cache or gauges", st)
	}
}

func TestScoringErrors(t *testing.T) {
	tests := []struct {
		name       string
		opts       vllmsim.Options
		method     string
		path       string
		body       string
		wantStatus int
		wantType   string
		wantParam  string // "" for null
		wantMsg    string // substring of the message
	}{
		{name: "bad JSON", path: "/rerank", body: `{"query":`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "body not an object", path: "/score", body: `["a"]`, wantStatus: 400, wantType: "BadRequestError"},
		{name: "rerank: missing query", path: "/rerank", body: `{"documents":["a"]}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.query", wantMsg: "Field required"},
		{name: "rerank: missing documents", path: "/v1/rerank", body: `{"query":"a"}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.documents", wantMsg: "Field required"},
		{name: "rerank: query a list", path: "/v2/rerank", body: `{"query":["a"],"documents":["a"]}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.query"},
		{name: "rerank: query null", path: "/rerank", body: `{"query":null,"documents":["a"]}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.query"},
		{name: "rerank: documents a number", path: "/rerank", body: `{"query":"a","documents":7}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.documents"},
		{name: "rerank: a document not a string", path: "/rerank", body: `{"query":"a","documents":["a",1]}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.documents"},
		{name: "rerank: document object without content", path: "/rerank", body: `{"query":"a","documents":[{"text":"a"}]}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.documents"},
		{name: "rerank: empty documents", path: "/rerank", body: `{"query":"a","documents":[]}`, wantStatus: 400, wantType: "BadRequestError", wantMsg: "At least one text_pair element must be given"},
		{name: "rerank: multimodal document on a text model", path: "/rerank", body: `{"query":"a","documents":[{"content":[{"type":"text","text":"a"}]}]}`, wantStatus: 400, wantType: "BadRequestError", wantMsg: "MultiModalParam is not supported"},
		{name: "rerank: negative top_n", path: "/rerank", body: `{"query":"a","documents":["a"],"top_n":-1}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.top_n", wantMsg: "greater than or equal to 0"},
		{name: "rerank: fractional top_n", path: "/rerank", body: `{"query":"a","documents":["a"],"top_n":1.5}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.top_n"},
		{name: "rerank: null top_n", path: "/rerank", body: `{"query":"a","documents":["a"],"top_n":null}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.top_n"},
		{name: "score: no inputs", path: "/score", body: `{}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.queries", wantMsg: "Field required"},
		{name: "score: queries without documents", path: "/score", body: `{"queries":"a"}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.documents", wantMsg: "Field required"},
		{name: "score: an incomplete pair reports the first member", path: "/v1/score", body: `{"text_1":"a","items":["b"]}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.queries"},
		{name: "score: queries of the wrong type", path: "/score", body: `{"queries":{"a":1},"documents":["b"]}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.queries"},
		{name: "score: N:M lengths", path: "/score", body: `{"queries":["a","b"],"documents":["a","b","c"]}`, wantStatus: 400, wantType: "BadRequestError", wantMsg: "Input lengths must be either 1:1, 1:N or N:N"},
		{name: "score: N against none", path: "/score", body: `{"queries":["a","b"],"documents":[]}`, wantStatus: 400, wantType: "BadRequestError", wantMsg: "Input lengths must be either 1:1, 1:N or N:N"},
		{name: "score: empty queries", path: "/score", body: `{"queries":[],"documents":["a"]}`, wantStatus: 400, wantType: "BadRequestError", wantMsg: "At least one text element must be given"},
		{name: "score: empty documents", path: "/score", body: `{"data_1":"a","data_2":[]}`, wantStatus: 400, wantType: "BadRequestError", wantMsg: "At least one text_pair element must be given"},
		{name: "score: multimodal query", path: "/score", body: `{"text_1":{"content":[]},"text_2":"a"}`, wantStatus: 400, wantType: "BadRequestError", wantMsg: "MultiModalParam is not supported"},
		{name: "negative max_tokens_per_doc", path: "/rerank", body: `{"query":"a","documents":["a"],"max_tokens_per_doc":-1}`, wantStatus: 400, wantType: "BadRequestError", wantMsg: "max_tokens_per_doc must be a non-negative integer"},
		{name: "max_tokens_per_query at max_model_len", opts: vllmsim.Options{MaxModelLen: 32}, path: "/score", body: `{"queries":"a","documents":"a","max_tokens_per_query":32}`, wantStatus: 400, wantType: "BadRequestError", wantMsg: "max_tokens_per_query (32) must be less than max_model_len (32)."},
		{name: "truncate_prompt_tokens beyond max_model_len", opts: vllmsim.Options{MaxModelLen: 32}, path: "/rerank", body: `{"query":"a","documents":["a"],"truncate_prompt_tokens":33}`, wantStatus: 400, wantType: "BadRequestError", wantMsg: "truncate_prompt_tokens value is greater than max_model_len"},
		{name: "truncate_prompt_tokens below -1", path: "/rerank", body: `{"query":"a","documents":["a"],"truncate_prompt_tokens":-2}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.truncate_prompt_tokens"},
		{name: "unknown padding", path: "/rerank", body: `{"query":"a","documents":["a"],"padding":"longest"}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.padding"},
		{name: "unknown truncation side", path: "/score", body: `{"queries":"a","documents":"a","truncation_side":"middle"}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.truncation_side"},
		{name: "empty cache_salt", path: "/rerank", body: `{"query":"a","documents":["a"],"cache_salt":""}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.cache_salt"},
		{name: "use_activation not a boolean", path: "/rerank", body: `{"query":"a","documents":["a"],"use_activation":"maybe"}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.use_activation"},
		{name: "chat_template_kwargs not an object", path: "/score", body: `{"queries":"a","documents":"a","chat_template_kwargs":[1]}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "body.chat_template_kwargs"},
		{name: "pair beyond max_model_len", opts: vllmsim.Options{MaxModelLen: 4}, path: "/rerank", body: `{"query":"one two","documents":["three four five"]}`, wantStatus: 400, wantType: "BadRequestError", wantParam: "input_tokens", wantMsg: "maximum context length is 4 tokens. However, you requested 0 output tokens and your prompt contains at least 5 input tokens"},
		{name: "unknown model: rerank", path: "/rerank", body: `{"model":"gpt-x","query":"a","documents":["a"]}`, wantStatus: 404, wantType: "NotFoundError", wantMsg: "The model `gpt-x` does not exist."},
		{name: "unknown model: score", path: "/v1/score", body: `{"model":"gpt-x","queries":"a","documents":["a"]}`, wantStatus: 404, wantType: "NotFoundError", wantMsg: "The model `gpt-x` does not exist."},
		{name: "unknown model comes before the inputs' checks", path: "/score", body: `{"model":"gpt-x","queries":"a","documents":[]}`, wantStatus: 404, wantType: "NotFoundError"},
		{name: "fail rate 1: rerank", opts: vllmsim.Options{FailRate: 1}, path: "/rerank", body: `{"query":"a","documents":["a"]}`, wantStatus: 503, wantType: "ServiceUnavailableError"},
		{name: "fail rate 1: score", opts: vllmsim.Options{FailRate: 1}, path: "/score", body: `{"queries":"a","documents":["a"]}`, wantStatus: 503, wantType: "ServiceUnavailableError"},
		{name: "wrong method", method: http.MethodGet, path: "/v2/rerank", wantStatus: 405, wantType: "MethodNotAllowedError"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := errorCase(t, tc.opts, tc.method, tc.path, tc.body, tc.wantStatus)
			e := decode[errorBody](t, b)
			if e.Error.Type != tc.wantType || e.Error.Code != tc.wantStatus || e.Error.Message == "" {
				t.Errorf("error body = %s, want type %s code %d", b, tc.wantType, tc.wantStatus)
			}
			if got := e.Error.Param; (got == nil) != (tc.wantParam == "") || (got != nil && *got != tc.wantParam) {
				t.Errorf("error body = %s, want param %q", b, tc.wantParam)
			}
			if !strings.Contains(e.Error.Message, tc.wantMsg) {
				t.Errorf("message %q, want it to contain %q", e.Error.Message, tc.wantMsg)
			}
		})
	}
}
