#!/usr/bin/env bash
# Three nodes in three network namespaces (deploy/netns.sh): the head
# (coordinator, router, trainer) and two engine nodes join through the
# gatekeeper over the veth links, the main job runs across them with the
# weights pulled over UCX restricted to tcp (as between hosts without RDMA),
# and every engine ends byte-identical to the trainer. Nodes talk mutual TLS
# with certificates and per-node secrets from `rlsync certs make`.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
netns_up rlc 3 1
a0=$(netns_addr 0) a1=$(netns_addr 1) a2=$(netns_addr 2)
"$rlsync" certs make --out "$dir/certs" --nodes trainer-node,engine-node-a,engine-node-b > /dev/null
cat > "$dir/three.yaml" <<YAML
name: three
model:
  synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 1}
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
trainer: {node: trainer-node, step_time_ms: 100}
engines:
  - {name: rollout-a, node: engine-node-a, tp: 2}
  - {name: rollout-b, node: engine-node-b, tp: 2}
router: {node: trainer-node}
coordinator: {node: trainer-node}
transfer: {backend: ucx, mode: sharded, ucx_transports: [tcp]}
workload: {prompts: 128, concurrency: 4, max_tokens: 48}  # long enough for several syncs (trainer steps every 100 ms)
YAML
netns_start 1 "$dir/a.log" "$rlsync" node --topology "$dir/three.yaml" --node engine-node-a
netns_start 2 "$dir/b.log" "$rlsync" node --topology "$dir/three.yaml" --node engine-node-b
timeout 180 ip netns exec "$name-0" "$rlsync" node --topology "$dir/three.yaml" --node trainer-node --run \
  --no-progress --json "$dir/three.json" > "$dir/head.log" 2>&1 \
  || { cat "$dir/head.log" "$dir/a.log" "$dir/b.log"; echo "FAIL: the main job across namespaces failed"; exit 1; }
grep -q '"weights_verified": true' "$dir/three.json" || { cat "$dir/head.log"; echo "FAIL: weights not verified"; exit 1; }
grep -q '"completed": 128' "$dir/three.json" || { cat "$dir/three.json"; echo "FAIL: requests lost"; exit 1; }
grep -q "admitted by trainer-node" "$dir/a.log" || { cat "$dir/a.log"; echo "FAIL: engine-node-a not admitted"; exit 1; }
grep -q "admitted by trainer-node" "$dir/b.log" || { cat "$dir/b.log"; echo "FAIL: engine-node-b not admitted"; exit 1; }
for n in a b; do # every connection to the producer said which transport it uses: tcp only
  grep -q "connected to producer ucx-[0-9a-f]* .*\[tcp\]" "$dir/$n.log" \
    || { cat "$dir/$n.log"; echo "FAIL: engine-node-$n did not pull over UCX/tcp"; exit 1; }
  ! grep "connected to producer" "$dir/$n.log" | grep -v "\[tcp\]" || { echo "FAIL: a connection not over tcp"; exit 1; }
  # ...and the groups too: the namespaces share one host, whose shared memory
  # a list without shm must not use (every connection says it is off).
  ! grep -q "groups in shared memory" "$dir/$n.log" || { cat "$dir/$n.log"; echo "FAIL: groups lent in shared memory"; exit 1; }
  ! grep "connected to producer" "$dir/$n.log" | grep -v "no shared memory: turned off" \
    || { echo "FAIL: a connection that may map the producer's memory"; exit 1; }
done
syncs=$(tr -d ' \n' < "$dir/three.json" \
        | grep -o '"engines":[1-9][0-9]*,"stall_ms":[0-9.e+-]*,"transfer_ms":[0-9.e+-]*,"bytes":[1-9]' | wc -l)
[ "$syncs" -ge 3 ] || { cat "$dir/three.json"; echo "FAIL: only $syncs syncs moved weights"; exit 1; }
echo "$syncs syncs moved weights" 
grep "byte-identical" "$dir/head.log"
echo ok
