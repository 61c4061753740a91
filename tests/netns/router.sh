#!/usr/bin/env bash
# The router on a member node: five network namespaces, the head (the
# coordinator alone), a router node, a trainer node and two engine nodes.
# The engine nodes join first and learn the router only when its node joins
# later: the coordinator vouches for it to every engine, and engines on the
# other nodes take its generate requests. The head's --run drives the
# workload through that remote router, and every engine ends byte-identical
# to the trainer.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
netns_five_nodes rlq 7 router.yaml remote-router router-node trainer-node router-node '  node: trainer-node
  step_time_ms: 200
  ranks:
    - {node: trainer-node, layers: "0-3"}'
logs() { for f in head r t a b; do echo "== $f"; cat "$dir/$f.log" 2>/dev/null || true; done; }
netns_start 0 "$dir/head.log" timeout 240 "$rlsync" node --topology "$dir/router.yaml" --node head --run \
  --no-progress --json "$dir/run.json"
head_pid=$started
netns_start 3 "$dir/a.log" "$rlsync" node --topology "$dir/router.yaml" --node engine-node-a
netns_start 4 "$dir/b.log" "$rlsync" node --topology "$dir/router.yaml" --node engine-node-b
# The engines register before any router exists: they must learn it later.
for n in a b; do
  for _ in $(seq 300); do grep -q "1 engines registered" "$dir/$n.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "1 engines registered" "$dir/$n.log" || { logs; echo "FAIL: engine-node-$n did not register"; exit 1; }
done
netns_start 1 "$dir/r.log" "$rlsync" node --topology "$dir/router.yaml" --node router-node
netns_start 2 "$dir/t.log" "$rlsync" node --topology "$dir/router.yaml" --node trainer-node
wait "$head_pid" || { logs; echo "FAIL: the main job through a router on a member node failed"; exit 1; }
grep -q "the router" "$dir/r.log" || { logs; echo "FAIL: router-node did not register its router"; exit 1; }
grep -q '"weights_verified": true' "$dir/run.json" || { logs; cat "$dir/run.json"; echo "FAIL: weights not verified"; exit 1; }
grep -q '"completed": 16' "$dir/run.json" || { logs; cat "$dir/run.json"; echo "FAIL: requests lost"; exit 1; }
for n in a b; do # the vouched router was obeyed: nothing refused
  ! grep "refused" "$dir/$n.log" || { logs; echo "FAIL: engine-node-$n refused a message"; exit 1; }
done
grep "byte-identical" "$dir/head.log"
echo ok
