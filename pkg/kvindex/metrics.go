package kvindex

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

func kvDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("rolter_kvindex_"+name, help, labels, nil)
}

var (
	descFresh     = kvDesc("fresh", "1 when the provider's KV view is used for scoring (loaded, in sync, heard from recently), else 0.", "provider")
	descAge       = kvDesc("age_seconds", "Seconds since the followed watcher's last delta or heartbeat for the provider; -1 before any.", "provider")
	descHeartbeat = kvDesc("heartbeat_seconds", "The followed watcher's heartbeat period: the longest of its recent intervals between status messages (an outage's gap excluded), at least the period it announces; 0 until known.", "provider")
	descSilent    = kvDesc("watcher_silent", "1 when the followed watcher missed the heartbeats that make the view stale, else 0.", "provider")
	descWatcher   = kvDesc("watcher_info", "1 for the watcher epoch the provider's view follows (one series per provider).", "provider", "epoch")
	descEntries   = kvDesc("entries", "Block identities held for the provider, by kind (resident, speculative).", "provider", "kind")
	descResyncs   = kvDesc("resyncs_total", "Snapshots installed for the provider (start, gap, failover).", "provider")
	descGaps      = kvDesc("gaps_total", "Sequence gaps seen in the followed watcher's deltas.", "provider")
	descFailovers = kvDesc("failovers_total", "Times the view switched to another watcher epoch.", "provider")
)

// Collector returns a collector reporting, at scrape time, the health of
// the index's view of every provider it follows (rolter_kvindex_*).
func (ix *Index) Collector() prometheus.Collector { return collector{ix} }

type collector struct{ ix *Index }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFresh, descAge, descHeartbeat, descSilent, descWatcher, descEntries, descResyncs, descGaps, descFailovers} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, name := range c.ix.Providers() {
		s, ok := c.ix.Stats(name)
		if !ok {
			continue
		}
		g := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{name}, labels...)...)
		}
		cnt := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), name)
		}
		g(descFresh, b2f(c.ix.Fresh(name)))
		age := -1.0
		if s.Age >= 0 {
			age = s.Age.Seconds()
		}
		g(descAge, age)
		g(descHeartbeat, s.Heartbeat.Seconds())
		g(descSilent, b2f(s.Silent))
		if s.Epoch != 0 {
			g(descWatcher, 1, fmt.Sprintf("%016x", s.Epoch))
		}
		g(descEntries, float64(s.Resident), "resident")
		g(descEntries, float64(s.Speculative), "speculative")
		cnt(descResyncs, s.Resyncs)
		cnt(descGaps, s.Gaps)
		cnt(descFailovers, s.Failovers)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
