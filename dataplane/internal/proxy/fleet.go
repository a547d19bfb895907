package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rolter.dev/pkg/routing"
)

// fleetCollector reports, at scrape time, what the proxy shares with its
// peers (rolter.dev/pkg/fleet) and the shared prefix index per target.
type fleetCollector struct{ p *Proxy }

func fleetDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("rolter_fleet_"+name, help, labels, nil)
}

var (
	fleetPublished = fleetDesc("published_total", "What this proxy published to its peers, by unit (batches, chunks, bytes).", "unit")
	fleetReceived  = fleetDesc("received_total", "Peers' observation batches folded (prefix hashes or queued prefill), hashes folded (batches and snapshots), per-target queued-prefill reports folded (predicted_ttft), the KV block identities those reports speculated and the arrivals they carried, and load reports taken, by unit (batches, chunks, queue_reports, kv_blocks, arrivals, load_reports).", "unit")
	fleetDropped   = fleetDesc("dropped_total", "Peer messages or entries dropped, by reason (malformed; unknown_route: a route or layout this proxy does not have, e.g. during a config change; lost_batch: gaps in a peer's sequence; queue_full: local picks not shared because more than 4,096 per route arrived between two flushes).", "reason")
	fleetSnapshots = fleetDesc("snapshots_total", "Warm-up snapshots served to new peers and applied from a peer, by direction (served, applied).", "direction")
	fleetPubErrors = fleetDesc("publish_errors_total", "Publishes NATS refused (connection closed).")
	fleetUrgent    = fleetDesc("urgent_reports_total", "Queue reports published at once, between queue ticks, for predicted_ttft's picks in a burst.")
	fleetPeers     = fleetDesc("peers", "Peers heard from within their load-report TTL.")
	fleetStateAge  = fleetDesc("state_age_seconds", "Seconds since a peer was last heard from; absent until one is.")
	fleetTrip      = fleetDesc("trip_seconds", "How late the slowest live peer hears this proxy: half the smoothed round trip shown by the peers' echoes of its load reports (predicted_ttft's turns in a burst last two of it, at least it and a fifth of the queue interval); absent until measured.")
	fleetClock     = fleetDesc("clock_offset_seconds", "The largest difference, either way, between this proxy's wall clock and a live peer's, from the clock its load reports carry and half the round trip (predicted_ttft's turns in a burst order the proxies per slot of the wall clock: keep it well under a turn, two queue intervals); absent until the trip is measured.")
	peerQueued     = prometheus.NewDesc("rolter_fleet_peer_queued_prefill_tokens",
		"Uncached prompt tokens the peers report pending at a target (sent, no first token yet), summed over their unexpired queue reports (predicted_ttft with sharing).", []string{"model", "provider"}, nil)
	sharedChunks = prometheus.NewDesc("rolter_shared_prefix_chunks",
		"Prompt-prefix hashes in a target's shared index (this proxy's and its peers' observations).", []string{"model", "provider"}, nil)
)

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{fleetPublished, fleetReceived, fleetDropped, fleetSnapshots, fleetPubErrors, fleetUrgent, fleetPeers, fleetStateAge, fleetTrip, fleetClock, peerQueued, sharedChunks} {
		ch <- d
	}
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	s := c.p.fleet.Stats(now)
	counter := func(d *prometheus.Desc, v uint64, label ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label...)
	}
	counter(fleetPublished, s.BatchesPublished, "batches")
	counter(fleetPublished, s.ChunksPublished, "chunks")
	counter(fleetPublished, s.BytesPublished, "bytes")
	counter(fleetReceived, s.BatchesReceived, "batches")
	counter(fleetReceived, s.ChunksFolded, "chunks")
	counter(fleetReceived, s.QueueReports, "queue_reports")
	counter(fleetReceived, s.BlocksSpeculated, "kv_blocks")
	counter(fleetReceived, s.Arrivals, "arrivals")
	counter(fleetReceived, s.LoadReports, "load_reports")
	counter(fleetDropped, s.Malformed, "malformed")
	counter(fleetDropped, s.UnknownRoute, "unknown_route")
	counter(fleetDropped, s.LostBatches, "lost_batch")
	counter(fleetDropped, s.Overflow, "queue_full")
	counter(fleetSnapshots, s.SnapshotsServed, "served")
	counter(fleetSnapshots, s.SnapshotsApplied, "applied")
	counter(fleetPubErrors, s.PublishErrors)
	counter(fleetUrgent, s.UrgentReports)
	ch <- prometheus.MustNewConstMetric(fleetPeers, prometheus.GaugeValue, float64(s.Peers))
	if !s.LastHeard.IsZero() {
		ch <- prometheus.MustNewConstMetric(fleetStateAge, prometheus.GaugeValue, now.Sub(s.LastHeard).Seconds())
	}
	if s.Trip > 0 {
		ch <- prometheus.MustNewConstMetric(fleetTrip, prometheus.GaugeValue, s.Trip.Seconds())
		ch <- prometheus.MustNewConstMetric(fleetClock, prometheus.GaugeValue, s.ClockOffset.Seconds())
	}
	rt := c.p.rt.Load()
	if rt == nil {
		return
	}
	for name, r := range rt.routes {
		// Variants sharing a provider sum, as the label set is (model, provider).
		chunks, queued := map[string]float64{}, map[string]float64{}
		for _, pl := range r.pools {
			if sq, ok := pl.balancer.(routing.SharedQueue); ok && pl.fleet != nil {
				for i, t := range pl.targets {
					queued[t.cfg.Provider.Name] += float64(sq.PeerQueue(i).Tokens)
				}
			}
			sa, ok := pl.balancer.(routing.SharedAffinity)
			if !ok {
				continue
			}
			for i, st := range sa.SharedStats() {
				if i < len(pl.targets) {
					chunks[pl.targets[i].cfg.Provider.Name] += float64(st.Chunks)
				}
			}
		}
		for prov, n := range chunks {
			ch <- prometheus.MustNewConstMetric(sharedChunks, prometheus.GaugeValue, n, name, prov)
		}
		for prov, n := range queued {
			ch <- prometheus.MustNewConstMetric(peerQueued, prometheus.GaugeValue, n, name, prov)
		}
	}
}
