package config

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"rolter.dev/pkg/delivery"
	"rolter.dev/pkg/usage"
)

// Snapshot is a compiled, immutable configuration: secrets resolved, virtual
// keys reduced to peppered digests, lookups indexed. Never mutate one; build
// a new one and swap it.
type Snapshot struct {
	// Version identifies the config this snapshot was built from (a content
	// hash in file mode, the etcd revision under the control plane).
	Version string

	Server   Server
	Retry    Retry
	Cooldown Cooldown
	Breaker  Breaker
	Health   Health
	Timeouts Timeouts
	Cache    Cache

	// Delivery is the post-response policy's config; ModelPrices and
	// Accounting drive usage records.
	Delivery    delivery.Config
	ModelPrices []usage.ModelPrice
	Accounting  usage.AccountingConfig

	// Providers and Routes are in config order.
	Providers []*CompiledProvider
	Routes    []*CompiledRoute

	providers map[string]*CompiledProvider
	routes    map[string]*CompiledRoute
	keys      map[Digest]*Key
	pepper    []byte
}

// CompiledProvider is a provider with its API key resolved.
type CompiledProvider struct {
	Name             string
	Kind             string
	APIBase          string // without a trailing slash
	APIKey           string // secret: never log it
	AnthropicVersion string
	KVEvents         *KVEvents
	LMCache          *LMCache
	// EngineLoad is nil unless [providers.engine_load] is present.
	EngineLoad *CompiledEngineLoad
	// KVCapacityTokens is kv_capacity_tokens (0: not set).
	KVCapacityTokens int
	// StreamUsage is stream_usage, default applied.
	StreamUsage bool
}

// PublishesKV reports whether the provider's engine publishes KV state a
// kvwatcher follows: KV events or LMCache occupancy.
func (p *CompiledProvider) PublishesKV() bool { return p.KVEvents != nil || p.LMCache != nil }

// CompiledEngineLoad is a provider's engine-load scraping, defaults applied.
type CompiledEngineLoad struct {
	// URL is scraped with GET: api_base without a trailing /v1, plus path.
	URL string
	// Interval is the time between two scrapes; a value older than Stale
	// is not used.
	Interval time.Duration
	Stale    time.Duration
}

// LogValue keeps the API key out of logs.
func (p *CompiledProvider) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", p.Name), slog.String("kind", p.Kind), slog.String("api_base", p.APIBase))
}

// CompiledRoute is a route with its targets bound to providers.
type CompiledRoute struct {
	Model    string
	Strategy string
	Targets  []CompiledTarget
	// Cache is nil when the route has no [routes.cache] table.
	Cache *CompiledRouteCache
	// Balancer holds the strategy parameters; zero values mean defaults.
	// Its SpeculativeTTLMS is always nil: see SpeculativeTTL.
	Balancer Balancer
	// SpeculativeTTL is balancer.speculative_ttl_ms with its default
	// applied; 0 turns speculation off.
	SpeculativeTTL time.Duration
	// Variants, when present, split the route's traffic; each has its own
	// targets (Targets is then only their default, and may be empty).
	Variants []CompiledVariant
	// AllowVariantPin honours the x-rolter-variant request header.
	AllowVariantPin bool
}

// CompiledTarget is one upstream of a route.
type CompiledTarget struct {
	Provider *CompiledProvider
	// Model is the upstream model name sent to the provider.
	Model  string
	Weight int
}

// CompiledRouteCache is a route's response-cache settings, defaults applied.
type CompiledRouteCache struct {
	Enabled  bool
	TTL      time.Duration
	PerKey   bool
	Semantic *CompiledSemantic
}

// CompiledSemantic is a route's semantic-cache settings.
type CompiledSemantic struct {
	Provider      *CompiledProvider
	Model         string
	Threshold     float64
	MaxCandidates int
	Timeout       time.Duration
}

// Digest is the peppered digest of a virtual key secret.
type Digest [sha256.Size]byte

// Key is a virtual key as the data plane knows it: no secret, only rules.
type Key struct {
	// ID identifies the key in logs and cache scopes (its name).
	ID        string
	Models    map[string]bool // empty = all
	Providers map[string]bool // empty = all
	Disabled  bool
	ExpiresAt time.Time // zero = never
	// Cache overrides the route's cache opt-in when non-nil.
	Cache *bool
}

// AllowsModel reports whether the key may call the public model.
func (k *Key) AllowsModel(model string) bool { return len(k.Models) == 0 || k.Models[model] }

// AllowsProvider reports whether the key may reach the provider.
func (k *Key) AllowsProvider(name string) bool { return len(k.Providers) == 0 || k.Providers[name] }

// CompileOptions supplies what compilation reads from the outside world.
// Zero fields use the process's environment and file system.
type CompileOptions struct {
	Version   string
	LookupEnv func(string) (string, bool)
	ReadFile  func(string) ([]byte, error)
}

// Compile validates c and builds a Snapshot. Secret-resolution failures are
// reported with their field paths, like validation failures.
func Compile(c *Config, opts CompileOptions) (*Snapshot, error) {
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.ReadFile == nil {
		opts.ReadFile = os.ReadFile
	}
	cfg := *c
	applyDefaults(&cfg)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v := &validator{}
	s := &Snapshot{
		Version:  opts.Version,
		Server:   cfg.Server,
		Retry:    cfg.Retry,
		Cooldown: cfg.Cooldown,
		Breaker:  cfg.Breaker,
		Health:   cfg.Health,
		Timeouts: cfg.Timeouts,
		Cache:    cfg.Cache,
		Delivery: delivery.Config{
			Guardrails: cfg.Guardrails,
			Plugins:    append([]delivery.PluginConfig(nil), cfg.Plugins...),
			PII:        cfg.PII,
		},
		ModelPrices: append([]usage.ModelPrice(nil), cfg.ModelPrices...),
		Accounting:  cfg.Accounting,
		providers:   make(map[string]*CompiledProvider, len(cfg.Providers)),
		routes:      make(map[string]*CompiledRoute, len(cfg.Routes)),
		keys:        make(map[Digest]*Key, len(cfg.VirtualKeys)),
	}
	s.Server.KeyPepper = ""
	s.Server.CORS.AllowedOrigins = slices.Clone(cfg.Server.CORS.AllowedOrigins)
	s.Server.CORS.AllowedHeaders = slices.Clone(cfg.Server.CORS.AllowedHeaders)
	s.pepper = []byte(cfg.Server.KeyPepper)
	if env, ok := opts.LookupEnv("ROLTER_KEY_PEPPER"); ok && env != "" {
		s.pepper = []byte(env)
	}
	if len(s.pepper) == 0 {
		s.pepper = processPepper
	}
	for i, p := range cfg.Providers {
		cp := &CompiledProvider{
			Name: p.Name, Kind: p.Kind, APIBase: strings.TrimRight(p.APIBase, "/"),
			AnthropicVersion: p.AnthropicVersion,
			KVCapacityTokens: p.KVCapacityTokens,
			StreamUsage:      p.StreamUsage == nil || *p.StreamUsage,
		}
		if p.KVEvents != nil {
			kv := *p.KVEvents
			kv.DataParallelHosts = slices.Clone(kv.DataParallelHosts)
			cp.KVEvents = &kv
		}
		if p.LMCache != nil {
			lm := *p.LMCache
			cp.LMCache = &lm
		}
		if el := p.EngineLoad; el != nil {
			cp.EngineLoad = &CompiledEngineLoad{
				URL:      strings.TrimSuffix(cp.APIBase, "/v1") + el.Path,
				Interval: time.Duration(el.IntervalMS) * time.Millisecond,
				Stale:    time.Duration(el.StaleMS) * time.Millisecond,
			}
		}
		path := fmt.Sprintf("providers[%d]", i)
		switch {
		case p.APIKey != "":
			cp.APIKey = p.APIKey
		case p.APIKeyEnv != "":
			val, ok := opts.LookupEnv(p.APIKeyEnv)
			if !ok || val == "" {
				v.add(path+".api_key_env", "environment variable %q is not set", p.APIKeyEnv)
			}
			cp.APIKey = val
		case p.APIKeyFile != "":
			b, err := opts.ReadFile(p.APIKeyFile)
			if err != nil {
				v.add(path+".api_key_file", "%v", err)
			}
			cp.APIKey = strings.TrimSpace(string(b))
		}
		s.Providers = append(s.Providers, cp)
		s.providers[cp.Name] = cp
	}
	for _, r := range cfg.Routes {
		cr := &CompiledRoute{Model: r.Model, Strategy: r.Strategy, SpeculativeTTL: DefaultSpeculativeTTLMS * time.Millisecond}
		if r.Balancer != nil {
			cr.Balancer, cr.SpeculativeTTL = compileBalancer(*r.Balancer)
		}
		cr.Targets = s.compileTargets(r.Model, r.Targets)
		s.compileVariants(&r, cr)
		if rc := r.Cache; rc != nil {
			ttl := cfg.Cache.DefaultTTLSecs
			if rc.TTLSecs != nil {
				ttl = *rc.TTLSecs
			}
			cc := &CompiledRouteCache{Enabled: *rc.Enabled, TTL: time.Duration(ttl) * time.Second, PerKey: rc.PerKey}
			if sem := rc.Semantic; sem != nil {
				cc.Semantic = &CompiledSemantic{
					Provider: s.providers[sem.Provider], Model: sem.Model,
					Threshold: *sem.Threshold, MaxCandidates: *sem.MaxCandidates,
					Timeout: time.Duration(sem.TimeoutMS) * time.Millisecond,
				}
			}
			cr.Cache = cc
		}
		s.Routes = append(s.Routes, cr)
		s.routes[cr.Model] = cr
	}
	for i, k := range cfg.VirtualKeys {
		path := fmt.Sprintf("virtual_keys[%d]", i)
		var d Digest
		switch {
		case k.KeyDigest != "":
			d, _ = ParseDigest(k.KeyDigest) // Validate checked it
		case k.KeyEnv != "":
			val, ok := opts.LookupEnv(k.KeyEnv)
			if !ok || len(val) < 16 {
				v.add(path+".key_env", "environment variable %q is not set or shorter than 16 characters", k.KeyEnv)
				continue
			}
			d = s.digest(val)
		default:
			d = s.digest(k.Key)
		}
		if _, dup := s.keys[d]; dup {
			v.add(path+".key", "same secret as another key")
			continue
		}
		key := &Key{ID: k.Name, Disabled: k.Disabled, Cache: k.Cache, Models: set(k.Models), Providers: set(k.Providers)}
		if k.ExpiresAt != nil {
			key.ExpiresAt = *k.ExpiresAt
		}
		s.keys[d] = key
	}
	if err := v.err(); err != nil {
		return nil, err
	}
	return s, nil
}

// compileBalancer splits b into the balancer parameters and the
// speculative TTL with its default applied.
func compileBalancer(b Balancer) (Balancer, time.Duration) {
	ttl := DefaultSpeculativeTTLMS * time.Millisecond
	if t := b.SpeculativeTTLMS; t != nil {
		ttl = time.Duration(*t) * time.Millisecond
	}
	// Compiled values hold no pointers, so that two compiles of one config
	// print (and fingerprint) the same.
	b.SpeculativeTTLMS = nil
	return b, ttl
}

func (s *Snapshot) compileTargets(model string, targets []Target) []CompiledTarget {
	var out []CompiledTarget
	for _, t := range targets {
		m := t.Model
		if m == "" {
			m = model
		}
		out = append(out, CompiledTarget{Provider: s.providers[t.Provider], Model: m, Weight: *t.Weight})
	}
	return out
}

// processPepper is the fallback pepper: random per process, so file-mode
// digests are useless outside it.
var processPepper = func() []byte {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return b
}()

func set(list []string) map[string]bool {
	if len(list) == 0 {
		return nil
	}
	m := make(map[string]bool, len(list))
	for _, s := range list {
		m[s] = true
	}
	return m
}

// DigestKey computes the peppered digest of a virtual key secret.
func DigestKey(pepper []byte, secret string) Digest {
	mac := hmac.New(sha256.New, pepper)
	mac.Write([]byte(secret))
	var d Digest
	copy(d[:], mac.Sum(nil))
	return d
}

// String is the lowercase hex of the digest, the form of
// virtual_keys[].key_digest.
func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// ParseDigest parses the hex form of a [Digest].
func ParseDigest(s string) (Digest, error) {
	var d Digest
	if len(s) != 2*len(d) {
		return d, fmt.Errorf("must be %d hex characters, got %d", 2*len(d), len(s))
	}
	if _, err := hex.Decode(d[:], []byte(s)); err != nil {
		return d, errors.New("must be hex")
	}
	return d, nil
}

// PepperCheck fingerprints a pepper without revealing it, so that two
// processes can tell whether they digest keys with the same pepper.
func PepperCheck(pepper []byte) string {
	d := DigestKey(pepper, "rolter:pepper-check:v1")
	return hex.EncodeToString(d[:8])
}

func (s *Snapshot) digest(secret string) Digest { return DigestKey(s.pepper, secret) }

// Provider returns the named provider, or nil.
func (s *Snapshot) Provider(name string) *CompiledProvider { return s.providers[name] }

// Route returns the route of a public model name, or nil.
func (s *Snapshot) Route(model string) *CompiledRoute { return s.routes[model] }

// Open reports whether requests need no virtual key: no key is configured
// and server.require_auth is explicitly false (it defaults to true).
func (s *Snapshot) Open() bool { return len(s.keys) == 0 && !s.Server.RequireAuth }

// KeyCount is the number of virtual keys configured.
func (s *Snapshot) KeyCount() int { return len(s.keys) }

// Auth errors returned by [Snapshot.Authenticate]. They deliberately say the
// same for unknown, disabled and expired keys to the client.
var (
	ErrKeyMissing = errors.New("config: missing api key")
	ErrKeyInvalid = errors.New("config: invalid api key")
)

// Authenticate resolves a presented secret to its key. Unknown, disabled and
// expired keys all return ErrKeyInvalid.
func (s *Snapshot) Authenticate(secret string, now time.Time) (*Key, error) {
	if secret == "" {
		return nil, ErrKeyMissing
	}
	k, ok := s.keys[s.digest(secret)]
	if !ok || k.Disabled || (!k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt)) {
		return nil, ErrKeyInvalid
	}
	return k, nil
}
