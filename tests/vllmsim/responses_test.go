package vllmsim_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"rolter.dev/tests/vllmsim"
)

type responseObject struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	CreatedAt         int64  `json:"created_at"`
	Status            string `json:"status"`
	Model             string `json:"model"`
	Background        bool   `json:"background"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Status  string `json:"status"`
		Role    string `json:"role"`
		Content []struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			Annotations []any  `json:"annotations"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		TotalTokens        int `json:"total_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokensDetails struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
	} `json:"usage"`
}

func (r responseObject) text() string {
	if len(r.Output) == 0 || len(r.Output[0].Content) == 0 {
		return ""
	}
	return r.Output[0].Content[0].Text
}

func TestResponses(t *testing.T) {
	sysUser := promptTokens(vllmsim.Message{Role: "system", Content: "be brief"}, vllmsim.Message{Role: "user", Content: "hello"})
	tests := []struct {
		name       string
		body       string
		wantStatus string
		wantInput  int
		wantOutput int
	}{
		{
			name:       "string input with instructions completes",
			body:       `{"model":"sim-model","instructions":"be brief","input":"hello"}`,
			wantStatus: "completed", wantInput: len(sysUser), wantOutput: vllmsim.DefaultMaxTokens,
		},
		{
			name: "input items give the same prompt",
			body: `{"model":"sim-model","input":[{"role":"system","content":"be brief"},
				{"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}]}]}`,
			wantStatus: "completed", wantInput: len(sysUser), wantOutput: vllmsim.DefaultMaxTokens,
		},
		{
			name:       "max_output_tokens reached is incomplete",
			body:       `{"model":"sim-model","instructions":"be brief","input":"hello","max_output_tokens":3}`,
			wantStatus: "incomplete", wantInput: len(sysUser), wantOutput: 3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{})
			r := decode[responseObject](t, post(t, ts, "/v1/responses", tc.body, http.StatusOK))
			if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.CreatedAt == 0 || r.Model != "sim-model" {
				t.Errorf("envelope = %+v", r)
			}
			if r.Status != tc.wantStatus {
				t.Errorf("status = %q, want %q", r.Status, tc.wantStatus)
			}
			if (tc.wantStatus == "incomplete") != (r.IncompleteDetails != nil && r.IncompleteDetails.Reason == "max_output_tokens") {
				t.Errorf("incomplete_details = %+v", r.IncompleteDetails)
			}
			if len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" ||
				!strings.HasPrefix(r.Output[0].ID, "msg_") || r.Output[0].Status != tc.wantStatus ||
				len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" || r.Output[0].Content[0].Annotations == nil {
				t.Fatalf("output = %+v", r.Output)
			}
			if got := len(vllmsim.Tokenize(r.text())); got != tc.wantOutput {
				t.Errorf("output has %d tokens, want %d", got, tc.wantOutput)
			}
			u := r.Usage
			if u == nil || u.InputTokens != tc.wantInput || u.OutputTokens != tc.wantOutput || u.TotalTokens != tc.wantInput+tc.wantOutput {
				t.Errorf("usage = %+v, want input %d output %d", u, tc.wantInput, tc.wantOutput)
			}
		})
	}
}

func TestResponsesStream(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	whole := decode[responseObject](t, post(t, ts, "/v1/responses", `{"model":"sim-model","input":"tell me","max_output_tokens":2}`, http.StatusOK))
	events := parseSSE(t, post(t, ts, "/v1/responses", `{"model":"sim-model","input":"tell me","max_output_tokens":2,"stream":true}`, http.StatusOK))
	var names []string
	var text strings.Builder
	var final responseObject
	for i, e := range events {
		names = append(names, e.name)
		data := decode[map[string]any](t, []byte(e.data))
		if data["type"] != e.name || data["sequence_number"] != float64(i) {
			t.Errorf("event %d %q: type %v sequence_number %v", i, e.name, data["type"], data["sequence_number"])
		}
		switch e.name {
		case "response.output_text.delta":
			text.WriteString(data["delta"].(string))
		case "response.incomplete", "response.completed":
			final = decode[struct {
				Response responseObject `json:"response"`
			}](t, []byte(e.data)).Response
		}
	}
	want := []string{
		"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.done",
		"response.content_part.done", "response.output_item.done", "response.incomplete",
	}
	if !slices.Equal(names, want) {
		t.Errorf("events = %v\nwant %v", names, want)
	}
	if text.String() != whole.text() || final.text() != whole.text() {
		t.Errorf("streamed %q, final %q, non-streamed %q", text.String(), final.text(), whole.text())
	}
	if final.Usage == nil || final.Usage.OutputTokens != 2 || final.Status != "incomplete" {
		t.Errorf("final response = %+v", final)
	}
}

func TestResponsesPreviousResponseID(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{BlockSize: 4})
	first := decode[responseObject](t, post(t, ts, "/v1/responses",
		`{"model":"sim-model","instructions":"be brief","input":"what is a prefix cache"}`, http.StatusOK))

	second := decode[responseObject](t, post(t, ts, "/v1/responses",
		`{"model":"sim-model","instructions":"be brief","previous_response_id":"`+first.ID+`","input":"and a block"}`, http.StatusOK))
	wantPrompt := promptTokens(
		vllmsim.Message{Role: "system", Content: "be brief"},
		vllmsim.Message{Role: "user", Content: "what is a prefix cache"},
		vllmsim.Message{Role: "assistant", Content: first.text()},
		vllmsim.Message{Role: "user", Content: "and a block"},
	)
	if second.Usage.InputTokens != len(wantPrompt) {
		t.Errorf("input_tokens = %d, want %d (the previous turn is part of the prompt)", second.Usage.InputTokens, len(wantPrompt))
	}
	if second.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Errorf("continuing a conversation hit no cached tokens")
	}

	status, b := do(t, ts, http.MethodPost, "/v1/responses", `{"model":"sim-model","previous_response_id":"resp_unknown","input":"x"}`)
	if status != http.StatusNotFound || string(b) != notFoundBody("resp_unknown") {
		t.Errorf("unknown previous_response_id: %d %s\nwant %s", status, b, notFoundBody("resp_unknown"))
	}
	_, other := newServer(t, vllmsim.Options{})
	status, _ = do(t, other, http.MethodPost, "/v1/responses", `{"model":"sim-model","previous_response_id":"`+first.ID+`","input":"x"}`)
	if status != http.StatusNotFound {
		t.Errorf("another replica knows response %s: status %d", first.ID, status)
	}
}

func TestResponsesSDK(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("unused"),
		option.WithHTTPClient(ts.Client()), option.WithMaxRetries(0))
	params := responses.ResponseNewParams{
		Model:        "sim-model",
		Instructions: openai.String("be brief"),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("hello sdk")},
	}
	resp, err := client.Responses.New(t.Context(), params, option.WithJSONSet("request_id", "resp_sdk"))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if resp.ID != "resp_sdk" {
		t.Errorf("id = %q, want the request_id resp_sdk", resp.ID)
	}
	got, err := client.Responses.Get(t.Context(), resp.ID, responses.ResponseGetParams{})
	if err != nil || got.ID != resp.ID || got.OutputText() != resp.OutputText() || got.Usage.TotalTokens != resp.Usage.TotalTokens {
		t.Errorf("Get = %+v, %v; want the created response", got, err)
	}
	_, err = client.Responses.Cancel(t.Context(), resp.ID)
	if apiErr, ok := errors.AsType[*openai.Error](err); !ok || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "response_id" {
		t.Errorf("Cancel: %v, want vLLM's 400", err)
	}
	if resp.Status != responses.ResponseStatusCompleted || len(vllmsim.Tokenize(resp.OutputText())) != vllmsim.DefaultMaxTokens {
		t.Errorf("response = status %s text %q", resp.Status, resp.OutputText())
	}
	if resp.Usage.OutputTokens != vllmsim.DefaultMaxTokens || resp.Usage.InputTokens == 0 {
		t.Errorf("usage = %+v", resp.Usage)
	}

	stream := client.Responses.NewStreaming(t.Context(), params)
	defer stream.Close()
	var deltas strings.Builder
	var completed *responses.Response
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.AsResponseOutputTextDelta().Delta)
		case "response.completed":
			r := ev.AsResponseCompleted().Response
			completed = &r
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if completed == nil {
		t.Fatalf("no response.completed event")
	}
	if deltas.String() != resp.OutputText() || completed.OutputText() != resp.OutputText() {
		t.Errorf("streamed %q, completed %q, non-streamed %q", deltas.String(), completed.OutputText(), resp.OutputText())
	}
	if completed.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Errorf("the repeated prompt hit no cached tokens: %+v", completed.Usage)
	}
}

// errorBody is vLLM's OpenAI error object.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

// notFoundBody is vLLM's answer to an unknown response id
// (_make_not_found_error, responses/serving.py at 055e47c28003).
func notFoundBody(id string) string {
	return `{"error":{"message":"Response with id '` + id + `' not found.","type":"invalid_request_error","param":"response_id","code":404}}`
}

// streamedResponse returns the response object of a stream's last event
// (response.completed or response.incomplete), as sent.
func streamedResponse(t *testing.T, body []byte) []byte {
	t.Helper()
	events := parseSSE(t, body)
	if len(events) == 0 {
		t.Fatalf("empty stream")
	}
	return decode[struct {
		Response json.RawMessage `json:"response"`
	}](t, []byte(events[len(events)-1].data)).Response
}

func TestResponsesRequestID(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	r := decode[responseObject](t, post(t, ts, "/v1/responses", `{"input":"hi","request_id":"resp_client_1"}`, http.StatusOK))
	if r.ID != "resp_client_1" {
		t.Errorf("id = %q, want the request_id resp_client_1", r.ID)
	}

	// Every event that carries the response carries the id.
	events := parseSSE(t, post(t, ts, "/v1/responses", `{"input":"hi","request_id":"client-2","stream":true}`, http.StatusOK))
	var carrying []string
	for _, e := range events {
		ev := decode[struct {
			Response *responseObject `json:"response"`
		}](t, []byte(e.data))
		if ev.Response == nil {
			continue
		}
		carrying = append(carrying, e.name)
		if ev.Response.ID != "client-2" {
			t.Errorf("%s: response id = %q, want the request_id client-2", e.name, ev.Response.ID)
		}
	}
	if want := []string{"response.created", "response.in_progress", "response.completed"}; !slices.Equal(carrying, want) {
		t.Errorf("events with a response = %v, want %v", carrying, want)
	}

	// request_id is a str in vLLM's ResponsesRequest: pydantic refuses
	// anything else, null included.
	for _, bad := range []string{`1`, `null`, `true`, `{"id":"x"}`, `["x"]`} {
		status, b := do(t, ts, http.MethodPost, "/v1/responses", `{"input":"hi","request_id":`+bad+`}`)
		e := decode[errorBody](t, b)
		if status != http.StatusBadRequest || e.Error.Type != "BadRequestError" || e.Error.Param == nil || *e.Error.Param != "body.request_id" {
			t.Errorf("request_id %s: %d %s, want a 400 on body.request_id", bad, status, b)
		}
	}
}

func TestResponsesStore(t *testing.T) {
	tests := []struct {
		name       string
		fields     string // extra request fields
		stream     bool
		wantStored bool
	}{
		{name: "stored by default", wantStored: true},
		{name: "stored by default, streamed", stream: true, wantStored: true},
		{name: "store true", fields: `,"store":true`, wantStored: true},
		{name: "store false", fields: `,"store":false`},
		{name: "store false, streamed", fields: `,"store":false`, stream: true},
		{name: "store null is vLLM's None: not stored", fields: `,"store":null`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := newServer(t, vllmsim.Options{})
			body := `{"input":"remember me","request_id":"resp_kept"` + tc.fields + `}`
			var created []byte // the response object as the create call answered it
			if tc.stream {
				created = streamedResponse(t, post(t, ts, "/v1/responses", strings.TrimSuffix(body, "}")+`,"stream":true}`, http.StatusOK))
			} else {
				created = post(t, ts, "/v1/responses", body, http.StatusOK)
			}
			want := decode[map[string]any](t, created)
			if want["id"] != "resp_kept" || want["store"] != tc.wantStored {
				t.Errorf("created id %v store %v, want resp_kept %v", want["id"], want["store"], tc.wantStored)
			}

			status, b := do(t, ts, http.MethodGet, "/v1/responses/resp_kept", "")
			switch {
			case !tc.wantStored && (status != http.StatusNotFound || string(b) != notFoundBody("resp_kept")):
				t.Errorf("GET of an unstored response: %d %s\nwant 404 %s", status, b, notFoundBody("resp_kept"))
			case tc.wantStored && status != http.StatusOK:
				t.Errorf("GET: %d %s", status, b)
			case tc.wantStored && !reflect.DeepEqual(decode[map[string]any](t, b), want):
				t.Errorf("GET = %s\nwant the created response %s", b, created)
			}

			wantStatus := http.StatusNotFound
			if tc.wantStored {
				wantStatus = http.StatusOK
			}
			status, b = do(t, ts, http.MethodPost, "/v1/responses", `{"input":"go on","previous_response_id":"resp_kept"}`)
			if status != wantStatus {
				t.Errorf("continuing it: %d %s, want %d", status, b, wantStatus)
			}
		})
	}
}

func TestResponsesRetrieve(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	first := decode[responseObject](t, post(t, ts, "/v1/responses", `{"input":"first","request_id":"resp_twice"}`, http.StatusOK))
	second := decode[responseObject](t, post(t, ts, "/v1/responses", `{"input":"second try","request_id":"resp_twice"}`, http.StatusOK))
	if first.text() == second.text() {
		t.Fatalf("two inputs gave the same text %q", first.text())
	}
	// A repeated request_id replaces the stored response, as in vLLM's
	// response_store.
	got := decode[responseObject](t, func() []byte {
		status, b := do(t, ts, http.MethodGet, "/v1/responses/resp_twice", "")
		if status != http.StatusOK {
			t.Fatalf("GET: %d %s", status, b)
		}
		return b
	}())
	if got.text() != second.text() {
		t.Errorf("GET text = %q, want the later response's %q", got.text(), second.text())
	}

	tests := []struct {
		name       string
		path       string
		wantStatus int
		wantBody   string // exact, if set
		wantParam  string // error.param, if set
	}{
		{name: "stored", path: "/v1/responses/resp_twice", wantStatus: 200},
		{name: "stream=false", path: "/v1/responses/resp_twice?stream=false", wantStatus: 200},
		{name: "starting_after without stream", path: "/v1/responses/resp_twice?starting_after=3", wantStatus: 200},
		{name: "unknown id", path: "/v1/responses/resp_nope", wantStatus: 404, wantBody: notFoundBody("resp_nope")},
		{name: "unknown id, stream=true", path: "/v1/responses/resp_nope?stream=true", wantStatus: 404, wantBody: notFoundBody("resp_nope")},
		{name: "stream=true is not replayed", path: "/v1/responses/resp_twice?stream=true", wantStatus: 400},
		{name: "stream=Yes is pydantic's true", path: "/v1/responses/resp_twice?stream=Yes", wantStatus: 400},
		{name: "stream not a boolean", path: "/v1/responses/resp_nope?stream=maybe", wantStatus: 400, wantParam: "query.stream"},
		{name: "starting_after not an integer", path: "/v1/responses/resp_nope?starting_after=x", wantStatus: 400, wantParam: "query.starting_after"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, b := do(t, ts, http.MethodGet, tc.path, "")
			if status != tc.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", status, tc.wantStatus, b)
			}
			switch {
			case tc.wantBody != "" && string(b) != tc.wantBody:
				t.Errorf("body = %s\nwant %s", b, tc.wantBody)
			case tc.wantParam != "":
				if e := decode[errorBody](t, b); e.Error.Param == nil || *e.Error.Param != tc.wantParam {
					t.Errorf("body = %s, want param %s", b, tc.wantParam)
				}
			case status == http.StatusOK:
				if r := decode[responseObject](t, b); r.ID != "resp_twice" || r.text() != second.text() {
					t.Errorf("response = %+v", r)
				}
			case status == http.StatusBadRequest:
				if !strings.Contains(string(b), "vllmsim does not replay streams") {
					t.Errorf("body = %s, want vllmsim's refusal to replay", b)
				}
			}
		})
	}

	// The store is the replica's own.
	_, other := newServer(t, vllmsim.Options{})
	if status, b := do(t, other, http.MethodGet, "/v1/responses/resp_twice", ""); status != http.StatusNotFound || string(b) != notFoundBody("resp_twice") {
		t.Errorf("another replica: %d %s, want 404", status, b)
	}
}

func TestResponsesCancel(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	status, b := do(t, ts, http.MethodPost, "/v1/responses/resp_nope/cancel", "")
	if status != http.StatusNotFound || string(b) != notFoundBody("resp_nope") {
		t.Errorf("unknown id: %d %s\nwant 404 %s", status, b, notFoundBody("resp_nope"))
	}

	// A finished synchronous response cannot be cancelled; vLLM's
	// cancel_responses answers this 400 and leaves it as it is.
	created := post(t, ts, "/v1/responses", `{"input":"done","request_id":"resp_done"}`, http.StatusOK)
	status, b = do(t, ts, http.MethodPost, "/v1/responses/resp_done/cancel", "")
	const want = `{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","param":"response_id","code":400}}`
	if status != http.StatusBadRequest || string(b) != want {
		t.Errorf("finished response: %d %s\nwant 400 %s", status, b, want)
	}
	if status, b := do(t, ts, http.MethodGet, "/v1/responses/resp_done", ""); status != http.StatusOK || !reflect.DeepEqual(decode[map[string]any](t, b), decode[map[string]any](t, created)) {
		t.Errorf("after the refused cancel, GET = %d %s\nwant %s", status, b, created)
	}

	post(t, ts, "/v1/responses", `{"input":"done","request_id":"resp_unkept","store":false}`, http.StatusOK)
	if status, b := do(t, ts, http.MethodPost, "/v1/responses/resp_unkept/cancel", ""); status != http.StatusNotFound || string(b) != notFoundBody("resp_unkept") {
		t.Errorf("unstored response: %d %s, want 404", status, b)
	}
}

func TestResponsesBackgroundRefused(t *testing.T) {
	tests := []struct {
		name      string
		fields    string
		wantMsg   string // a 400's message; "" for 200
		wantParam string
	}{
		{name: "background false", fields: `"background":false`},
		{name: "background null", fields: `"background":null`},
		// vLLM's own 400 (validate_background).
		{name: "background without store", fields: `"background":true,"store":false`, wantMsg: "background can only be used when `store` is true", wantParam: "background"},
		{name: "background with store null", fields: `"background":true,"store":null`, wantMsg: "background can only be used when `store` is true", wantParam: "background"},
		{name: "background without store, streamed", fields: `"background":true,"store":false,"stream":true`, wantMsg: "background can only be used when `store` is true", wantParam: "background"},
		// vllmsim's: it does not stream background responses.
		{name: "background streamed", fields: `"background":true,"store":true,"stream":true`, wantMsg: "vllmsim does not stream background responses", wantParam: "stream"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sim, ts := newServer(t, vllmsim.Options{})
			status, b := do(t, ts, http.MethodPost, "/v1/responses", `{"input":"later","request_id":"resp_bg",`+tc.fields+`}`)
			if tc.wantMsg == "" {
				if r := decode[responseObject](t, b); status != http.StatusOK || r.Status != "completed" || r.Background {
					t.Errorf("%d %s, want a synchronous 200", status, b)
				}
				return
			}
			e := decode[errorBody](t, b)
			if status != http.StatusBadRequest || !strings.Contains(e.Error.Message, tc.wantMsg) || e.Error.Param == nil || *e.Error.Param != tc.wantParam {
				t.Errorf("%d %s, want a 400 on %s saying %q", status, b, tc.wantParam, tc.wantMsg)
			}
			if status, _ := do(t, ts, http.MethodGet, "/v1/responses/resp_bg", ""); status != http.StatusNotFound {
				t.Errorf("a refused request was stored: GET %d", status)
			}
			if n := sim.Stats().Requests; n != 0 {
				t.Errorf("a refused request was admitted: %d requests", n)
			}
		})
	}
}

func TestResponsesRoutes(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	tests := []struct {
		method, path string
		wantStatus   int
		wantAllow    string // the Allow header of a 405
		wantType     string // error.type; "" for no body (HEAD)
		wantBody     string // exact, if set
	}{
		{http.MethodPost, "/v1/responses/resp_x", 405, "GET", "MethodNotAllowedError", ""},
		{http.MethodDelete, "/v1/responses/resp_x", 405, "GET", "MethodNotAllowedError", ""},
		{http.MethodGet, "/v1/responses/resp_x/cancel", 405, "POST", "MethodNotAllowedError", ""},
		{http.MethodPut, "/v1/responses/resp_x/cancel", 405, "POST", "MethodNotAllowedError", ""},
		{http.MethodHead, "/v1/responses/resp_x", 404, "", "", ""},
		{http.MethodGet, "/v1/responses/", 404, "", "NotFoundError", ""},
		{http.MethodGet, "/v1/responses/resp_x/", 404, "", "NotFoundError", ""},
		{http.MethodGet, "/v1/responses/resp_x/input_items", 404, "", "NotFoundError", ""},
		{http.MethodPost, "/v1/responses/resp_x/cancel/", 404, "", "NotFoundError", ""},
		{http.MethodPost, "/v1/responses//cancel", 404, "", "NotFoundError", ""},
		// The pattern's own text is an id like any other.
		{http.MethodGet, "/v1/responses/{response_id}", 404, "", "invalid_request_error", notFoundBody("{response_id}")},
		{http.MethodPost, "/v1/responses/cancel", 405, "GET", "MethodNotAllowedError", ""},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tc.method, ts.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.wantStatus || resp.Header.Get("Allow") != tc.wantAllow {
				t.Fatalf("status %d Allow %q, want %d %q; body %s", resp.StatusCode, resp.Header.Get("Allow"), tc.wantStatus, tc.wantAllow, b)
			}
			if tc.wantType != "" {
				if e := decode[errorBody](t, b); e.Error.Type != tc.wantType || e.Error.Code != tc.wantStatus {
					t.Errorf("body = %s, want type %s", b, tc.wantType)
				}
			}
			if tc.wantBody != "" && string(b) != tc.wantBody {
				t.Errorf("body = %s\nwant %s", b, tc.wantBody)
			}
		})
	}
}

// TestResponsesFunctionToolsInPrompt: a Responses request's function tools
// are in its prompt as vLLM renders them, the chat tool of their
// FunctionTool dump (every field but type, null where left out), so the
// chat /tokenize of that form counts its prompt exactly; other tools add
// nothing.
func TestResponsesFunctionToolsInPrompt(t *testing.T) {
	_, ts := newServer(t, vllmsim.Options{})
	inputTokens := func(tools string) int {
		b := post(t, ts, "/v1/responses", `{"model":"sim-model","input":"look it up","max_output_tokens":1`+tools+`}`, http.StatusOK)
		return decode[struct {
			Usage struct {
				InputTokens int `json:"input_tokens"`
			} `json:"usage"`
		}](t, b).Usage.InputTokens
	}
	plain := inputTokens("")
	if got := inputTokens(`,"tools":[{"type":"web_search"}]`); got != plain {
		t.Fatalf("a built-in tool changed the prompt: %d tokens, %d without", got, plain)
	}
	withTools := inputTokens(`,"tools":[{"type":"function","name":"lookup","description":"find it","parameters":{"type":"object"}}]`)
	chatForm := post(t, ts, "/tokenize", `{"model":"sim-model","messages":[{"role":"user","content":"look it up"}],"add_generation_prompt":true,"add_special_tokens":true,`+
		`"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"},"strict":null,"allowed_callers":null,"defer_loading":null,"description":"find it","output_schema":null}}]}`, http.StatusOK)
	count := decode[struct {
		Count int `json:"count"`
	}](t, chatForm).Count
	if withTools <= plain || withTools != count {
		t.Fatalf("with a function tool %d prompt tokens (%d without), the chat form's /tokenize %d", withTools, plain, count)
	}
}
