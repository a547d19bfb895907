package sim

import (
	"strings"
	"testing"
)

// predicted_ttft:scale_s=S routes over every replica but the last until S
// seconds in, then reloads the route with the last one added. The reloaded
// balancer inherits what the old one learned: without KV events its
// approximate index is all it knows of where the conversations are, and a
// balancer rebuilt from nothing re-prefills them (the CLI measures the
// same at the defaults: docs/routing.md, a route whose targets change).
func TestScaleInherits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Replicas = 4
	mt := DefaultMultiturn()
	mt.Clients = 64
	w := Multiturn(mt, cfg.Seed)

	never := mustRun(t, cfg, w, "predicted_ttft:kv_events=0:scale_s=100000")
	if last := never.Replicas[cfg.Replicas-1].Requests; last != 0 {
		t.Fatalf("the last replica, not yet in the route, served %d requests", last)
	}
	inherited := mustRun(t, cfg, w, "predicted_ttft:kv_events=0:scale_s=4")
	rebuilt := mustRun(t, cfg, w, "predicted_ttft:kv_events=0:scale_s=4:inherit=0")
	if inherited.Replicas[cfg.Replicas-1].Requests == 0 || rebuilt.Replicas[cfg.Replicas-1].Requests == 0 {
		t.Fatal("the replica that joined the route at 4 s served nothing")
	}
	if inherited.CachedTokens <= rebuilt.CachedTokens {
		t.Fatalf("inheriting cached %d prompt tokens, rebuilding %d: the rebuilt balancer should have lost its conversations",
			inherited.CachedTokens, rebuilt.CachedTokens)
	}
	t.Logf("hit rate: inherited %.3f, rebuilt %.3f", inherited.HitRate, rebuilt.HitRate)

	cfg.Proxies, cfg.Share = 2, true
	if _, err := Run(cfg, w, mustStrategy(t, "predicted_ttft:scale_s=4")); err == nil || !strings.Contains(err.Error(), "scale_s") {
		t.Fatalf("scale_s through sharing proxies: error %v, want one naming scale_s", err)
	}
}
