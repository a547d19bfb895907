// Package metrics defines the data plane's Prometheus metrics. Every name
// starts with rolter_. Metrics are registered on an injected registerer so
// tests build a fresh registry each time.
package metrics

import "github.com/prometheus/client_golang/prometheus"

// Metrics holds the data plane's collectors. Safe for concurrent use.
type Metrics struct {
	Requests          *prometheus.CounterVec // endpoint, model, code, variant
	UpstreamErrors    *prometheus.CounterVec // provider, reason
	TargetRequests    *prometheus.CounterVec // model, provider, outcome
	Retries           *prometheus.CounterVec // model
	CooldownsTripped  *prometheus.CounterVec // provider
	BreakerOpened     *prometheus.CounterVec // provider
	BreakerClosed     *prometheus.CounterVec // provider
	HealthDown        *prometheus.CounterVec // provider
	HealthRecovered   *prometheus.CounterVec // provider
	ProviderHealthy   *prometheus.GaugeVec   // provider
	EngineLoad        *prometheus.GaugeVec   // provider
	EngineLoadFails   *prometheus.CounterVec // provider
	InFlight          prometheus.Gauge
	AuthFailures      *prometheus.CounterVec   // reason
	CORSPreflights    *prometheus.CounterVec   // result
	ClientDisconnects *prometheus.CounterVec   // reason
	Latency           *prometheus.HistogramVec // model, variant
	TTFT              *prometheus.HistogramVec // model, variant
	CacheLookup       *prometheus.HistogramVec // result
	Tokenize          *prometheus.CounterVec   // model, outcome
	TokenIDsIgnored   *prometheus.CounterVec   // model
	TokenizeChecked   *prometheus.CounterVec   // model, endpoint, result
	TokenizeSeconds   *prometheus.HistogramVec // model
	TurnWait          *prometheus.HistogramVec // model
	ConfigVersion     prometheus.Gauge
	ConfigInfo        *prometheus.GaugeVec // version
	ConfigReloads     prometheus.Counter
	ConfigFailures    prometheus.Counter
	StateSaves        *prometheus.CounterVec // outcome
	StateBytes        prometheus.Gauge
}

// Buckets for request latency and time to first token, in seconds.
var latencyBuckets = []float64{.001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rolter_" + name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		Requests:         cv("requests_total", "Client requests answered, by endpoint, public model, HTTP status (502 for a response the upstream broke off after it started) and route variant (empty for routes without variants).", "endpoint", "model", "code", "variant"),
		UpstreamErrors:   cv("upstream_errors_total", "Failed upstream attempts (transport errors and retryable statuses).", "provider", "reason"),
		TargetRequests:   cv("target_requests_total", "Upstream attempts by target and outcome (ok = a 2xx relayed whole; error = the target failed or answered otherwise; client_gone = the client left before the answer reached it whole; shutting_down = the proxy halted it at the end of its drain).", "model", "provider", "outcome"),
		Retries:          cv("retries_total", "Retries of a request on another target.", "model"),
		CooldownsTripped: cv("cooldowns_tripped_total", "Targets parked after a failure.", "provider"),
		BreakerOpened:    cv("breaker_opened_total", "Circuit breakers opened.", "provider"),
		BreakerClosed:    cv("breaker_closed_total", "Circuit breakers closed again after a successful probe.", "provider"),
		HealthDown:       cv("health_down_total", "Providers marked unhealthy by active health checks.", "provider"),
		HealthRecovered:  cv("health_recovered_total", "Providers marked healthy again by active health checks.", "provider"),
		AuthFailures:     cv("auth_failures_total", "Requests refused by authentication or authorization.", "reason"),
		CORSPreflights:   cv("cors_preflights_total", "Browsers' CORS preflights the proxy answered, by result: allowed, or denied (the origin is not in server.cors.allowed_origins).", "result"),
		EngineLoadFails:  cv("engine_load_scrape_failures_total", "Failed scrapes of a replica's engine load (request, status, body, parse, missing metric).", "provider"),
		StateSaves:       cv("routing_state_saves_total", "Writes of the --routing-state file (what the balancers learned, read back at the next start), by outcome: ok, error.", "outcome"),
		TokenIDsIgnored:  cv("token_ids_header_ignored_total", "Requests whose x-rolter-vllm-token-ids header was not a comma-separated list of unsigned 32-bit token ids: ignored whole, the request routed as one without it.", "model"),
		TokenizeChecked:  cv("tokenize_checked_total", "Requests routed on token ids from an engine's /tokenize whose answer reported its prompt's length, by result: match (as many tokens as the ids), mismatch (the engine rendered the prompt otherwise than the proxy's conversion: the ids matched the wrong blocks), by the endpoint whose conversion it checks.", "model", "endpoint", "result"),
		Tokenize:         cv("tokenize_total", "Requests of precise routes without a token-ids header, by how their token ids were obtained: cached, engine (the replica's /tokenize), or why not: timeout, error, rejected (a client error from the engine), unsupported (a body /tokenize cannot reproduce), none (no replica to ask), distrusted (the endpoint's ids were lately proven wrong: not asked for a while), shutting_down (the proxy halted during the call).", "model", "outcome"),
		EngineLoad: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rolter_engine_load_requests", Help: "Requests running plus waiting on the replica, as last scraped from its metrics ([providers.engine_load]).",
		}, []string{"provider"}),
		ProviderHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rolter_provider_healthy", Help: "1 while the provider passes its health checks.",
		}, []string{"provider"}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rolter_inflight_requests", Help: "Client requests being served.",
		}),
		ClientDisconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rolter_client_disconnects_total", Help: "Requests whose client went away before the response ended, by reason: closed (the client closed the connection or the stream), write_timeout (it stopped reading: a write took longer than server.client_write_timeout_ms, and the proxy cut it off).",
		}, []string{"reason"}),
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rolter_request_latency_seconds", Help: "Time from request to the end of the response, by public model and route variant.", Buckets: latencyBuckets,
		}, []string{"model", "variant"}),
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rolter_request_ttft_seconds", Help: "Time from request to the first response byte sent to the client, by public model and route variant.", Buckets: latencyBuckets,
		}, []string{"model", "variant"}),
		CacheLookup: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rolter_cache_lookup_seconds", Help: "Time of a response-cache lookup (exact, then semantic with its embedding call), by result.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"result"}),
		TokenizeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rolter_tokenize_seconds", Help: "Time of a call to a replica's /tokenize for a request's token ids, failed ones included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"model"}),
		TurnWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rolter_routing_turn_wait_seconds", Help: "Waits of requests for their turn in a burst before the pick (predicted_ttft among several sharing proxies).",
			Buckets: []float64{.001, .0025, .005, .01, .02, .05, .1, .25},
		}, []string{"model"}),
		ConfigVersion: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rolter_config_version", Help: "Generation of the config snapshot in use (increments on every applied change).",
		}),
		ConfigInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rolter_config_info", Help: "1 for the version string of the config snapshot in use.",
		}, []string{"version"}),
		ConfigReloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rolter_config_reloads_total", Help: "Config snapshots applied after startup.",
		}),
		ConfigFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rolter_config_reload_failures_total", Help: "Config changes refused; the previous snapshot kept serving.",
		}),
		StateBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rolter_routing_state_bytes", Help: "Size of the last --routing-state file written.",
		}),
	}
	reg.MustRegister(m.ProviderHealthy, m.EngineLoad, m.InFlight, m.ClientDisconnects, m.Latency, m.TTFT, m.CacheLookup, m.TokenizeSeconds,
		m.TurnWait, m.ConfigVersion, m.ConfigInfo, m.ConfigReloads, m.ConfigFailures, m.StateBytes)
	// Both reasons are exported from the start, so that a rate or an
	// alert on either has a series before the first one happens.
	for _, reason := range []string{"closed", "write_timeout"} {
		m.ClientDisconnects.WithLabelValues(reason)
	}
	for _, outcome := range []string{"ok", "error"} {
		m.StateSaves.WithLabelValues(outcome)
	}
	return m
}
