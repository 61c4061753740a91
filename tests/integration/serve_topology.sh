#!/usr/bin/env bash
# `rlsync serve --topology T --node srv`: the server is a member node of a
# two-node topology. The head (`rlsync node --run`) runs the main job; its
# coordinator syncs the served engine with rlsync's own transfer while the
# server's HTTP routes serve: completions between rounds, /weight_info
# showing the coordinator's version numbers, /weight_checker digests that
# follow the versions, and 409 on every route that would fight the
# coordinator. The job verifies the served engine byte-identical to the
# trainer; the server stops with the coordinator. Then the refusals of the
# command line (a node with two engines, the coordinator's node, --checkpoint).
set -euo pipefail
rlsync=$1
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in serve.log head.log; do [ -f "$dir/$f" ] && sed "s/^/  $f: /" "$dir/$f" | tail -25; done
  exit 1
}
# Odd ports below the ephemeral range: other cluster tests take even ones.
port=$((20001 + ($$ % 6000) * 2))
"$rlsync" certs make --out "$dir/certs" --nodes head,srv,pair > /dev/null
cat > "$dir/t.yaml" <<YAML
name: served
model:
  synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 1}
nodes:
  - {name: head, address: 127.0.0.1, port: $port}
  - {name: srv, address: 127.0.0.1}
cluster:
  tls: {ca: certs/ca.pem, cert: "certs/{node}.pem", key: "certs/{node}.key"}
  secret_file: "certs/{node}.secret"
  heartbeat_interval_ms: 200
  heartbeat_timeout_ms: 2000
  connect_deadline_ms: 20000
trainer: {node: head, step_time_ms: 400}
engines:
  - {name: local, node: head, tp: 1}
  - {name: served, node: srv, tp: 2}
router: {node: head}
coordinator: {node: head}
workload: {prompts: 3000, concurrency: 2, max_tokens: 32}
YAML

# 1. The server first (it retries the gatekeeper until connect_deadline), then the head's job.
(cd "$dir" && exec "$rlsync" serve --topology t.yaml --node srv --port 0) > "$dir/serve.log" 2>&1 &
serve_pid=$!
pids+=($serve_pid)
(cd "$dir" && exec timeout 180 "$rlsync" node --topology t.yaml --node head --run --json job.json --no-progress) \
  > "$dir/head.log" 2>&1 &
head_pid=$!
pids+=($head_pid)
url=""
for _ in $(seq 1 400); do
  url=$(sed -n 's/^rlsync serve: listening on \(http:[^ ]*\).*/\1/p' "$dir/serve.log")
  [ -n "$url" ] && break
  kill -0 "$serve_pid" 2>/dev/null || fail "rlsync serve exited before listening"
  sleep 0.05
done
[ -n "$url" ] || fail "rlsync serve did not print its URL"
grep -q "engine served of node srv, weights from the coordinator" "$dir/serve.log" || fail "no engine named in the URL line"

# 2. While the job runs: the routes that would fight the coordinator answer 409.
code() { curl -sS -o "$dir/body" -w '%{http_code}' -X "$1" "$url$2" -H 'Content-Type: application/json' ${3:+-d "$3"}; }
for route in /start_weight_update /finish_weight_update /init_weight_transfer_engine /update_weight_version \
             /reset_prefix_cache /sleep /wake_up /collective_rpc; do
  c=$(code POST "$route" '{}')
  [ "$c" = 409 ] || fail "$route answered $c, not 409: $(cat "$dir/body")"
  grep -q "coordinator owns the engine's weights" "$dir/body" || fail "$route: no reason: $(cat "$dir/body")"
  grep -q '"code":409' "$dir/body" || fail "$route: not vLLM's envelope: $(cat "$dir/body")"
done
c=$(code POST /update_weights "{\"update_info\": {\"path\": \"$dir\"}}")
[ "$c" = 409 ] || fail "update_weights with a path answered $c: $(cat "$dir/body")"
for route in /pause /resume; do
  c=$(code POST "$route")
  [ "$c" = 409 ] || fail "$route answered $c, not 409: $(cat "$dir/body")"
  grep -q '^{"error":"/' "$dir/body" || fail "$route: not the flat envelope: $(cat "$dir/body")"
done
[ "$(code GET /health)" = 200 ] || fail "/health: $(cat "$dir/body")"

# 3. Completions, versions and digests while the coordinator's rounds go on
# (a round may land between two calls: versions and digests are collected
# apart, each must change during the job).
completions=0
versions=()
digests=()
while kill -0 "$head_pid" 2>/dev/null; do
  c=$(code POST /v1/completions '{"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}' 2>/dev/null) || break
  if [ "$c" = 200 ] && grep -q '"finish_reason"' "$dir/body"; then
    completions=$((completions + 1))
    cp "$dir/body" "$dir/completion.json"
  fi
  c=$(code GET /weight_info 2>/dev/null) || break
  [ "$c" = 200 ] && versions+=("$(sed -n 's/.*"weight_version":"\([^"]*\)".*/\1/p' "$dir/body")")
  c=$(code POST /weight_checker '{"action": "checksum"}' 2>/dev/null) || break
  if [ "$c" = 200 ]; then
    digests+=("$(sha256sum < "$dir/body" | cut -c1-64)")
    cp "$dir/body" "$dir/checker.json"
  fi
  c=$(code GET /metrics 2>/dev/null) || break
  [ "$c" = 200 ] && cp "$dir/body" "$dir/metrics.txt"
  sleep 0.05
done
wait "$head_pid" || fail "the head's job exited non-zero"
[ "$completions" -ge 2 ] || fail "only $completions completions served during the job"
# /metrics shows the served engine, which the coordinator drives (the node's registry).
grep -q '^vllm:generation_tokens_total{engine="served"} [1-9]' "$dir/metrics.txt" \
  || fail "/metrics has no served-engine series: $(grep -c . "$dir/metrics.txt") lines"
grep -q '^vllm:rl_weight_update_operation_duration_seconds_count{engine="served",operation="finish"} [1-9]' \
  "$dir/metrics.txt" || fail "/metrics counts no finished weight update of the served engine"
grep -q '"weight_versions":\[{"version":"[0-9]*"' "$dir/completion.json" || fail "no weight_versions span: $(cat "$dir/completion.json")"
numbered=$(printf '%s\n' "${versions[@]}" | grep -E '^[0-9]+$' | sort -u | wc -l)
[ "$numbered" -ge 2 ] || fail "saw coordinator versions '${versions[*]}' at /weight_info, wanted two numbered ones"
distinct=$(printf '%s\n' "${digests[@]}" | sort -u | wc -l)
[ "$distinct" -ge 2 ] || fail "the weight checker's digests did not change across versions ${versions[*]}"
grep -q '"dp0:pp0:pcp0:tp1:' "$dir/checker.json" || fail "no tp1 shard keys: $(head -c 300 "$dir/checker.json")"

# 4. The job verified the served engine against the trainer, and the server stopped with the coordinator.
grep -q '"weights_verified": true' "$dir/job.json" || fail "weights not verified: $(cat "$dir/job.json")"
grep -q "served v[0-9]*: byte-identical to the trainer" "$dir/head.log" || fail "the served engine was not verified"
for _ in $(seq 1 200); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.05; done
kill -0 "$serve_pid" 2>/dev/null && fail "rlsync serve still runs after the coordinator ended"
rc=0
wait "$serve_pid" || rc=$?
[ "$rc" -eq 0 ] || fail "rlsync serve exited $rc after the coordinator ended"
grep -q "rlsync serve: stopping (the coordinator ended)" "$dir/serve.log" || fail "no stop line"

# 5. The command line's refusals.
refused() { # ARGS... ; the message is the last argument
  local want=${*: -1}
  set +e
  (cd "$dir" && "$rlsync" serve "${@:1:$#-1}") > "$dir/refused.out" 2>&1
  local rc=$?
  set -e
  [ "$rc" -ne 0 ] && grep -q -- "$want" "$dir/refused.out" || { cat "$dir/refused.out"; fail "serve ${*:1:$#-1}: exit $rc"; }
}
refused --topology t.yaml --node head "is the coordinator's node"
refused --topology t.yaml --node srv --checkpoint "$dir" "leave --checkpoint out"
refused --topology t.yaml "--node"
refused --topology t.yaml --node nowhere "no node 'nowhere'"
sed -e 's/{name: local, node: head, tp: 1}/{name: pair, node: srv, replicas: 2, tp: 1}/' "$dir/t.yaml" > "$dir/two.yaml"
refused --topology two.yaml --node srv "places 3 engines on node srv"
echo "serve --topology: ok ($numbered versions and $distinct digests seen; $completions completions)"
