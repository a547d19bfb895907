package app

import (
	"context"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"rolter.dev/pkg/config"
)

// Mode is how the watcher reaches a provider's KV-event publisher.
type Mode string

// The connection modes.
const (
	// ModeConnect dials the endpoint the replica binds (vLLM's
	// "tcp://*:5557"; the watcher connects to tcp://<replica>:5557).
	ModeConnect Mode = "connect"
	// ModeBind binds the endpoint and lets replicas connect to it (their
	// --kv-events-config endpoint names the watcher). Several providers may
	// share one bound endpoint; each message goes to the provider whose
	// topic equals the message's topic exactly.
	ModeBind Mode = "bind"
)

// Provider is one provider to watch, as a [Source] gives it.
type Provider struct {
	// Name is the provider's name: the NATS subjects and the proxies'
	// index use it.
	Name string
	// KV configures the vLLM KV-event stream; nil for none.
	KV *KVSpec
	// LM configures LMCache occupancy polling; nil for none.
	LM *LMSpec
}

// KVSpec configures a provider's KV-event stream.
type KVSpec struct {
	// Endpoint is the publisher's ZMQ endpoint (ModeConnect) or the
	// endpoint to bind (ModeBind): tcp://HOST:PORT or ipc://PATH.
	Endpoint string
	// Topic is the subscription's topic prefix (ModeConnect) or the exact
	// topic of this provider's messages (ModeBind), e.g. kv@pod-a@model.
	Topic string
	// Mode is ModeConnect or ModeBind.
	Mode Mode
	// ReplayEndpoint is the replica's replay ROUTER (vLLM's
	// replay_endpoint), dialled on a sequence gap and to catch up on a new
	// stream; empty for none.
	ReplayEndpoint string
	// Model names the identity chains of the provider's blocks (see
	// kvindex.Seed): the upstream model name the proxies send. Blocks of a
	// LoRA adapter use the adapter's name instead.
	Model string
	// MaxBlocks caps the blocks kept; the oldest are evicted first.
	MaxBlocks int
	// Stale is how long the provider's telemetry stays fresh without an
	// event.
	Stale time.Duration
	// DataParallelSize is the engine's number of data-parallel ranks (0
	// means 1). Rank r publishes on Endpoint's port + r and replays on
	// ReplayEndpoint's port + r ([RankEndpoint]); each rank has its own
	// sequence, and the provider's blocks are the union of the ranks'.
	DataParallelSize int
	// DataParallelHosts, for ranks on several nodes (ModeConnect only),
	// are the nodes' hosts in rank order, each running
	// Ranks()/len(DataParallelHosts) consecutive ranks: rank r publishes
	// and replays on its node's host, at the ports above. Empty: every
	// rank on Endpoint's host.
	DataParallelHosts []string
}

// Ranks returns the number of data-parallel ranks (at least 1).
func (kv *KVSpec) Ranks() int { return max(kv.DataParallelSize, 1) }

// RankEndpoints returns where data-parallel rank publishes and replays:
// [RankEndpoint] of Endpoint and ReplayEndpoint, on the rank's node's host
// when DataParallelHosts is set.
func (kv *KVSpec) RankEndpoints(rank int) (endpoint, replay string, err error) {
	if endpoint, err = RankEndpoint(kv.Endpoint, rank); err != nil {
		return "", "", err
	}
	if replay, err = RankEndpoint(kv.ReplayEndpoint, rank); err != nil {
		return "", "", err
	}
	if n := len(kv.DataParallelHosts); n > 0 {
		host := kv.DataParallelHosts[min(rank/max(kv.Ranks()/n, 1), n-1)]
		endpoint, replay = onHost(endpoint, host), onHost(replay, host)
	}
	return endpoint, replay, nil
}

// onHost returns the tcp:// endpoint with its host replaced by host (other
// endpoints unchanged).
func onHost(endpoint, host string) string {
	if !strings.HasPrefix(endpoint, "tcp://") {
		return endpoint
	}
	return "tcp://" + host + endpoint[strings.LastIndexByte(endpoint, ':'):]
}

// RankEndpoint returns the endpoint data-parallel rank uses when endpoint
// is configured, as vLLM's ZmqEventPublisher.offset_endpoint_port computes
// it: the TCP port plus rank (rank 0: endpoint itself). vLLM appends
// "_dp<rank>" to inproc:// endpoints and rejects anything else; so does
// this, bar inproc (a watcher cannot reach it).
func RankEndpoint(endpoint string, rank int) (string, error) {
	if rank == 0 || endpoint == "" {
		return endpoint, nil
	}
	u, err := url.Parse(strings.Replace(endpoint, "://*:", "://0.0.0.0:", 1))
	if err != nil || u.Scheme != "tcp" {
		return "", fmt.Errorf("endpoint %q: data-parallel ranks need tcp://HOST:PORT", endpoint)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil || port < 1 || port+rank > 65535 {
		return "", fmt.Errorf("endpoint %q: no port for rank %d", endpoint, rank)
	}
	i := strings.LastIndexByte(endpoint, ':')
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}

// LMSpec configures LMCache occupancy polling.
type LMSpec struct {
	// Endpoint is polled with GET for {"occupancy": f, "cache_available": b}.
	Endpoint string
	// Refresh is the time between polls.
	Refresh time.Duration
	// Stale is how long an occupancy stays fresh.
	Stale time.Duration
}

// Equal reports whether p and o configure the same watch.
func (p Provider) Equal(o Provider) bool {
	if p.Name != o.Name || (p.KV == nil) != (o.KV == nil) || (p.LM == nil) != (o.LM == nil) {
		return false
	}
	return (p.KV == nil || p.KV.equal(o.KV)) && (p.LM == nil || *p.LM == *o.LM)
}

func (kv *KVSpec) equal(o *KVSpec) bool {
	a, b := *kv, *o
	hostsEqual := slices.Equal(a.DataParallelHosts, b.DataParallelHosts)
	a.DataParallelHosts, b.DataParallelHosts = nil, nil
	return hostsEqual && reflect.DeepEqual(a, b)
}

func (p Provider) validate() error {
	if p.Name == "" {
		return fmt.Errorf("provider without a name")
	}
	if kv := p.KV; kv != nil {
		if kv.Endpoint == "" {
			return fmt.Errorf("provider %q: kv_events.endpoint is empty", p.Name)
		}
		if kv.Mode != ModeConnect && kv.Mode != ModeBind {
			return fmt.Errorf("provider %q: kv_events.mode: want connect or bind, got %q", p.Name, kv.Mode)
		}
		if kv.Stale <= 0 {
			return fmt.Errorf("provider %q: kv_events.stale_secs must be > 0", p.Name)
		}
		if kv.DataParallelSize < 0 {
			return fmt.Errorf("provider %q: kv_events.data_parallel_size must be >= 1", p.Name)
		}
		if n := len(kv.DataParallelHosts); n > 0 && (kv.Mode != ModeConnect || kv.Ranks()%n != 0 || slices.Contains(kv.DataParallelHosts, "")) {
			return fmt.Errorf("provider %q: kv_events.data_parallel_hosts: want connect mode and non-empty hosts that each run the same number of the %d ranks", p.Name, kv.Ranks())
		}
		for r := 1; r < kv.Ranks(); r++ {
			if _, _, err := kv.RankEndpoints(r); err != nil {
				return fmt.Errorf("provider %q: kv_events: %w", p.Name, err)
			}
		}
	}
	if lm := p.LM; lm != nil && (lm.Endpoint == "" || lm.Refresh <= 0 || lm.Stale <= 0) {
		return fmt.Errorf("provider %q: lmcache needs endpoint, refresh_secs and stale_secs", p.Name)
	}
	return nil
}

// Source yields the providers to watch: the file in file mode, the control
// plane's snapshot stream otherwise (any implementation of this interface).
type Source interface {
	// Run calls update with the current providers and again after every
	// change, from Run's goroutine only, until ctx ends (then it returns
	// nil) or the source fails for good (then it returns the error).
	// Providers without KV events or LMCache are left out by the caller.
	Run(ctx context.Context, update func([]Provider)) error
}

// StaticSource is a [Source] that gives one fixed list.
type StaticSource []Provider

// Run calls update once and waits for ctx to end.
func (s StaticSource) Run(ctx context.Context, update func([]Provider)) error {
	update([]Provider(s))
	<-ctx.Done()
	return nil
}

// FromConfig returns the providers of c that have [providers.kv_events] or
// [providers.lmcache], in config order.
//
// The KV mode is "bind" when the endpoint's host is a wildcard ("*",
// "0.0.0.0", "::", "[::]") and "connect" otherwise. The identity model is
// the upstream model the routes send to the provider (a target's model, or
// its route's model); when the routes send several, the first in config
// order is used and the ambiguity is returned in warnings.
func FromConfig(c *config.Config) (providers []Provider, warnings []string) {
	models := map[string][]string{}
	for _, r := range c.Routes {
		targets := slices.Clone(r.Targets)
		for _, v := range r.Variants {
			targets = append(targets, v.Targets...)
		}
		for _, t := range targets {
			m := t.Model
			if m == "" {
				m = r.Model
			}
			if !contains(models[t.Provider], m) {
				models[t.Provider] = append(models[t.Provider], m)
			}
		}
	}
	for _, p := range c.Providers {
		if p.KVEvents == nil && p.LMCache == nil {
			continue
		}
		out := Provider{Name: p.Name}
		if kv := p.KVEvents; kv != nil {
			spec := &KVSpec{
				Endpoint: kv.Endpoint, Topic: kv.Topic, Mode: DefaultMode(kv.Endpoint),
				MaxBlocks: kv.MaxBlocks, Stale: time.Duration(kv.StaleSecs) * time.Second,
				DataParallelSize: max(kv.DataParallelSize, 1), DataParallelHosts: slices.Clone(kv.DataParallelHosts),
			}
			if kv.Mode != "" {
				spec.Mode = Mode(kv.Mode)
			}
			spec.ReplayEndpoint = kv.ReplayEndpoint
			if kv.Model != "" {
				spec.Model = kv.Model
			} else if ms := models[p.Name]; len(ms) > 0 {
				spec.Model = ms[0]
				if len(ms) > 1 {
					warnings = append(warnings, fmt.Sprintf("provider %q: routes send models %q; block identities use %q (set kv_events.model)", p.Name, ms, ms[0]))
				}
			}
			out.KV = spec
		}
		if lm := p.LMCache; lm != nil {
			out.LM = &LMSpec{Endpoint: lm.Endpoint, Refresh: time.Duration(lm.RefreshSecs) * time.Second, Stale: time.Duration(lm.StaleSecs) * time.Second}
		}
		providers = append(providers, out)
	}
	return providers, warnings
}

// DefaultMode returns ModeBind for an endpoint whose host is a wildcard and
// ModeConnect otherwise (an ipc:// endpoint is dialled).
func DefaultMode(endpoint string) Mode {
	if config.WildcardHost(endpoint) {
		return ModeBind
	}
	return ModeConnect
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
