#!/usr/bin/env bash
# Runs every native fuzz target of every module for the given time each.
set -euo pipefail
t=${1:-20s}
cd "$(dirname "$0")/.."
for m in pkg dataplane controlplane kvwatcher tests; do
  (cd "$m" && for pkg in $(go list ./...); do
    for f in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
      echo "== $pkg $f"
      go test "$pkg" -run '^$' -fuzz "^$f\$" -fuzztime "$t"
    done
  done)
done
