package config

import (
	"rolter.dev/pkg/delivery"
	"rolter.dev/pkg/usage"
)

// Defaults of the reference gateway (rolter-behaviour.md §2.6, §3.7–3.9).
const (
	DefaultListen           = ":8080"
	DefaultMaxBodyBytes     = 32 << 20
	DefaultMetricsPath      = "/metrics"
	DefaultAnthropicVersion = "2023-06-01"
	// DefaultKVTopic is vLLM's own KVEventsConfig.topic default (""; see
	// vllm/config/kv_events.py), so an engine left at its defaults is
	// matched. Being the zero value, it is what an absent key and topic = ""
	// both give; a non-empty default would need the decode to tell the two
	// apart (Default cannot pre-fill list elements).
	DefaultKVTopic          = ""
	DefaultKVMaxBlocks      = 1_000_000
	DefaultKVStaleSecs      = 30
	DefaultLMCacheRefresh   = 2
	DefaultLMCacheStaleSecs = 10
	DefaultSemanticThresh   = 0.92
	DefaultSemanticMaxCands = 256
	DefaultStrategy         = "round_robin"
	// DefaultSpeculativeTTLMS is [routes.balancer] speculative_ttl_ms: long
	// enough to cover a prefill and the event's trip through the watcher.
	DefaultSpeculativeTTLMS = 5000
	// MaxSpeculativeTTLMS bounds it: a guess older than this is noise.
	MaxSpeculativeTTLMS = 600_000
	// DefaultKVDataParallelSize is [providers.kv_events] data_parallel_size.
	DefaultKVDataParallelSize = 1
	// MaxKVDataParallelSize bounds it (one subscription per rank).
	MaxKVDataParallelSize = 256
	// DefaultTokenizeTimeoutMS is [providers.kv_events] tokenize_timeout_ms:
	// the most a request waits for the engine's /tokenize. The call adds
	// about 3 ms (p50) for a 4,000-token prompt with vllmsim through the
	// proxy (docs/routing.md, BenchmarkTokenizeThroughProxy); 50 ms leaves
	// a loaded vLLM API server room while staying small beside the prefill
	// a precise pick saves (thousands of tokens).
	DefaultTokenizeTimeoutMS = 50
	// MaxTokenizeTimeoutMS bounds it: past a few seconds routing on the
	// approximate state is the better trade.
	MaxTokenizeTimeoutMS = 10_000
	// DefaultEngineLoadPath, DefaultEngineLoadIntervalMS: [providers.engine_load]
	// path and interval_ms; stale_ms defaults to
	// DefaultEngineLoadStaleFactor × interval_ms.
	DefaultEngineLoadPath        = "/metrics"
	DefaultEngineLoadIntervalMS  = 500
	DefaultEngineLoadStaleFactor = 3
	// MinEngineLoadIntervalMS and MaxEngineLoadMS bound interval_ms and
	// stale_ms.
	MinEngineLoadIntervalMS = 50
	MaxEngineLoadMS         = 3_600_000
	// MaxKVCapacityTokens bounds providers[].kv_capacity_tokens: 2^36
	// tokens, far past any replica's KV cache.
	MaxKVCapacityTokens = 1 << 36
)

// server.body_read_timeout_secs, server.max_discard_bytes and
// server.client_write_timeout_ms.
const (
	// DefaultBodyReadTimeoutSecs gives a client 30 s to send its body: a
	// full 32 MiB body then needs about 1.1 MB/s.
	DefaultBodyReadTimeoutSecs = 30
	// DefaultMaxDiscardBytes is twice DefaultMaxBodyBytes: a client over
	// the limit is usually not far over it.
	DefaultMaxDiscardBytes = 64 << 20
	// DefaultClientWriteTimeoutMS gives a client 30 s to take each write
	// (at most 32 KiB): any client that is reading, however slowly over a
	// poor link, takes one in far less; only one that stopped reading
	// does not.
	DefaultClientWriteTimeoutMS = 30_000
	// MaxClientWriteTimeoutMS bounds it (one hour).
	MaxClientWriteTimeoutMS = 3_600_000
	// DefaultIdleSecs is timeouts.idle_secs: a body silent for 2 minutes
	// is a hung replica, not a slow one. The longest silence of a healthy
	// engine is a stream's wait for its first token (vLLM sends a
	// stream's headers at once, before queueing and prefill), which
	// exceeds a minute only under an overload that has failed already;
	// between tokens an engine is silent for milliseconds.
	DefaultIdleSecs = 120
	// MaxIdleSecs bounds it (one day).
	MaxIdleSecs = 86400
)

// server.cors: vLLM's CORS (vllm/entrypoints/openai/cli_args.py,
// FrontendArgs; installed as Starlette's CORSMiddleware in
// vllm/entrypoints/openai/api_server.py, build_app).
const (
	// DefaultCORSMaxAgeSecs is Starlette's CORSMiddleware max_age, which
	// vLLM leaves at its default.
	DefaultCORSMaxAgeSecs = 600
	// MaxCORSMaxAgeSecs bounds it: one day, Firefox's own cap (Chromium
	// caps at two hours).
	MaxCORSMaxAgeSecs = 86400
)

// Default returns a Config holding every section default. [Parse] decodes
// the file on top of it, so a key the file leaves out keeps its default and a
// key it sets to zero stays zero.
func Default() Config {
	return Config{
		Server: Server{
			Listen:               DefaultListen,
			MaxBodyBytes:         DefaultMaxBodyBytes,
			BodyReadTimeoutSecs:  DefaultBodyReadTimeoutSecs,
			MaxDiscardBytes:      DefaultMaxDiscardBytes,
			ClientWriteTimeoutMS: DefaultClientWriteTimeoutMS,
			RequireAuth:          true,
			MetricsPath:          DefaultMetricsPath,
			CORS:                 CORS{AllowedOrigins: []string{"*"}, AllowedHeaders: []string{"*"}, MaxAgeSecs: DefaultCORSMaxAgeSecs},
		},
		Retry:    Retry{MaxRetries: 2, BaseBackoffMS: 100, MaxBackoffMS: 2000},
		Cooldown: Cooldown{BaseSecs: 5, MaxSecs: 300},
		Breaker:  Breaker{Enabled: false, FailureThreshold: 5, OpenSecs: 30},
		Health: Health{
			Enabled: false, IntervalSecs: 10, TimeoutSecs: 2,
			ConsecutiveFailureThreshold: 3, RecoverySuccessThreshold: 2,
		},
		Timeouts:   Timeouts{ConnectSecs: 10, RequestSecs: 60, IdleSecs: DefaultIdleSecs},
		Guardrails: delivery.DefaultGuardrails(),
		PII:        delivery.DefaultPII(),
		Accounting: usage.DefaultAccounting(),
		Cache: Cache{
			Enabled: false, DefaultTTLSecs: 60, Namespace: "rolter:cache",
			MaxEntryBytes: 1 << 20, TimeoutMS: 50, MemoryMaxBytes: 64 << 20,
		},
	}
}

// applyDefaults fills the defaults of list elements (providers, routes,
// targets, keys), which Default cannot pre-fill. It is idempotent.
func applyDefaults(c *Config) {
	c.Guardrails.ApplyDefaults()
	delivery.ApplyPluginDefaults(c.Plugins)
	for i := range c.Providers {
		p := &c.Providers[i]
		if p.Kind == KindAnthropic && p.AnthropicVersion == "" {
			p.AnthropicVersion = DefaultAnthropicVersion
		}
		if kv := p.KVEvents; kv != nil {
			if kv.MaxBlocks == 0 {
				kv.MaxBlocks = DefaultKVMaxBlocks
			}
			if kv.StaleSecs == 0 {
				kv.StaleSecs = DefaultKVStaleSecs
			}
			if kv.DataParallelSize == 0 {
				kv.DataParallelSize = DefaultKVDataParallelSize
			}
			if kv.Tokenize == nil {
				on := true
				kv.Tokenize = &on
			}
			if kv.TokenizeTimeoutMS == 0 {
				kv.TokenizeTimeoutMS = DefaultTokenizeTimeoutMS
			}
		}
		if el := p.EngineLoad; el != nil {
			if el.Path == "" {
				el.Path = DefaultEngineLoadPath
			}
			if el.IntervalMS == 0 {
				el.IntervalMS = DefaultEngineLoadIntervalMS
			}
			if el.StaleMS == 0 && el.IntervalMS > 0 {
				el.StaleMS = DefaultEngineLoadStaleFactor * el.IntervalMS
			}
		}
		if lm := p.LMCache; lm != nil {
			if lm.RefreshSecs == 0 {
				lm.RefreshSecs = DefaultLMCacheRefresh
			}
			if lm.StaleSecs == 0 {
				lm.StaleSecs = DefaultLMCacheStaleSecs
			}
		}
	}
	for i := range c.Routes {
		r := &c.Routes[i]
		if r.Strategy == "" {
			r.Strategy = DefaultStrategy
		}
		for j := range r.Targets {
			if r.Targets[j].Weight == nil {
				r.Targets[j].Weight = ptr(1)
			}
		}
		applyVariantDefaults(r)
		if rc := r.Cache; rc != nil {
			if rc.Enabled == nil {
				rc.Enabled = ptr(true)
			}
			if s := rc.Semantic; s != nil {
				if s.Threshold == nil {
					s.Threshold = ptr(DefaultSemanticThresh)
				}
				if s.MaxCandidates == nil {
					s.MaxCandidates = ptr(DefaultSemanticMaxCands)
				}
				if s.TimeoutMS == 0 {
					s.TimeoutMS = 1000
				}
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }
