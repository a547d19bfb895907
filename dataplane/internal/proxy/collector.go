package proxy

import "github.com/prometheus/client_golang/prometheus"

// inflightCollector reports per-target in-flight counts at scrape time from
// the live atomics, so the request path never touches a labelled gauge.
type inflightCollector struct{ p *Proxy }

var inflightDesc = prometheus.NewDesc("rolter_target_inflight_requests",
	"Upstream requests in flight per target, streams included.", []string{"model", "provider"}, nil)

func (c *inflightCollector) Describe(ch chan<- *prometheus.Desc) { ch <- inflightDesc }

func (c *inflightCollector) Collect(ch chan<- prometheus.Metric) {
	rt := c.p.rt.Load()
	if rt == nil {
		return
	}
	for _, rc := range rt.snap.Routes {
		seen := map[string]bool{}
		for _, t := range rt.routes[rc.Model].targets {
			if seen[t.cfg.Provider.Name] {
				continue
			}
			seen[t.cfg.Provider.Name] = true
			ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(t.state.InFlight()), rc.Model, t.cfg.Provider.Name)
		}
	}
}
