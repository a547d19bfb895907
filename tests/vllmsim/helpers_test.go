package vllmsim_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"rolter.dev/tests/vllmsim"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newServer starts a simulator under httptest, closed when the test ends.
func newServer(t *testing.T, opts vllmsim.Options) (*vllmsim.Server, *httptest.Server) {
	t.Helper()
	sim, err := vllmsim.New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(sim)
	t.Cleanup(ts.Close)
	return sim, ts
}

// errorCase sends body to path (POST when method is empty) on a new
// simulator with opts, fails the test unless the answer has status want,
// and returns the answer's body: one case of an error table.
func errorCase(t *testing.T, opts vllmsim.Options, method, path, body string, want int) []byte {
	t.Helper()
	_, ts := newServer(t, opts)
	if method == "" {
		method = http.MethodPost
	}
	status, b := do(t, ts, method, path, body)
	if status != want {
		t.Fatalf("status = %d, want %d; body %s", status, want, b)
	}
	return b
}

// do sends a request and returns the status and body.
func do(t *testing.T, ts *httptest.Server, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp.StatusCode, b
}

// post sends a JSON POST and fails the test unless the status is want.
func post(t *testing.T, ts *httptest.Server, path, body string, want int) []byte {
	t.Helper()
	status, b := do(t, ts, http.MethodPost, path, body)
	if status != want {
		t.Fatalf("POST %s: status %d, want %d; body %s", path, status, want, b)
	}
	return b
}

// decode unmarshals JSON into a T, failing the test on error.
func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %T: %v; body %s", v, err, b)
	}
	return v
}

// sseEvent is one server-sent event.
type sseEvent struct {
	name string // the event: line, or ""
	data string
}

// parseSSE splits an event stream into events, checking that every line is
// an event:, data: or blank line.
func parseSSE(t *testing.T, body []byte) []sseEvent {
	t.Helper()
	var events []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data != "" {
				events = append(events, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if cur.data != "" {
		t.Fatalf("stream ends inside an event: %+v", cur)
	}
	return events
}

// stats fetches GET /sim/stats.
func stats(t *testing.T, ts *httptest.Server) vllmsim.Stats {
	t.Helper()
	status, b := do(t, ts, http.MethodGet, "/sim/stats", "")
	if status != http.StatusOK {
		t.Fatalf("GET /sim/stats: %d %s", status, b)
	}
	return decode[vllmsim.Stats](t, b)
}

// chatBody returns a chat request body for one user message.
func chatBody(model, content string, extra string) string {
	b, _ := json.Marshal(map[string]any{
		"model":    model,
		"messages": []map[string]string{{"role": "user", "content": content}},
	})
	if extra == "" {
		return string(b)
	}
	return string(b[:len(b)-1]) + "," + extra + "}"
}

// promptTokens returns the tokens of a one-user-message chat prompt.
func promptTokens(msgs ...vllmsim.Message) []uint32 {
	return vllmsim.Tokenize(vllmsim.ChatPrompt(msgs))
}
