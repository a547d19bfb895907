package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The keys of modelsDoc: keyAll may use every model, keyBD only b and d.
const (
	keyAll = "sk-rolter-all-0000000000"
	keyBD  = "sk-rolter-bd-00000000000"
)

// modelsDoc routes a to e, in that order, to u.
func modelsDoc(u *upstream) string {
	var b strings.Builder
	b.WriteString(providers(u))
	for _, m := range []string{"a", "b", "c", "d", "e"} {
		b.WriteString("[[routes]]\nmodel = \"" + m + "\"\ntargets = [{ provider = \"p0\" }]\n")
	}
	b.WriteString("[[virtual_keys]]\nname = \"all\"\nkey = \"" + keyAll + "\"\n")
	b.WriteString("[[virtual_keys]]\nname = \"bd\"\nkey = \"" + keyBD + "\"\nmodels = [\"b\", \"d\"]\n")
	return b.String()
}

// getModels sends a request without a body as each SDK would: with
// anthropic, the key as x-api-key and an anthropic-version header; else
// the key as a Bearer token.
func getModels(t *testing.T, method, target, key string, anthropic bool) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, target, nil)
	if anthropic {
		req.Header.Set("Anthropic-Version", "2023-06-01")
		req.Header.Set("X-Api-Key", key)
	} else {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// The exact bodies of both shapes: same models, each API's fields only.
func TestModelsShapeFollowsTheClient(t *testing.T) {
	_, srv := newTestProxy(t, modelsDoc(newUpstream(t, "a")))
	tests := []struct {
		name, path, key string
		anthropic       bool
		want            string
	}{
		{"openai list", "/v1/models", keyBD, false,
			`{"object":"list","data":[{"id":"b","object":"model","created":0,"owned_by":"rolter"},{"id":"d","object":"model","created":0,"owned_by":"rolter"}]}`},
		{"anthropic list", "/v1/models", keyBD, true,
			`{"data":[{"type":"model","id":"b","display_name":"b","created_at":"1970-01-01T00:00:00Z"},{"type":"model","id":"d","display_name":"d","created_at":"1970-01-01T00:00:00Z"}],"has_more":false,"first_id":"b","last_id":"d"}`},
		{"openai model", "/v1/models/d", keyBD, false, `{"id":"d","object":"model","created":0,"owned_by":"rolter"}`},
		{"anthropic model", "/v1/models/d", keyBD, true, `{"type":"model","id":"d","display_name":"d","created_at":"1970-01-01T00:00:00Z"}`},
		// The query is Anthropic's: an OpenAI client's list ignores it.
		{"openai list ignores limit", "/v1/models?limit=0", keyBD, false,
			`{"object":"list","data":[{"id":"b","object":"model","created":0,"owned_by":"rolter"},{"id":"d","object":"model","created":0,"owned_by":"rolter"}]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, h, b := getModels(t, http.MethodGet, srv.URL+tc.path, tc.key, tc.anthropic)
			if status != 200 || h.Get("Content-Type") != "application/json" || strings.TrimSpace(string(b)) != tc.want {
				t.Fatalf("%d %s\n got %s\nwant %s", status, h.Get("Content-Type"), b, tc.want)
			}
			// HEAD answers as GET does, without the body.
			status, h, b = getModels(t, http.MethodHead, srv.URL+tc.path, tc.key, tc.anthropic)
			if status != 200 || h.Get("Content-Type") != "application/json" || len(b) != 0 {
				t.Fatalf("HEAD: %d %s, %d body bytes; want 200, application/json, none", status, h.Get("Content-Type"), len(b))
			}
		})
	}
}

func TestModelsAnthropicPages(t *testing.T) {
	_, srv := newTestProxy(t, modelsDoc(newUpstream(t, "a")))
	tests := []struct {
		name, query, key string
		want             []string
		hasMore          bool
	}{
		{"default limit: all five", "", keyAll, []string{"a", "b", "c", "d", "e"}, false},
		{"limit 1", "limit=1", keyAll, []string{"a"}, true},
		{"limit 2 from the start", "limit=2", keyAll, []string{"a", "b"}, true},
		{"limit exactly the list", "limit=5", keyAll, []string{"a", "b", "c", "d", "e"}, false},
		{"limit 1000", "limit=1000", keyAll, []string{"a", "b", "c", "d", "e"}, false},
		{"after_id: the next page", "limit=2&after_id=b", keyAll, []string{"c", "d"}, true},
		{"after_id: the last page, short", "limit=2&after_id=c", keyAll, []string{"d", "e"}, false},
		{"after_id: the last model", "after_id=e", keyAll, []string{}, false},
		{"before_id: the previous page", "limit=2&before_id=e", keyAll, []string{"c", "d"}, true},
		{"before_id: the first page", "limit=2&before_id=c", keyAll, []string{"a", "b"}, false},
		{"before_id: a short first page", "limit=3&before_id=b", keyAll, []string{"a"}, false},
		{"before_id: the first model", "before_id=a", keyAll, []string{}, false},
		{"the key's list is paged", "limit=1", keyBD, []string{"b"}, true},
		{"after_id in the key's list", "limit=1&after_id=b", keyBD, []string{"d"}, false},
		{"before_id in the key's list", "before_id=d", keyBD, []string{"b"}, false},
		{"other parameters are ignored", "lifecycle%5B%5D=active&limit=1", keyAll, []string{"a"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, _, b := getModels(t, http.MethodGet, srv.URL+"/v1/models?"+tc.query, tc.key, true)
			var got anthropicModelList
			if status != 200 || json.Unmarshal(b, &got) != nil {
				t.Fatalf("%d %s", status, b)
			}
			ids := []string{}
			for _, m := range got.Data {
				ids = append(ids, m.ID)
			}
			if !slices.Equal(ids, tc.want) || got.HasMore != tc.hasMore {
				t.Fatalf("%v has_more %v, want %v has_more %v", ids, got.HasMore, tc.want, tc.hasMore)
			}
			if len(ids) == 0 {
				if got.FirstID != nil || got.LastID != nil || !strings.Contains(string(b), `"first_id":null,"last_id":null`) {
					t.Fatalf("an empty page's ids: %s", b)
				}
			} else if got.FirstID == nil || got.LastID == nil || *got.FirstID != ids[0] || *got.LastID != ids[len(ids)-1] {
				t.Fatalf("first_id %v last_id %v of %v", got.FirstID, got.LastID, ids)
			}
		})
	}
}

// Every refusal on the models paths is in the caller's dialect; an
// Anthropic client gets Anthropic's error shape and types.
func TestModelsErrorsInTheClientsDialect(t *testing.T) {
	u := newUpstream(t, "a")
	_, srv := newTestProxy(t, modelsDoc(u))
	tests := []struct {
		name, method, path, key string
		anthropic               bool
		status                  int
		code, typ, msg          string
	}{
		{"limit 0", "GET", "/v1/models?limit=0", keyAll, true, 400, "invalid_request", "invalid_request_error", "limit: must be an integer from 1 to 1000"},
		{"limit 1001", "GET", "/v1/models?limit=1001", keyAll, true, 400, "invalid_request", "invalid_request_error", "limit"},
		{"limit negative", "GET", "/v1/models?limit=-1", keyAll, true, 400, "invalid_request", "invalid_request_error", "limit"},
		{"limit not a number", "GET", "/v1/models?limit=ten", keyAll, true, 400, "invalid_request", "invalid_request_error", `got "ten"`},
		{"limit not an integer", "GET", "/v1/models?limit=1.5", keyAll, true, 400, "invalid_request", "invalid_request_error", "limit"},
		{"limit empty", "GET", "/v1/models?limit=", keyAll, true, 400, "invalid_request", "invalid_request_error", "limit"},
		{"after_id unknown", "GET", "/v1/models?after_id=zz", keyAll, true, 400, "invalid_request", "invalid_request_error", `after_id: no model "zz"`},
		{"before_id unknown", "GET", "/v1/models?before_id=zz", keyAll, true, 400, "invalid_request", "invalid_request_error", `before_id: no model "zz"`},
		// As unknown as zz: nothing tells the key c exists.
		{"after_id the key may not use", "GET", "/v1/models?after_id=c", keyBD, true, 400, "invalid_request", "invalid_request_error", `after_id: no model "c"`},
		{"before_id the key may not use", "GET", "/v1/models?before_id=c", keyBD, true, 400, "invalid_request", "invalid_request_error", `before_id: no model "c"`},
		{"after_id and before_id", "GET", "/v1/models?after_id=a&before_id=e", keyAll, true, 400, "invalid_request", "invalid_request_error", "at most one"},
		{"malformed query", "GET", "/v1/models?limit=%zz", keyAll, true, 400, "invalid_request", "invalid_request_error", "malformed query"},
		{"anthropic: unknown model", "GET", "/v1/models/zz", keyAll, true, 404, "model_not_found", "not_found_error", `"zz" does not exist`},
		{"anthropic: a model the key may not use", "GET", "/v1/models/c", keyBD, true, 404, "model_not_found", "not_found_error", `"c" does not exist`},
		{"anthropic: wrong key on the list", "GET", "/v1/models", "sk-rolter-wrong-00000000", true, 401, "invalid_api_key", "authentication_error", "invalid api key"},
		{"anthropic: wrong key on a model", "GET", "/v1/models/a", "sk-rolter-wrong-00000000", true, 401, "invalid_api_key", "authentication_error", "invalid api key"},
		{"anthropic: POST the list", "POST", "/v1/models", keyAll, true, 405, "method_not_allowed", "invalid_request_error", "use GET"},
		{"anthropic: DELETE a model", "DELETE", "/v1/models/a", keyAll, true, 405, "method_not_allowed", "invalid_request_error", "use GET"},
		{"openai: unknown model", "GET", "/v1/models/zz", keyAll, false, 404, "model_not_found", "invalid_request_error", `"zz" does not exist`},
		{"openai: POST the list", "POST", "/v1/models", keyAll, false, 405, "method_not_allowed", "invalid_request_error", "use GET"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, h, b := getModels(t, tc.method, srv.URL+tc.path, tc.key, tc.anthropic)
			if status != tc.status || h.Get("X-Rolter-Error") != tc.code {
				t.Fatalf("%d %s %s", status, h.Get("X-Rolter-Error"), b)
			}
			var typ, msg string
			if tc.anthropic {
				var e anthropicErrorBody
				if err := json.Unmarshal(b, &e); err != nil || e.Type != "error" {
					t.Fatalf("not Anthropic's error shape: %s", b)
				}
				typ, msg = e.Error.Type, e.Error.Message
			} else {
				var e openAIErrorBody
				if err := json.Unmarshal(b, &e); err != nil || e.Error.Code != tc.code {
					t.Fatalf("not OpenAI's error shape: %s", b)
				}
				typ, msg = e.Error.Type, e.Error.Message
			}
			if typ != tc.typ || !strings.Contains(msg, tc.msg) {
				t.Fatalf("type %q message %q, want %q containing %q", typ, msg, tc.typ, tc.msg)
			}
		})
	}
	if u.hits.Load() != 0 {
		t.Fatalf("the upstream was called %d times", u.hits.Load())
	}
	// Before the first config, too.
	bare := newServer(t, New(Options{}))
	for _, path := range []string{"/v1/models", "/v1/models/a"} {
		status, _, b := getModels(t, http.MethodGet, bare+path, keyAll, true)
		var e anthropicErrorBody
		if status != 503 || json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != "overloaded_error" {
			t.Fatalf("%s before a config: %d %s", path, status, b)
		}
	}
}

// Paging through the Anthropic list with every limit, forward and back,
// gives the OpenAI list: the two shapes list the same models in the same
// order, for every key.
func TestModelsBothShapesListTheSame(t *testing.T) {
	_, srv := newTestProxy(t, modelsDoc(newUpstream(t, "a")))
	for _, key := range []string{keyAll, keyBD} {
		_, _, b := getModels(t, http.MethodGet, srv.URL+"/v1/models", key, false)
		var list modelList
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, m := range list.Data {
			want = append(want, m.ID)
		}
		last := want[len(want)-1]
		for limit := 1; limit <= len(want)+1; limit++ {
			// Forward from the start, then back from the last model (which
			// that walk leaves out), as the SDKs' auto-paging does.
			fwd := walkModels(t, srv.URL, key, limit, "after_id", "", func(pg anthropicModelList) *string { return pg.LastID })
			back := walkModels(t, srv.URL, key, limit, "before_id", last, func(pg anthropicModelList) *string { return pg.FirstID })
			back = append(back, last)
			if !slices.Equal(fwd, want) || !slices.Equal(back, want) {
				t.Fatalf("key %s, limit %d: forward %v, back %v, the OpenAI list %v", key, limit, fwd, back, want)
			}
		}
	}
}

// walkModels pages through an Anthropic client's list while has_more,
// the next cursor taken from each page by next; it returns the models in
// list order.
func walkModels(t *testing.T, base, key string, limit int, param, cursor string, next func(anthropicModelList) *string) []string {
	t.Helper()
	var ids []string
	for range 100 { // a bound, so that a has_more that never ends fails
		q := "limit=" + strconv.Itoa(limit)
		if cursor != "" {
			q += "&" + param + "=" + url.QueryEscape(cursor)
		}
		status, _, b := getModels(t, http.MethodGet, base+"/v1/models?"+q, key, true)
		var pg anthropicModelList
		if status != 200 || json.Unmarshal(b, &pg) != nil {
			t.Fatalf("%s: %d %s", q, status, b)
		}
		var page []string
		for _, m := range pg.Data {
			page = append(page, m.ID)
		}
		if param == "before_id" {
			ids = append(page, ids...)
		} else {
			ids = append(ids, page...)
		}
		if !pg.HasMore {
			return ids
		}
		if c := next(pg); c != nil {
			cursor = *c
		}
	}
	t.Fatal("has_more never ended")
	return nil
}

// FuzzModelPage checks the parser of an Anthropic client's list query
// and the page it selects: whatever the query, a parsed limit is in
// bounds, and the page is the run of models next to the cursor, no longer
// than the limit, with has_more true exactly when models lie beyond it.
func FuzzModelPage(f *testing.F) {
	for _, q := range []string{"", "limit=2", "limit=0", "limit=1001", "after_id=b&limit=2", "before_id=d", "before_id=e&limit=2", "before_id=a&after_id=b",
		"limit=%zz", "limit=+3", "limit=03", "limit=1&limit=2", "after_id=", "lifecycle[]=active", "after_id=a;b", "limit=9999999999999999999"} {
		f.Add(q)
	}
	ids := []string{"a", "b", "c", "d", "e"}
	f.Fuzz(func(t *testing.T, q string) {
		pg, err := parseModelPage(q)
		if err != nil {
			return
		}
		if pg.limit < 1 || pg.limit > modelPageMax || pg.afterID != "" && pg.beforeID != "" {
			t.Fatalf("parsed %q as %+v", q, pg)
		}
		page, hasMore, err := pg.window(ids)
		cursor := pg.afterID + pg.beforeID
		if err != nil {
			if cursor == "" || slices.Contains(ids, cursor) {
				t.Fatalf("%q: %v", q, err)
			}
			return
		}
		if len(page) > pg.limit {
			t.Fatalf("%q: %d models over limit %d", q, len(page), pg.limit)
		}
		start := 0 // where page lies in ids
		switch {
		case pg.afterID != "":
			start = slices.Index(ids, pg.afterID) + 1
		case pg.beforeID != "":
			start = slices.Index(ids, pg.beforeID) - len(page)
		}
		if start < 0 || !slices.Equal(ids[start:start+len(page)], page) {
			t.Fatalf("%q: page %v is not next to the cursor", q, page)
		}
		beyond := start > 0
		if pg.beforeID == "" {
			beyond = start+len(page) < len(ids)
		}
		if hasMore != beyond || len(page) < pg.limit && hasMore {
			t.Fatalf("%q: page %v has_more %v", q, page, hasMore)
		}
	})
}
