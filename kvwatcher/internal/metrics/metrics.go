// Package metrics holds the watcher's Prometheus metrics, registered on an
// injected registerer. Every name starts with rolter_kvwatcher_; labels are
// bounded by the configuration (provider names, bind endpoints).
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the watcher's metrics. All methods are safe for concurrent
// use.
type Metrics struct {
	Events           *prometheus.CounterVec // provider, kind
	Batches          *prometheus.CounterVec // provider, source (live, replay)
	Malformed        *prometheus.CounterVec // provider, reason (frames, payload)
	Skipped          *prometheus.CounterVec // provider, reason
	StreamFailures   *prometheus.CounterVec // provider, reason
	ReplayAttempts   *prometheus.CounterVec // provider, kind (gap, catchup), result (ok, failed)
	Clears           *prometheus.CounterVec // provider, reason
	Evictions        *prometheus.CounterVec // provider
	StateBlocks      *prometheus.GaugeVec   // provider
	Synced           *prometheus.GaugeVec   // provider
	Age              *prometheus.GaugeVec   // provider, source (vllm, lmcache)
	Published        *prometheus.CounterVec // provider, type
	PublishedBlocks  *prometheus.CounterVec // provider, op
	PublishErrors    *prometheus.CounterVec // provider
	SnapshotRequests *prometheus.CounterVec // provider
	LMRefreshes      *prometheus.CounterVec // provider
	LMFailures       *prometheus.CounterVec // provider, reason
	UnknownTopic     *prometheus.CounterVec // endpoint
	ConfigApply      *prometheus.CounterVec // result
	Providers        prometheus.Gauge
}

// New creates the metrics and registers them on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	c := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "rolter", Subsystem: "kvwatcher", Name: name, Help: help}, labels)
	}
	g := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "rolter", Subsystem: "kvwatcher", Name: name, Help: help}, labels)
	}
	m := &Metrics{
		Events:           c("events_total", "KV events applied, by kind (block_stored, block_removed, all_blocks_cleared).", "provider", "kind"),
		Batches:          c("batches_total", "KV event batches consumed, live or replayed.", "provider", "source"),
		Malformed:        c("malformed_total", "Messages skipped as malformed: not 3 frames with an 8-byte sequence (frames), or an undecodable payload (payload).", "provider", "reason"),
		Skipped:          c("skipped_total", "Parts of batches not indexed, by reason (medium, kind, parent, extra_keys, lora_id, block_size; topic: a message under another topic).", "provider", "reason"),
		StreamFailures:   c("stream_failures_total", "KV event stream failures: connect, disconnect, gap, restart.", "provider", "reason"),
		ReplayAttempts:   c("replay_attempts_total", "Replay requests, for a gap or to catch up on a new stream, by result.", "provider", "kind", "result"),
		Clears:           c("clears_total", "Times a provider's state was cleared, by reason.", "provider", "reason"),
		Evictions:        c("evictions_total", "Blocks dropped to keep a provider's state within max_blocks.", "provider"),
		StateBlocks:      g("state_blocks", "Resident block identities in a provider's state.", "provider"),
		Synced:           g("synced", "1 when the provider's state mirrors its engine (connected, no unrepaired gap), else 0.", "provider"),
		Age:              g("telemetry_age_seconds", "Seconds since the provider's last KV event batch (vllm) or successful LMCache poll (lmcache); -1 before the first.", "provider", "source"),
		Published:        c("published_messages_total", "NATS messages published, by type (delta, status, snapshot).", "provider", "type"),
		PublishedBlocks:  c("published_blocks_total", "Block identities published in deltas, by op (stored, removed).", "provider", "op"),
		PublishErrors:    c("publish_errors_total", "NATS publish failures.", "provider"),
		SnapshotRequests: c("snapshot_requests_total", "Snapshot requests answered.", "provider"),
		LMRefreshes:      c("lmcache_refreshes_total", "Successful LMCache occupancy polls.", "provider"),
		LMFailures:       c("lmcache_refresh_failures_total", "Failed LMCache polls: request, status, body, value.", "provider", "reason"),
		UnknownTopic:     c("unknown_topic_total", "Messages on a bound endpoint whose topic names no provider.", "endpoint"),
		ConfigApply:      c("config_apply_total", "Provider list updates, by result.", "result"),
		Providers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "rolter", Subsystem: "kvwatcher", Name: "providers",
			Help: "Providers watched."}),
	}
	for _, col := range []prometheus.Collector{m.Events, m.Batches, m.Malformed, m.Skipped, m.StreamFailures, m.ReplayAttempts,
		m.Clears, m.Evictions, m.StateBlocks, m.Synced, m.Age, m.Published, m.PublishedBlocks, m.PublishErrors,
		m.SnapshotRequests, m.LMRefreshes, m.LMFailures, m.UnknownTopic, m.ConfigApply, m.Providers} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Forget drops provider's series (it is no longer watched).
func (m *Metrics) Forget(provider string) {
	l := prometheus.Labels{"provider": provider}
	for _, v := range []*prometheus.CounterVec{m.Events, m.Batches, m.Malformed, m.Skipped, m.StreamFailures, m.ReplayAttempts,
		m.Clears, m.Evictions, m.Published, m.PublishedBlocks, m.PublishErrors, m.SnapshotRequests, m.LMRefreshes, m.LMFailures} {
		v.DeletePartialMatch(l)
	}
	for _, v := range []*prometheus.GaugeVec{m.StateBlocks, m.Synced, m.Age} {
		v.DeletePartialMatch(l)
	}
}

// RegisterNATS registers rolter_kvwatcher_nats_connected, reading
// connected at each scrape (app.RunService owns the connection).
func RegisterNATS(reg prometheus.Registerer, connected func() bool) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "rolter", Subsystem: "kvwatcher", Name: "nats_connected",
		Help: "1 while the NATS connection is up, else 0 (publishes are buffered meanwhile, then fail)."},
		func() float64 {
			if connected() {
				return 1
			}
			return 0
		}))
}
