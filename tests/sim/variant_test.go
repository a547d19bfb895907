package sim

import (
	"math"
	"testing"
)

// TestVariantsSplit: a 90/10 route over two replica pools sends about 10 %
// of the sessions' requests to the canary's pool and none outside its
// pools, and the report adds up to the run.
func TestVariantsSplit(t *testing.T) {
	specs, err := ParseVariants("stable=90:cache_aware@0-5,canary=10:least_load@6+7")
	if err != nil {
		t.Fatal(err)
	}
	st, rep, err := Variants(specs, 8)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.SessionKeys = true
	mt := DefaultMultiturn()
	mt.Clients, mt.Rounds = 400, 3
	res, err := Run(cfg, Multiturn(mt, 1), st)
	if err != nil {
		t.Fatal(err)
	}
	rep.Finish()
	stable, canary := rep.Variants[0], rep.Variants[1]
	if stable.Requests+canary.Requests != res.Requests {
		t.Fatalf("report %d + %d requests, run %d", stable.Requests, canary.Requests, res.Requests)
	}
	// Sessions are sticky: the share is over 400 sessions (binomial sd 1.5 %).
	if share := float64(canary.Requests) / float64(res.Requests); math.Abs(share-0.10) > 0.05 {
		t.Errorf("canary share %.3f, want 0.10 ± 0.05", share)
	}
	served := 0
	for i, r := range res.Replicas {
		if i >= 6 {
			served += r.Requests
		}
	}
	if served != canary.Requests {
		t.Errorf("replicas 6-7 served %d requests, the canary %d", served, canary.Requests)
	}
	if canary.TTFTP50 <= 0 || stable.HitRate <= 0 {
		t.Errorf("stats not computed: %+v %+v", stable, canary)
	}
}

func TestParseVariantsErrors(t *testing.T) {
	for _, s := range []string{"stable", "stable=x:cache_aware@0", "a=1:nope@0", "a=1:random@3-1", "a=1:random"} {
		if _, err := ParseVariants(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
	specs, _ := ParseVariants("a=0:random@0,b=0:random@1")
	if _, _, err := Variants(specs, 2); err == nil {
		t.Error("weights summing to 0 accepted")
	}
	specs, _ = ParseVariants("a=1:random@0-8")
	if _, _, err := Variants(specs, 8); err == nil {
		t.Error("a replica outside the fleet accepted")
	}
}

// FuzzParseVariants: the --variants flag never panics, and what it accepts
// names a replica range it can build (or Variants refuses it).
func FuzzParseVariants(f *testing.F) {
	for _, s := range []string{"stable=90:cache_aware@0-5,canary=10:least_load@6+7", "a=1:random@0", "a=1:random@0-99999999999", "a=-1:x@", "=@", "a=1:cache_aware:threshold=0.3@0-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		specs, err := ParseVariants(s)
		if err != nil {
			return
		}
		for _, v := range specs {
			if v.Name == "" || len(v.Replicas) == 0 || v.Strategy.New == nil {
				t.Fatalf("%q parsed into %+v", s, v)
			}
		}
		_, _, _ = Variants(specs, 8)
	})
}
