package usage

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
)

// Accounting sinks of [AccountingConfig.Sink].
const (
	SinkStdout = "stdout"
	SinkFile   = "file"
	SinkNone   = "none"
)

// DefaultQueueCapacity is the default number of records a [JSONLines]
// sink buffers before it drops.
const DefaultQueueCapacity = 10000

// maxQueueCapacity bounds queue_capacity (records are a few hundred bytes).
const maxQueueCapacity = 1_000_000

// Sink receives one [Record] per request. Write must not block the request
// path; Close flushes what was written and releases the sink.
type Sink interface {
	Write(Record)
	Close() error
}

// AccountingConfig is the [accounting] table.
type AccountingConfig struct {
	// Sink is stdout (default), file or none.
	Sink string `toml:"sink"`
	// Path is the file appended to when sink = "file" (created with mode
	// 0600).
	Path string `toml:"path"`
	// QueueCapacity is how many records wait for the writer before new
	// ones are dropped and counted (default 10000).
	QueueCapacity int `toml:"queue_capacity"`
}

// DefaultAccounting returns the [accounting] defaults.
func DefaultAccounting() AccountingConfig {
	return AccountingConfig{Sink: SinkStdout, QueueCapacity: DefaultQueueCapacity}
}

// Validate checks the [accounting] table; path is its key ("accounting").
func (c *AccountingConfig) Validate(path string) []error {
	var errs []error
	switch c.Sink {
	case SinkStdout, SinkNone:
		if c.Path != "" {
			errs = append(errs, &FieldError{Path: path + ".path", Msg: fmt.Sprintf("only applies to sink = %q, got sink %q", SinkFile, c.Sink)})
		}
	case SinkFile:
		if c.Path == "" {
			errs = append(errs, &FieldError{Path: path + ".path", Msg: `must be set when sink = "file"`})
		}
	default:
		errs = append(errs, &FieldError{Path: path + ".sink", Msg: fmt.Sprintf("must be one of %q, got %q", []string{SinkStdout, SinkFile, SinkNone}, c.Sink)})
	}
	if c.QueueCapacity < 1 || c.QueueCapacity > maxQueueCapacity {
		errs = append(errs, &FieldError{Path: path + ".queue_capacity", Msg: fmt.Sprintf("must be in [1, %d], got %d", maxQueueCapacity, c.QueueCapacity)})
	}
	return errs
}

// SinkStats is a snapshot of a [JSONLines] sink's counters.
type SinkStats struct {
	// Written counts records flushed to the writer.
	Written uint64
	// Dropped counts records refused because the queue was full or the
	// sink closed.
	Dropped uint64
	// Errors counts records lost to write errors.
	Errors uint64
	// Queued is the number of records waiting now.
	Queued int
}

// JSONLines writes records as JSON lines from a goroutine of its own, so
// that Write never blocks: records wait in a bounded queue, and when it is
// full a record is dropped and counted. The writer flushes whenever the
// queue runs empty. Close stops accepting records, writes and flushes the
// queued ones, waits for the goroutine and closes the underlying file if
// the sink owns one. Safe for concurrent use.
type JSONLines struct {
	mu     sync.RWMutex // guards closed against sends on a closed queue
	closed bool
	queue  chan Record // closed by Close; nil in discard mode
	wg     sync.WaitGroup
	closer io.Closer
	log    *slog.Logger
	once   sync.Once
	err    error // the result of Close

	written, dropped, errs atomic.Uint64
}

var _ Sink = (*JSONLines)(nil)

// JSONLinesOptions configure [NewJSONLines].
type JSONLinesOptions struct {
	// QueueCapacity is the queue size; <= 0 means DefaultQueueCapacity.
	QueueCapacity int
	// Closer, when set, is closed by Close after the last flush (the file
	// the sink owns); nil leaves the writer open (stdout).
	Closer io.Closer
	// Logger receives write errors (nil discards). Records are never
	// logged.
	Logger *slog.Logger
}

// NewJSONLines starts a sink writing to w. The caller must Close it.
func NewJSONLines(w io.Writer, opts JSONLinesOptions) *JSONLines {
	if opts.QueueCapacity <= 0 {
		opts.QueueCapacity = DefaultQueueCapacity
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &JSONLines{
		queue:  make(chan Record, opts.QueueCapacity),
		closer: opts.Closer,
		log:    opts.Logger.With("component", "usage_sink"),
	}
	s.wg.Go(func() { s.run(w) })
	return s
}

// Open builds the sink cfg describes: JSON lines on stdout, JSON lines
// appended to cfg.Path, or (sink = "none") a sink that discards every
// record. The caller must Close it.
func Open(cfg AccountingConfig, logger *slog.Logger) (*JSONLines, error) {
	opts := JSONLinesOptions{QueueCapacity: cfg.QueueCapacity, Logger: logger}
	switch cfg.Sink {
	case SinkNone:
		return &JSONLines{}, nil
	case SinkStdout, "":
		return NewJSONLines(os.Stdout, opts), nil
	case SinkFile:
		f, err := os.OpenFile(cfg.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("usage: open accounting file: %w", err)
		}
		opts.Closer = f
		return NewJSONLines(f, opts), nil
	}
	return nil, fmt.Errorf("usage: unknown accounting sink %q", cfg.Sink)
}

// Write queues r without blocking. A full queue or a closed sink drops it
// (counted in Dropped). A discarding sink ignores it.
func (s *JSONLines) Write(r Record) {
	if s.queue == nil {
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		s.dropped.Add(1)
		return
	}
	select {
	case s.queue <- r:
	default:
		s.dropped.Add(1)
	}
}

// Close stops the sink: records queued before it are written and flushed,
// later ones are dropped. It waits for the writer and returns the last
// write error the writer saw, joined with the error of closing the file.
// Idempotent.
func (s *JSONLines) Close() error {
	s.once.Do(func() {
		if s.queue == nil {
			return
		}
		s.mu.Lock()
		s.closed = true
		close(s.queue)
		s.mu.Unlock()
		s.wg.Wait()
		if s.closer != nil {
			if err := s.closer.Close(); err != nil {
				s.err = errors.Join(s.err, fmt.Errorf("usage: close accounting sink: %w", err))
			}
		}
	})
	return s.err
}

// Stats returns the sink's counters.
func (s *JSONLines) Stats() SinkStats {
	return SinkStats{
		Written: s.written.Load(), Dropped: s.dropped.Load(), Errors: s.errs.Load(),
		Queued: len(s.queue),
	}
}

// run is the writer goroutine: it drains the queue until Close closes it.
// Records are counted as written when a flush succeeds; a failed write or
// flush loses the records buffered since the last flush (counted in
// Errors), and the writer carries on.
func (s *JSONLines) run(w io.Writer) {
	bw := bufio.NewWriterSize(w, 64<<10)
	var line []byte
	pending := uint64(0)
	fail := func(err error) {
		s.errs.Add(pending)
		s.log.Warn("accounting records lost", slog.Uint64("records", pending), slog.Any("err", err))
		pending = 0
		bw.Reset(w)
	}
	flush := func() {
		if pending == 0 {
			return
		}
		if err := bw.Flush(); err != nil {
			fail(err)
			s.err = fmt.Errorf("usage: write accounting records: %w", err)
			return
		}
		s.written.Add(pending)
		pending = 0
	}
	for r := range s.queue {
		var err error
		line, err = appendRecord(line[:0], &r)
		if err != nil {
			s.errs.Add(1)
			continue
		}
		pending++
		if _, err := bw.Write(line); err != nil {
			fail(err)
			continue
		}
		if len(s.queue) == 0 {
			flush()
		}
	}
	flush()
}

// appendRecord appends r as one JSON line.
func appendRecord(dst []byte, r *Record) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return dst, err
	}
	dst = append(dst, b...)
	return append(dst, '\n'), nil
}
