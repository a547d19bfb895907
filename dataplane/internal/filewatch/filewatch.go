// Package filewatch reloads a config file when it changes (file mode).
//
// # Overview
//
// The file is polled: its size, modification time and, when those move,
// a content hash. Polling follows what editors and Kubernetes ConfigMaps do
// to files (rename over, symlink swap) without special cases. A valid change
// is compiled and applied; an invalid one is logged with its field paths,
// counted, and the running config keeps serving.
package filewatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"time"

	"rolter.dev/dataplane/internal/metrics"
	"rolter.dev/pkg/config"
)

// Applier takes a new snapshot; it returns an error when it cannot use it.
type Applier interface {
	Apply(*config.Snapshot) error
}

// Watcher reloads one file. It is owned by the goroutine running Run.
type Watcher struct {
	path     string
	apply    Applier
	metrics  *metrics.Metrics
	log      *slog.Logger
	interval time.Duration
	lastHash string
	lastStat os.FileInfo
}

// New returns a watcher of path that applies changes to a.
func New(path string, a Applier, m *metrics.Metrics, log *slog.Logger) *Watcher {
	return &Watcher{path: path, apply: a, metrics: m, log: log.With("component", "filewatch", "path", path), interval: 500 * time.Millisecond}
}

// Load reads, compiles and applies the file once. Startup uses it: an
// error here means there is no config to serve.
func (w *Watcher) Load() error {
	data, err := os.ReadFile(w.path)
	if err != nil {
		return err
	}
	st, _ := os.Stat(w.path)
	return w.applyData(data, st)
}

// Version is the content hash used as the snapshot version in file mode.
func Version(data []byte) string {
	sum := sha256.Sum256(data)
	return "file-" + hex.EncodeToString(sum[:6])
}

func (w *Watcher) applyData(data []byte, st os.FileInfo) error {
	hash := Version(data)
	w.lastStat = st
	if hash == w.lastHash {
		return nil
	}
	cfg, err := config.Parse(data)
	if err == nil {
		err = errors.Join(cfg.Validate(), cfg.CheckRoutes())
	}
	var snap *config.Snapshot
	if err == nil {
		snap, err = config.Compile(cfg, config.CompileOptions{Version: hash})
	}
	if err == nil {
		err = w.apply.Apply(snap)
	}
	w.lastHash = hash // a bad file is reported once, not on every poll
	return err
}

// Run polls until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := os.Stat(w.path)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) || w.lastStat != nil {
				w.log.Warn("config file unreadable; keeping the running config", "err", err)
			}
			w.lastStat = nil
			continue
		}
		if w.lastStat != nil && st.Size() == w.lastStat.Size() && st.ModTime().Equal(w.lastStat.ModTime()) {
			continue
		}
		data, err := os.ReadFile(w.path)
		if err != nil {
			w.log.Warn("config file unreadable; keeping the running config", "err", err)
			continue
		}
		before := w.lastHash
		if err := w.applyData(data, st); err != nil {
			w.metrics.ConfigFailures.Inc()
			w.log.Error("config change refused; the previous config keeps serving", "err", err)
			continue
		}
		if w.lastHash != before {
			w.log.Info("config reloaded", "version", w.lastHash)
		}
	}
}
