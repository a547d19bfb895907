package proxy

import (
	"testing"

	"rolter.dev/pkg/config"
	"rolter.dev/pkg/kvindex"
)

// The proxy seeds a target's block identities with the model the kvwatcher
// seeds the engine's blocks with: kv_events.model when set (the served
// name can differ from the upstream model the proxy sends), else the
// upstream model. Seeded differently, no block would ever match.
func TestKVSourceSeedsLikeTheWatcher(t *testing.T) {
	named := &config.CompiledProvider{Name: "a", KVEvents: &config.KVEvents{Endpoint: "tcp://a:5557", Model: "served-name"}}
	unnamed := &config.CompiledProvider{Name: "b", KVEvents: &config.KVEvents{Endpoint: "tcp://b:5557"}}
	s := newKVSource(nil, []target{
		{cfg: config.CompiledTarget{Provider: named, Model: "upstream-name"}},
		{cfg: config.CompiledTarget{Provider: unnamed, Model: "upstream-name"}},
	})
	if got, want := s.targets[0].seed, kvindex.Seed("served-name"); got != want {
		t.Errorf("kv_events.model set: seed %x, want kv_events.model's %x", got, want)
	}
	if got, want := s.targets[1].seed, kvindex.Seed("upstream-name"); got != want {
		t.Errorf("kv_events.model unset: seed %x, want the upstream model's %x", got, want)
	}
}
