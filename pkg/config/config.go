package config

import (
	"time"

	"rolter.dev/pkg/delivery"
	"rolter.dev/pkg/usage"
)

// Config is a configuration as written: the TOML file, or the objects the
// control plane keeps in etcd. Optional list-element fields whose zero value
// means something are pointers so that "absent" can take the default.
type Config struct {
	Server      Server       `toml:"server"`
	Retry       Retry        `toml:"retry"`
	Cooldown    Cooldown     `toml:"cooldown"`
	Breaker     Breaker      `toml:"breaker"`
	Health      Health       `toml:"health"`
	Timeouts    Timeouts     `toml:"timeouts"`
	Cache       Cache        `toml:"cache"`
	Providers   []Provider   `toml:"providers"`
	Routes      []Route      `toml:"routes"`
	VirtualKeys []VirtualKey `toml:"virtual_keys"`

	// The post-response delivery policy (pkg/delivery) and accounting
	// (pkg/usage): their schemas live with the code that runs them.
	Guardrails  delivery.GuardrailsConfig `toml:"guardrails"`
	Plugins     []delivery.PluginConfig   `toml:"plugins"`
	PII         delivery.PIIConfig        `toml:"pii_sanitizer"`
	ModelPrices []usage.ModelPrice        `toml:"model_prices"`
	Accounting  usage.AccountingConfig    `toml:"accounting"`
}

// Server configures the data plane's HTTP listener and auth.
type Server struct {
	// Listen is the HTTP address of the data plane.
	Listen string `toml:"listen"`
	// MaxBodyBytes caps a request body; larger bodies get 413.
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// BodyReadTimeoutSecs bounds reading a request body, from the end of
	// its headers: a body that stops arriving is cut off (408) and its
	// connection closed, so slow or stalled clients cannot hold the proxy.
	BodyReadTimeoutSecs int `toml:"body_read_timeout_secs"`
	// MaxDiscardBytes is how much of a body the proxy refuses (413, 401,
	// …) it still reads and throws away after answering, so that a client
	// that writes its whole body before reading gets the answer instead of
	// a connection reset. 0 closes at once.
	MaxDiscardBytes int64 `toml:"max_discard_bytes"`
	// ClientWriteTimeoutMS bounds each write of a response to the client
	// (a stream's event, a copy buffer of a body): a client that takes
	// none of it for this long is cut off, its upstream request cancelled.
	// A stall timeout, not a total one: every write gets the whole time,
	// and time spent waiting for the upstream does not count.
	ClientWriteTimeoutMS int `toml:"client_write_timeout_ms"`
	// KeyPepper is the secret mixed into virtual-key digests. The
	// ROLTER_KEY_PEPPER environment variable takes precedence. When neither
	// is set, a random per-process pepper is used (fine for file mode, where
	// keys are hashed at load; the control plane needs a fixed one).
	KeyPepper string `toml:"key_pepper"`
	// RequireAuth refuses requests without a valid virtual key even when no
	// key is configured. It defaults to true: removing the last key never
	// opens the gateway; only an explicit false does (dev setups).
	RequireAuth bool `toml:"require_auth"`
	// MetricsPath is where Prometheus metrics are served.
	MetricsPath string `toml:"metrics_path"`
	// CORS answers browsers' cross-origin requests to the API paths.
	CORS CORS `toml:"cors"`
}

// CORS configures the proxy's answers to browsers' cross-origin requests
// (the Fetch standard's CORS protocol) on the API paths, /v1/... Its
// defaults are vLLM's (--allowed-origins and --allowed-headers ["*"],
// --allow-credentials off), so that a browser app that called vLLM
// directly keeps working behind the proxy. Validated in cors.go; the
// proxy applies it in dataplane/internal/proxy/cors.go.
type CORS struct {
	// AllowedOrigins lists the origins (scheme://host[:port], as browsers
	// send them in Origin) whose pages may call the API, or is ["*"] for
	// any. Empty turns CORS off: no Access-Control-* header is added and
	// OPTIONS is answered 405 as any method a path does not serve.
	AllowedOrigins []string `toml:"allowed_origins"`
	// AllowedHeaders lists the request headers a page may send, or is
	// ["*"]: whatever its preflight asks for (Access-Control-Request-Headers
	// reflected, as vLLM does; the literal "*" would not cover
	// Authorization).
	AllowedHeaders []string `toml:"allowed_headers"`
	// MaxAgeSecs is how long a browser may reuse a preflight's answer.
	MaxAgeSecs int `toml:"max_age_secs"`
	// AllowCredentials lets pages send cookies and TLS client certificates
	// (a virtual key in a header needs no credentials). Never with
	// AllowedOrigins ["*"]: browsers refuse credentials from a wildcard.
	AllowCredentials bool `toml:"allow_credentials"`
}

// Retry configures retries of retryable upstream failures.
type Retry struct {
	MaxRetries    int `toml:"max_retries"`
	BaseBackoffMS int `toml:"base_backoff_ms"`
	MaxBackoffMS  int `toml:"max_backoff_ms"`
}

// Cooldown configures how long a failing target is parked.
type Cooldown struct {
	// BaseSecs is the default park time; 0 disables cooldowns.
	BaseSecs int `toml:"base_secs"`
	// MaxSecs caps a Retry-After driven park time.
	MaxSecs int `toml:"max_secs"`
}

// Breaker configures the per-target circuit breaker.
type Breaker struct {
	Enabled          bool `toml:"enabled"`
	FailureThreshold int  `toml:"failure_threshold"`
	OpenSecs         int  `toml:"open_secs"`
}

// Health configures active health checks of providers.
type Health struct {
	Enabled      bool `toml:"enabled"`
	IntervalSecs int  `toml:"interval_secs"`
	TimeoutSecs  int  `toml:"timeout_secs"`
	// Path is probed with GET; empty means the kind's free probe
	// (/health for openai_compatible, /v1/models for openai and anthropic).
	Path                        string `toml:"path"`
	ConsecutiveFailureThreshold int    `toml:"consecutive_failure_threshold"`
	RecoverySuccessThreshold    int    `toml:"recovery_success_threshold"`
}

// Timeouts bound upstream calls.
type Timeouts struct {
	ConnectSecs int `toml:"connect_secs"`
	// RequestSecs bounds the time to response headers.
	RequestSecs int `toml:"request_secs"`
	// IdleSecs bounds the time a response body may go without a byte
	// from the upstream once its headers came (0: unbounded): a replica
	// that hangs mid-answer. A stream that keeps coming is never cut.
	IdleSecs int `toml:"idle_secs"`
}

// Cache configures the response cache backend shared by all routes.
type Cache struct {
	Enabled        bool   `toml:"enabled"`
	RedisURL       string `toml:"redis_url"`
	DefaultTTLSecs int    `toml:"default_ttl_secs"`
	Namespace      string `toml:"namespace"`
	// MaxEntryBytes caps a stored body; 0 means no limit.
	MaxEntryBytes int64 `toml:"max_entry_bytes"`
	// TimeoutMS bounds every Redis operation, so the cache never holds a
	// request up for longer; a slower answer is a miss.
	TimeoutMS int `toml:"timeout_ms"`
	// MemoryMaxBytes caps the in-process backend used when redis_url is
	// empty.
	MemoryMaxBytes int64 `toml:"memory_max_bytes"`
}

// Provider kinds.
const (
	KindOpenAICompatible = "openai_compatible"
	KindOpenAI           = "openai"
	KindAnthropic        = "anthropic"
)

// Provider is an upstream: a vLLM/SGLang replica or a hosted API.
type Provider struct {
	Name    string `toml:"name"`
	Kind    string `toml:"kind"`
	APIBase string `toml:"api_base"`
	// At most one of APIKey, APIKeyEnv and APIKeyFile.
	APIKey     string `toml:"api_key"`
	APIKeyEnv  string `toml:"api_key_env"`
	APIKeyFile string `toml:"api_key_file"`
	// AnthropicVersion is sent as anthropic-version to kind "anthropic".
	AnthropicVersion string    `toml:"anthropic_version"`
	KVEvents         *KVEvents `toml:"kv_events"`
	LMCache          *LMCache  `toml:"lmcache"`
	// EngineLoad, when present, makes every proxy scrape the replica's
	// Prometheus metrics for its real queue (vLLM's running + waiting
	// requests) and route on it; absent: off.
	EngineLoad *EngineLoad `toml:"engine_load"`
	// KVCapacityTokens is the replica's KV cache capacity in tokens
	// (vLLM's num_gpu_blocks × block_size). predicted_ttft bounds its
	// approximate index of the replica with it when [providers.engine_load]
	// has not scraped vllm:cache_config_info; 0: not set.
	KVCapacityTokens int `toml:"kv_capacity_tokens"`
	// StreamUsage makes the proxies ask an OpenAI-dialect provider for the
	// usage of every chat and completions stream (stream_options.
	// include_usage), so that its usage record is known, and keep the usage
	// chunk from a client that did not ask for it; nil: true. False for an
	// upstream that refuses stream_options. Kind "anthropic" always reports
	// usage and ignores it.
	StreamUsage *bool `toml:"stream_usage"`
}

// EngineLoad configures scraping a replica's own load from its Prometheus
// text metrics (vllm:num_requests_running + vllm:num_requests_waiting).
// Zero values take the defaults.
type EngineLoad struct {
	// Path is scraped with GET, relative to api_base without a trailing
	// /v1 (vLLM serves /metrics at its root). Default "/metrics".
	Path string `toml:"path"`
	// IntervalMS is the time between two scrapes. Default 500, minimum 50.
	IntervalMS int `toml:"interval_ms"`
	// StaleMS is how long a scraped value is used; past it (failed or slow
	// scrapes) the proxy routes on its own view. Default 3 × IntervalMS.
	StaleMS int `toml:"stale_ms"`
}

// KVEvents configures the provider's vLLM KV-event publisher.
type KVEvents struct {
	Endpoint  string `toml:"endpoint"`
	Topic     string `toml:"topic"`
	MaxBlocks int    `toml:"max_blocks"`
	StaleSecs int    `toml:"stale_secs"`
	// Mode is "connect" (the watcher dials the replica's bound endpoint)
	// or "bind" (the watcher binds endpoint and replicas connect to it,
	// told apart by topic); empty: bind for a wildcard host, else connect.
	Mode string `toml:"mode"`
	// ReplayEndpoint is the replica's replay (ROUTER) socket, used to
	// repair sequence gaps; empty: a gap clears the provider's state.
	ReplayEndpoint string `toml:"replay_endpoint"`
	// Model is the model name block identities are seeded with (vLLM's
	// served model name); empty: the upstream model the routes send.
	Model string `toml:"model"`
	// DataParallelSize is the replica's --data-parallel-size: rank r
	// publishes on Endpoint's port + r (and replays on ReplayEndpoint's
	// port + r), as vLLM's ZmqEventPublisher does. Default 1.
	DataParallelSize int `toml:"data_parallel_size"`
	// DataParallelHosts, for a replica whose ranks run on several nodes
	// (vLLM's --data-parallel-size-local on each), lists the nodes in rank
	// order: each runs DataParallelSize / len(DataParallelHosts)
	// consecutive ranks, and rank r publishes on its node's host at
	// Endpoint's port + r (replays likewise). Connect mode only: in bind
	// mode every rank connects to the watcher. Empty: every rank on
	// Endpoint's host.
	DataParallelHosts []string `toml:"data_parallel_hosts"`
	// Tokenize lets the proxies ask this replica's POST /tokenize for the
	// token ids of a request that carries no x-rolter-vllm-token-ids, when
	// its route's strategy routes on the KV events (precise_cache_aware,
	// predicted_ttft); nil: true.
	Tokenize *bool `toml:"tokenize"`
	// TokenizeTimeoutMS bounds that call; a slower or failed one routes the
	// request on the approximate state. Default DefaultTokenizeTimeoutMS.
	TokenizeTimeoutMS int `toml:"tokenize_timeout_ms"`
}

// LMCache configures polling of the provider's LMCache occupancy signal.
type LMCache struct {
	Endpoint    string `toml:"endpoint"`
	RefreshSecs int    `toml:"refresh_secs"`
	StaleSecs   int    `toml:"stale_secs"`
}

// Route maps a public model name to targets and a strategy.
type Route struct {
	Model    string      `toml:"model"`
	Targets  []Target    `toml:"targets"`
	Strategy string      `toml:"strategy"`
	Cache    *RouteCache `toml:"cache"`
	// Balancer tunes the strategy; absent keys take the strategy's defaults.
	Balancer *Balancer `toml:"balancer"`
	// Variants split the route's traffic by weight (A/B tests, canaries);
	// with variants, Targets, Strategy and Balancer are only the defaults
	// of the variants that leave theirs out. See variant.go.
	Variants []Variant `toml:"variants"`
	// AllowVariantPin lets a caller choose a variant with the
	// x-rolter-variant request header; off, the header is ignored.
	AllowVariantPin bool `toml:"allow_variant_pin"`
}

// Balancer holds per-route strategy parameters. Zero or absent values take
// the defaults of the strategy (threshold 0.5, margins 2 and 1.5, 1,000,000
// prefix-tree nodes per target, every pipeline scorer at weight 1).
type Balancer struct {
	// Threshold is cache_aware's minimum prefix-match fraction for affinity.
	Threshold float64 `toml:"threshold"`
	// BalanceAbs and BalanceRel are cache_aware's load-guard margins: the
	// warm target keeps affinity unless it has more than BalanceAbs and more
	// than BalanceRel times the in-flight requests of the least-loaded one.
	BalanceAbs int     `toml:"balance_abs"`
	BalanceRel float64 `toml:"balance_rel"`
	// MaxTrieNodes caps each target's share of the prefix tree, in bytes of
	// prompt text (one node per byte, as the reference's byte trie).
	MaxTrieNodes int `toml:"max_trie_nodes"`
	// Scorers weighs the pipeline's scorers by name: prefix_cache,
	// least_load, session_affinity, static_weight (0 turns one off).
	Scorers map[string]float64 `toml:"scorers"`
	// SpeculativeTTLMS is how long precise_cache_aware counts a routed
	// request's blocks as resident on its target before the engine's events
	// confirm them, in milliseconds; nil: DefaultSpeculativeTTLMS, 0: no
	// speculation. Compiled into CompiledRoute.SpeculativeTTL (and cleared
	// in CompiledRoute.Balancer).
	SpeculativeTTLMS *int `toml:"speculative_ttl_ms"`
	// SignalWeight and LoadWeight weigh the cache signal (KV blocks held,
	// LMCache headroom) and least load in precise_cache_aware and
	// lmcache_aware; 0 means the strategy's default.
	SignalWeight float64 `toml:"signal_weight"`
	LoadWeight   float64 `toml:"load_weight"`
}

// Target is one upstream of a route.
type Target struct {
	Provider string `toml:"provider"`
	// Model is the upstream model name; empty means the route's model.
	Model string `toml:"model"`
	// Weight is used by the weighted strategy; default 1.
	Weight *int `toml:"weight"`
}

// RouteCache opts a route into the response cache.
type RouteCache struct {
	// Enabled defaults to true when the table is present.
	Enabled *bool `toml:"enabled"`
	// TTLSecs defaults to cache.default_ttl_secs.
	TTLSecs  *int      `toml:"ttl_secs"`
	PerKey   bool      `toml:"per_key"`
	Semantic *Semantic `toml:"semantic"`
}

// Semantic configures the semantic response cache of a route.
type Semantic struct {
	Provider      string   `toml:"provider"`
	Model         string   `toml:"model"`
	Threshold     *float64 `toml:"threshold"`
	MaxCandidates *int     `toml:"max_candidates"`
	// TimeoutMS bounds the embedding call; past it the lookup is exact-only.
	TimeoutMS int `toml:"timeout_ms"`
}

// VirtualKey is a client credential with its permissions. The secret is
// given as Key or read from KeyEnv, or only its digest is given as KeyDigest
// (how the control plane stores keys); after [Compile] only the peppered
// digest is kept.
type VirtualKey struct {
	Name   string `toml:"name"`
	Key    string `toml:"key"`
	KeyEnv string `toml:"key_env"`
	// KeyDigest is the hex of [DigestKey] of the secret under the pepper in
	// use; the secret itself is then never known to this process.
	KeyDigest string `toml:"key_digest"`
	// Models and Providers are allow-lists; empty means all.
	Models    []string   `toml:"models"`
	Providers []string   `toml:"providers"`
	Disabled  bool       `toml:"disabled"`
	ExpiresAt *time.Time `toml:"expires_at"`
	// Cache overrides the route's response-cache opt-in when set.
	Cache *bool `toml:"cache"`
}
