#!/usr/bin/env bash
# External engines (engines[].kind: vllm): the topology's engines are two
# `rlsync serve --strict-vllm` processes (vLLM's exact answers, no rlsync
# extras), each fronted by the adapter in the rlsync process beside it.
#  1. the main job: every round over vLLM's HTTP routes and the disk
#     backend (safetensors in weights_dir), every request through streaming
#     /v1/completions, every engine's weights verified against the trainer's
#     (the adapter's checksums, cross-checked by the server's weight_checker);
#  2. the kill drill: one server SIGKILLed mid-run and restarted on its port
#     with its initial weights: its requests rerouted, none lost, and it
#     serves again only after a sync brought it current (the end check
#     verifies it too).
set -euo pipefail
rlsync=$1
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "== $f"; tail -40 "$f"; done; exit 1; }
# Below the ephemeral range (32768+): a restarted server must get its port back.
base=$((20000 + ($$ % 3000) * 4))

"$rlsync" checkpoint make --out "$dir/ck" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --seed 3 > /dev/null
echo "vllm-key-$$" > "$dir/server.key"
chmod 600 "$dir/server.key"

start_server() { # INDEX: serves ck on base+INDEX, strict vLLM answers
  local i=$1
  "$rlsync" serve --checkpoint "$dir/ck" --strict-vllm --port $((base + i)) --api-key-file "$dir/server.key" \
    >> "$dir/server$i.log" 2>&1 &
  pids+=($!)
  eval "server$i=$!"
  for _ in $(seq 1 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((base + i))/health")" = 200 ] && return 0
    sleep 0.05
  done
  fail "server $i did not start"
}
start_server 0
start_server 1

cat > "$dir/vllm.yaml" <<YAML
name: vllm
model: {checkpoint: ck}
nodes: [{name: a}]
trainer: {node: a, step_time_ms: 150}
engines:
  - {name: v0, node: a, kind: vllm, url: "http://127.0.0.1:$base", api_key_file: server.key, weights_dir: w0}
  - {name: v1, node: a, kind: vllm, url: "http://127.0.0.1:$((base + 1))", api_key_file: server.key, weights_dir: w1}
cluster: {heartbeat_interval_ms: 200, heartbeat_timeout_ms: 1000}
workload: {prompts: 24, concurrency: 4, max_tokens: 8}
YAML
"$rlsync" validate "$dir/vllm.yaml" > "$dir/validate.log" 2>&1 || fail "the topology does not validate"
grep -q "kind: vllm" "$dir/validate.log" || fail "validate does not print kind"

# 1. The main job over HTTP engines.
timeout 300 "$rlsync" run "$dir/vllm.yaml" --no-progress --json "$dir/run.json" > "$dir/run.log" 2>&1 \
  || fail "rlsync run over vLLM-API engines"
jq -e '.weights_verified == true and .requests.failed == 0 and .requests.completed == 24 and .stream_mismatches == 0' "$dir/run.json" > /dev/null \
  || { cat "$dir/run.json"; fail "main job: not every request completed or weights not verified"; }
ls "$dir"/w0/v*/*.safetensors > /dev/null 2>&1 || fail "no safetensors written in weights_dir"
[ "$(ls -d "$dir"/w0/v* | wc -l)" -le 2 ] || fail "old versions not removed from weights_dir"

# 2. The kill drill: server 1 dies mid-run, comes back with its initial weights.
sed -e 's/prompts: 24, concurrency: 4, max_tokens: 8/prompts: 3000, concurrency: 4, max_tokens: 16/' \
  "$dir/vllm.yaml" > "$dir/drill.yaml"
timeout 600 "$rlsync" run "$dir/drill.yaml" --no-progress --json "$dir/drill.json" > "$dir/drill.log" 2>&1 &
runner=$!
for _ in $(seq 1 300); do grep -q "^sync " "$dir/drill.log" && break; sleep 0.1; done
sleep 1
kill -9 "$server1"
sleep 1.5 # past the heartbeat timeout: the coordinator and the router see it gone
start_server 1
wait "$runner" || fail "the drill's run failed"
jq -e '.weights_verified == true and .requests.failed == 0 and .requests.completed == 3000 and .stream_mismatches == 0' "$dir/drill.json" > /dev/null \
  || { cat "$dir/drill.json"; fail "drill: a request lost or an engine not current"; }
# The restarted server was registered again (a restart: unroutable until synced) and ends current.
grep -q "v1: its server answers again; registered as incarnation" "$dir/drill.log" \
  || fail "drill: the restarted server was not registered again"
jq -e '[.weights[].version] | (length == 2 and min == max)' "$dir/drill.json" > /dev/null \
  || { jq '.weights' "$dir/drill.json"; fail "drill: the engines end on different versions"; }
echo "ok"
