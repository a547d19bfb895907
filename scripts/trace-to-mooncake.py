#!/usr/bin/env python3
"""Rewrite a trace of Mooncake's fields whose timestamps are absolute, in
any unit, strings or numbers, and out of order (LMBench's TraceReplayer
format, e.g. its traces/gmi_trace.jsonl) as the Mooncake JSONL rolter-sim
reads: sorted by time, timestamps in integer milliseconds since the first.

    scripts/trace-to-mooncake.py --unit ns IN.jsonl OUT.jsonl

Records keep their order among equal timestamps; every other field is
copied. A line that is not a JSON object with input_length, output_length,
hash_ids and timestamp is an error naming the line.
"""
import argparse
import json
import sys

UNITS = {"ns": 1e6, "us": 1e3, "ms": 1.0, "s": 1e-3}  # units per millisecond


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--unit", choices=sorted(UNITS), required=True, help="the input timestamps' unit")
    ap.add_argument("input")
    ap.add_argument("output")
    a = ap.parse_args()
    recs = []
    with open(a.input) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                ts = float(r["timestamp"]) if isinstance(r["timestamp"], (int, float)) else int(r["timestamp"])
                for k in ("input_length", "output_length", "hash_ids"):
                    r[k]
            except (ValueError, KeyError, TypeError) as e:
                sys.exit(f"{a.input}:{n}: {e!r}")
            recs.append((ts, len(recs), r))
    recs.sort(key=lambda x: (x[0], x[1]))
    t0 = recs[0][0] if recs else 0
    with open(a.output, "w") as out:
        for ts, _, r in recs:
            r["timestamp"] = int((ts - t0) / UNITS[a.unit])
            out.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
