package sse

import (
	"context"
	"fmt"
	"io"
)

// Replay writes events to w as a server-sent-events stream: each event
// followed by a blank line, and w flushed after each event when it has a
// FlushError() error or Flush() method (as an http.ResponseWriter does). It
// stops early with ctx's error when ctx is done, and returns the first write
// or flush error.
func Replay(ctx context.Context, w io.Writer, events [][]byte) error {
	for _, ev := range events {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := w.Write(ev); err != nil {
			return fmt.Errorf("sse: replay: %w", err)
		}
		if _, err := io.WriteString(w, "\n\n"); err != nil {
			return fmt.Errorf("sse: replay: %w", err)
		}
		if err := flush(w); err != nil {
			return fmt.Errorf("sse: replay: flush: %w", err)
		}
	}
	return nil
}

func flush(w io.Writer) error {
	switch f := w.(type) {
	case interface{ FlushError() error }:
		return f.FlushError()
	case interface{ Flush() error }:
		return f.Flush()
	case interface{ Flush() }:
		f.Flush()
	}
	return nil
}

// AppendStream appends events to dst in their wire form, each followed by a
// blank line: the bytes [Replay] writes.
func AppendStream(dst []byte, events [][]byte) []byte {
	for _, ev := range events {
		dst = append(dst, ev...)
		dst = append(dst, '\n', '\n')
	}
	return dst
}
