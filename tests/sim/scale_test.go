package sim

import (
	"strings"
	"testing"
)

// predicted_ttft:scale_s=S routes over every replica but the last until S
// seconds in, then reloads the route with the last one added (drain_s: the
// last one taken out). The reloaded balancer inherits what the old one
// learned: without KV events its approximate index is all it knows of
// where the conversations are, and a balancer rebuilt from nothing
// re-prefills them (the CLI measures the same at the defaults:
// docs/routing.md, a route whose targets change).
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

	// :drain_s takes the last replica out of the route: it serves requests
	// before, none after, and the replicas that stay keep their
	// conversations only by inheritance.
	drainedInherited := mustRun(t, cfg, w, "predicted_ttft:kv_events=0:drain_s=4")
	drainedRebuilt := mustRun(t, cfg, w, "predicted_ttft:kv_events=0:drain_s=4:inherit=0")
	notDrained := mustRun(t, cfg, w, "predicted_ttft:kv_events=0:drain_s=100000")
	if drainedInherited.Replicas[cfg.Replicas-1].Requests >= notDrained.Replicas[cfg.Replicas-1].Requests {
		t.Fatalf("the drained replica served %d requests, as many as when never drained (%d)",
			drainedInherited.Replicas[cfg.Replicas-1].Requests, notDrained.Replicas[cfg.Replicas-1].Requests)
	}
	if drainedInherited.CachedTokens <= drainedRebuilt.CachedTokens {
		t.Fatalf("after a drain, inheriting cached %d prompt tokens, rebuilding %d", drainedInherited.CachedTokens, drainedRebuilt.CachedTokens)
	}

	// Through two proxies that share their state, each reloads its own
	// route and rebinds the new balancer to the fleet, as the proxy does.
	shared := cfg
	shared.Proxies, shared.Share = 2, true
	sharedInherited := mustRun(t, shared, w, "predicted_ttft:kv_events=0:scale_s=4")
	sharedRebuilt := mustRun(t, shared, w, "predicted_ttft:kv_events=0:scale_s=4:inherit=0")
	if sharedInherited.CachedTokens <= sharedRebuilt.CachedTokens {
		t.Fatalf("through sharing proxies, inheriting cached %d prompt tokens, rebuilding %d", sharedInherited.CachedTokens, sharedRebuilt.CachedTokens)
	}

	cfg.Replicas = 1
	if _, err := Run(cfg, w, mustStrategy(t, "predicted_ttft:scale_s=4")); err == nil || !strings.Contains(err.Error(), "scale_s") {
		t.Fatalf("scale_s on one replica: error %v, want one naming scale_s", err)
	}
}

// predicted_ttft:restart_s=S restarts the proxy at S: its new balancer
// reads back the state the old one wrote (routing.StateKeeper, the proxy's
// --routing-state) through its binary form, or with :inherit=0 starts from
// nothing and loses every conversation's replica.
func TestRestartReadsBackItsState(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Replicas = 4
	mt := DefaultMultiturn()
	mt.Clients = 64
	w := Multiturn(mt, cfg.Seed)
	restored := mustRun(t, cfg, w, "predicted_ttft:kv_events=0:restart_s=4")
	fresh := mustRun(t, cfg, w, "predicted_ttft:kv_events=0:restart_s=4:inherit=0")
	if restored.CachedTokens <= fresh.CachedTokens {
		t.Fatalf("restored from its state the restarted proxy cached %d prompt tokens, from nothing %d", restored.CachedTokens, fresh.CachedTokens)
	}
	t.Logf("hit rate: restored %.3f, from nothing %.3f", restored.HitRate, fresh.HitRate)

	// One proxy of two restarts (:restart_one=1): its peer keeps routing
	// as before, so the run is between never restarting and both.
	shared := cfg
	shared.Proxies, shared.Share = 2, true
	bothFresh := mustRun(t, shared, w, "predicted_ttft:kv_events=0:restart_s=4:inherit=0")
	oneFresh := mustRun(t, shared, w, "predicted_ttft:kv_events=0:restart_s=4:inherit=0:restart_one=1")
	if oneFresh.CachedTokens <= bothFresh.CachedTokens {
		t.Fatalf("one proxy of two restarting from nothing cached %d prompt tokens, both %d", oneFresh.CachedTokens, bothFresh.CachedTokens)
	}
	cfg.Replicas = 1 // a restart needs no second replica
	mustRun(t, cfg, w, "predicted_ttft:restart_s=4")
}
