#!/usr/bin/env bash
# The fleet's HTTP endpoint (router.http_port) across two processes on
# loopback: the router runs on the member node with an ephemeral endpoint
# behind the cluster's bearer token. The node prints its URL; a client
# gets completions (plain and streamed) from the whole fleet with the
# weight version of every token, /health, /v1/models and the router's
# metrics; `rlsync run` serves and prints it too.
set -euo pipefail
rlsync=$1
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "== $f"; tail -30 "$f"; done; exit 1; }
# Below the ephemeral range (32768+), so that no outgoing connection holds it.
port=$((20000 + ($$ % 6000) * 2))
"$rlsync" certs make --out "$dir/certs" --nodes head,workers > /dev/null
echo "fleet-token-$$" > "$dir/api.key"
chmod 600 "$dir/api.key"
cat > "$dir/two.yaml" <<YAML
name: two
model:
  synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 1}
nodes:
  - {name: head, address: 127.0.0.1, port: $port}
  - {name: workers, address: 127.0.0.1}
cluster:
  tls: {ca: certs/ca.pem, cert: "certs/{node}.pem", key: "certs/{node}.key"}
  secret_file: "certs/{node}.secret"
  http_api_key_file: api.key
  heartbeat_interval_ms: 200
  heartbeat_timeout_ms: 2000
  connect_deadline_ms: 10000
trainer: {node: head, step_time_ms: 50}
engines:
  - {name: local, node: head, tp: 1}
  - {name: remote, node: workers, replicas: 2, tp: 1}
router: {node: workers, http_port: 0}
coordinator: {node: head}
YAML
"$rlsync" validate "$dir/two.yaml" > "$dir/validate.log" 2>&1 || fail "the topology does not validate"
grep -q "http_port: 0" "$dir/validate.log" || fail "validate does not print router.http_port"

"$rlsync" node --topology "$dir/two.yaml" --node head > "$dir/head.log" 2>&1 &
pids+=($!)
"$rlsync" node --topology "$dir/two.yaml" --node workers > "$dir/workers.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do grep -q "completions on" "$dir/workers.log" && break; sleep 0.1; done
url=$(grep -o "completions on http://127.0.0.1:[0-9]*" "$dir/workers.log" | head -1 | sed 's/completions on //')
[ -n "$url" ] || fail "workers: no completions URL"
grep -q "completions on" "$dir/head.log" && fail "the head serves completions though the router is elsewhere"

# Every engine serving: then a request goes to any of them (the head's engine
# obeys the router the coordinator vouches for, though it runs on another node).
serving=0
for _ in $(seq 1 300); do
  if "$rlsync" status "$dir/two.yaml" --json > "$dir/status.json" 2> "$dir/status.log"; then
    serving=$(jq '[.engines[] | select(.state == "serving")] | length' "$dir/status.json")
    # The router hears of each routable engine just after the coordinator: wait for both.
    [ "$serving" -eq 3 ] && jq -e '.router.routable == 3' "$dir/status.json" > /dev/null && break
  fi
  sleep 0.2
done
[ "$serving" -eq 3 ] || fail "not 3 engines serving"
# The head names the router registered from the member node to nodes that join later.
jq -e '.router.routable == 3' "$dir/status.json" > /dev/null || { cat "$dir/status.json"; fail "status: the router"; }

auth="Authorization: Bearer fleet-token-$$"
body='{"model": "two", "prompt": [1, 2, 3], "max_tokens": 6, "n": 3, "temperature": 0, "return_token_ids": true}'
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" "$url/v1/completions")
[ "$code" = 401 ] || fail "completions without the token: $code"
curl -sf -H "$auth" -H 'Content-Type: application/json' -d "$body" "$url/v1/completions" > "$dir/plain.json" \
  || fail "completions with the token"
jq -e '(.choices | length) == 3 and all(.choices[]; (.token_ids | length) == 6
        and (.weight_versions | length) >= 1 and .weight_versions[-1].end == 6
        and (.weight_versions[0].version | tonumber) >= 1)' "$dir/plain.json" > /dev/null \
  || { cat "$dir/plain.json"; fail "completion choices"; }
# Greedy on one version everywhere: every choice the same tokens, whichever engine served it.
[ "$(jq -c '[.choices[].token_ids] | unique | length' "$dir/plain.json")" = 1 ] || echo "note: choices span versions"

stream='{"model": "two", "prompt": "hi", "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}}'
curl -sfN -H "$auth" -H 'Content-Type: application/json' -d "$stream" "$url/v1/completions" > "$dir/stream.txt" \
  || fail "streamed completions"
[ "$(tail -c 14 "$dir/stream.txt" | tr -d '\n')" = "data: [DONE]" ] || { cat "$dir/stream.txt"; fail "stream end"; }
grep -q '"completion_tokens":4' "$dir/stream.txt" || fail "stream usage"

[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] || fail "/health"
curl -sf "$url/v1/models" | jq -e '.data[0].id == "two" and .data[0].max_model_len > 0' > /dev/null || fail "/v1/models"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/metrics")" = 401 ] || fail "/metrics without the token"
curl -sf -H "$auth" "$url/metrics" > "$dir/router.prom" || fail "/metrics"
awk '$1 == "rlsync_router_completed_total" && $2 >= 4 { ok = 1 } END { exit !ok }' "$dir/router.prom" \
  || { grep rlsync_router "$dir/router.prom"; fail "router metrics"; }

# One process: `rlsync run` serves the endpoint too, and says where.
cat > "$dir/one.yaml" <<YAML
name: one
model:
  synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, intermediate_size: 128, vocab_size: 320}
nodes: [{name: a}]
trainer: {node: a, step_time_ms: 20}
engines: [{name: e, node: a}]
router: {http_port: 0}
YAML
"$rlsync" run "$dir/one.yaml" --prompts 4 --max-tokens 4 --no-progress > "$dir/run.log" 2>&1 || fail "rlsync run"
grep -q "completions on http://127.0.0.1:[0-9]*/v1/completions" "$dir/run.log" || fail "run: no completions URL"
echo "ok"
