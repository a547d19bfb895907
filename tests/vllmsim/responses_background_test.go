package vllmsim_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"rolter.dev/tests/vllmsim"
)

// never is a time to first token no test waits out: a background request
// under it stays admitted until it is cancelled or reset.
const never = time.Hour

// newParkedServer starts a simulator whose requests never reach their
// first token; its background generations are stopped when the test ends.
func newParkedServer(t *testing.T, opts vllmsim.Options) (*vllmsim.Server, *httptest.Server) {
	t.Helper()
	opts.TTFT = never
	sim, ts := newServer(t, opts)
	t.Cleanup(sim.Reset)
	return sim, ts
}

// createBackground sends a background create and checks that it answers
// at once (the server does not wait for the generation; the bound only
// turns a hang into a failure) with the queued response vLLM stores.
func createBackground(t *testing.T, ts *httptest.Server, body string) (responseObject, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/responses", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatalf("background create: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("background create: %d %s", resp.StatusCode, b)
	}
	raw := decode[map[string]any](t, b)
	r := decode[responseObject](t, b)
	// ResponsesResponse.from_request(..., output=[], status="queued",
	// usage=None) in _create_responses (serving.py at 055e47c28003).
	if r.Status != "queued" || !r.Background || raw["store"] != true || r.Usage != nil || r.CreatedAt == 0 {
		t.Errorf("background create = %s, want queued, background, stored, without usage", b)
	}
	if out, ok := raw["output"].([]any); !ok || len(out) != 0 {
		t.Errorf("background create output = %v, want []", raw["output"])
	}
	return r, raw
}

// getResponse retrieves a stored response.
func getResponse(t *testing.T, ts *httptest.Server, id string) (responseObject, []byte) {
	t.Helper()
	status, b := do(t, ts, http.MethodGet, "/v1/responses/"+id, "")
	if status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", id, status, b)
	}
	return decode[responseObject](t, b), b
}

// waitDone polls a background response until it leaves the queued state
// (waitFor is kvpublish_test.go's), and returns it.
func waitDone(t *testing.T, ts *httptest.Server, id string) (responseObject, []byte) {
	t.Helper()
	var r responseObject
	var b []byte
	waitFor(t, "response "+id+" to finish", func() bool {
		r, b = getResponse(t, ts, id)
		return r.Status != "queued"
	})
	return r, b
}

func TestResponsesBackgroundCompletes(t *testing.T) {
	tests := []struct {
		name       string
		fields     string
		wantStatus string
		wantOutput int
	}{
		{name: "completed", wantStatus: "completed", wantOutput: vllmsim.DefaultMaxTokens},
		{name: "max_output_tokens reached is incomplete", fields: `,"max_output_tokens":3`, wantStatus: "incomplete", wantOutput: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"model":"sim-model","instructions":"be brief","input":"work on this","request_id":"resp_bg"` + tc.fields + `}`
			// The same request, synchronous, on a replica of its own.
			_, syncTS := newServer(t, vllmsim.Options{})
			want := decode[responseObject](t, post(t, syncTS, "/v1/responses", body, http.StatusOK))

			sim, ts := newServer(t, vllmsim.Options{})
			queued, _ := createBackground(t, ts, strings.TrimSuffix(body, "}")+`,"background":true}`)
			if queued.ID != "resp_bg" {
				t.Errorf("id = %q, want the request_id resp_bg", queued.ID)
			}

			done, doneBody := waitDone(t, ts, "resp_bg")
			if done.Status != tc.wantStatus || done.ID != "resp_bg" || !done.Background || done.CreatedAt != queued.CreatedAt {
				t.Errorf("finished response = %s, want %s, background, created at %d", doneBody, tc.wantStatus, queued.CreatedAt)
			}
			if (tc.wantStatus == "incomplete") != (done.IncompleteDetails != nil && done.IncompleteDetails.Reason == "max_output_tokens") {
				t.Errorf("incomplete_details = %+v", done.IncompleteDetails)
			}
			if done.text() != want.text() || len(vllmsim.Tokenize(done.text())) != tc.wantOutput {
				t.Errorf("text = %q, want the synchronous response's %q (%d tokens)", done.text(), want.text(), tc.wantOutput)
			}
			if u := done.Usage; u == nil || want.Usage == nil || u.InputTokens != want.Usage.InputTokens || u.OutputTokens != tc.wantOutput || u.TotalTokens != u.InputTokens+u.OutputTokens {
				t.Errorf("usage = %+v, want %+v", done.Usage, want.Usage)
			}

			// It ran on the engine like any request.
			st := sim.Stats()
			if st.Requests != 1 || st.ByEndpoint["/v1/responses"] != 1 || st.Completed != 1 || st.Cancelled != 0 ||
				st.GenerationTokens != uint64(tc.wantOutput) || st.PromptTokens != uint64(want.Usage.InputTokens) || st.Running != 0 {
				t.Errorf("stats = %+v, want one completed request of %d prompt and %d output tokens", st, want.Usage.InputTokens, tc.wantOutput)
			}

			// A finished background response cannot be cancelled, as a
			// synchronous one (cancel_responses), and stays as it is.
			status, b := do(t, ts, http.MethodPost, "/v1/responses/resp_bg/cancel", "")
			const wantCancel = `{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","param":"response_id","code":400}}`
			if status != http.StatusBadRequest || string(b) != wantCancel {
				t.Errorf("cancel after the end: %d %s\nwant 400 %s", status, b, wantCancel)
			}
			if _, after := getResponse(t, ts, "resp_bg"); !reflect.DeepEqual(decode[map[string]any](t, after), decode[map[string]any](t, doneBody)) {
				t.Errorf("after the refused cancel, GET = %s\nwant %s", after, doneBody)
			}

			// Its conversation, output included, is continued.
			next := decode[responseObject](t, post(t, ts, "/v1/responses",
				`{"model":"sim-model","previous_response_id":"resp_bg","input":"and then"}`, http.StatusOK))
			wantPrompt := promptTokens(
				vllmsim.Message{Role: "user", Content: "work on this"},
				vllmsim.Message{Role: "assistant", Content: done.text()},
				vllmsim.Message{Role: "user", Content: "and then"},
			)
			if next.Usage == nil || next.Usage.InputTokens != len(wantPrompt) {
				t.Errorf("continuation usage = %+v, want %d input tokens", next.Usage, len(wantPrompt))
			}
		})
	}
}

func TestResponsesBackgroundCancel(t *testing.T) {
	sim, ts := newParkedServer(t, vllmsim.Options{})
	queued, queuedRaw := createBackground(t, ts, `{"input":"a long job","request_id":"resp_long","background":true}`)

	// The request is admitted and runs: it holds the engine.
	waitFor(t, "the background request to run", func() bool { return sim.Stats().Running == 1 })
	if st := sim.Stats(); st.Requests != 1 || st.ByEndpoint["/v1/responses"] != 1 ||
		st.PromptTokens != uint64(len(promptTokens(vllmsim.Message{Role: "user", Content: "a long job"}))) {
		t.Errorf("stats = %+v, want the background request counted and admitted", st)
	}
	// vLLM stores no "in_progress" for a non-streaming background
	// response: it stays queued until the task stores its outcome.
	if r, b := getResponse(t, ts, "resp_long"); !reflect.DeepEqual(decode[map[string]any](t, b), queuedRaw) {
		t.Errorf("GET while running = %s (status %s), want the queued response", b, r.Status)
	}

	status, b := do(t, ts, http.MethodPost, "/v1/responses/resp_long/cancel", "")
	if status != http.StatusOK {
		t.Fatalf("cancel: %d %s", status, b)
	}
	// cancel_responses answers the stored response, now cancelled: the
	// queued one, without output or usage.
	cancelled := decode[map[string]any](t, b)
	wantCancelled := map[string]any{}
	for k, v := range queuedRaw {
		wantCancelled[k] = v
	}
	wantCancelled["status"] = "cancelled"
	if !reflect.DeepEqual(cancelled, wantCancelled) {
		t.Errorf("cancel = %s\nwant the queued response %+v in status cancelled", b, wantCancelled)
	}
	// The cancel waited for the generation to stop.
	if st := sim.Stats(); st.Running != 0 || st.Cancelled != 1 || st.Completed != 0 || st.GenerationTokens != 0 {
		t.Errorf("stats after the cancel = %+v, want one cancelled request and none running", st)
	}
	if _, got := getResponse(t, ts, queued.ID); !reflect.DeepEqual(decode[map[string]any](t, got), cancelled) {
		t.Errorf("GET after the cancel = %s\nwant %s", got, b)
	}

	// A cancelled response is no longer queued: a second cancel is the 400.
	status, b = do(t, ts, http.MethodPost, "/v1/responses/resp_long/cancel", "")
	if e := decode[errorBody](t, b); status != http.StatusBadRequest || e.Error.Message != "Cannot cancel a synchronous response." {
		t.Errorf("second cancel: %d %s, want 400", status, b)
	}
	if r, _ := getResponse(t, ts, queued.ID); r.Status != "cancelled" || r.Usage != nil || len(r.Output) != 0 {
		t.Errorf("GET after the second cancel = %+v, want it cancelled, without output", r)
	}
}

func TestResponsesBackgroundOccupiesEngine(t *testing.T) {
	sim, ts := newParkedServer(t, vllmsim.Options{MaxNumSeqs: 1})
	createBackground(t, ts, `{"input":"first","request_id":"resp_a","background":true}`)
	waitFor(t, "the first request to run", func() bool { return sim.Stats().Running == 1 })
	// The running one holds the only slot: the next waits for it.
	createBackground(t, ts, `{"input":"second","request_id":"resp_b","background":true}`)
	waitFor(t, "the second request to wait", func() bool { return sim.Stats().Waiting == 1 })
	if st := sim.Stats(); st.Running != 1 || st.Requests != 2 {
		t.Fatalf("stats = %+v, want one running, one waiting", st)
	}

	// Cancelling the waiting one takes it out of the queue.
	post(t, ts, "/v1/responses/resp_b/cancel", "", http.StatusOK)
	if st := sim.Stats(); st.Running != 1 || st.Waiting != 0 || st.Cancelled != 1 {
		t.Errorf("stats = %+v, want the first running and the second cancelled", st)
	}

	// Cancelling the running one frees its slot for the next.
	createBackground(t, ts, `{"input":"third","request_id":"resp_c","background":true}`)
	waitFor(t, "the third request to wait", func() bool { return sim.Stats().Waiting == 1 })
	post(t, ts, "/v1/responses/resp_a/cancel", "", http.StatusOK)
	waitFor(t, "the third request to run", func() bool {
		st := sim.Stats()
		return st.Running == 1 && st.Waiting == 0
	})
	if st := sim.Stats(); st.Cancelled != 2 || st.Requests != 3 {
		t.Errorf("stats = %+v, want three requests, two cancelled", st)
	}
}

func TestResponsesBackgroundPreviousUnfinished(t *testing.T) {
	sim, ts := newParkedServer(t, vllmsim.Options{})
	createBackground(t, ts, `{"input":"first","request_id":"resp_first","background":true}`)
	// vLLM finds the queued response: its conversation is in msg_store
	// from the create call, and its output is still empty, so the new
	// prompt has no assistant turn.
	createBackground(t, ts, `{"input":"second","previous_response_id":"resp_first","background":true}`)
	waitFor(t, "both background requests to run", func() bool { return sim.Stats().Running == 2 })
	first := promptTokens(vllmsim.Message{Role: "user", Content: "first"})
	second := promptTokens(vllmsim.Message{Role: "user", Content: "first"}, vllmsim.Message{Role: "user", Content: "second"})
	if got := sim.Stats().PromptTokens; got != uint64(len(first)+len(second)) {
		t.Errorf("prompt tokens = %d, want %d + %d (the unfinished response adds no assistant turn)", got, len(first), len(second))
	}
}

func TestResponsesBackgroundReset(t *testing.T) {
	sim, ts := newParkedServer(t, vllmsim.Options{})
	createBackground(t, ts, `{"input":"forget me","request_id":"resp_reset","background":true}`)
	waitFor(t, "the background request to run", func() bool { return sim.Stats().Running == 1 })

	post(t, ts, "/sim/reset", "", http.StatusOK)
	// Reset stopped the generation before zeroing the counters.
	if st := sim.Stats(); st.Running != 0 || st.Waiting != 0 || st.Requests != 0 || st.Cancelled != 0 || st.BlocksInUse != 0 {
		t.Errorf("stats after reset = %+v, want nothing running and zero counters", st)
	}
	if status, b := do(t, ts, http.MethodGet, "/v1/responses/resp_reset", ""); status != http.StatusNotFound {
		t.Errorf("GET after reset: %d %s, want 404", status, b)
	}
	if status, b := do(t, ts, http.MethodPost, "/v1/responses/resp_reset/cancel", ""); status != http.StatusNotFound {
		t.Errorf("cancel after reset: %d %s, want 404", status, b)
	}
}

func TestResponsesBackgroundSDK(t *testing.T) {
	_, ts := newParkedServer(t, vllmsim.Options{})
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("unused"),
		option.WithHTTPClient(ts.Client()), option.WithMaxRetries(0))
	resp, err := client.Responses.New(t.Context(), responses.ResponseNewParams{
		Model:      "sim-model",
		Input:      responses.ResponseNewParamsInputUnion{OfString: openai.String("in the background")},
		Background: openai.Bool(true),
	}, option.WithJSONSet("request_id", "resp_sdk_bg"))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if resp.ID != "resp_sdk_bg" || resp.Status != responses.ResponseStatusQueued || !resp.Background || len(resp.Output) != 0 {
		t.Errorf("New = id %q status %q background %v output %v, want queued", resp.ID, resp.Status, resp.Background, resp.Output)
	}
	got, err := client.Responses.Get(t.Context(), resp.ID, responses.ResponseGetParams{})
	if err != nil || got.Status != responses.ResponseStatusQueued {
		t.Errorf("Get = %+v, %v; want it queued", got, err)
	}
	cancelled, err := client.Responses.Cancel(t.Context(), resp.ID)
	if err != nil || cancelled.ID != resp.ID || cancelled.Status != responses.ResponseStatusCancelled {
		t.Errorf("Cancel = %+v, %v; want it cancelled", cancelled, err)
	}
	_, err = client.Responses.Cancel(t.Context(), resp.ID)
	if apiErr, ok := errors.AsType[*openai.Error](err); !ok || apiErr.StatusCode != http.StatusBadRequest {
		t.Errorf("second Cancel: %v, want vLLM's 400", err)
	}
}
