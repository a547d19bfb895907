package e2e_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"rolter.dev/pkg/usage"
	"rolter.dev/tests/vllmsim"
)

// usageFleet starts one replica and a proxy writing its usage records to a
// file, with extra added to the replica's provider table.
func usageFleet(t *testing.T, providerExtra string) (base, records string) {
	t.Helper()
	r := startReplica(t, vllmsim.Options{Models: []string{"sim"}})
	records = filepath.Join(t.TempDir(), "usage.jsonl")
	cfg := fmt.Sprintf("[accounting]\nsink = \"file\"\npath = %q\n", records)
	cfg = strings.Replace(fleetConfig(cfg, "round_robin", r), "\nkind = \"openai_compatible\"\n", "\nkind = \"openai_compatible\"\n"+providerExtra, 1)
	a, _ := startProxy(t, cfg)
	return a.URL(), records
}

// lastRecord waits for the n-th usage record of the file and returns it.
func lastRecord(t *testing.T, path string, n int) usage.Record {
	t.Helper()
	var rows []usage.Record
	waitFor(t, fmt.Sprintf("%d usage records", n), func() bool {
		b, _ := os.ReadFile(path)
		rows = rows[:0]
		for line := range bytes.Lines(b) {
			var r usage.Record
			if json.Unmarshal(line, &r) == nil {
				rows = append(rows, r)
			}
		}
		return len(rows) >= n
	})
	return rows[n-1]
}

// sseData returns the data of each event of an SSE body but [DONE].
func sseData(t *testing.T, body string) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && d != "[DONE]" {
			out = append(out, d)
		}
	}
	if !strings.Contains(body, "data: [DONE]") {
		t.Fatalf("no [DONE] in %s", body)
	}
	return out
}

// TestStreamUsageForEveryClient: an SDK stream that does not ask for its
// usage (the SDKs' default) is recorded with its tokens, because the proxy
// asks the replica for them, and the client still gets the stream it asked
// for, without the usage chunk; a client that asks gets the chunk; a
// provider with stream_usage = false leaves the stream as it was
// (usage_unknown).
func TestStreamUsageForEveryClient(t *testing.T) {
	base, records := usageFleet(t, "")
	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	chat := openai.ChatCompletionNewParams{
		Model:               "m",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("count my tokens")},
		MaxCompletionTokens: openai.Int(7),
	}
	stream := func(p openai.ChatCompletionNewParams) (chunks, empty int, acc openai.ChatCompletionAccumulator) {
		s := client.Chat.Completions.NewStreaming(t.Context(), p)
		for s.Next() {
			c := s.Current()
			chunks++
			if len(c.Choices) == 0 {
				empty++
			}
			acc.AddChunk(c)
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		return chunks, empty, acc
	}

	t.Run("not asked: recorded, not shown", func(t *testing.T) {
		chunks, empty, acc := stream(chat)
		if empty != 0 || acc.Usage.TotalTokens != 0 || chunks < 7 {
			t.Fatalf("%d chunks, %d without choices, usage %+v: the client got a chunk it did not ask for", chunks, empty, acc.Usage)
		}
		r := lastRecord(t, records, 1)
		if r.UsageUnknown || r.CompletionTokens != 7 || r.PromptTokens == 0 || !r.Stream || r.Status != 200 {
			t.Fatalf("record %+v", r)
		}
	})

	t.Run("asked: shown and recorded", func(t *testing.T) {
		p := chat
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		_, empty, acc := stream(p)
		if empty != 1 || acc.Usage.CompletionTokens != 7 {
			t.Fatalf("%d chunks without choices, usage %+v", empty, acc.Usage)
		}
		if r := lastRecord(t, records, 2); r.UsageUnknown || r.CompletionTokens != 7 {
			t.Fatalf("record %+v", r)
		}
	})

	t.Run("completions, continuous usage declined", func(t *testing.T) {
		// continuous_usage_stats without include_usage gives no usage at
		// vLLM: the proxy must not turn it into usage on every chunk.
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(
			`{"model":"m","prompt":"once upon a time","max_tokens":5,"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`))
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		resp.Body.Close()
		for _, d := range sseData(t, body.String()) {
			if strings.Contains(d, `"usage"`) {
				t.Fatalf("a chunk carries usage: %s", d)
			}
		}
		if r := lastRecord(t, records, 3); r.UsageUnknown || r.CompletionTokens != 5 {
			t.Fatalf("record %+v", r)
		}
	})

	t.Run("stream_usage = false", func(t *testing.T) {
		base, records := usageFleet(t, "stream_usage = false\n")
		c := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0))
		s := c.Chat.Completions.NewStreaming(t.Context(), chat)
		for s.Next() {
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		if r := lastRecord(t, records, 1); !r.UsageUnknown || r.CompletionTokens != 0 {
			t.Fatalf("record %+v, want usage_unknown", r)
		}
	})
}
