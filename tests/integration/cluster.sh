#!/usr/bin/env bash
# Several processes on loopback: `rlsync launch --run` starts a head node
# (coordinator, router, trainer, one engine) and a worker node (two engines)
# that joins over mutual TLS by proving its own secret (certificates and
# per-node secrets from `rlsync certs make`); the main job runs across them
# and every engine ends byte-identical to the trainer. Then the refusals: a
# node with the wrong secret, a node whose certificate another CA signed, a
# peer without a certificate, garbage bytes on the port, and a message of
# the wrong type are refused, and the head keeps serving. Insecure mode
# warns at every start.
set -euo pipefail
rlsync=$1
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
# Below the ephemeral range (32768+), so that no outgoing connection holds it.
port=$((20000 + ($$ % 6000) * 2))
"$rlsync" certs make --out "$dir/certs" --nodes head,workers > /dev/null
"$rlsync" certs make --out "$dir/other" --nodes workers > /dev/null
cat > "$dir/two.yaml" <<YAML
name: two
model:
  synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 1}
nodes:
  - {name: head, address: 127.0.0.1, port: $port}
  - {name: workers, address: 127.0.0.1, restart: on-failure}
cluster:
  tls: {ca: certs/ca.pem, cert: "certs/{node}.pem", key: "certs/{node}.key"}
  secret_file: "certs/{node}.secret"
  heartbeat_interval_ms: 200
  heartbeat_timeout_ms: 2000
  connect_deadline_ms: 10000
trainer: {node: head, step_time_ms: 50}
engines:
  - {name: local, node: head, tp: 2}
  - {name: remote, node: workers, replicas: 2, tp: 2}
router: {node: head}
coordinator: {node: head}
transfer: {backend: ucx, mode: sharded}
workload: {prompts: 12, concurrency: 4, max_tokens: 16}
YAML

# 1. The main job across two processes.
timeout 120 "$rlsync" launch "$dir/two.yaml" --run --json "$dir/two.json" > "$dir/launch.out" 2>&1 \
  || { cat "$dir/launch.out"; echo "FAIL: launch --run exited non-zero"; exit 1; }
grep -q '"weights_verified": true' "$dir/two.json" || { cat "$dir/launch.out"; echo "FAIL: weights not verified"; exit 1; }
grep -q '"completed": 12' "$dir/two.json" || { cat "$dir/two.json"; echo "FAIL: requests lost"; exit 1; }
[ "$(grep -c 'byte-identical to the trainer' "$dir/launch.out")" -eq 3 ] || { cat "$dir/launch.out"; echo "FAIL: not 3 engines verified"; exit 1; }
grep -q "\[workers\] rlsync node workers: admitted by head" "$dir/launch.out" || { echo "FAIL: no admission line"; exit 1; }
# launch applies the workers' restart key: their node says nothing about it.
! grep -q "nothing restarts this process" "$dir/launch.out" || { cat "$dir/launch.out"; echo "FAIL: a launched node says it is unsupervised"; exit 1; }

# 2. Refusals, against a head that keeps serving (no --run).
"$rlsync" node --topology "$dir/two.yaml" --node head > "$dir/head.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q "gatekeeper on" "$dir/head.log" && break; sleep 0.1; done
grep -q "gatekeeper on" "$dir/head.log" || { cat "$dir/head.log"; echo "FAIL: head did not come up"; exit 1; }
# Garbage bytes on the port: the connection is dropped, nothing else happens.
exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GARBAGE\x00\xff%.0s' {1..200} >&3 && exec 3>&- || true
# A message of the wrong type to the gatekeeper (over TLS, with a member's
# certificate): refused, logged by CAF, no crash.
"$rlsync" ping --connect "127.0.0.1:$port" --count 1 --deadline-ms 3000 --ca "$dir/certs/ca.pem" \
  --cert "$dir/certs/workers.pem" --key "$dir/certs/workers.key" > "$dir/ping.out" 2>&1 && {
  cat "$dir/ping.out"; echo "FAIL: the gatekeeper answered a ping"; exit 1; }
# No certificate, or one another CA signed: the handshake never completes.
timeout 30 "$rlsync" ping --connect "127.0.0.1:$port" --count 1 --deadline-ms 2000 > "$dir/ping.out" 2>&1 && {
  cat "$dir/ping.out"; echo "FAIL: a peer without a certificate got through"; exit 1; }
sed -e 's#certs/ca.pem#other/ca.pem#; s#"certs/{node}.pem"#"other/{node}.pem"#; s#"certs/{node}.key"#"other/{node}.key"#' \
    -e 's/connect_deadline_ms: 10000/connect_deadline_ms: 2000/' "$dir/two.yaml" > "$dir/other.yaml"
grep -q 'other/ca.pem' "$dir/other.yaml" || { echo "FAIL: could not make other.yaml"; exit 1; }
set +e
timeout 30 "$rlsync" node --topology "$dir/other.yaml" --node workers > "$dir/other.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "cannot reach the coordinator's node" "$dir/other.log" \
  || { cat "$dir/other.log"; echo "FAIL: a certificate of another CA: exit $rc"; exit 1; }
# Insecure mode: refused by validation unless asked for, then a loud warning at every start.
sed -e '/^  tls:/d' -e 's/connect_deadline_ms: 10000/connect_deadline_ms: 1000/' "$dir/two.yaml" > "$dir/plain.yaml"
"$rlsync" validate "$dir/plain.yaml" > "$dir/plain.out" 2>&1 && { cat "$dir/plain.out"; echo "FAIL: two nodes without TLS validated"; exit 1; }
grep -q "plain.yaml:[0-9]*:[0-9]*: cluster: more than one node needs cluster.tls" "$dir/plain.out" \
  || { cat "$dir/plain.out"; echo "FAIL: no located refusal of plaintext"; exit 1; }
sed -i 's/^cluster:/cluster:\n  allow_insecure_network: true/' "$dir/plain.yaml"
printf 'drill:\n  faults:\n    - {at_ms: 500, action: kill, target: remote-0, duration_ms: 500}\n' >> "$dir/plain.yaml"
timeout 30 "$rlsync" node --topology "$dir/plain.yaml" --node workers > "$dir/plain.log" 2>&1 || true
[ "$(grep -c '^WARNING: ' "$dir/plain.log")" -ge 4 ] && grep -q "INSECURE NETWORK" "$dir/plain.log" \
  || { cat "$dir/plain.log"; echo "FAIL: no loud warning in insecure mode"; exit 1; }
# A node started by hand says what its topology asks that only launch and drill do.
grep -q "rlsync node workers: the topology's 1 drill fault(s) are injected by rlsync drill" "$dir/plain.log" \
  || { cat "$dir/plain.log"; echo "FAIL: no notice of the drill's faults"; exit 1; }
# The wrong secret: refused, and the node says so.
printf 'wrong\n' > "$dir/wrong.secret"
chmod 600 "$dir/wrong.secret"
set +e
timeout 30 "$rlsync" node --topology "$dir/two.yaml" --node workers --secret-file "$dir/wrong.secret" > "$dir/bad.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || { cat "$dir/bad.log"; echo "FAIL: a wrong secret exited $rc, expected 1"; exit 1; }
grep -q "refused to admit" "$dir/bad.log" || { cat "$dir/bad.log"; echo "FAIL: no refusal message"; exit 1; }
grep -q "refused workers" "$dir/head.log" || { cat "$dir/head.log"; echo "FAIL: the head did not log the refusal"; exit 1; }
# After all that, the right secret still joins.
timeout 30 "$rlsync" node --topology "$dir/two.yaml" --node workers > "$dir/good.log" 2>&1 &
good=$!
pids+=($good)
for _ in $(seq 1 100); do grep -q "engines registered" "$dir/good.log" && break; sleep 0.1; done
grep -q "2 engines registered" "$dir/good.log" || { cat "$dir/good.log" "$dir/head.log"; echo "FAIL: a good node could not join after the attacks"; exit 1; }
grep -q "rlsync node workers: restart: on-failure is applied by rlsync launch" "$dir/good.log" \
  || { cat "$dir/good.log"; echo "FAIL: a node started by hand does not say its restart key needs launch"; exit 1; }
kill -TERM "${pids[0]}"
set +e; wait "$good"; wrc=$?; wait "${pids[0]}"; hrc=$?; set -e
[ "$wrc" -eq 0 ] || { cat "$dir/good.log"; echo "FAIL: the worker exited $wrc when the head went away"; exit 1; }
# The head published over TLS stops cleanly: port closed, every actor
# terminated (no "still busy ... exiting anyway"), exit 0.
[ "$hrc" -eq 0 ] && grep -q "stopped by signal 15" "$dir/head.log" && ! grep -q "still busy" "$dir/head.log" \
  || { cat "$dir/head.log"; echo "FAIL: the head did not stop cleanly on SIGTERM (exit $hrc)"; exit 1; }
echo ok
