// Package metrics defines the control plane's Prometheus metrics. Every
// name starts with rolter_controlplane_. They are registered on an injected
// registerer, so tests build a fresh registry each time.
package metrics

import "github.com/prometheus/client_golang/prometheus"

// Metrics holds the control plane's collectors. Safe for concurrent use.
type Metrics struct {
	// ConfigRevision is the config revision this replica publishes.
	ConfigRevision prometheus.Gauge
	// ConnectedNodes counts open snapshot streams by node role.
	ConnectedNodes *prometheus.GaugeVec // role
	// NodeRevision is the revision each connected node last acknowledged.
	NodeRevision *prometheus.GaugeVec // node_id
	// NodeAcks counts node answers to pushed snapshots.
	NodeAcks *prometheus.CounterVec // result: ack | nack
	// PushLatency is the time from this replica seeing a config change (or
	// from the send, for a node that connected later) to the node's ACK.
	PushLatency prometheus.Histogram
	// WatchResyncs counts re-lists of the etcd config.
	WatchResyncs *prometheus.CounterVec // reason
	// StatesRejected counts stored states that failed the consistency check
	// and were not published.
	StatesRejected prometheus.Counter
	// AdminRequests counts admin calls by method and gRPC code.
	AdminRequests *prometheus.CounterVec // method, code
	// RefusedRequests counts calls refused for their token, by reason.
	RefusedRequests *prometheus.CounterVec // method, reason
}

// Push-latency buckets, in seconds: pushes should land well under a second.
var pushBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ConfigRevision: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rolter_controlplane_config_revision", Help: "Config revision (etcd revision of the last config change) this replica publishes.",
		}),
		ConnectedNodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rolter_controlplane_connected_nodes", Help: "Nodes with an open snapshot stream to this replica, by role.",
		}, []string{"role"}),
		NodeRevision: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rolter_controlplane_node_config_revision", Help: "Config revision each connected node last acknowledged running.",
		}, []string{"node_id"}),
		NodeAcks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rolter_controlplane_node_acks_total", Help: "Node answers to pushed snapshots, by result (ack or nack).",
		}, []string{"result"}),
		PushLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "rolter_controlplane_push_latency_seconds", Help: "Time from a config change reaching this replica (or the send, for a node that connected later) to the node's ACK.",
			Buckets: pushBuckets,
		}),
		WatchResyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rolter_controlplane_watch_resync_total", Help: "Full re-lists of the etcd config, by reason.",
		}, []string{"reason"}),
		StatesRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rolter_controlplane_states_rejected_total", Help: "Stored config states that failed the consistency check and were not published.",
		}),
		AdminRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rolter_controlplane_admin_requests_total", Help: "Admin API calls by method and gRPC status code.",
		}, []string{"method", "code"}),
		RefusedRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rolter_controlplane_refused_requests_total", Help: "Calls refused for their bearer token, by method and reason (missing, invalid, node_token).",
		}, []string{"method", "reason"}),
	}
	reg.MustRegister(m.ConfigRevision, m.ConnectedNodes, m.NodeRevision, m.NodeAcks, m.PushLatency,
		m.WatchResyncs, m.StatesRejected, m.AdminRequests, m.RefusedRequests)
	return m
}
