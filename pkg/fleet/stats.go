package fleet

import (
	"sync/atomic"
	"time"

	fleetv1 "rolter.dev/proto/rolter/fleet/v1"
)

// Stats are a node's counters, for metrics.
type Stats struct {
	// BatchesPublished, ChunksPublished and BytesPublished count what the
	// node sent: observation batches (prefix hashes or queued prefill), the
	// hashes in them, and the bytes of every message (observations, queues,
	// loads, snapshots).
	BatchesPublished, ChunksPublished, BytesPublished uint64
	// BatchesReceived counts peers' observation batches folded;
	// ChunksFolded the hashes folded from them and from snapshots.
	BatchesReceived, ChunksFolded uint64
	// LoadReports counts peers' load reports taken; QueueReports the
	// per-target queue reports folded from their observation batches;
	// BlocksSpeculated the KV block identities those reports carried
	// (predicted_ttft with KV events); Arrivals the peers' arrivals they
	// carried (predicted_ttft).
	LoadReports, QueueReports, BlocksSpeculated, Arrivals uint64
	// Malformed counts messages that did not decode (or named a target out
	// of range); UnknownRoute entries for a route or layout this node does
	// not have (a config change in flight); LostBatches the gaps in peers'
	// batch sequences.
	Malformed, UnknownRoute, LostBatches uint64
	// SnapshotsServed and SnapshotsApplied count warm-up snapshots.
	SnapshotsServed, SnapshotsApplied uint64
	// PublishErrors counts publishes NATS refused (connection closed);
	// Overflow local picks dropped because a route's queue was full.
	PublishErrors, Overflow uint64
	// QueueTicks counts the queue intervals on which the node looked for
	// queued prefill to publish: none while no route shares its queue.
	// UrgentReports counts the queue reports published at once, between
	// ticks, because a balancer asked (predicted_ttft's picks in a burst:
	// routing.ReportTrigger).
	QueueTicks, UrgentReports uint64
	// Peers is the number of peers heard within their load TTL.
	Peers int
	// LastHeard is when a peer was last heard from (zero: never).
	LastHeard time.Time
	// Trip is how late the slowest live peer hears this node: half the
	// smoothed round trip its echoes of the node's load reports show (0:
	// none measured).
	Trip time.Duration
	// ClockOffset is the largest difference, either way, between this
	// node's wall clock and a live peer's, as their load reports and round
	// trips show it (0: none measured).
	ClockOffset time.Duration
}

type counters struct {
	batchesPublished, chunksPublished, bytesPublished atomic.Uint64
	batchesReceived, chunksFolded, loadReports        atomic.Uint64
	queueReports, blocksSpeculated, arrivals          atomic.Uint64
	malformed, unknownRoute, lostBatches              atomic.Uint64
	snapshotsServed, snapshotsApplied                 atomic.Uint64
	publishErrors, overflow, queueTicks               atomic.Uint64
	urgentReports                                     atomic.Uint64
}

func (c *counters) published(bytes int, msg *fleetv1.Observations) {
	c.batchesPublished.Add(1)
	c.bytesPublished.Add(uint64(bytes))
	for _, r := range msg.Routes {
		for _, t := range r.Targets {
			c.chunksPublished.Add(uint64(len(t.Chunks)))
		}
	}
}

// Stats returns the node's counters as of now.
func (n *Node) Stats(now time.Time) Stats {
	s := Stats{
		BatchesPublished: n.stats.batchesPublished.Load(),
		ChunksPublished:  n.stats.chunksPublished.Load(),
		BytesPublished:   n.stats.bytesPublished.Load(),
		BatchesReceived:  n.stats.batchesReceived.Load(),
		ChunksFolded:     n.stats.chunksFolded.Load(),
		LoadReports:      n.stats.loadReports.Load(),
		QueueReports:     n.stats.queueReports.Load(),
		BlocksSpeculated: n.stats.blocksSpeculated.Load(),
		Arrivals:         n.stats.arrivals.Load(),
		Malformed:        n.stats.malformed.Load(),
		UnknownRoute:     n.stats.unknownRoute.Load(),
		LostBatches:      n.stats.lostBatches.Load(),
		SnapshotsServed:  n.stats.snapshotsServed.Load(),
		SnapshotsApplied: n.stats.snapshotsApplied.Load(),
		PublishErrors:    n.stats.publishErrors.Load(),
		Overflow:         n.stats.overflow.Load(),
		QueueTicks:       n.stats.queueTicks.Load(),
		UrgentReports:    n.stats.urgentReports.Load(),
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	s.Trip = n.trip
	for _, p := range n.peers {
		if p.offsetSeen && p.live(now) {
			s.ClockOffset = max(s.ClockOffset, p.offset, -p.offset)
		}
		if p.heard.After(s.LastHeard) {
			s.LastHeard = p.heard
		}
		if now.Sub(p.heard) < loadTTLIntervals*n.opts.LoadInterval {
			s.Peers++
		}
	}
	return s
}
