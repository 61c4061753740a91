#!/usr/bin/env bash
# Real-process drills in network namespaces: the three-node cluster of
# netns: cluster runs the main job (weights over UCX/tcp) while
#   1. engine-node-a's process is killed with SIGKILL in the middle of the
#      run (a 16 MiB model, a sync every 300 ms: often mid-transfer; the
#      head's log says how it was noticed), then started again: it rejoins through the gatekeeper
#      as a new incarnation and serves after its next sync;
#   2. engine-node-b's link is cut (deploy/netns.sh partition: the process
#      keeps running): the head must notice within the heartbeat timeout
#      (unanswered heartbeats, or the connection dropped when the kernel saw
#      the carrier go), reroute its requests, and after healing take it back
#      (it answers again, or its node rejoins through the gatekeeper) and
#      bring it current at the next sync boundary.
# Then every request must have completed and both engines must end
# byte-identical to the trainer.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
netns_kill_signal=KILL
netns_cleanup_hook() { # the head runs under timeout: kill its child too
  pkill -9 -f -- "--topology $dir/three.yaml" 2>/dev/null || true
}
netns_up rld 3 1
a0=$(netns_addr 0) a1=$(netns_addr 1) a2=$(netns_addr 2)
"$rlsync" certs make --out "$dir/certs" --nodes trainer-node,engine-node-a,engine-node-b > /dev/null
cat > "$dir/three.yaml" <<YAML
name: three
model:
  synthetic: {layers: 4, hidden_size: 512, heads: 8, kv_heads: 4, intermediate_size: 1024, vocab_size: 320, dtype: bf16, seed: 1}
nodes:
  - {name: trainer-node, address: $a0, port: 7300}
  - {name: engine-node-a, address: $a1}
  - {name: engine-node-b, address: $a2}
cluster:
  tls: {ca: certs/ca.pem, cert: "certs/{node}.pem", key: "certs/{node}.key"}
  secret_file: "certs/{node}.secret"
  heartbeat_interval_ms: 200
  heartbeat_timeout_ms: 2000
  connect_deadline_ms: 15000
trainer: {node: trainer-node, step_time_ms: 300}
engines:
  - {name: rollout-a, node: engine-node-a, tp: 1}
  - {name: rollout-b, node: engine-node-b, tp: 1}
router: {node: trainer-node}
coordinator: {node: trainer-node}
transfer: {backend: ucx, mode: sharded, ucx_transports: [tcp]}
sync:
  deadlines_ms: {pause: 3000, flush: 1000, start: 2000, transfer: 5000, finish: 2000, continue: 1000}
workload: {prompts: 240, concurrency: 6, max_tokens: 32}
YAML
start_node() { # node namespace-index log; the pid goes to $started
  netns_start "$2" "$dir/$3.log" "$rlsync" node --topology "$dir/three.yaml" --node "$1"
}
start_node engine-node-a 1 a
a_pid=$started
start_node engine-node-b 2 b
timeout 240 ip netns exec "$name-0" "$rlsync" node --topology "$dir/three.yaml" --node trainer-node --run \
  --no-progress --json "$dir/three.json" > "$dir/head.log" 2>&1 &
head=$!
pids+=($head)
wait_for() { # pattern file seconds
  local deadline=$((SECONDS + $3))
  until grep -q -- "$1" "$2"; do
    [ $SECONDS -lt $deadline ] || { cat "$dir/head.log"; echo "FAIL: no '$1' in $2 within $3 s"; exit 1; }
    kill -0 "$head" 2>/dev/null || { cat "$dir/head.log"; echo "FAIL: the head exited while waiting for '$1'"; exit 1; }
    sleep 0.05
  done
}
count() { grep -c -- "$1" "$2" || true; }
# 1. kill -9 an engine process in the middle of the run, then start it again.
wait_for "sync .* 2 engines" "$dir/head.log" 60
before=$(count "^sync " "$dir/head.log")
wait_for_more_syncs() { local n=$1; local deadline=$((SECONDS + 30)); while [ "$(count "^sync " "$dir/head.log")" -lt "$n" ]; do [ $SECONDS -lt $deadline ] || break; sleep 0.05; done; }
wait_for_more_syncs $((before + 3))
kill -9 "$a_pid"
wait "$a_pid" 2>/dev/null || true # reaped quietly: bash would report the kill
t_kill=$SECONDS
wait_for "rollout-a left (down\|evicted rollout-a\|rollout-a silent for" "$dir/head.log" 30
echo "engine-node-a killed: $(grep -o 'evicted rollout-a ([a-z]*\|rollout-a left (down[^)]*)\|rollout-a silent for [0-9.]* ms' "$dir/head.log" | head -1)"
sleep 1
start_node engine-node-a 1 a
# 2. cut engine-node-b's link, wait for the head to notice, heal it.
rejoined=$(( $(count "^sync .* 2 engines" "$dir/head.log") + 2 ))
deadline=$((SECONDS + 60))
while [ "$(count "^sync .* 2 engines" "$dir/head.log")" -lt "$rejoined" ]; do
  [ $SECONDS -lt $deadline ] || { cat "$dir/head.log" "$dir/a.log"; echo "FAIL: the restarted engine-node-a never synced with the fleet"; exit 1; }
  sleep 0.1
done
echo "engine-node-a rejoined: syncs of 2 engines again"
admitted_b=$(count "admitted engine-node-b" "$dir/head.log")
"$netns" partition "$name" 2
t_cut=$SECONDS
# Detected either way: heartbeats go unanswered past the timeout, or the
# kernel reports the lost carrier and CAF drops the connection (down).
wait_for "rollout-b silent for\|rollout-b left (down" "$dir/head.log" 10
echo "partition detected within $((SECONDS - t_cut + 1)) s: $(grep -o 'rollout-b silent for [0-9.]* ms\|rollout-b left (down[^)]*)' "$dir/head.log" | head -1) (heartbeat timeout 2000 ms)"
sleep 1
"$netns" heal "$name" 2
# Back either way: the link held and it answers heartbeats again, or the link
# broke (the kernel saw the carrier go) and the node rejoined through the gatekeeper.
deadline=$((SECONDS + 30))
until grep -q "rollout-b answers again" "$dir/head.log" || [ "$(count "admitted engine-node-b" "$dir/head.log")" -gt "$admitted_b" ]; do
  [ $SECONDS -lt $deadline ] || { cat "$dir/head.log" "$dir/b.log"; echo "FAIL: engine-node-b never came back after healing"; exit 1; }
  sleep 0.1
done
echo "partition healed: $(grep -q "rollout-b answers again" "$dir/head.log" && echo "rollout-b answers again" || echo "engine-node-b rejoined through the gatekeeper")"
wait "$head" || { cat "$dir/head.log"; tail -n 20 "$dir/a.log" "$dir/b.log"; echo "FAIL: the main job failed"; exit 1; }
grep -q '"completed": 240' "$dir/three.json" || { cat "$dir/head.log"; echo "FAIL: not every request completed"; exit 1; }
grep -q '"weights_verified": true' "$dir/three.json" || { cat "$dir/head.log"; echo "FAIL: weights not verified"; exit 1; }
grep "byte-identical" "$dir/head.log"
echo "node a's log:"; grep -v "^\[" "$dir/a.log" | grep -v "connected to producer" | tail -n 8
echo ok
