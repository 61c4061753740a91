#!/usr/bin/env bash
# Observability across two processes on loopback: a head (coordinator,
# router, trainer, one engine) and a member node (two engines), each with a
# metrics port (the head's fixed, the member's ephemeral) behind a bearer
# token. After the cold sync: /health answers without the token, /metrics
# only with it, in Prometheus text format with vLLM's and rlsync's names and
# sane values; `rlsync status --json` parses and lists every engine serving,
# and its text form names them too.
set -euo pipefail
rlsync=$1
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "== $f"; tail -30 "$f"; done; exit 1; }
# Below the ephemeral range (32768+), so that no outgoing connection holds it.
port=$((20000 + ($$ % 6000) * 2))
mport=$((port + 1))
"$rlsync" certs make --out "$dir/certs" --nodes head,workers > /dev/null
echo "scrape-token-$$" > "$dir/api.key"
chmod 600 "$dir/api.key"
cat > "$dir/two.yaml" <<YAML
name: two
model:
  synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 1}
nodes:
  - {name: head, address: 127.0.0.1, port: $port, metrics_port: $mport}
  - {name: workers, address: 127.0.0.1, metrics_port: 0}
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
router: {node: head}
coordinator: {node: head}
YAML
"$rlsync" validate "$dir/two.yaml" > "$dir/validate.log" 2>&1 || fail "the topology does not validate"
grep -q "metrics_port: $mport" "$dir/validate.log" || fail "validate does not print metrics_port"

"$rlsync" node --topology "$dir/two.yaml" --node head > "$dir/head.log" 2>&1 &
pids+=($!)
"$rlsync" node --topology "$dir/two.yaml" --node workers > "$dir/workers.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do grep -q "metrics on" "$dir/workers.log" && grep -q "metrics on" "$dir/head.log" && break; sleep 0.1; done
grep -q "rlsync node head: metrics on http://127.0.0.1:$mport/metrics" "$dir/head.log" || fail "head: no metrics URL"
wurl=$(grep -o "http://127.0.0.1:[0-9]*/metrics" "$dir/workers.log" | head -1)
[ -n "$wurl" ] || fail "workers: no metrics URL"

# Every engine serving, as the status says.
serving=0
for _ in $(seq 1 300); do
  if "$rlsync" status "$dir/two.yaml" --json > "$dir/status.json" 2> "$dir/status.log"; then
    serving=$(jq '[.engines[] | select(.state == "serving")] | length' "$dir/status.json")
    # The router hears of each routable engine just after the coordinator: wait for both.
    [ "$serving" -eq 3 ] && jq -e '.router.routable == 3' "$dir/status.json" > /dev/null && break
  fi
  sleep 0.2
done
[ "$serving" -eq 3 ] || { cat "$dir/status.json" "$dir/status.log" 2>/dev/null; fail "not 3 engines serving"; }
[ "$(jq -r '[.engines[].name] | sort | join(",")' "$dir/status.json")" = "local,remote-0,remote-1" ] \
  || fail "status lists $(jq -c '[.engines[].name]' "$dir/status.json")"
[ "$(jq '.version' "$dir/status.json")" -ge 1 ] || fail "status: no synced version"
jq -e '.last_round.bytes > 0 and .router.routable == 3' "$dir/status.json" > /dev/null || fail "status: last round or router"
"$rlsync" status "$dir/two.yaml" > "$dir/status.txt" 2>&1 || fail "status (text) failed"
grep -Eq "^remote-1 +workers +serving" "$dir/status.txt" || { cat "$dir/status.txt"; fail "status text"; }

# /health without the token; /metrics only with it.
hurl="http://127.0.0.1:$mport"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$hurl/health")" = 200 ] || fail "/health"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$hurl/metrics")" = 401 ] || fail "/metrics without the token"
auth="Authorization: Bearer scrape-token-$$"
curl -sf -H "$auth" -D "$dir/head.headers" "$hurl/metrics" > "$dir/head.prom" || fail "/metrics with the token"
grep -qi "^content-type: text/plain; version=0.0.4" "$dir/head.headers" || fail "content type"
curl -sf -H "$auth" "$wurl" > "$dir/workers.prom" || fail "workers' /metrics"

value() { # value FILE SERIES: the sample's value, or "missing"
  awk -v s="$2" '$1 == s { print $2; found = 1 } END { if (!found) print "missing" }' "$1"
}
at_least() { # at_least FILE SERIES MIN
  local v; v=$(value "$1" "$2")
  [ "$v" != missing ] && awk -v v="$v" -v m="$3" 'BEGIN { exit !(v + 0 >= m) }' || fail "$2 in $(basename "$1"): $v, wanted >= $3"
}
equals() { # equals FILE SERIES VALUE
  local v; v=$(value "$1" "$2")
  [ "$v" = "$3" ] || fail "$2 in $(basename "$1"): $v, wanted $3"
}
for f in "$dir/head.prom" "$dir/workers.prom"; do
  grep -q '^# TYPE vllm:rl_weight_update_operation_duration_seconds histogram$' "$f" || fail "no weight-update histogram in $f"
  grep -q '^# TYPE vllm:rl_weight_update_operations_in_flight gauge$' "$f" || fail "no in-flight gauge in $f"
  for name in vllm:num_requests_running vllm:num_requests_waiting vllm:prompt_tokens_total vllm:generation_tokens_total; do
    grep -q "^# TYPE $name " "$f" || fail "no $name in $f"
  done
done
# The trainer keeps publishing, so a scrape may land inside a transfer: the
# gauge is 0 or 1 (one transfer per engine at a time), and it comes back to 0
# (a leaked increment would never let it).
inflight='vllm:rl_weight_update_operations_in_flight{engine="local"}'
v=$(value "$dir/head.prom" "$inflight")
[ "$v" = 0 ] || [ "$v" = 1 ] || fail "$inflight: $v, wanted 0 or 1"
for _ in $(seq 1 100); do
  [ "$v" = 0 ] && break
  sleep 0.1
  v=$(curl -sf -H "$auth" "$hurl/metrics" | awk -v s="$inflight" '$1 == s { print $2 }')
done
[ "$v" = 0 ] || fail "$inflight stays at $v for 10 s"
for op in init start update finish; do
  at_least "$dir/head.prom" "vllm:rl_weight_update_operation_duration_seconds_count{engine=\"local\",operation=\"$op\"}" 1
done
at_least "$dir/head.prom" 'vllm:rl_weight_update_operation_duration_seconds_bucket{engine="local",operation="update",le="600"}' 1
for e in remote-0 remote-1; do
  at_least "$dir/workers.prom" "vllm:rl_weight_update_operation_duration_seconds_count{engine=\"$e\",operation=\"finish\"}" 1
  at_least "$dir/workers.prom" "rlsync_engine_weight_version{engine=\"$e\"}" 1
  equals "$dir/workers.prom" "vllm:num_requests_waiting{engine=\"$e\"}" 0
done
at_least "$dir/head.prom" 'rlsync_sync_rounds_total{outcome="complete"}' 1
at_least "$dir/head.prom" 'rlsync_sync_bytes_total' 1
at_least "$dir/head.prom" 'rlsync_synced_version' 1
equals "$dir/head.prom" 'rlsync_engines{state="serving"}' 3
equals "$dir/head.prom" 'rlsync_engines{state="evicted"}' 0
equals "$dir/head.prom" 'rlsync_trainer_ranks' 1
for phase in pause flush start transfer finish resume; do
  at_least "$dir/head.prom" "rlsync_sync_phase_seconds_count{phase=\"$phase\"}" 1
done
equals "$dir/head.prom" 'rlsync_router_queued_requests' 0
grep -q '^rlsync_sync_phase_seconds_bucket{phase="transfer",le="+Inf"} ' "$dir/head.prom" || fail "no +Inf bucket"
# The coordinator's figures live on the head only.
grep -q '^rlsync_sync_rounds_total' "$dir/workers.prom" && fail "the member exports the coordinator's rounds"

# A metrics port that is taken: the node says which and exits 1.
sed -e "s/metrics_port: 0}/metrics_port: $mport}/" "$dir/two.yaml" > "$dir/taken.yaml"
sed -i -e "s/port: $port, metrics_port: $mport}/port: $port}/" "$dir/taken.yaml"
set +e
timeout 30 "$rlsync" node --topology "$dir/taken.yaml" --node workers > "$dir/taken.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "metrics port 127.0.0.1:$mport" "$dir/taken.log" || fail "a taken metrics port: exit $rc"
echo "ok"
