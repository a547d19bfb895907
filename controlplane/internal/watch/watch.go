// Package watch follows the config in etcd with list-then-watch and hands
// every new consistent state to a callback.
//
// # Overview
//
// A session lists the config prefix at revision R, publishes the decoded
// state, then watches the prefix from R+1 (with the leader required,
// progress notifications and previous values) and applies each batch of
// events to its copy of the key-values, publishing after each batch. A
// compaction, a lost leader, a closed channel or any error ends the
// session; the next one re-lists after a jittered backoff, so the state is
// never built from a gap. A state that fails [state.State.Check] (only
// possible when something other than a control plane wrote etcd) is logged,
// counted and not published: the last good one stays.
//
// # Lifecycle
//
// [Watcher.Run] returns when its context ends.
package watch

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"rolter.dev/controlplane/internal/metrics"
	"rolter.dev/controlplane/internal/state"
	"rolter.dev/controlplane/internal/store"
	"rolter.dev/pkg/backoff"
)

// Watcher follows one etcd config prefix. Create it with [New].
type Watcher struct {
	cli     *clientv3.Client
	layout  store.Layout
	publish func(*state.State)
	metrics *metrics.Metrics
	log     *slog.Logger
	// MaxBackoff caps the delay between sessions.
	maxBackoff time.Duration
}

// New returns a watcher that calls publish with each new consistent state,
// from the goroutine running [Watcher.Run].
func New(cli *clientv3.Client, layout store.Layout, publish func(*state.State), m *metrics.Metrics, log *slog.Logger) *Watcher {
	return &Watcher{cli: cli, layout: layout, publish: publish, metrics: m, log: log.With("component", "watch"), maxBackoff: 2 * time.Second}
}

// Run follows the config until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	reason := "start"
	for attempt := 0; ctx.Err() == nil; {
		w.metrics.WatchResyncs.WithLabelValues(reason).Inc()
		started := time.Now()
		err := w.session(ctx)
		if ctx.Err() != nil {
			return
		}
		reason = classify(err)
		if time.Since(started) > 10*time.Second {
			attempt = 0
		}
		attempt++
		d := max(50*time.Millisecond, backoff.Delay(attempt, 100*time.Millisecond, w.maxBackoff, rand.Float64()))
		w.log.Warn("etcd watch ended; re-listing", "reason", reason, "err", err, "retry_in", d.String())
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func classify(err error) string {
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return "compacted"
	case errors.Is(err, rpctypes.ErrNoLeader):
		return "no_leader"
	case errors.Is(err, errClosed):
		return "closed"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	default:
		return "error"
	}
}

var errClosed = errors.New("watch: channel closed")

func (w *Watcher) session(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	resp, err := w.cli.Get(lctx, w.layout.ConfigPrefix(), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return err
	}
	kvs := make(map[string]*mvccpb.KeyValue, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		kvs[string(kv.Key)] = kv
	}
	cluster := resp.Header.ClusterId
	w.emit(kvs, cluster)
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	ch := w.cli.Watch(wctx, w.layout.ConfigPrefix(), clientv3.WithPrefix(),
		clientv3.WithRev(resp.Header.Revision+1), clientv3.WithProgressNotify(), clientv3.WithPrevKV())
	for wr := range ch {
		if err := wr.Err(); err != nil {
			return err
		}
		if wr.IsProgressNotify() || len(wr.Events) == 0 {
			continue
		}
		for _, ev := range wr.Events {
			switch ev.Type {
			case mvccpb.PUT:
				kvs[string(ev.Kv.Key)] = ev.Kv
			case mvccpb.DELETE:
				delete(kvs, string(ev.Kv.Key))
			}
		}
		w.emit(kvs, cluster)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errClosed
}

func (w *Watcher) emit(kvs map[string]*mvccpb.KeyValue, cluster uint64) {
	list := make([]*mvccpb.KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		list = append(list, kv)
	}
	ld := w.layout.Decode(list, cluster, w.log)
	if len(ld.Corrupt) > 0 {
		w.metrics.StatesRejected.Inc()
		w.log.Error("stored config has undecodable objects; keeping the last published state", "revision", ld.State.Revision, "keys", ld.Corrupt)
		return
	}
	if err := ld.State.Check(); err != nil {
		w.metrics.StatesRejected.Inc()
		w.log.Error("stored config fails validation; keeping the last published state", "revision", ld.State.Revision, "err", err)
		return
	}
	w.publish(ld.State)
}
