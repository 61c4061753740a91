#!/usr/bin/env bash
# The shipped configs/cluster.yaml, run as shipped except for what a machine
# without its network must change: the three nodes' addresses (rewritten to
# three network namespaces), ucx_transports (no RDMA here: tcp), the state
# file's directory (a scratch one instead of /var/lib/rlsync) and the
# workload's size (flags). Two trainer ranks (layers 0-3 and 4-7), wave_size
# 2, tp 4, UCX, mutual TLS with per-node secrets: the main job runs across
# the namespaces and every engine ends byte-identical to the trainer.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
netns_up rly 3 3
a0=$(netns_addr 0) a1=$(netns_addr 1) a2=$(netns_addr 2)
cluster_yaml_rewritten "$dir/cluster.yaml" "$a0" "$a1" "$a2"
"$rlsync" certs make --out "$dir/certs" --nodes trainer-node,engine-node-a,engine-node-b > /dev/null
"$rlsync" validate "$dir/cluster.yaml" > /dev/null

netns_start 1 "$dir/a.log" "$rlsync" node --topology "$dir/cluster.yaml" --node engine-node-a
netns_start 2 "$dir/b.log" "$rlsync" node --topology "$dir/cluster.yaml" --node engine-node-b
timeout 240 ip netns exec "$name-0" "$rlsync" node --topology "$dir/cluster.yaml" --node trainer-node --run \
  --prompts 16 --concurrency 4 --max-tokens 24 --no-progress --json "$dir/run.json" > "$dir/head.log" 2>&1 \
  || { cat "$dir/head.log" "$dir/a.log" "$dir/b.log"; echo "FAIL: the main job on cluster.yaml failed"; exit 1; }
grep -q "2 trainer ranks up" "$dir/head.log" || { cat "$dir/head.log"; echo "FAIL: the head did not start both ranks"; exit 1; }
grep -q '"weights_verified": true' "$dir/run.json" || { cat "$dir/head.log"; echo "FAIL: weights not verified"; exit 1; }
grep -q '"completed": 16' "$dir/run.json" || { cat "$dir/run.json"; echo "FAIL: requests lost"; exit 1; }
for n in a b; do # engines pulled from the ranks' producers over UCX/tcp, nothing else
  grep -q "connected to producer ucx-[0-9a-f]* .*\[tcp\]" "$dir/$n.log" \
    || { cat "$dir/$n.log"; echo "FAIL: engine-node-$n did not pull over UCX/tcp"; exit 1; }
  ! grep "connected to producer" "$dir/$n.log" | grep -v "\[tcp\]" || { echo "FAIL: a connection not over tcp"; exit 1; }
done
syncs=$(tr -d ' \n' < "$dir/run.json" \
        | grep -o '"engines":[1-9][0-9]*,"stall_ms":[0-9.e+-]*,"transfer_ms":[0-9.e+-]*,"bytes":[1-9]' | wc -l)
[ "$syncs" -ge 2 ] || { cat "$dir/run.json"; echo "FAIL: only $syncs syncs moved weights"; exit 1; }
echo "$syncs syncs moved weights"
grep "byte-identical" "$dir/head.log"
echo ok
