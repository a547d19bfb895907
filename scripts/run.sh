#!/usr/bin/env bash
# `make run`: three simulated vLLM replicas and one rolter-proxy in file mode,
# on this machine. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${ROLTER_CONFIG:-rolter.example.toml}
PROXY_ADDR=${ROLTER_LISTEN:-127.0.0.1:8080}
LOGDIR=$(mktemp -d -t rolter-run.XXXXXX)
pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "stopping..."
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "stopped (logs were in $LOGDIR)"
  exit 0
}
trap cleanup INT TERM EXIT

for i in 1 2 3; do
  ./bin/vllmsim --listen "127.0.0.1:800$i" --model sim-model --ttft 20ms --itl 5ms --prefill-tps 20000 \
    >"$LOGDIR/vllm-$i.log" 2>&1 &
  pids+=($!)
done
./bin/rolter-proxy --config "$CONFIG" --listen "$PROXY_ADDR" >"$LOGDIR/proxy.log" 2>&1 &
pids+=($!)

wait_ready() {
  for _ in $(seq 1 100); do
    curl -fsS "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "not ready: $1 (see $LOGDIR)" >&2
  return 1
}
for i in 1 2 3; do wait_ready "http://127.0.0.1:800$i/health"; done
wait_ready "http://$PROXY_ADDR/readyz"

cat <<MSG

rolter is running: 3 simulated vLLM replicas (127.0.0.1:8001-8003) behind rolter-proxy on $PROXY_ADDR
config: $CONFIG (edit it: changes apply live)   logs: $LOGDIR

  curl -s http://$PROXY_ADDR/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"llama-3.1-8b","messages":[{"role":"user","content":"Hello!"}]}'

  streaming: add "stream":true      models: curl -s http://$PROXY_ADDR/v1/models
  metrics:   http://$PROXY_ADDR/metrics

Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}" || true
echo "a process exited; see $LOGDIR" >&2
