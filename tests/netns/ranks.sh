#!/usr/bin/env bash
# Trainer ranks on their own nodes: five network namespaces, the head
# (coordinator and router, no trainer), two trainer nodes each running one
# rank (layers 0-1 and 2-3, each with its own UCX producer) and two engine
# nodes. Every node joins through the gatekeeper over mutual TLS; the main
# job runs with the engines pulling each layer from the rank holding it over
# UCX restricted to tcp, and every engine ends byte-identical to the trainer
# (the head rebuilds the synthetic ranks' bytes to check them).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
netns_five_nodes rlr 4 ranks.yaml ranks trainer-0 trainer-1 head '  node: trainer-0
  step_time_ms: 200
  ranks:
    - {node: trainer-0, layers: "0-1"}
    - {node: trainer-1, layers: "2-3"}'
netns_start 1 "$dir/t0.log" "$rlsync" node --topology "$dir/ranks.yaml" --node trainer-0
netns_start 2 "$dir/t1.log" "$rlsync" node --topology "$dir/ranks.yaml" --node trainer-1
netns_start 3 "$dir/a.log" "$rlsync" node --topology "$dir/ranks.yaml" --node engine-node-a
netns_start 4 "$dir/b.log" "$rlsync" node --topology "$dir/ranks.yaml" --node engine-node-b
logs() { for f in head t0 t1 a b; do echo "== $f"; cat "$dir/$f.log"; done; }
timeout 240 ip netns exec "$name-0" "$rlsync" node --topology "$dir/ranks.yaml" --node head --run \
  --no-progress --json "$dir/run.json" > "$dir/head.log" 2>&1 \
  || { logs; echo "FAIL: the main job with ranks on their own nodes failed"; exit 1; }
grep -q '"weights_verified": true' "$dir/run.json" || { logs; echo "FAIL: weights not verified"; exit 1; }
grep -q '"completed": 16' "$dir/run.json" || { cat "$dir/run.json"; echo "FAIL: requests lost"; exit 1; }
for n in t0 t1; do
  grep -q "1 trainer ranks" "$dir/$n.log" || { logs; echo "FAIL: $n did not register its rank"; exit 1; }
done
for n in a b; do # each engine node pulled from both ranks' producers, over tcp only
  [ "$(grep "\[tcp\]" "$dir/$n.log" | grep -o "connected to producer ucx-[0-9a-f]*" | sort -u | wc -l)" -ge 2 ] \
    || { cat "$dir/$n.log"; echo "FAIL: engine-node-$n did not pull from both ranks over UCX/tcp"; exit 1; }
  ! grep "connected to producer" "$dir/$n.log" | grep -v "\[tcp\]" || { echo "FAIL: a connection not over tcp"; exit 1; }
done
grep "byte-identical" "$dir/head.log"
echo ok
