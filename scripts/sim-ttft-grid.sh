#!/bin/sh
# The predicted_ttft judging grid of docs/routing.md (issue 13): every
# workload and setting, predicted_ttft against the peers, one JSON line per
# strategy and run. Usage:
#   scripts/sim-ttft-grid.sh synthetic|trace|trace-settings|variations|settings|ramps|mixed|mixed2|mixed3|mixed4|random|returns|saturated|share|fleets|trips|hetero|other-trace|arxiv-trace|gmi-trace OUT
# from the repository root after `make sim`; the parts can run in parallel.
# other-trace replays a Mooncake-format trace this repository does not
# carry, named by OTHER_TRACE (docs/routing.md: Mooncake's
# FAST25-release/traces/synthetic_trace.jsonl), whole, at the judged
# capacities and settings and through 4 sharing proxies; arxiv-trace does
# the same with the excerpt of Mooncake's arxiv trace this repository
# carries (tests/sim/testdata/README.md); gmi-trace replays LMBench's GMI
# trace, named by GMI_TRACE, at its own speedups and settings.
# TRACE_LIMIT bounds the trace runs (default 1500 records, for a 2-core
# machine shared by 8 agents); SEED, when set, runs every part on that seed
# instead of the simulator's default (1); SIM_ARGS, when set, is added to
# every run (e.g. SIM_ARGS='--itl-growth-ms 0.3': steps that slow with the
# batch). Judge and chart with
#   (cd tests && go run ./cmd/rolter-sim-grid --png ../docs/routing-ttft.png OUT...)
set -eu
part=$1
out=$2
S=${STRATEGIES:-predicted_ttft,predicted_ttft:kv_events=0,cache_aware,least_load,peers}
L=${TRACE_LIMIT:-1500}
T=${TRACE_STRATEGIES:-predicted_ttft,predicted_ttft:kv_events=0,sglang,llmd_approx,llmd_approx_bench,llmd_precise,dynamo,dynamo_approx,aibrix}
run() {
	# shellcheck disable=SC2086
	set -- ${SEED:+--seed "$SEED"} "$@" ${SIM_ARGS:-}
	echo "# bin/rolter-sim --quiet --json $*" >>"$out"
	${SIM:-bin/rolter-sim} --quiet --json "$@" >>"$out"
}
# sharing_workloads F: F once for each of the six workloads the parts on
# fleets of proxies run (fleets, trips, hetero), its arguments that
# workload's flags.
sharing_workloads() {
	A=tests/sim/testdata/mooncake_arxiv_excerpt.jsonl
	for w in "--workload gsp" "--workload multiturn" "--workload agent" "--workload unique" \
		"--workload trace --trace-limit $L --capacity 32768" "--workload trace --trace $A --capacity 32768"; do
		# shellcheck disable=SC2086
		"$1" $w
	done
}
# trace_runs FILE: a Mooncake-format trace, whole, at the judged capacities
# and settings and through 4 sharing proxies.
trace_runs() {
	for a in "--capacity 8192" "--capacity 32768" "--capacity 131072" "--capacity 524288" \
		"--capacity 32768 --replicas 4" "--capacity 32768 --replicas 16" "--capacity 32768 --prefill-us 25" \
		"--capacity 32768 --prefill-us 100" "--capacity 131072 --speedup 2"; do
		# shellcheck disable=SC2086
		run --workload trace --trace "$1" $a --strategies $T
	done
	run --workload trace --trace "$1" --capacity 32768 --proxies 4 --share on --strategies predicted_ttft,predicted_ttft:kv_events=0
}
: >"$out"
case $part in
synthetic)
	for w in gsp multiturn agent unique; do
		run --workload $w --strategies $S
		run --workload $w --replicas 4 --strategies $S
		run --workload $w --replicas 16 --strategies $S
		run --workload $w --prefill-us 25 --strategies $S
		run --workload $w --prefill-us 100 --strategies $S
	done ;;
trace)
	for c in 8192 32768 131072 524288; do
		run --workload trace --trace-limit $L --capacity $c --strategies $T
	done ;;
trace-settings)
	for a in "--replicas 4" "--replicas 16" "--prefill-us 25" "--prefill-us 100"; do
		# shellcheck disable=SC2086
		run --workload trace --trace-limit $L --capacity 32768 $a --strategies $T
	done ;;
variations)
	# The workloads' own parameters moved, so that nothing is judged only on
	# the defaults it was developed on.
	run --workload gsp --gsp-groups 32 --gsp-system-len 4096 --gsp-question-len 256 --strategies $S
	run --workload gsp --rate 20 --strategies $S
	run --workload multiturn --mt-request-len 1024 --mt-rounds 8 --mt-clients 64 --strategies $S
	run --workload agent --agent-agents 32 --agent-tool-len 4096 --strategies $S
	run --workload unique --unique-len 4096 --rate 8 --strategies $S ;;
settings)
	# Simulator settings the grid does not move (client ramps, open loop,
	# the engine's batch limit, decode speed, KV event delay, block size,
	# cache size, fixed prefill cost), each alone on every workload.
	for w in gsp multiturn agent unique; do
		for a in "--ramp 3s" "--rate 6" "--parallel-prefill" "--max-batch 16" "--max-batch 8" "--itl-ms 5" \
			"--kv-delay 500ms" "--block-size 64" "--capacity 1024" "--prefill-base-ms 20"; do
			# shellcheck disable=SC2086
			run --workload $w $a --strategies $S
		done
	done
	run --workload multiturn --mt-think-ms 2000 --strategies $S ;;
ramps)
	# Closed-loop clients starting one by one over seconds, where balance
	# is hardest (docs/routing.md, the follow-up wait).
	for a in "--workload agent --ramp 1s" "--workload agent --ramp 2s" "--workload agent --ramp 5s" \
		"--workload agent --replicas 16 --ramp 2s" "--workload agent --replicas 16 --ramp 5s" \
		"--workload agent --prefill-us 25 --ramp 2s" "--workload agent --prefill-us 25 --ramp 5s" \
		"--workload gsp --ramp 5s" "--workload multiturn --ramp 5s" "--workload multiturn --ramp 1s" \
		"--workload agent --agent-agents 32 --agent-tool-len 4096 --ramp 2s"; do
		# shellcheck disable=SC2086
		run $a --strategies $S
	done ;;
mixed)
	# Several settings and seeds moved at once, picked without looking at
	# the results: a check on runs nothing was developed on (the runs
	# that name a seed keep it: a later --seed wins).
	for a in "--workload gsp --replicas 12 --prefill-us 70" "--workload multiturn --replicas 6 --mt-think-ms 500" \
		"--workload agent --replicas 12 --agent-agents 48" "--workload agent --ramp 3s --replicas 6" \
		"--workload unique --replicas 12 --rate 10" "--workload multiturn --mt-rounds 8 --mt-clients 128 --prefill-us 30" \
		"--workload gsp --gsp-groups 128 --gsp-prompts 8 --capacity 2048" \
		"--workload agent --agent-tool-len 1024 --agent-turns 12 --prefill-us 40" \
		"--workload trace --trace-limit 1000 --capacity 65536 --replicas 6" "--workload multiturn --seed 4 --replicas 10" \
		"--workload agent --seed 5 --ramp 1500ms" "--workload gsp --seed 6 --rate 12 --replicas 6" \
		"--workload agent --seed 7" "--workload agent --seed 8 --replicas 10" "--workload multiturn --seed 9 --prefill-us 60" \
		"--workload gsp --seed 10 --replicas 10 --gsp-groups 96" "--workload agent --seed 11 --agent-agents 96 --replicas 12" \
		"--workload multiturn --seed 12 --ramp 2s --replicas 12" "--workload unique --seed 13 --prefill-us 80 --replicas 6" \
		"--workload agent --seed 14 --agent-tool-ms 2000" "--workload trace --trace-limit 1000 --capacity 16384 --prefill-us 60" \
		"--workload gsp --seed 15 --gsp-system-len 8192 --capacity 8192" "--workload agent --seed 16 --prefill-us 75 --ramp 4s" \
		"--workload multiturn --seed 17 --mt-request-len 256 --mt-rounds 10"; do
		# shellcheck disable=SC2086
		run $a --strategies $S
	done ;;
mixed2)
	# A second set like mixed, seeds 20-43, picked without looking at the
	# results (docs/routing.md: it found the saturated follow-up wait).
	for a in "--workload gsp --seed 20 --replicas 5 --gsp-groups 40 --gsp-question-len 512" \
		"--workload multiturn --seed 21 --replicas 7 --mt-clients 96 --prefill-us 45" \
		"--workload agent --seed 22 --replicas 9 --agent-agents 24 --agent-turns 6" \
		"--workload unique --seed 23 --replicas 5 --unique-len 8192 --rate 3" \
		"--workload gsp --seed 24 --capacity 1536 --gsp-groups 48 --ramp 2s" \
		"--workload multiturn --seed 25 --mt-request-len 2048 --mt-rounds 4 --replicas 12" \
		"--workload agent --seed 26 --agent-tool-len 8192 --agent-agents 16 --replicas 4" \
		"--workload trace --seed 27 --trace-limit 800 --capacity 24576 --replicas 10" \
		"--workload gsp --seed 28 --gsp-system-len 1024 --gsp-prompts 32 --prefill-us 35 --replicas 6" \
		"--workload multiturn --seed 29 --mt-think-ms 1000 --replicas 14 --ramp 3s" \
		"--workload agent --seed 30 --agent-task-len 2048 --prefill-us 90 --replicas 10" \
		"--workload unique --seed 31 --unique-len 1024 --rate 30 --replicas 10" \
		"--workload gsp --seed 32 --rate 15 --gsp-groups 24 --replicas 12 --capacity 8192" \
		"--workload multiturn --seed 33 --mt-clients 32 --mt-rounds 12 --capacity 2048" \
		"--workload agent --seed 34 --agent-agents 64 --ramp 6s --replicas 8" \
		"--workload trace --seed 35 --trace-limit 800 --capacity 98304 --prefill-us 40 --replicas 6" \
		"--workload gsp --seed 36 --gsp-groups 200 --gsp-prompts 4 --replicas 8" \
		"--workload multiturn --seed 37 --prefill-us 20 --mt-request-len 512 --replicas 5" \
		"--workload agent --seed 38 --agent-tool-ms 500 --agent-turns 16 --replicas 6" \
		"--workload agent --seed 39 --itl-ms 10 --replicas 12 --agent-agents 40" \
		"--workload gsp --seed 40 --itl-ms 8 --gsp-output-len 64 --replicas 10" \
		"--workload multiturn --seed 41 --block-size 32 --replicas 9 --mt-think-ms 300" \
		"--workload trace --seed 42 --trace-limit 800 --capacity 16384 --replicas 12 --prefill-us 70" \
		"--workload agent --seed 43 --block-size 32 --prefill-us 55 --ramp 2500ms"; do
		# shellcheck disable=SC2086
		run $a --strategies $S
	done ;;
mixed3)
	# A third set, seeds 50-73, picked without looking at the results and
	# moving what the others rarely do: answer lengths, decode speed,
	# concurrency, block and cache sizes together.
	for a in "--workload gsp --seed 50 --gsp-output-len 32 --itl-ms 4 --replicas 6" \
		"--workload multiturn --seed 51 --mt-output-len 64 --itl-ms 5 --replicas 8" \
		"--workload agent --seed 52 --agent-output-len 64 --itl-ms 6 --replicas 8" \
		"--workload unique --seed 53 --unique-output-len 32 --itl-ms 4 --replicas 8" \
		"--workload gsp --seed 54 --gsp-output-len 512 --replicas 12 --prefill-us 30" \
		"--workload multiturn --seed 55 --mt-output-len 512 --mt-rounds 6 --capacity 3072" \
		"--workload agent --seed 56 --agent-output-len 512 --agent-turns 10 --replicas 6" \
		"--workload trace --seed 57 --trace-limit 1000 --capacity 49152 --itl-ms 10 --replicas 8" \
		"--workload gsp --seed 58 --gsp-groups 16 --gsp-prompts 64 --gsp-output-len 48 --itl-ms 6" \
		"--workload multiturn --seed 59 --mt-clients 192 --mt-think-ms 200 --replicas 10" \
		"--workload agent --seed 60 --agent-agents 48 --agent-tool-ms 100 --prefill-us 35" \
		"--workload unique --seed 61 --unique-len 16384 --rate 2 --replicas 6" \
		"--workload gsp --seed 62 --block-size 64 --capacity 1024 --gsp-groups 24 --itl-ms 3" \
		"--workload multiturn --seed 63 --block-size 64 --mt-request-len 768 --prefill-us 70 --replicas 6" \
		"--workload agent --seed 64 --max-batch 24 --agent-agents 40 --replicas 10" \
		"--workload trace --seed 65 --trace-limit 1000 --capacity 20480 --prefill-us 120 --replicas 10" \
		"--workload gsp --seed 66 --rate 25 --gsp-output-len 128 --replicas 10 --prefill-us 60" \
		"--workload multiturn --seed 67 --mt-system-len 2048 --mt-clients 96 --replicas 12" \
		"--workload agent --seed 68 --agent-system-len 4096 --agent-tool-len 512 --itl-ms 4 --replicas 8" \
		"--workload agent --seed 69 --ramp 3s --agent-output-len 128 --itl-ms 5 --replicas 12" \
		"--workload gsp --seed 70 --ramp 2s --gsp-output-len 64 --itl-ms 5 --replicas 8 --prefill-us 80" \
		"--workload multiturn --seed 71 --ramp 2s --mt-output-len 96 --itl-ms 4 --replicas 8" \
		"--workload trace --seed 72 --trace-limit 1000 --capacity 65536 --speedup 3 --replicas 8" \
		"--workload unique --seed 73 --rate 40 --unique-len 512 --unique-output-len 64 --replicas 8"; do
		# shellcheck disable=SC2086
		run $a --strategies $S
	done ;;
mixed4)
	# A fourth set, seeds 90-113, written after the waste term read where a
	# prefix lives (docs/routing.md) and before any of its runs: caches
	# under pressure (small capacities, long histories, late KV events)
	# next to roomy ones, with the workloads' own parameters moved.
	for a in "--workload agent --seed 90 --capacity 2048 --agent-agents 48 --replicas 6" \
		"--workload multiturn --seed 91 --capacity 2048 --mt-rounds 8 --mt-clients 128 --replicas 8" \
		"--workload trace --seed 92 --trace-limit 1000 --capacity 16384 --replicas 6 --prefill-us 80" \
		"--workload gsp --seed 93 --capacity 768 --gsp-groups 48 --replicas 8" \
		"--workload agent --seed 94 --kv-delay 300ms --agent-tool-len 3072 --replicas 8" \
		"--workload multiturn --seed 95 --kv-delay 250ms --mt-request-len 384 --replicas 10" \
		"--workload unique --seed 96 --unique-len 3072 --replicas 6 --prefill-us 40" \
		"--workload trace --seed 97 --trace-limit 1000 --capacity 98304 --replicas 12 --itl-ms 6" \
		"--workload agent --seed 98 --agent-turns 12 --agent-tool-len 1536 --capacity 8192 --replicas 8" \
		"--workload multiturn --seed 99 --mt-system-len 1024 --mt-rounds 7 --capacity 3072 --replicas 8" \
		"--workload gsp --seed 100 --gsp-system-len 6144 --capacity 4096 --replicas 12 --prefill-us 45" \
		"--workload agent --seed 101 --agent-agents 80 --ramp 2s --replicas 12" \
		"--workload multiturn --seed 102 --mt-clients 320 --mt-think-ms 300 --replicas 12 --capacity 6144" \
		"--workload trace --seed 103 --trace-limit 1000 --capacity 24576 --speedup 2 --replicas 8" \
		"--workload unique --seed 104 --rate 12 --unique-len 2048 --replicas 8 --itl-ms 8" \
		"--workload agent --seed 105 --agent-system-len 2048 --agent-task-len 1024 --prefill-us 60 --replicas 6" \
		"--workload gsp --seed 106 --gsp-groups 96 --gsp-prompts 12 --capacity 2048 --replicas 8 --itl-ms 4" \
		"--workload multiturn --seed 107 --mt-request-len 768 --mt-output-len 256 --replicas 6 --prefill-us 55" \
		"--workload agent --seed 108 --max-batch 32 --agent-agents 96 --replicas 8" \
		"--workload trace --seed 109 --trace-limit 1000 --capacity 12288 --replicas 16 --prefill-us 30" \
		"--workload multiturn --seed 110 --block-size 32 --mt-clients 160 --capacity 2048 --replicas 8" \
		"--workload agent --seed 111 --block-size 32 --agent-tool-ms 1000 --agent-tool-len 2560 --replicas 10" \
		"--workload gsp --seed 112 --ramp 3s --gsp-question-len 512 --capacity 1536 --replicas 6" \
		"--workload unique --seed 113 --unique-len 8192 --rate 3 --replicas 10 --prefill-us 35"; do
		# shellcheck disable=SC2086
		run $a --strategies $S
	done ;;
random)
	# The 80 runs of scripts/sim-random-settings.txt, settings drawn at
	# random before any ran (docs/routing.md, random settings).
	grep -v '^#' scripts/sim-random-settings.txt | while read -r a; do
		# shellcheck disable=SC2086
		run $a --strategies $S
	done ;;
returns)
	# Multiturn with think times between rounds, fixed (conversations come
	# back in the order they left: LRU's worst case) and exponential
	# (--mt-think-exp: a random order), at the judged settings.
	for t in "--mt-think-ms 2000" "--mt-think-ms 2000 --mt-think-exp" "--mt-think-ms 10000 --mt-think-exp"; do
		for a in "" "--replicas 4" "--replicas 16" "--prefill-us 25" "--prefill-us 100"; do
			# shellcheck disable=SC2086
			run --workload multiturn $t $a --strategies $S
		done
	done ;;
saturated)
	# Short answers and fast decode, so that clients come back at once and
	# the prefill queues stay busy (docs/routing.md, saturated prefill
	# queues), seeds 80-85.
	for a in "--workload agent --seed 80 --agent-output-len 32 --itl-ms 2" \
		"--workload multiturn --seed 81 --mt-output-len 32 --itl-ms 2" \
		"--workload gsp --seed 82 --gsp-output-len 16 --itl-ms 2 --replicas 16" \
		"--workload multiturn --seed 83 --mt-output-len 48 --itl-ms 3 --prefill-us 80 --replicas 4" \
		"--workload agent --seed 84 --agent-output-len 48 --itl-ms 3 --replicas 16" \
		"--workload gsp --seed 85 --gsp-output-len 24 --itl-ms 3 --prefill-us 20 --replicas 4"; do
		# shellcheck disable=SC2086
		run $a --strategies $S
	done ;;
share)
	# Through 4 proxies also blind (turns=0: no turns in a burst).
	P4=predicted_ttft,predicted_ttft:kv_events=0,predicted_ttft:turns=0
	for w in gsp multiturn agent unique; do
		run --workload $w --strategies predicted_ttft,predicted_ttft:kv_events=0
		run --workload $w --proxies 4 --share on --strategies $P4
	done
	run --workload trace --trace-limit $L --capacity 32768 --strategies predicted_ttft,predicted_ttft:kv_events=0
	run --workload trace --trace-limit $L --capacity 32768 --proxies 4 --share on --strategies $P4
	A=tests/sim/testdata/mooncake_arxiv_excerpt.jsonl
	run --workload trace --trace $A --capacity 32768 --strategies predicted_ttft,predicted_ttft:kv_events=0
	run --workload trace --trace $A --capacity 32768 --proxies 4 --share on --strategies $P4 ;;
fleets)
	# Fleets of proxies against one proxy on the same replicas: more proxies
	# than replicas, as many, and small fleets (also blind: turns=0).
	fleet_runs() {
		for r in 8 4 2; do
			run "$@" --replicas $r --strategies predicted_ttft
		done
		for rp in "8 16" "8 8" "4 6" "4 8" "2 3"; do
			run "$@" --replicas "${rp% *}" --proxies "${rp#* }" --share on --strategies predicted_ttft,predicted_ttft:turns=0
		done
	}
	sharing_workloads fleet_runs ;;
trips)
	# The fleet's message trip (--share-delay; the queue interval is 5 ms):
	# 4 proxies on 8 replicas, in turns and blind, against one proxy.
	trip_runs() {
		run "$@" --strategies predicted_ttft
		for d in 2ms 5ms 10ms 20ms; do
			run "$@" --proxies 4 --share on --share-delay $d --strategies predicted_ttft,predicted_ttft:turns=0
		done
	}
	sharing_workloads trip_runs ;;
hetero)
	# Heterogeneous fleets (--slowdown): every second replica twice as slow,
	# one in four twice as slow, and every second with steps that slow
	# with the batch.
	hetero_runs() {
		for h in "--slowdown 1,2" "--slowdown 1,1,1,2" "--slowdown 1,2 --itl-growth-ms 0.3"; do
			# shellcheck disable=SC2086
			run "$@" $h --strategies $T
		done
	}
	sharing_workloads hetero_runs ;;
other-trace)
	: "${OTHER_TRACE:?set OTHER_TRACE to a Mooncake-format JSONL trace}"
	trace_runs "$OTHER_TRACE" ;;
arxiv-trace)
	trace_runs tests/sim/testdata/mooncake_arxiv_excerpt.jsonl ;;
gmi-trace)
	# LMBench's GMI trace (docs/routing.md): 32-token blocks, one day of
	# traffic (1,931 requests) replayed 300-3,000 times faster.
	: "${GMI_TRACE:?set GMI_TRACE to the GMI trace rewritten by scripts/trace-to-mooncake.py}"
	for a in "--speedup 300" "--speedup 1000" "--speedup 3000" "--speedup 1000 --capacity 1024" \
		"--speedup 1000 --capacity 16384" "--speedup 1000 --replicas 4" "--speedup 1000 --replicas 16" \
		"--speedup 1000 --prefill-us 25" "--speedup 1000 --prefill-us 100" "--speedup 1000 --itl-growth-ms 0.5"; do
		# shellcheck disable=SC2086
		run --workload trace --trace "$GMI_TRACE" --trace-block-tokens 32 $a --strategies $T
	done
	run --workload trace --trace "$GMI_TRACE" --trace-block-tokens 32 --speedup 1000 --proxies 4 --share on --strategies predicted_ttft,predicted_ttft:kv_events=0 ;;
*) echo "usage: $0 synthetic|trace|trace-settings|variations|settings|ramps|mixed|mixed2|mixed3|mixed4|returns|saturated|share|fleets|trips|hetero|other-trace|arxiv-trace|gmi-trace OUT" >&2; exit 2 ;;
esac
