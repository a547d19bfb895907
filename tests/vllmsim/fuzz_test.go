package vllmsim_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"rolter.dev/tests/vllmsim"
)

// fuzzPaths are the endpoints FuzzRequestBody picks from.
var fuzzPaths = []string{
	"/v1/chat/completions", "/v1/completions", "/v1/messages",
	"/v1/responses", "/v1/embeddings", "/tokenize",
	"/v1/responses/resp_x/cancel",
	"/rerank", "/v1/rerank", "/v2/rerank", "/score", "/v1/score",
}

// checkFuzzResponse checks what any request body may get: a 200 with a JSON
// body or a well-formed event stream, or a client error with a JSON body.
func checkFuzzResponse(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	body := rec.Body.Bytes()
	switch rec.Code {
	case http.StatusOK:
		if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
			for chunk := range strings.SplitSeq(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
				for line := range strings.SplitSeq(chunk, "\n") {
					data, ok := strings.CutPrefix(line, "data: ")
					if ok && data != "[DONE]" && !json.Valid([]byte(data)) {
						t.Fatalf("invalid JSON event data %q", data)
					}
				}
			}
			return
		}
	case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge:
	default:
		t.Fatalf("status %d: %s", rec.Code, body)
	}
	if !json.Valid(body) {
		t.Fatalf("status %d with invalid JSON body %q", rec.Code, body)
	}
}

func newFuzzServer(f *testing.F) *vllmsim.Server {
	sim, err := vllmsim.New(vllmsim.Options{MaxModelLen: 256, CapacityBlocks: 64, BlockSize: 4, MaxBodyBytes: 1 << 16})
	if err != nil {
		f.Fatal(err)
	}
	return sim
}

// FuzzChatRequest feeds arbitrary bodies to the chat completions parser
// and handler: they must never panic, and must answer 200 or a client
// error in the OpenAI shape.
func FuzzChatRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"assistant","content":null},{"role":"tool","content":[{"text":"x"}]}],"max_completion_tokens":1}`,
		`{"messages":[{"role":"user","content":{"text":"x"}}]}`,
		`{"messages":[],"max_tokens":-1}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":1e300}`,
		`{"messages":[{"role":"user","content":"x"}],"n":3,"max_tokens":4,"logprobs":true,"top_logprobs":2,"stop":["a b","c"],"stream":true}`,
		`{"messages":[{"role":"user","content":"x"}],"n":0,"top_logprobs":1e40,"stop":[1],"min_tokens":-1}`,
		`{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":"x","stop":"","ignore_eos":true,"temperature":0,"n":2}`,
		`{"messages":[{"role":"user","content":"x"}],"ignore_eos":true,"min_tokens":300,"include_stop_str_in_output":true,"stop":"e"}`,
		`{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}],"echo":true,"n":2,"stop_token_ids":[1,"2",true,3.0],"min_tokens":2,"prompt_logprobs":2,"stream":false}`,
		`{"messages":[{"role":"user","content":[{"text":"x"}]}],"echo":true,"add_generation_prompt":false,"logprobs":true,"top_logprobs":3,"stream":true}`,
		`{"messages":[{"role":"user","content":"x"}],"stop_token_ids":[-1,2147483648,"x",null],"prompt_logprobs":-1,"stream":true}`,
		`{"messages":[{"role":"user","content":"x"}],"stop_token_ids":5,"prompt_logprobs":"2","echo":1,"top_logprobs":null}`,
		`[`, `null`, ``, `"just a string"`,
	} {
		f.Add([]byte(seed))
	}
	sim := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/v1/chat/completions", bytes.NewReader(body)))
		checkFuzzResponse(t, rec)
	})
}

// FuzzRequestBody does the same for every endpoint that reads a body.
func FuzzRequestBody(f *testing.F) {
	seeds := []string{
		`{"prompt":"hi","max_tokens":2}`,
		`{"prompt":[[1,2,3],[4]],"stream":true}`,
		`{"prompt":"hi there","n":2,"echo":true,"logprobs":3,"max_tokens":0,"stop":["e"],"stream":true}`,
		`{"prompt":[5,6],"echo":true,"logprobs":true,"min_tokens":2,"ignore_eos":true,"stop":"x","include_stop_str_in_output":true}`,
		`{"prompt":"x","logprobs":-1,"n":-1,"echo":null,"stop":["a","b","c","d","e"]}`,
		`{"prompt":"x","logprobs":1.5,"top_logprobs":3,"n":16385,"temperature":1e-9}`,
		`{"prompt":"hi there","n":3,"echo":true,"logprobs":1,"prompt_logprobs":3,"stop_token_ids":[7,"8",1e1],"include_stop_str_in_output":true}`,
		`{"prompt":[5,6,7],"prompt_logprobs":0,"stream":true,"stop_token_ids":[],"min_tokens":3}`,
		`{"prompt":"x","prompt_logprobs":21,"stop_token_ids":[-5,-5,1.5]}`,
		`{"messages":[{"role":"assistant","content":"a"}],"echo":true,"prompt_logprobs":1e400,"stop_token_ids":{}}`,
		`{"input":["a","b"],"encoding_format":"base64"}`,
		`{"input":[{"type":"function_call_output","output":[{"type":"input_text","text":"ok"}]},{"role":"user","content":"x"}],"instructions":"be"}`,
		`{"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"r"}]}]}],"stream":true}`,
		`{"messages":[{"role":"system","content":"s"},{"role":"assistant","content":[{"type":"tool_use","id":"u","input":{}},{"type":"tool_result","content":[1]}]},{"role":"user","content":[]}],"tools":[{"name":"f","input_schema":{}}]}`,
		`{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false}`,
		`{"previous_response_id":"resp_x","input":"y"}`,
		`{"input":"y","request_id":"resp_x","store":true}`,
		`{"input":"y","request_id":7,"store":null,"stream":true}`,
		`{"input":"y","background":true,"store":false}`,
		`{"input":"y","background":true,"max_output_tokens":2,"request_id":"resp_x"}`,
		`{"input":"y","background":true,"stream":true}`,
		`{"query":"a b","documents":["b c","a",""],"top_n":2}`,
		`{"query":{"content":[]},"documents":"x","top_n":-1,"use_activation":false}`,
		`{"query":"q","documents":["d e f g"],"truncate_prompt_tokens":2,"truncation_side":"left","padding":"max_length","max_tokens_per_doc":1}`,
		`{"queries":["a","b"],"documents":["c","d"],"top_n":"1.0","truncate_prompt_tokens":-1}`,
		`{"queries":"a","items":[],"max_tokens_per_query":300}`,
		`{"text_1":["x"],"text_2":["y",{"content":[{"type":"text","text":"z"}]}],"cache_salt":""}`,
		`{"data_1":"p","data_2":["q"],"priority":1e300,"use_activation":"yes"}`,
	}
	for i := range fuzzPaths {
		for _, s := range seeds {
			f.Add(uint8(i), []byte(s))
		}
	}
	sim := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		path := fuzzPaths[int(which)%len(fuzzPaths)]
		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodPost, path, bytes.NewReader(body)))
		checkFuzzResponse(t, rec)
	})
}

// FuzzResponsePaths feeds arbitrary ids, suffixes and query strings to GET
// and POST under /v1/responses/: they must never panic, and must answer
// the one stored response, or an error in the OpenAI shape.
func FuzzResponsePaths(f *testing.F) {
	for _, seed := range []struct {
		post        bool
		rest, query string
	}{
		{false, "resp_seed", ""},
		{false, "resp_seed", "stream=true&starting_after=2"},
		{false, "resp_seed", "stream=OFF&stream=maybe"},
		{true, "resp_seed/cancel", ""},
		{false, "resp_seed/cancel", ""},
		{true, "resp_seed", ""},
		{false, "", ""},
		{false, "{response_id}", "starting_after=%zz"},
		{true, "a//cancel", ""},
	} {
		f.Add(seed.post, seed.rest, seed.query)
	}
	sim := newFuzzServer(f)
	rec := httptest.NewRecorder()
	sim.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(`{"input":"hi","request_id":"resp_seed"}`)))
	if rec.Code != http.StatusOK {
		f.Fatalf("storing the seed response: %d %s", rec.Code, rec.Body)
	}
	f.Fuzz(func(t *testing.T, post bool, rest, query string) {
		method := http.MethodGet
		if post {
			method = http.MethodPost
		}
		req := httptest.NewRequestWithContext(t.Context(), method, "/", nil)
		req.URL.Path, req.URL.RawQuery = "/v1/responses/"+rest, query
		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		switch rec.Code {
		case http.StatusOK:
			if method != http.MethodGet || rest != "resp_seed" {
				t.Fatalf("%s %s: 200 %s", method, req.URL.Path, body)
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed:
		default:
			t.Fatalf("%s %s: status %d: %s", method, req.URL.Path, rec.Code, body)
		}
		if !json.Valid(body) {
			t.Fatalf("status %d with invalid JSON body %q", rec.Code, body)
		}
	})
}
