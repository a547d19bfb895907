#!/usr/bin/env bash
# `make run`: the split system on one machine: a control plane with an
# embedded etcd, three simulated vLLM replicas, a kvwatcher with an embedded
# NATS server, and two rolter-proxies that follow the control plane and share
# their routing state over NATS. The example config is applied through the admin
# API. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${ROLTER_CONFIG:-rolter.example.toml}
PROXY_ADDR=${ROLTER_LISTEN:-127.0.0.1:8080}
PROXY2_ADDR=${ROLTER_LISTEN2:-127.0.0.1:8081}
CP_ADDR=${ROLTER_CONTROLPLANE:-127.0.0.1:7070}
WORK=$(mktemp -d -t rolter-run.XXXXXX)
# Dev credentials for this run only: the admin token (rolterctl), the node
# token (the proxy) and the virtual-key pepper shared by both.
export ROLTER_ADMIN_TOKENS="dev-admin-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export ROLTER_NODE_TOKENS="dev-node-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export ROLTER_KEY_PEPPER="dev-pepper-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "stopping..."
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "stopped (logs and etcd data were in $WORK)"
  exit 0
}
trap cleanup INT TERM EXIT

wait_http() {
  for _ in $(seq 1 150); do
    curl -fsS "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "not ready: $1 (see $WORK)" >&2
  return 1
}

NATS_ADDR=${ROLTER_NATS:-127.0.0.1:4222}
for i in 1 2 3; do
  ./bin/vllmsim --listen "127.0.0.1:800$i" --model sim-model --ttft 20ms --itl 5ms --prefill-tps 20000 \
    --kv-events "tcp://127.0.0.1:$((5556 + i))" --kv-topic kv-events --kv-replay "tcp://127.0.0.1:$((5566 + i))" \
    >"$WORK/vllm-$i.log" 2>&1 &
  pids+=($!)
done

./bin/rolter-controlplane --dev --embed-etcd "$WORK/etcd" --embed-etcd-listen 127.0.0.1:0 --listen "$CP_ADDR" \
  >"$WORK/controlplane.log" 2>&1 &
pids+=($!)
for i in 1 2 3; do wait_http "http://127.0.0.1:800$i/health"; done

export ROLTER_CONTROLPLANE=$CP_ADDR ROLTER_TOKEN=$ROLTER_ADMIN_TOKENS
applied=""
for _ in $(seq 1 150); do # the control plane may still be starting
  if ./bin/rolterctl apply -f "$CONFIG" >"$WORK/apply.log" 2>&1; then applied=1; break; fi
  sleep 0.1
done
[[ -n $applied ]] || { echo "applying $CONFIG failed:" >&2; cat "$WORK/apply.log" >&2; exit 1; }

# The kvwatcher follows the control plane for its providers and runs the
# embedded NATS server the proxy reads KV deltas from.
./bin/rolter-kvwatcher --controlplane "$CP_ADDR" --token "$ROLTER_NODE_TOKENS" --embed-nats "$NATS_ADDR" \
  --snapshot-cache "$WORK/kvwatcher-snapshot.json" --metrics-listen 127.0.0.1:9465 >"$WORK/kvwatcher.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:9465/metrics"

# Two proxies, as behind an L4 balancer: they share prefix observations and
# in-flight counts over the same NATS (docs/sharing.md).
n=0
for addr in "$PROXY_ADDR" "$PROXY2_ADDR"; do
  n=$((n + 1))
  ROLTER_NODE_TOKEN=$ROLTER_NODE_TOKENS ./bin/rolter-proxy --controlplane "$CP_ADDR" --listen "$addr" \
    --snapshot-cache "$WORK/snapshot-$n.json" --routing-state "$WORK/routing-$n.state" \
    --nats "nats://$NATS_ADDR" >"$WORK/proxy-$n.log" 2>&1 &
  pids+=($!)
done
wait_http "http://$PROXY_ADDR/readyz"
wait_http "http://$PROXY2_ADDR/readyz"

cat <<MSG

rolter is running on this machine:
  control plane   $CP_ADDR (embedded etcd in $WORK/etcd)
  rolter-proxy    http://$PROXY_ADDR and http://$PROXY2_ADDR (follow the control plane, share routing state)
  vLLM replicas   127.0.0.1:8001-8003 (simulated; KV events on tcp://127.0.0.1:5557-5559)
  kvwatcher       embedded NATS on $NATS_ADDR, metrics on http://127.0.0.1:9465/metrics
  logs            $WORK

Send a request:
  curl -s http://$PROXY_ADDR/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"llama-3.1-8b","messages":[{"role":"user","content":"Hello!"}]}'
Streamed (server-sent events):
  curl -sN http://$PROXY_ADDR/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"llama-3.1-8b","stream":true,"messages":[{"role":"user","content":"Hello!"}]}'

Both routes decide on the engines' KV events (llama-3.1-8b with predicted_ttft): the proxy
asks a replica's /tokenize for the token ids; a client that has them may send them instead:
  IDS=\$(curl -s 127.0.0.1:8001/tokenize -d '{"model":"sim-model","prompt":"A long shared prefix ..."}' \\
        | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["tokens"])))')
  curl -s http://$PROXY_ADDR/v1/completions -H 'content-type: application/json' -H "x-rolter-vllm-token-ids: \$IDS" \\
    -d '{"model":"llama-3.1-8b-precise","prompt":"A long shared prefix ...","max_tokens":8}'

Change the config through the control plane (the proxy follows within a second):
  export ROLTER_CONTROLPLANE=$CP_ADDR ROLTER_TOKEN=$ROLTER_ADMIN_TOKENS
  bin/rolterctl list routes
  bin/rolterctl apply -f $CONFIG --dry-run        # edit the file first, see the diff
  bin/rolterctl status                             # which node runs which version
  bin/rolterctl keys create team-a --models llama-3.1-8b
      # prints the secret once; from then on every request needs a key:
      # -H "authorization: Bearer sk-rolter-..." (OpenAI) or -H "x-api-key: sk-rolter-..." (Anthropic)

Either proxy routes a conversation where the other sent its prefix; each one's
rolter_fleet_peers shows the other:
  curl -s http://$PROXY2_ADDR/metrics | grep -E '^rolter_fleet_(peers|received_total)'

A Responses conversation the replicas store continues through either proxy (the response's id
names the replica that stores it):
  ID=\$(curl -s http://$PROXY_ADDR/v1/responses -H 'content-type: application/json' \\
        -d '{"model":"llama-3.1-8b","input":"Hello!","max_output_tokens":8}' \\
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  curl -s http://$PROXY2_ADDR/v1/responses -H 'content-type: application/json' \\
    -d "{\\"model\\":\\"llama-3.1-8b\\",\\"previous_response_id\\":\\"\$ID\\",\\"input\\":\\"And then?\\"}"
  curl -s http://$PROXY2_ADDR/v1/responses/\$ID

Metrics: http://$PROXY_ADDR/metrics        Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}" || true
echo "a process exited; see $WORK" >&2
