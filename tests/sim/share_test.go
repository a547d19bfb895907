package sim

import (
	"testing"
	"time"

	"rolter.dev/pkg/fleet"
)

// Four proxies that share their routing state through pkg/fleet hit the
// replicas' caches about as often as one proxy, where four independent
// proxies lose most of it; the peers' policies are not affected by Share.
func TestSharingProxiesRouteAsOne(t *testing.T) {
	w := preciseWorkload()
	// Clients starting over a second, and all in the same instant: then
	// requests of one new prefix reach several proxies before any hears
	// of the others, a prefix lands on several replicas, and the proxies
	// must agree on one copy afterwards (sharing.preferred in pkg/routing;
	// before they did, this run reached 0.87 of one proxy's hit rate).
	for _, ramp := range []time.Duration{time.Second, 0} {
		one := preciseConfig()
		one.Ramp = ramp
		four := one
		four.Proxies = 4
		shared := four
		shared.Share = true
		for _, name := range []string{"cache_aware", "cache_aware:balance_rel=2"} {
			r1, r4, rs := mustRun(t, one, w, name), mustRun(t, four, w, name), mustRun(t, shared, w, name)
			t.Logf("%s, ramp %v: one proxy %.3f, four independent %.3f, four sharing %.3f (imbalance %.2f)", name, ramp, r1.HitRate, r4.HitRate, rs.HitRate, rs.LoadImbalance)
			if !rs.Shared || r4.Shared {
				t.Fatalf("%s: Shared = %v with sharing, %v without", name, rs.Shared, r4.Shared)
			}
			if rs.HitRate < 0.95*r1.HitRate || rs.HitRate < r4.HitRate+0.1 {
				t.Errorf("%s, ramp %v: sharing proxies hit %.3f; one proxy %.3f, independent ones %.3f", name, ramp, rs.HitRate, r1.HitRate, r4.HitRate)
			}
			if rs.LoadImbalance > 1.25 {
				t.Errorf("%s, ramp %v: sharing proxies' load imbalance %.2f", name, ramp, rs.LoadImbalance)
			}
		}
	}
	four := preciseConfig()
	four.Proxies = 4
	shared := four
	shared.Share = true
	// A peer's policy does not share: Share changes nothing for it.
	a, b := mustRun(t, four, w, "sglang"), mustRun(t, shared, w, "sglang")
	if a.HitRate != b.HitRate || b.Shared {
		t.Fatalf("sglang with Share: hit %.3f vs %.3f, Shared %v", b.HitRate, a.HitRate, b.Shared)
	}
}

// Without a propagation delay or a load interval worth mentioning, sharing
// proxies see each other's picks; with the messages never arriving in time
// (a delay longer than the run) they behave like independent ones.
func TestSharingNeedsTheMessages(t *testing.T) {
	w := preciseWorkload()
	cfg := preciseConfig()
	cfg.Ramp, cfg.Proxies, cfg.Share = time.Second, 4, true
	fast := mustRun(t, cfg, w, "cache_aware")
	cfg.ShareDelay = time.Hour
	late := mustRun(t, cfg, w, "cache_aware")
	cfg.Share = false
	off := mustRun(t, cfg, w, "cache_aware")
	t.Logf("hit rate: messages in time %.3f, never in time %.3f, no sharing %.3f", fast.HitRate, late.HitRate, off.HitRate)
	if late.HitRate > off.HitRate+0.03 || fast.HitRate < late.HitRate+0.1 {
		t.Fatalf("hit rate: messages in time %.3f, never in time %.3f, no sharing %.3f", fast.HitRate, late.HitRate, off.HitRate)
	}
}

// Ramp starts the closed loop's clients one by one.
func TestRamp(t *testing.T) {
	w := preciseWorkload()
	cfg := preciseConfig()
	cfg.Ramp = 700 * time.Millisecond
	r, err := Run(cfg, w, mustStrategy(t, "round_robin"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != w.Requests() {
		t.Fatalf("%d of %d requests completed", r.Requests, w.Requests())
	}
	cfg.Ramp = 0
	r0, _ := Run(cfg, w, mustStrategy(t, "round_robin"))
	if r.Makespan <= r0.Makespan {
		t.Fatalf("makespan %v with a ramp, %v without: the ramp did not delay the start", r.Makespan, r0.Makespan)
	}
}

// SpreadArrivals keeps the order and spreads each bucket within it.
func TestSpreadArrivals(t *testing.T) {
	w := &Workload{}
	for i, at := range []time.Duration{0, 0, 0, 3 * time.Second, 3 * time.Second, 6 * time.Second} {
		w.Sessions = append(w.Sessions, &Session{ID: i, Start: at})
	}
	SpreadArrivals(w, 1)
	prev := time.Duration(-1)
	for i, s := range w.Sessions {
		if s.Start < prev {
			t.Fatalf("session %d starts at %v, before its predecessor's %v", i, s.Start, prev)
		}
		prev = s.Start
	}
	if s := w.Sessions; s[0].Start == s[1].Start && s[1].Start == s[2].Start || s[2].Start >= 3*time.Second || s[4].Start >= 6*time.Second || s[3].Start < 3*time.Second {
		t.Fatalf("buckets not spread within themselves: %v %v %v | %v %v | %v", s[0].Start, s[1].Start, s[2].Start, s[3].Start, s[4].Start, s[5].Start)
	}
}

// Through four sharing proxies, a burst of requests that share new prefixes
// (gsp's clients starting in one instant) is placed in turns (Defer in
// pkg/routing): most of what picking it blind (:turns=0) loses to
// duplicated system prompts against one proxy comes back.
func TestBurstTakesTurns(t *testing.T) {
	w := GSP(GSPParams{Groups: 16, PromptsPerGroup: 8, SystemLen: 1024, QuestionLen: 64, OutputLen: 32, Concurrency: 64}, 1)
	cfg := DefaultConfig()
	one := mustRun(t, cfg, w, "predicted_ttft")
	cfg.Proxies, cfg.Share = 4, true
	turns, blind := mustRun(t, cfg, w, "predicted_ttft"), mustRun(t, cfg, w, "predicted_ttft:turns=0")
	t.Logf("hit rate: one proxy %.3f, four in turns %.3f (%d deferred), four blind %.3f", one.HitRate, turns.HitRate, turns.Decisions["deferred"], blind.HitRate)
	if turns.Decisions["deferred"] == 0 || blind.Decisions["deferred"] != 0 {
		t.Fatalf("deferred: %d in turns, %d blind", turns.Decisions["deferred"], blind.Decisions["deferred"])
	}
	if turns.HitRate-blind.HitRate < (one.HitRate-blind.HitRate)/2 {
		t.Fatalf("hit rate: one proxy %.3f, four in turns %.3f, four blind %.3f", one.HitRate, turns.HitRate, blind.HitRate)
	}
	// The turns' picks leave at once (pkg/routing's ReportTrigger, the
	// proxies' Urgent), not on the queue ticks: with the ticks an hour
	// apart the burst is placed as well.
	cfg.ShareQueueInterval = time.Hour
	untick := mustRun(t, cfg, w, "predicted_ttft")
	t.Logf("hit rate with the queue ticks an hour apart: %.3f (%d reports at once)", untick.HitRate, untick.Decisions["reports_at_once"])
	if untick.Decisions["reports_at_once"] == 0 || untick.HitRate < turns.HitRate-0.01 {
		t.Fatalf("hit rate: four in turns %.3f, with the queue ticks an hour apart %.3f", turns.HitRate, untick.HitRate)
	}
}

// With more proxies than a trace's same-instant buckets have requests (8
// proxies, 4 replicas, buckets of 3 new prompts), each proxy mostly
// receives its requests one at a time, and only the peers' reported
// arrivals show the bursts: in turns, at least a quarter of the TTFT that
// blind picks lose against one proxy comes back (rolter-sim, seed 1: 29 %;
// 4 % without the peers' arrivals).
func TestFleetBurstsTakeTurns(t *testing.T) {
	var recs []TraceRecord
	id := int64(0)
	for b := range 60 {
		for k := range 3 {
			blocks := 12 + (b*4+k)%17 // prompts of 6,144 to 14,336 tokens: the law needs lengths that differ
			r := TraceRecord{Timestamp: int64(b) * 1000, InputLength: blocks * TraceBlockTokens, OutputLength: 16}
			for range blocks {
				id++
				r.HashIDs = append(r.HashIDs, id)
			}
			recs = append(recs, r)
		}
	}
	w := TraceWorkload(recs, 0, 1, 1)
	cfg := DefaultConfig()
	cfg.Replicas = 4
	one := mustRun(t, cfg, w, "predicted_ttft")
	cfg.Proxies, cfg.Share = 8, true
	// And where the fleet's messages take twice its queue interval to
	// arrive (a fleet across zones): the turns are as long as the trip.
	for _, trip := range []time.Duration{DefaultShareDelay, 2 * fleet.DefaultQueueInterval} {
		cfg.ShareDelay = trip
		turns, blind := mustRun(t, cfg, w, "predicted_ttft"), mustRun(t, cfg, w, "predicted_ttft:turns=0")
		t.Logf("trip %v, TTFT mean: one proxy %v, 8 in turns %v (%d deferred), 8 blind %v", trip, one.TTFTMean, turns.TTFTMean, turns.Decisions["deferred"], blind.TTFTMean)
		if blind.TTFTMean-turns.TTFTMean < (blind.TTFTMean-one.TTFTMean)/4 {
			t.Fatalf("trip %v, TTFT mean: one proxy %v, 8 in turns %v, 8 blind %v", trip, one.TTFTMean, turns.TTFTMean, blind.TTFTMean)
		}
	}
}
