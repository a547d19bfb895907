#!/usr/bin/env bash
# Installs what `make test` needs that a fresh machine lacks. Idempotent.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
