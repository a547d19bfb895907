package config

import (
	"errors"

	"fmt"
	"net"
	"net/url"
	"regexp"
	"rolter.dev/pkg/delivery"
	"rolter.dev/pkg/usage"
	"strconv"
	"strings"
)

// Strategies lists every strategy name the config accepts.
var Strategies = []string{
	"round_robin", "random", "weighted", "power_of_two", "least_load",
	"consistent_hash", "cache_aware", "pipeline", "precise_cache_aware",
	"lmcache_aware", "predicted_latency", "predicted_ttft",
}

// Scorers lists the pipeline scorers [routes.balancer] scorers may weigh.
var Scorers = []string{"prefix_cache", "least_load", "session_affinity", "static_weight"}

// MaxTargets is the most targets one route may have.
const MaxTargets = 256

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)

// Validate checks every field and every reference and returns all failures
// joined, each a [*FieldError] with its path. It does not resolve secrets
// from the environment or files; [Compile] does.
func (c *Config) Validate() error {
	v := &validator{}
	c.validateSections(v)
	providers := make(map[string]int, len(c.Providers))
	for i := range c.Providers {
		p := &c.Providers[i]
		path := fmt.Sprintf("providers[%d]", i)
		if first, dup := providers[p.Name]; dup && p.Name != "" {
			v.add(path+".name", "duplicate provider %q (also providers[%d])", p.Name, first)
		} else {
			providers[p.Name] = i
		}
		validateProvider(v, path, p)
	}
	kinds := make([]string, len(c.Providers))
	for i := range c.Providers {
		kinds[i] = c.Providers[i].Kind
	}
	routes := make(map[string]int, len(c.Routes))
	for i := range c.Routes {
		r := &c.Routes[i]
		path := fmt.Sprintf("routes[%d]", i)
		if first, dup := routes[r.Model]; dup && r.Model != "" {
			v.add(path+".model", "duplicate route %q (also routes[%d])", r.Model, first)
		} else {
			routes[r.Model] = i
		}
		validateRoute(v, path, r, providers, kinds)
	}
	keyNames := make(map[string]int, len(c.VirtualKeys))
	for i := range c.VirtualKeys {
		k := &c.VirtualKeys[i]
		path := fmt.Sprintf("virtual_keys[%d]", i)
		if first, dup := keyNames[k.Name]; dup && k.Name != "" {
			v.add(path+".name", "duplicate key name %q (also virtual_keys[%d])", k.Name, first)
		} else {
			keyNames[k.Name] = i
		}
		validateKey(v, path, k, providers, routes)
	}
	return v.err()
}

func (c *Config) validateSections(v *validator) {
	v.errs = append(v.errs, c.Guardrails.Validate("guardrails")...)
	v.errs = append(v.errs, delivery.ValidatePlugins("plugins", c.Plugins)...)
	v.errs = append(v.errs, c.PII.Validate("pii_sanitizer")...)
	v.errs = append(v.errs, usage.ValidatePrices("model_prices", c.ModelPrices)...)
	v.errs = append(v.errs, c.Accounting.Validate("accounting")...)
	s := c.Server
	validateListen(v, "server.listen", s.Listen)
	v.positive64("server.max_body_bytes", s.MaxBodyBytes)
	v.between("server.body_read_timeout_secs", s.BodyReadTimeoutSecs, 1, 3600)
	if s.MaxDiscardBytes < 0 {
		v.add("server.max_discard_bytes", "must be >= 0, got %d", s.MaxDiscardBytes)
	}
	v.between("server.client_write_timeout_ms", s.ClientWriteTimeoutMS, 1, MaxClientWriteTimeoutMS)
	if !strings.HasPrefix(s.MetricsPath, "/") {
		v.add("server.metrics_path", "must start with /, got %q", s.MetricsPath)
	}
	validateCORS(v, "server.cors", s.CORS)
	v.between("retry.max_retries", c.Retry.MaxRetries, 0, 10)
	v.positive("retry.base_backoff_ms", c.Retry.BaseBackoffMS)
	if c.Retry.MaxBackoffMS < c.Retry.BaseBackoffMS {
		v.add("retry.max_backoff_ms", "must be >= retry.base_backoff_ms (%d), got %d", c.Retry.BaseBackoffMS, c.Retry.MaxBackoffMS)
	}
	v.between("cooldown.base_secs", c.Cooldown.BaseSecs, 0, 86400)
	if c.Cooldown.MaxSecs < c.Cooldown.BaseSecs {
		v.add("cooldown.max_secs", "must be >= cooldown.base_secs (%d), got %d", c.Cooldown.BaseSecs, c.Cooldown.MaxSecs)
	}
	v.positive("breaker.failure_threshold", c.Breaker.FailureThreshold)
	v.positive("breaker.open_secs", c.Breaker.OpenSecs)
	v.positive("health.interval_secs", c.Health.IntervalSecs)
	v.positive("health.timeout_secs", c.Health.TimeoutSecs)
	if c.Health.Path != "" && !strings.HasPrefix(c.Health.Path, "/") {
		v.add("health.path", "must start with /, got %q", c.Health.Path)
	}
	v.positive("health.consecutive_failure_threshold", c.Health.ConsecutiveFailureThreshold)
	v.positive("health.recovery_success_threshold", c.Health.RecoverySuccessThreshold)
	v.positive("timeouts.connect_secs", c.Timeouts.ConnectSecs)
	v.positive("timeouts.request_secs", c.Timeouts.RequestSecs)
	v.between("timeouts.idle_secs", c.Timeouts.IdleSecs, 0, MaxIdleSecs)
	v.between("cache.default_ttl_secs", c.Cache.DefaultTTLSecs, 0, 365*86400)
	if c.Cache.Namespace == "" {
		v.add("cache.namespace", "must not be empty")
	}
	if c.Cache.MaxEntryBytes < 0 {
		v.add("cache.max_entry_bytes", "must be >= 0, got %d", c.Cache.MaxEntryBytes)
	}
	v.between("cache.timeout_ms", c.Cache.TimeoutMS, 1, 60000)
	if c.Cache.MemoryMaxBytes < 1 {
		v.add("cache.memory_max_bytes", "must be > 0, got %d", c.Cache.MemoryMaxBytes)
	}
	if u := c.Cache.RedisURL; u != "" {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "redis" && pu.Scheme != "rediss" && pu.Scheme != "unix") {
			v.add("cache.redis_url", "must be a redis://, rediss:// or unix:// URL, got %q", redact(u))
		}
	}
}

// validateListen checks a TCP listen address as net.Listen takes it: host
// (possibly empty) and a numeric port.
func validateListen(v *validator, path, addr string) {
	if addr == "" {
		v.add(path, "must not be empty")
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.add(path, "must be host:port (e.g. \":8080\" or \"127.0.0.1:8080\"), got %q", addr)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		v.add(path, "port must be a number in 0..65535, got %q", port)
	}
}

// CheckRoutes refuses a config that routes nothing: every request would get
// 404. It is separate from [Config.Validate] because the control plane
// stores configs built object by object, which have no route at first; data
// planes run it before applying a config, and the control plane runs it on
// whole documents and on edits that would remove the last route.
func (c *Config) CheckRoutes() error {
	if len(c.Routes) == 0 {
		return &FieldError{Path: "routes", Msg: "no routes: every request would get 404; add at least one [[routes]] table"}
	}
	return nil
}

func validateProvider(v *validator, path string, p *Provider) {
	if p.Name == "" {
		v.add(path+".name", "must not be empty")
	} else if !namePattern.MatchString(p.Name) {
		v.add(path+".name", "must match %s, got %q", namePattern, p.Name)
	}
	switch p.Kind {
	case KindOpenAICompatible, KindOpenAI, KindAnthropic:
	case "":
		v.add(path+".kind", "must not be empty (openai_compatible, openai or anthropic)")
	default:
		v.add(path+".kind", "unknown kind %q (want openai_compatible, openai or anthropic)", p.Kind)
	}
	v.httpURL(path+".api_base", p.APIBase)
	set := 0
	for _, s := range []string{p.APIKey, p.APIKeyEnv, p.APIKeyFile} {
		if s != "" {
			set++
		}
	}
	if set > 1 {
		v.add(path, "set at most one of api_key, api_key_env and api_key_file")
	}
	if p.AnthropicVersion != "" && p.Kind != KindAnthropic {
		v.add(path+".anthropic_version", "only applies to kind \"anthropic\"")
	}
	if kv := p.KVEvents; kv != nil {
		kp := path + ".kv_events"
		if u, err := url.Parse(kv.Endpoint); kv.Endpoint == "" || err != nil || (u.Scheme != "tcp" && u.Scheme != "ipc") {
			v.add(kp+".endpoint", "must be a tcp:// or ipc:// ZMQ endpoint, got %q", kv.Endpoint)
		}
		v.positive(kp+".max_blocks", kv.MaxBlocks)
		v.positive(kp+".stale_secs", kv.StaleSecs)
		if n := kv.TokenizeTimeoutMS; n < 1 || n > MaxTokenizeTimeoutMS {
			v.add(kp+".tokenize_timeout_ms", "must be in [1, %d], got %d", MaxTokenizeTimeoutMS, n)
		}
		if kv.Mode != "" && kv.Mode != "connect" && kv.Mode != "bind" {
			v.add(kp+".mode", "must be \"connect\" or \"bind\", got %q", kv.Mode)
		}
		if r := kv.ReplayEndpoint; r != "" {
			if u, err := url.Parse(r); err != nil || (u.Scheme != "tcp" && u.Scheme != "ipc") {
				v.add(kp+".replay_endpoint", "must be a tcp:// or ipc:// ZMQ endpoint, got %q", r)
			}
		}
		if n := kv.DataParallelSize; n < 0 || n > MaxKVDataParallelSize { // 0: the default, 1
			v.add(kp+".data_parallel_size", "must be in [1, %d], got %d", MaxKVDataParallelSize, n)
		} else if n > 1 {
			// Ranks offset the port (vLLM has no such rule for ipc://).
			for _, ep := range [][2]string{{"endpoint", kv.Endpoint}, {"replay_endpoint", kv.ReplayEndpoint}} {
				if ep[1] != "" && !rankPorts(ep[1], n) {
					v.add(kp+"."+ep[0], "with data_parallel_size %d must be tcp://HOST:PORT with PORT in [1, %d], got %q", n, 65536-n, ep[1])
				}
			}
		}
		if hosts := kv.DataParallelHosts; len(hosts) > 0 {
			n := max(kv.DataParallelSize, 1)
			switch {
			case n%len(hosts) != 0:
				v.add(kp+".data_parallel_hosts", "%d hosts cannot each run the same number of data_parallel_size %d ranks", len(hosts), n)
			case kv.Mode == "bind" || (kv.Mode == "" && WildcardHost(kv.Endpoint)):
				v.add(kp+".data_parallel_hosts", "only applies in connect mode (in bind mode every rank connects to the watcher)")
			}
			for i, h := range hosts {
				if !hostOnly(h) {
					v.add(fmt.Sprintf("%s.data_parallel_hosts[%d]", kp, i), "must be a host name or address (no port), got %q", h)
				}
			}
		}
	}
	if p.KVCapacityTokens < 0 || p.KVCapacityTokens > MaxKVCapacityTokens {
		v.add(path+".kv_capacity_tokens", "must be in [0, %d], got %d", MaxKVCapacityTokens, p.KVCapacityTokens)
	}
	if el := p.EngineLoad; el != nil {
		ep := path + ".engine_load"
		if p.Kind != KindOpenAICompatible && p.Kind != "" {
			v.add(ep, "only applies to kind \"openai_compatible\" (a replica serving Prometheus metrics), got %q", p.Kind)
		}
		if !strings.HasPrefix(el.Path, "/") || strings.ContainsAny(el.Path, "?# \t\r\n") {
			v.add(ep+".path", "must be an absolute path (starting with /, no query), got %q", el.Path)
		}
		v.between(ep+".interval_ms", el.IntervalMS, MinEngineLoadIntervalMS, MaxEngineLoadMS)
		if el.StaleMS < 1 || el.StaleMS > MaxEngineLoadMS || (el.IntervalMS >= MinEngineLoadIntervalMS && el.StaleMS < el.IntervalMS) {
			v.add(ep+".stale_ms", "must be in [interval_ms (%d), %d], got %d", el.IntervalMS, MaxEngineLoadMS, el.StaleMS)
		}
	}
	if lm := p.LMCache; lm != nil {
		lp := path + ".lmcache"
		v.httpURL(lp+".endpoint", lm.Endpoint)
		v.positive(lp+".refresh_secs", lm.RefreshSecs)
		v.positive(lp+".stale_secs", lm.StaleSecs)
	}
}

func validateRoute(v *validator, path string, r *Route, providers map[string]int, kinds []string) {
	if r.Model == "" {
		v.add(path+".model", "must not be empty")
	}
	if !contains(Strategies, r.Strategy) {
		v.add(path+".strategy", "unknown strategy %q (want one of %s)", r.Strategy, strings.Join(Strategies, ", "))
	}
	switch {
	case len(r.Targets) == 0 && len(r.Variants) == 0:
		v.add(path+".targets", "must have at least one target")
	case len(r.Targets) > MaxTargets:
		v.add(path+".targets", "at most %d targets, got %d", MaxTargets, len(r.Targets))
	}
	validateTargets(v, path+".targets", r.Targets, providers)
	if b := r.Balancer; b != nil {
		validateBalancer(v, path+".balancer", b)
	}
	validateVariants(v, path, r, providers)
	if rc := r.Cache; rc != nil {
		cp := path + ".cache"
		if rc.TTLSecs != nil && *rc.TTLSecs < 0 {
			v.add(cp+".ttl_secs", "must be >= 0, got %d", *rc.TTLSecs)
		}
		if s := rc.Semantic; s != nil {
			sp := cp + ".semantic"
			if s.Provider == "" {
				v.add(sp+".provider", "must not be empty")
			} else if i, ok := providers[s.Provider]; !ok {
				v.add(sp+".provider", "unknown provider %q", s.Provider)
			} else if kinds[i] == KindAnthropic {
				v.add(sp+".provider", "provider %q is of kind anthropic, which has no /v1/embeddings", s.Provider)
			}
			if s.TimeoutMS < 0 || s.TimeoutMS > 60000 {
				v.add(sp+".timeout_ms", "must be in [0, 60000], got %d", s.TimeoutMS)
			}
			if s.Model == "" {
				v.add(sp+".model", "must not be empty")
			}
			if s.Threshold != nil && !(*s.Threshold > 0 && *s.Threshold <= 1) {
				v.add(sp+".threshold", "must be in (0, 1], got %g", *s.Threshold)
			}
			if s.MaxCandidates != nil && (*s.MaxCandidates < 1 || *s.MaxCandidates > 10000) {
				v.add(sp+".max_candidates", "must be in [1, 10000], got %d", *s.MaxCandidates)
			}
		}
	}
}

func validateTargets(v *validator, path string, targets []Target, providers map[string]int) {
	for j, t := range targets {
		tp := fmt.Sprintf("%s[%d]", path, j)
		if t.Provider == "" {
			v.add(tp+".provider", "must not be empty")
		} else if _, ok := providers[t.Provider]; !ok {
			v.add(tp+".provider", "unknown provider %q", t.Provider)
		}
		if t.Weight != nil && *t.Weight < 1 {
			v.add(tp+".weight", "must be >= 1, got %d", *t.Weight)
		}
	}
}

func validateBalancer(v *validator, bp string, b *Balancer) {
	if b.Threshold < 0 || b.Threshold > 1 || b.Threshold != b.Threshold {
		v.add(bp+".threshold", "must be in [0, 1], got %g", b.Threshold)
	}
	if b.BalanceAbs < 0 {
		v.add(bp+".balance_abs", "must be >= 0, got %d", b.BalanceAbs)
	}
	if b.BalanceRel < 0 || b.BalanceRel != b.BalanceRel || b.BalanceRel > 1e6 {
		v.add(bp+".balance_rel", "must be >= 0, got %g", b.BalanceRel)
	}
	if b.MaxTrieNodes < 0 {
		v.add(bp+".max_trie_nodes", "must be >= 0, got %d", b.MaxTrieNodes)
	}
	if w := b.SignalWeight; w < 0 || w != w || w > 1e6 {
		v.add(bp+".signal_weight", "must be in [0, 1e6], got %g", w)
	}
	if w := b.LoadWeight; w < 0 || w != w || w > 1e6 {
		v.add(bp+".load_weight", "must be in [0, 1e6], got %g", w)
	}
	if t := b.SpeculativeTTLMS; t != nil && (*t < 0 || *t > MaxSpeculativeTTLMS) {
		v.add(bp+".speculative_ttl_ms", "must be in [0, %d], got %d", MaxSpeculativeTTLMS, *t)
	}
	for name, w := range b.Scorers {
		if !contains(Scorers, name) {
			v.add(bp+".scorers."+name, "unknown scorer (want one of %s)", strings.Join(Scorers, ", "))
		} else if w < 0 || w != w || w > 1e6 {
			v.add(bp+".scorers."+name, "must be >= 0, got %g", w)
		}
	}
}

func validateKey(v *validator, path string, k *VirtualKey, providers, routes map[string]int) {
	if k.Name == "" {
		v.add(path+".name", "must not be empty")
	}
	set := 0
	for _, s := range []string{k.Key, k.KeyEnv, k.KeyDigest} {
		if s != "" {
			set++
		}
	}
	switch {
	case set > 1:
		v.add(path, "set one of key, key_env and key_digest, not several")
	case set == 0:
		v.add(path, "set one of key, key_env and key_digest")
	case k.Key != "" && len(k.Key) < 16:
		v.add(path+".key", "must be at least 16 characters")
	case k.KeyDigest != "":
		if _, err := ParseDigest(k.KeyDigest); err != nil {
			v.add(path+".key_digest", "%v", err)
		}
	}
	for j, m := range k.Models {
		if _, ok := routes[m]; !ok {
			v.add(fmt.Sprintf("%s.models[%d]", path, j), "unknown route %q", m)
		}
	}
	for j, p := range k.Providers {
		if _, ok := providers[p]; !ok {
			v.add(fmt.Sprintf("%s.providers[%d]", path, j), "unknown provider %q", p)
		}
	}
}

type validator struct{ errs []error }

func (v *validator) add(path, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) err() error { return errors.Join(v.errs...) }

func (v *validator) positive(path string, n int) {
	if n < 1 {
		v.add(path, "must be > 0, got %d", n)
	}
}

func (v *validator) positive64(path string, n int64) {
	if n < 1 {
		v.add(path, "must be > 0, got %d", n)
	}
}

func (v *validator) between(path string, n, lo, hi int) {
	if n < lo || n > hi {
		v.add(path, "must be in [%d, %d], got %d", lo, hi, n)
	}
}

func (v *validator) httpURL(path, s string) {
	u, err := url.Parse(s)
	if s == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.add(path, "must be an absolute http:// or https:// URL, got %q", redact(s))
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// redact hides URL passwords in error messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// hostOnly reports whether h is a host name, an IPv4 address or a
// bracketed IPv6 address, without a port: what goes between tcp:// and
// :PORT.
func hostOnly(h string) bool {
	if inner, ok := strings.CutPrefix(h, "["); ok {
		inner, ok = strings.CutSuffix(inner, "]")
		return ok && net.ParseIP(inner) != nil
	}
	return h != "" && !strings.ContainsAny(h, ":/@?#[] \t\r\n")
}

// WildcardHost reports whether endpoint is tcp:// on a wildcard host (*,
// 0.0.0.0, ::): an endpoint a replica would bind, so a watcher given it binds
// too ([providers.kv_events] mode's default is "bind" for it, else
// "connect").
func WildcardHost(endpoint string) bool {
	u, err := url.Parse(strings.Replace(endpoint, "://*:", "://0.0.0.0:", 1))
	if err != nil || u.Scheme != "tcp" {
		return false
	}
	switch u.Hostname() {
	case "0.0.0.0", "::", "":
		return true
	}
	return false
}

// rankPorts reports whether endpoint is tcp://HOST:PORT with ports PORT to
// PORT+n-1 all valid.
func rankPorts(endpoint string, n int) bool {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "tcp" {
		return false
	}
	port, err := strconv.Atoi(u.Port())
	return err == nil && port >= 1 && port+n-1 <= 65535
}
