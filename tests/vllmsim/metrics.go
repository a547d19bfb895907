package vllmsim

import (
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// This file writes GET /metrics by hand in the Prometheus text format, with
// the names and labels of vLLM's own metrics (engine="0", model_name = the
// first served name), plus a few vllmsim_* extras.

// metricsWriter accumulates a Prometheus text exposition.
type metricsWriter struct {
	b      strings.Builder
	labels string // the common labels, pre-rendered
}

// family writes the HELP and TYPE lines of a metric family.
func (m *metricsWriter) family(name, typ, help string) {
	m.b.WriteString("# HELP " + name + " " + help + "\n")
	m.b.WriteString("# TYPE " + name + " " + typ + "\n")
}

// sample writes one sample with the common labels plus extra (pre-rendered
// `k="v"` pairs, or "").
func (m *metricsWriter) sample(name, extra string, v float64) {
	m.b.WriteString(name + "{")
	if extra != "" {
		m.b.WriteString(extra + ",")
	}
	m.b.WriteString(m.labels + "} " + strconv.FormatFloat(v, 'g', -1, 64) + "\n")
}

// metric writes a family with a single sample.
func (m *metricsWriter) metric(name, typ, help string, v float64) {
	m.family(name, typ, help)
	m.sample(name, "", v)
}

// escapeLabel escapes a label value for the text format.
func escapeLabel(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

// handleMetrics serves GET /metrics.
func (s *Server) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	st := s.Stats()
	cs := s.cache.Stats()
	s.mu.Lock()
	finished := maps.Clone(s.stats.finished)
	s.mu.Unlock()

	m := &metricsWriter{labels: `engine="0",model_name="` + escapeLabel(s.opts.Models[0]) + `"`}
	usage := float64(cs.Pinned) / float64(s.cache.Capacity())
	m.metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", float64(st.Running))
	m.metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", float64(st.Waiting))
	m.metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage)
	m.metric("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage (deprecated name).", usage)
	// vLLM's info gauge of its CacheConfig (vllm/v1/metrics/loggers.py
	// log_metrics_info: every field of CacheConfig.metrics_info(), i.e.
	// vllm/config/cache.py's fields as strings, plus engine; no model_name;
	// value 1). The replica's capacity is num_gpu_blocks × block_size.
	m.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
	m.b.WriteString(`vllm:cache_config_info{block_size="` + strconv.Itoa(s.opts.BlockSize) +
		`",gpu_memory_utilization="0.9",swap_space="4",cache_dtype="auto",is_attention_free="False",num_gpu_blocks_override="None",sliding_window="None",enable_prefix_caching="True",prefix_caching_hash_algo="sha256",cpu_offload_gb="0",calculate_kv_scales="False",num_gpu_blocks="` +
		strconv.Itoa(s.cache.Capacity()) + `",num_cpu_blocks="None",engine="0"} 1.0` + "\n")
	m.metric("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", float64(cs.QueriedTokens))
	m.metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", float64(cs.HitTokens))
	m.metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", float64(st.PromptTokens))
	m.metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", float64(st.GenerationTokens))
	m.family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
	for _, reason := range []string{"abort", "length", "stop"} {
		m.sample("vllm:request_success_total", `finished_reason="`+reason+`"`, float64(finished[reason]))
	}
	m.metric("vllmsim_requests_total", "counter", "Inference requests accepted by the simulator, injected failures included.", float64(st.Requests))
	m.metric("vllmsim_injected_failures_total", "counter", "Requests answered 503 by the fail rate.", float64(st.Failures))
	m.metric("vllmsim_cache_evictions_total", "counter", "Prefix cache blocks evicted to make room.", float64(st.Evictions))
	m.metric("vllmsim_cache_blocks_resident", "gauge", "Blocks resident in the prefix cache.", float64(st.BlocksResident))
	m.metric("vllmsim_cache_blocks_capacity", "gauge", "Capacity of the prefix cache in blocks.", float64(st.CapacityBlocks))
	// Endpoints in a stable order.
	endpoints := make([]string, 0, len(st.ByEndpoint))
	for e := range st.ByEndpoint {
		endpoints = append(endpoints, e)
	}
	slices.Sort(endpoints)
	m.family("vllmsim_endpoint_requests_total", "counter", "Inference requests accepted, by endpoint.")
	for _, e := range endpoints {
		m.sample("vllmsim_endpoint_requests_total", `endpoint="`+escapeLabel(e)+`"`, float64(st.ByEndpoint[e]))
	}

	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(m.b.String()))
}
