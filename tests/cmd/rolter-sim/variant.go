package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"rolter.dev/tests/sim"
)

// runVariants runs --variants: one route split over weighted variants,
// each with its own strategy over its own replicas, reported per variant.
func runVariants(o *options, stdout, stderr io.Writer) error {
	specs, err := sim.ParseVariants(o.variants)
	if err != nil {
		return err
	}
	st, rep, err := sim.Variants(specs, o.cfg.Replicas)
	if err != nil {
		return err
	}
	w, err := o.buildWorkload()
	if err != nil {
		return err
	}
	bar := newProgress(stderr, !o.quiet && isTerminal(stderr), w.Requests())
	cfg := o.cfg
	bar.label = st.Name
	cfg.Progress = bar.step
	res, err := sim.Run(cfg, w, st)
	bar.clear()
	if err != nil {
		return err
	}
	rep.Finish()
	if o.jsonOut {
		enc := json.NewEncoder(stdout)
		for _, v := range rep.Variants {
			rec := map[string]any{
				"variant": v.Name, "weight": v.Weight, "replicas": v.Replicas, "workload": res.Workload,
				"requests": v.Requests, "share": ratio(float64(v.Requests), float64(res.Requests)),
				"token_hit_rate": v.HitRate, "ttft_mean_ms": ms(v.TTFTMean), "ttft_p50_ms": ms(v.TTFTP50), "ttft_p99_ms": ms(v.TTFTP99),
				"session_header": o.cfg.SessionKeys, "seed": o.cfg.Seed,
			}
			if err := enc.Encode(rec); err != nil {
				return err
			}
		}
		return nil
	}
	assign := "per request (no --session-header)"
	if o.cfg.SessionKeys {
		assign = "sticky per x-session-id"
	}
	fmt.Fprintf(stdout, "workload %s: %d requests; %d replicas; seed %d; variants assigned %s\n\n", res.Workload, res.Requests, o.cfg.Replicas, o.cfg.Seed, assign)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tweight\treplicas\trequests\tshare %\thit %\tTTFT mean ms\tp50 ms\tp99 ms\t")
	for _, v := range rep.Variants {
		reps := make([]string, len(v.Replicas))
		for i, r := range v.Replicas {
			reps[i] = fmt.Sprint(r)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%.1f\t%.1f\t%.0f\t%.0f\t%.0f\t\n", v.Name, v.Weight, strings.Join(reps, "+"), v.Requests,
			100*ratio(float64(v.Requests), float64(res.Requests)), 100*v.HitRate, ms(v.TTFTMean), ms(v.TTFTP50), ms(v.TTFTP99))
	}
	return tw.Flush()
}
