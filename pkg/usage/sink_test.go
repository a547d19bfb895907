package usage_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"rolter.dev/pkg/usage"
)

// syncBuffer is a bytes.Buffer safe to read while the sink writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(t *testing.T) []usage.Record {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []usage.Record
	sc := bufio.NewScanner(bytes.NewReader(s.b.Bytes()))
	for sc.Scan() {
		var r usage.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

// gateWriter blocks every Write until open is closed, and reports the
// first Write on entered.
type gateWriter struct {
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
	syncBuffer
}

func newGateWriter() *gateWriter {
	return &gateWriter{entered: make(chan struct{}), open: make(chan struct{})}
}

func (g *gateWriter) Write(p []byte) (int, error) {
	g.once.Do(func() { close(g.entered) })
	<-g.open
	return g.syncBuffer.Write(p)
}

func record(i int) usage.Record {
	return usage.Record{
		TS: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), RequestID: "req-" + string(rune('a'+i)), KeyID: "k", Model: "m",
		Provider: "p", TargetModel: "t", Status: 200, PromptTokens: int64(i), CompletionTokens: 2, CostUSD: 0.001,
		LatencyMS: usage.Millis(1500 * time.Microsecond), TTFTMS: 0.5,
	}
}

func TestJSONLinesWritesRecords(t *testing.T) {
	var buf syncBuffer
	s := usage.NewJSONLines(&buf, usage.JSONLinesOptions{})
	for i := range 3 {
		s.Write(record(i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got := buf.lines(t)
	if len(got) != 3 {
		t.Fatalf("%d lines, want 3", len(got))
	}
	for i, r := range got {
		if r != record(i) {
			t.Errorf("line %d = %+v, want %+v", i, r, record(i))
		}
	}
	if st := s.Stats(); st.Written != 3 || st.Dropped != 0 || st.Errors != 0 || st.Queued != 0 {
		t.Errorf("stats = %+v", st)
	}
	if got[0].LatencyMS != 1.5 {
		t.Errorf("latency_ms = %v", got[0].LatencyMS)
	}
}

func TestJSONLinesDropsWhenFull(t *testing.T) {
	w := newGateWriter()
	s := usage.NewJSONLines(w, usage.JSONLinesOptions{QueueCapacity: 2})
	s.Write(record(0))
	<-w.entered // the writer holds record 0 and is stuck in Write
	for i := 1; i <= 7; i++ {
		s.Write(record(i)) // 1 and 2 fit in the queue, 3..7 are dropped
	}
	if st := s.Stats(); st.Dropped != 5 || st.Queued != 2 {
		t.Errorf("stats while blocked = %+v", st)
	}
	close(w.open)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.Write(record(8)) // after Close: dropped, never a panic
	if st := s.Stats(); st.Written != 3 || st.Dropped != 6 {
		t.Errorf("stats = %+v", st)
	}
	if got := w.lines(t); len(got) != 3 || got[2] != record(2) {
		t.Errorf("lines = %+v", got)
	}
}

func TestJSONLinesCloseFlushesEverything(t *testing.T) {
	var buf syncBuffer
	s := usage.NewJSONLines(&buf, usage.JSONLinesOptions{QueueCapacity: 5000})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				s.Write(record(g*1000 + i))
			}
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if n := uint64(len(buf.lines(t))); n != st.Written || st.Written+st.Dropped != 4000 {
		t.Errorf("%d lines, stats %+v", n, st)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestJSONLinesStopsItsGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 10 {
		s := usage.NewJSONLines(&syncBuffer{}, usage.JSONLinesOptions{})
		s.Write(record(0))
		s.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines: %d > %d", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// failWriter fails every write.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestJSONLinesCountsWriteErrors(t *testing.T) {
	s := usage.NewJSONLines(failWriter{}, usage.JSONLinesOptions{})
	s.Write(record(0))
	s.Write(record(1))
	err := s.Close()
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("Close = %v", err)
	}
	if st := s.Stats(); st.Errors != 2 || st.Written != 0 {
		t.Errorf("stats = %+v", st)
	}
}

func TestOpen(t *testing.T) {
	t.Run("file: created 0600 and appended to", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "usage.jsonl")
		for i := range 2 {
			s, err := usage.Open(usage.AccountingConfig{Sink: usage.SinkFile, Path: path, QueueCapacity: 10}, nil)
			if err != nil {
				t.Fatal(err)
			}
			s.Write(record(i))
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(data), "\n"); n != 2 {
			t.Errorf("%d lines:\n%s", n, data)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
			t.Errorf("mode = %v", fi.Mode().Perm())
		}
	})
	t.Run("file: unwritable path", func(t *testing.T) {
		_, err := usage.Open(usage.AccountingConfig{Sink: usage.SinkFile, Path: filepath.Join(t.TempDir(), "no", "such", "dir", "f")}, nil)
		if err == nil {
			t.Error("no error")
		}
	})
	t.Run("none discards", func(t *testing.T) {
		s, err := usage.Open(usage.AccountingConfig{Sink: usage.SinkNone}, nil)
		if err != nil {
			t.Fatal(err)
		}
		s.Write(record(0))
		if err := s.Close(); err != nil || s.Stats() != (usage.SinkStats{}) {
			t.Errorf("close %v, stats %+v", err, s.Stats())
		}
	})
	t.Run("stdout", func(t *testing.T) {
		s, err := usage.Open(usage.DefaultAccounting(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
}

func TestAccountingValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  usage.AccountingConfig
		want []string
	}{
		{"default", usage.DefaultAccounting(), nil},
		{"file", usage.AccountingConfig{Sink: "file", Path: "/var/log/rolter/usage.jsonl", QueueCapacity: 10}, nil},
		{"none", usage.AccountingConfig{Sink: "none", QueueCapacity: 1}, nil},
		{"file without path", usage.AccountingConfig{Sink: "file", QueueCapacity: 10}, []string{`accounting.path: must be set when sink = "file"`}},
		{"path without file", usage.AccountingConfig{Sink: "stdout", Path: "x", QueueCapacity: 10}, []string{`accounting.path: only applies to sink = "file", got sink "stdout"`}},
		{"unknown sink and bad capacity", usage.AccountingConfig{Sink: "kafka"}, []string{
			`accounting.sink: must be one of ["stdout" "file" "none"], got "kafka"`,
			"accounting.queue_capacity: must be in [1, 1000000], got 0",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, err := range tc.cfg.Validate("accounting") {
				got = append(got, err.Error())
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("errors =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
