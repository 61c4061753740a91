#!/usr/bin/env bash
# The hostile-peer suite against a trainer rank on a member node: a scratch
# copy of configs/multiprocess.yaml with two ranks (rank 0 on the head, rank
# 1 on its own node "ranks"), two engine nodes, mutual TLS and per-node
# secrets. Checks:
#   - the rank node listens on loopback only, and on no CAF port (it
#     publishes nothing: its only link is the one to the head);
#   - garbage and truncated frames to every port it listens on (UCX's tcp
#     ports) leave it alive, and a round with both engines completes;
#   - through the head (CAF forwards by node id), an outsider (TLS without
#     a certificate) is turned away by TLS, and a member-credentialed but
#     unadmitted peer asking the rank's actors for UCX tickets, metadata,
#     the version or a freeze gets nothing: the rank refuses it (its log says
#     so, which also shows the requests reached it);
#   - after all of it a round with both engines completes.
# (An admitted member asking for another engine's tickets is
# tests/actors/test_authorization.cpp's "a trainer rank on a member node".)
# With --python, the ranks are external (trainer.source: external): two
# Python processes (rlsync.TrainerRank, tests/python/publish_loop.py), rank
# 0 joining under the head's node name, rank 1 as node "ranks"; the same
# checks hold for them: a Python rank authenticates exactly as a node does.
#
#   hostile_rank.sh RLSYNC HOSTILE_PEER SOURCE_DIR [--python PYTHON BUILD_DIR]
set -uo pipefail
rlsync=$1
peer=$2
src=$3
python_rank=${4:-}
command -v ss >/dev/null || { echo "skip: no ss here"; exit 77; }
if [ "$python_rank" = --python ]; then
  py=$5
  export PYTHONPATH="$6/python:$src/tools/python/examples"
  "$py" -c "import torch, rlsync" 2>/dev/null || { echo "skip: no torch or no rlsync module for $py"; exit 77; }
fi
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "== $f"; tail -n 30 "$f"; done; exit 1; }

# Below the ephemeral range, away from hostile_peer.sh's (14000-19999) and cluster.sh's.
port=$((12000 + ($$ % 1000) * 2))
python3 - "$src/configs/multiprocess.yaml" "$dir/topology.yaml" "$port" ${python_rank:+external} <<'PY' || fail "could not make the scratch topology"
import sys
src, dst, port = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(src).read()
def swap(old, new):
    global text
    if old not in text:
        sys.exit(f"configs/multiprocess.yaml no longer has {old!r}")
    text = text.replace(old, new, 1)
swap("    port: 7411\n", f"    port: {port}\n")
swap("  - name: engines-b\n    address: 127.0.0.1\n",
     "  - name: engines-b\n    address: 127.0.0.1\n  - name: ranks\n    address: 127.0.0.1\n")
# Steps of 1 s: the ranks start stepping when their processes start, and
# (today) a rank that registers more versions behind than a rank keeps (2)
# never meets the other; the members start first, the head last.
ranks = "  ranks:\n    - node: head\n      layers: \"0-1\"\n    - node: ranks\n      layers: \"2-3\"\n"
if len(sys.argv) > 4:  # Python ranks: they publish on their own clock
    swap("  source: synthetic\n  step_time_ms: 200\n", "  source: external\n" + ranks)
    swap("    dtype: bf16\n    seed: 1\n", "    dtype: bf16\n")  # the ranks' own processes make the values
else:
    swap("  step_time_ms: 200\n", "  step_time_ms: 1000\n" + ranks)
open(dst, "w").write(text)
PY
"$rlsync" validate "$dir/topology.yaml" > "$dir/validate.out" 2>&1 || { cat "$dir/validate.out"; fail "the scratch topology does not validate"; }
"$rlsync" certs make --out "$dir/certs" --nodes head,engines-a,engines-b,ranks > /dev/null || fail "certs make"
target="127.0.0.1:$port"

failed=()
check() { # NAME STATUS MESSAGE
  if [ "$2" -eq 0 ]; then echo "ok   [rank:$1] $3"; else echo "FAIL [rank:$1] $3"; failed+=("rank:$1"); fi
}

log="$dir/head.log"
for n in ranks engines-a engines-b; do # they retry joining until the head is up
  if [ -n "$python_rank" ] && [ "$n" = ranks ]; then continue; fi
  "$rlsync" node --topology "$dir/topology.yaml" --node "$n" > "$dir/$n.log" 2>&1 &
  pids+=($!)
  [ "$n" = ranks ] && rank_pid=$!
done
if [ -n "$python_rank" ]; then # the ranks' own processes, both on one clock
  epoch=$(date +%s)
  "$py" "$src/tests/python/publish_loop.py" "$dir/topology.yaml" 1 "$epoch" > "$dir/ranks.log" 2>&1 &
  rank_pid=$!; pids+=("$rank_pid")
  "$py" "$src/tests/python/publish_loop.py" "$dir/topology.yaml" 0 "$epoch" > "$dir/rank0.log" 2>&1 &
  pids+=($!)
fi
"$rlsync" node --topology "$dir/topology.yaml" --node head > "$log" 2>&1 &
head_pid=$!; pids+=("$head_pid")
for _ in $(seq 1 100); do grep -q "gatekeeper on" "$log" && break; sleep 0.1; done
grep -q "gatekeeper on" "$log" || fail "the head did not come up"
rounds() { grep -cE '^sync [0-9]+ v[0-9]+( \(cold\))?: 2 engines' "$log" || true; }
serves() { # a round with both engines within 15 s from now
  local before; before=$(rounds)
  for _ in $(seq 1 150); do
    kill -0 "$head_pid" 2>/dev/null || return 1
    kill -0 "$rank_pid" 2>/dev/null || return 1
    [ "$(rounds)" -gt "$before" ] && return 0
    sleep 0.1
  done
  return 1
}
for _ in $(seq 1 300); do [ "$(rounds)" -ge 1 ] && break; sleep 0.1; done
[ "$(rounds)" -ge 1 ] || fail "the cluster did not sync with both engines and two ranks"
grep -q "trainer ranks" "$dir/ranks.log" || fail "the ranks node did not register its rank"

# Its ports: loopback only, no CAF port (nothing published), UCX's tcp ones.
ss -Hltnp 2>/dev/null | awk -v pat="pid=$rank_pid," 'index($0, pat) {print $4}' | sort -u > "$dir/rank-ports"
echo "the rank node listens on: $(echo $(cat "$dir/rank-ports"))"
beyond=$(grep -vcE '^(127\.[0-9.]+|\[::1\]):[0-9]+$' "$dir/rank-ports" || true)
[ "$beyond" -eq 0 ]; check loopback-only $? "every port of the rank node is on loopback ($beyond beyond)"
[ -s "$dir/rank-ports" ]; check ports-found $? "the rank node's UCX tcp ports were found ($(wc -l < "$dir/rank-ports"))"

# Garbage and truncated frames to each.
for ep in $(sed -e 's/^\[::1\]/[::1]/' "$dir/rank-ports"); do
  timeout 30 "$peer" garbage "$ep" --wait-ms 300 > /dev/null
  python3 - "$ep" <<'PY'
import random, socket, struct, sys, time
host, port = sys.argv[1].rsplit(":", 1)
host = host.strip("[]")
random.seed(13)
shots = [
    struct.pack("!I", 1 << 20) + random.randbytes(100),        # a length prefix, then a tenth of it
    bytes([3, 0, 0, 0]) + struct.pack("!I", 64) + bytes(10),   # a BASP-like header cut short
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",           # a TLS ClientHello cut short
    random.randbytes(1 << 20),                                 # a long stream
]
for data in shots:
    try:
        with socket.create_connection((host, int(port)), timeout=3) as s:
            s.settimeout(3)
            s.sendall(data)
            time.sleep(0.1)
    except OSError as e:
        print(f"  {host}:{port}: {e}")
PY
  kill -0 "$rank_pid" 2>/dev/null || break
done
sleep 0.3
kill -0 "$rank_pid" 2>/dev/null; check garbage-survives $? "garbage and truncated frames to every port of the rank node: it is alive"
serves; check garbage-serves $? "after the garbage: a round with both engines (and both ranks) completes"

# Through the head, to the rank's actors.
rank_id=$(sed -n 's/.*gatekeeper: admitted ranks (\(.*\))$/\1/p' "$log" | tail -n 1)
[ -n "$rank_id" ] || fail "no 'gatekeeper: admitted ranks (NODE-ID)' line in the head's log"
timeout 60 "$peer" routed "$target" "$rank_id" --tls-anonymous --max-id 24 --engine rollout-a > "$dir/outsider.out" 2>&1; rc=$?
cat "$dir/outsider.out"
[ "$rc" -eq 0 ] && grep -q '^routed: refused' "$dir/outsider.out"
check outsider-routed-refused $? "an outsider asking the rank's actors through the head: refused (exit $rc)"
refusals_before=$(grep -c "trainer: refused '" "$dir/ranks.log" || true)
timeout 60 "$peer" routed "$target" "$rank_id" --max-id 24 --engine rollout-a \
  --tls-ca "$dir/certs/ca.pem" --tls-cert "$dir/certs/engines-a.pem" --tls-key "$dir/certs/engines-a.key" \
  > "$dir/member.out" 2>&1; rc=$?
cat "$dir/member.out"
check member-routed-refused "$rc" "an unadmitted member asking the rank's actors for tickets, meta, version, freeze: none answered (exit $rc)"
refusals=$(( $(grep -c "trainer: refused '" "$dir/ranks.log" || true) - refusals_before ))
grep "trainer: refused '" "$dir/ranks.log" | tail -n 3
[ "$refusals" -gt 0 ]; check member-routed-reached $? "the requests reached the rank and it refused them ($refusals refusals logged)"
serves; check routed-serves $? "after the routed requests: a round with both engines completes"
kill -0 "$rank_pid" 2>/dev/null; check rank-alive $? "the rank node is alive at the end"

echo
if [ "${#failed[@]}" -eq 0 ]; then echo "hostile rank: every check passed"; exit 0; fi
echo "hostile rank: ${#failed[@]} checks failed: ${failed[*]}"
for f in "$dir"/*.log; do echo "== $f"; tail -n 20 "$f"; done
exit 1
