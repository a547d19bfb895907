package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"rolter.dev/pkg/routing"
)

// inflightCollector reports, at scrape time, per-target in-flight counts from
// the live atomics (so the request path never touches a labelled gauge) and
// the balancers' decision counts and prefix-tree sizes. Counters of a
// balancer rebuilt by a reload restart from zero, as after a process restart.
type inflightCollector struct{ p *Proxy }

var inflightDesc = prometheus.NewDesc("rolter_target_inflight_requests",
	"Upstream requests in flight per target, streams included.", []string{"model", "provider"}, nil)

var (
	decisionsDesc = prometheus.NewDesc("rolter_routing_decisions_total",
		"Routing decisions by how they were made (affinity_hit, load_spill, least_load, least_warmed, cold, predicted, unpredicted).",
		[]string{"model", "strategy", "outcome", "variant"}, nil)
	treeNodesDesc = prometheus.NewDesc("rolter_prefix_tree_nodes",
		"Bytes of prompt text held in a target's share of the route's prefix tree.", []string{"model", "provider"}, nil)
	treeEvictionsDesc = prometheus.NewDesc("rolter_prefix_tree_evictions_total",
		"Prompts evicted from a target's prefix tree to stay under max_trie_nodes.", []string{"model", "provider"}, nil)
	lawFittedDesc = prometheus.NewDesc("rolter_predicted_ttft_law_fitted",
		"1 once predicted_ttft routes on its fitted latency law, 0 while on the unit law.", []string{"model", "variant"}, nil)
	lawTermDesc = prometheus.NewDesc("rolter_predicted_ttft_law_ms",
		"predicted_ttft's fitted law, TTFT ms = base + per_request_ahead x requests ahead + per_1k_queued_tokens x queued tokens/1000 + per_1k_own_tokens x own uncached tokens/1000; a whole answer (a client that does not stream) takes per_1k_decode_tokens x its output tokens after the first/1000 more (exported once fitted).",
		[]string{"model", "variant", "term"}, nil)
	lawSamplesDesc = prometheus.NewDesc("rolter_predicted_ttft_law_samples",
		"First tokens the fitted law in use was made on.", []string{"model", "variant"}, nil)
	lawFirstTokensDesc = prometheus.NewDesc("rolter_predicted_ttft_first_tokens_total",
		"First tokens reported to predicted_ttft, those that teach its law nothing included.", []string{"model", "variant"}, nil)
	lawWholeAnswersDesc = prometheus.NewDesc("rolter_predicted_ttft_whole_answers_total",
		"Answers that came back whole (clients that do not stream) reported to predicted_ttft, in place of first tokens.", []string{"model", "variant"}, nil)
	silentDesc = prometheus.NewDesc("rolter_predicted_ttft_silent_seconds",
		"How long a target has owed predicted_ttft an answer (a first token, or a whole answer for a client that does not stream) without answering it or, as their reports tell, its peers; 0 when it owes none. A frozen replica grows it without bound: past twice the longest answer lately predicted_ttft routes around it.",
		[]string{"model", "provider"}, nil)
	lawBytesPerTokenDesc = prometheus.NewDesc("rolter_predicted_ttft_bytes_per_token",
		"Prompt bytes per engine prompt token, as predicted_ttft learned it (its default until an engine reported a count).", []string{"model", "variant"}, nil)
)

var cacheDescs = map[string]*prometheus.Desc{}

func cacheDesc(name, help string) *prometheus.Desc {
	d := prometheus.NewDesc("rolter_"+name, help, nil, nil)
	cacheDescs[name] = d
	return d
}

var (
	cacheHits        = cacheDesc("cache_hits_total", "Requests answered from the exact response cache.")
	cacheMisses      = cacheDesc("cache_misses_total", "Cacheable requests not found in the exact cache.")
	cacheStores      = cacheDesc("cache_stores_total", "Responses stored in the exact cache.")
	cacheTooLarge    = cacheDesc("cache_too_large_total", "Responses served but not stored because they exceeded cache.max_entry_bytes.")
	cacheIncomplete  = cacheDesc("cache_incomplete_total", "Streamed responses not stored because they did not complete (upstream error, client gone).")
	cacheDecodeErrs  = cacheDesc("cache_decode_errors_total", "Stored entries that did not decode, or of a status other than 200 (served as misses).")
	cacheBackendErrs = cacheDesc("cache_backend_errors_total", "Failed cache backend operations (served as misses).")
	cacheBackendSkip = cacheDesc("cache_backend_skips_total", "Cache operations skipped while the backend was failing.")
	semHits          = cacheDesc("semantic_cache_hits_total", "Requests answered from the semantic cache.")
	semMisses        = cacheDesc("semantic_cache_misses_total", "Semantic lookups with an embedding but no entry above the threshold.")
	semStores        = cacheDesc("semantic_cache_stores_total", "Entries stored in the semantic cache.")
	semBypasses      = cacheDesc("semantic_cache_bypasses_total", "Requests whose meaning text alone would not capture (tools, media, …): exact cache only, no embedding call.")
	embedErrs        = cacheDesc("semantic_cache_embedding_errors_total", "Failed embedding calls (exact cache only for that request).")

	withheld        = cacheDesc("withheld_responses_total", "Responses the delivery policy refused (the upstream call, if any, is still billed).")
	guardBlocks     = cacheDesc("guardrail_blocks_total", "Requests and responses blocked by guardrail rules.")
	guardRedactions = cacheDesc("guardrail_redactions_total", "Guardrail redactions applied to requests and responses.")
	pluginBlocks    = cacheDesc("plugin_blocks_total", "Responses blocked by post_response plugins.")
	pluginErrors    = cacheDesc("plugin_errors_total", "Failed plugin calls (unreachable, timeout, malformed reply).")
	piiErrors       = cacheDesc("pii_sanitizer_errors_total", "Failed PII sanitizer or restore calls.")
	callsCancelled  = cacheDesc("delivery_calls_cancelled_total", "Plugin and PII sanitizer calls cut because their request ended first (the client left, or a drain): not counted as errors.")
	usageDropped    = cacheDesc("usage_records_dropped_total", "Usage records dropped because the accounting queue was full or a write failed.")
)

func (c *inflightCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range cacheDescs {
		ch <- d
	}
	ch <- inflightDesc
	ch <- decisionsDesc
	ch <- treeNodesDesc
	ch <- treeEvictionsDesc
	ch <- lawFittedDesc
	ch <- lawTermDesc
	ch <- lawSamplesDesc
	ch <- lawFirstTokensDesc
	ch <- lawWholeAnswersDesc
	ch <- lawBytesPerTokenDesc
	ch <- silentDesc
}

func (c *inflightCollector) Collect(ch chan<- prometheus.Metric) {
	rt := c.p.rt.Load()
	if rt == nil {
		return
	}
	st := c.p.cacheTotals.total(rt.cache)
	for d, v := range map[*prometheus.Desc]uint64{
		cacheHits: st.Hits, cacheMisses: st.Misses, cacheStores: st.Stores, cacheTooLarge: st.TooLarge,
		cacheIncomplete: st.Incomplete, cacheDecodeErrs: st.DecodeErrors, cacheBackendErrs: st.BackendErrors,
		cacheBackendSkip: st.BackendSkips, semHits: st.SemanticHits, semMisses: st.SemanticMisses,
		semStores: st.SemanticStores, semBypasses: st.SemanticBypasses, embedErrs: st.EmbeddingErrors,
	} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	ds := &c.p.deliveryStats
	for d, v := range map[*prometheus.Desc]uint64{
		withheld:        ds.Withheld.Load(),
		guardBlocks:     ds.GuardrailBlocks.Load() + ds.GuardrailOutputBlocks.Load(),
		guardRedactions: ds.GuardrailRedactions.Load() + ds.GuardrailOutputRedactions.Load(),
		pluginBlocks:    ds.PluginBlocks.Load(),
		pluginErrors:    ds.PluginErrors.Load(),
		piiErrors:       ds.PIIErrors.Load() + ds.PIIRestoreErrors.Load(),
		callsCancelled:  ds.CallsCancelled.Load(),
	} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	if rt.accounting != nil {
		st := rt.accounting.sink.Stats()
		ch <- prometheus.MustNewConstMetric(usageDropped, prometheus.CounterValue, float64(st.Dropped+st.Errors))
	}
	for _, rc := range rt.snap.Routes {
		r := rt.routes[rc.Model]
		// Several targets (or variants) may share a provider: sum them, as
		// the label set is (model, provider).
		nodes := map[string]float64{}
		evictions := map[string]float64{}
		silent := map[string]float64{}
		seen := map[string]bool{}
		for _, pl := range r.pools {
			if dc, ok := pl.balancer.(routing.DecisionCounter); ok {
				for outcome, n := range dc.Decisions() {
					ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.CounterValue, float64(n), rc.Model, pl.strategy, outcome, pl.variant)
				}
			}
			if lr, ok := pl.balancer.(routing.LawReporter); ok {
				collectLaw(ch, lr.Law(), rc.Model, pl.variant)
			}
			if sr, ok := pl.balancer.(routing.SilenceReporter); ok {
				for i, d := range sr.Silent(nil) {
					if i < len(pl.targets) {
						name := pl.targets[i].cfg.Provider.Name
						silent[name] = max(silent[name], d.Seconds())
					}
				}
			}
			if ts, ok := pl.balancer.(routing.TrieStats); ok {
				for i, st := range ts.TrieStats() {
					if i < len(pl.targets) {
						name := pl.targets[i].cfg.Provider.Name
						nodes[name] += float64(st.Nodes)
						evictions[name] += float64(st.Evictions)
					}
				}
			}
		}
		for name, d := range silent {
			ch <- prometheus.MustNewConstMetric(silentDesc, prometheus.GaugeValue, d, rc.Model, name)
		}
		for name, n := range nodes {
			ch <- prometheus.MustNewConstMetric(treeNodesDesc, prometheus.GaugeValue, n, rc.Model, name)
			ch <- prometheus.MustNewConstMetric(treeEvictionsDesc, prometheus.CounterValue, evictions[name], rc.Model, name)
		}
		for _, pl := range r.pools {
			for _, t := range pl.targets {
				if seen[t.cfg.Provider.Name] {
					continue
				}
				seen[t.cfg.Provider.Name] = true
				ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(t.state.InFlight()), rc.Model, t.cfg.Provider.Name)
			}
		}
	}
}

// collectLaw exports one pool's predicted_ttft law (routing.LawReporter).
func collectLaw(ch chan<- prometheus.Metric, l routing.LawState, model, variant string) {
	fitted := 0.0
	if l.Fitted {
		fitted = 1
		for term, v := range map[string]float64{
			"base": l.BaseMS, "per_request_ahead": l.AheadMS,
			"per_1k_queued_tokens": l.QueuedMSPer1K, "per_1k_own_tokens": l.OwnMSPer1K,
			"per_1k_decode_tokens": l.DecodeMSPer1K, "per_request_running": l.PerRunningMS,
		} {
			ch <- prometheus.MustNewConstMetric(lawTermDesc, prometheus.GaugeValue, v, model, variant, term)
		}
	}
	ch <- prometheus.MustNewConstMetric(lawFittedDesc, prometheus.GaugeValue, fitted, model, variant)
	ch <- prometheus.MustNewConstMetric(lawSamplesDesc, prometheus.GaugeValue, float64(l.Samples), model, variant)
	ch <- prometheus.MustNewConstMetric(lawFirstTokensDesc, prometheus.CounterValue, float64(l.FirstTokens), model, variant)
	ch <- prometheus.MustNewConstMetric(lawWholeAnswersDesc, prometheus.CounterValue, float64(l.WholeAnswers), model, variant)
	ch <- prometheus.MustNewConstMetric(lawBytesPerTokenDesc, prometheus.GaugeValue, l.BytesPerToken, model, variant)
}
