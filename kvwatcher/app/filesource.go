package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"rolter.dev/pkg/config"
)

// FileSource is the [Source] of file mode: it loads a rolter config file
// with config.Load and polls it for changes (size, modification time, then
// content), so renames over the file and symlink swaps are followed. An
// invalid change is logged and the previous providers stay in use. An empty
// file is invalid: it is what a file rewritten in place (truncated, then
// written) looks like between the two steps, and loading it as "no
// providers" would stop following every engine until the next poll.
type FileSource struct {
	// Path is the config file.
	Path string
	// Interval is the polling period; default 1s.
	Interval time.Duration
	// Logger receives reload logs; default: discard.
	Logger *slog.Logger
	// OnResult, if set, is called after every load attempt with its error
	// (nil on success), e.g. to count reloads.
	OnResult func(error)
}

var _ Source = (*FileSource)(nil)

var errEmptyConfig = errors.New("the config file is empty (being rewritten?)")

// Run loads the file, calls update, and polls until ctx ends. A file that
// cannot be loaded at the start is an error.
func (s *FileSource) Run(ctx context.Context, update func([]Provider)) error {
	interval := s.Interval
	if interval <= 0 {
		interval = time.Second
	}
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "kvwatcher_config", "path", s.Path)
	var lastData []byte
	var lastStat os.FileInfo
	load := func() error {
		cfg, data, err := config.Load(s.Path)
		if err == nil && len(bytes.TrimSpace(data)) == 0 {
			err = errEmptyConfig
		}
		if s.OnResult != nil {
			s.OnResult(err)
		}
		if err != nil {
			return err
		}
		lastData = data
		providers, warnings := FromConfig(cfg)
		for _, w := range warnings {
			log.Warn("config", "warning", w)
		}
		update(providers)
		return nil
	}
	// Stat before reading, as the polls do: a change made after the stat
	// shows as a different stat at the next poll, never as a missed one.
	lastStat, _ = os.Stat(s.Path)
	if err := load(); err != nil {
		return fmt.Errorf("kvwatcher: load %s: %w", s.Path, err)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		st, err := os.Stat(s.Path)
		if err != nil || (lastStat != nil && st.Size() == lastStat.Size() && st.ModTime().Equal(lastStat.ModTime())) {
			continue
		}
		lastStat = st
		data, err := os.ReadFile(s.Path)
		if err != nil || bytes.Equal(data, lastData) {
			continue
		}
		if err := load(); err != nil {
			log.Error("config reload failed; keeping the previous providers", "err", err)
		} else {
			log.Info("config reloaded")
		}
	}
}
