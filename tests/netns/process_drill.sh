#!/usr/bin/env bash
# rlsync drill --netns: a three-node topology, each node its own `rlsync node`
# process in its own network namespace (the drill makes them with
# deploy/netns.sh and removes them), weights over UCX/tcp:
#   1. engine-node-a's process is SIGKILLed during round 6's finish and
#      started again 1.5 s later;
#   2. engine-node-b's link is cut as round 40 goes out (the process keeps
#      running) and restored 2.5 s later: the head notices within the
#      heartbeat timeout and takes it back after healing. Timed by rounds, not
#      by the clock: at 3 s after round 1 a loaded machine had not yet brought
#      engine-node-a back, both engines were out at once and min_live failed;
#      rounds slow down with the machine, and 34 rounds (8 s at 250 ms a step)
#      are ample for a node restarted after 1.5 s to rejoin.
#   3. configs/drills/process-rank-partition.yaml: trainer rank 1's node
#      (two ranks, each on its own node) cut off as a transfer goes out,
#      while an engine waits for a group it withholds: the round aborts.
# Every judged invariant must hold. Without root the drill refuses --netns.
# CASE (the third argument) runs one part: drill (1 and 2) or ranks (3);
# none runs both. ctest runs each as its own test: each drill's job is
# CPU-bound and slows with the machine (see tests/integration/process_drill.sh).
set -euo pipefail
rlsync=${1:?usage: $0 RLSYNC_BINARY SOURCE_ROOT [CASE]}
root=${2:?usage: $0 RLSYNC_BINARY SOURCE_ROOT [CASE]}
case=${3:-all}
case $case in all | drill | ranks) ;;
  *) echo "FAIL: unknown part '$case'"; exit 1 ;;
esac
part() { [ "$case" = all ] || [ "$case" = "$1" ]; }
if ! "$root/deploy/netns.sh" can 2>/dev/null; then
  echo "skipping netns test $(basename "$0"): network namespaces cannot be created here (needs root and iproute2)"
  exit 77
fi
dir=$(mktemp -d)
# Namespaces another run left (one killed by a timeout cannot clean up) are
# not this run's fault: only new ones count below.
drill_namespaces() { ip netns list | awk '{print $1}' | grep '^rldrill' | sort || true; }
namespaces_before=$(drill_namespaces)
# A failed run keeps its directory (every node's log, the report) for diagnosis.
trap 'rc=$?; if [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; then rm -rf "$dir"; else echo "kept for diagnosis: $dir" >&2; fi' EXIT
"$rlsync" certs make --out "$dir/certs" --nodes head,engine-node-a,engine-node-b > /dev/null
cat > "$dir/netns-drill.yaml" <<YAML
name: netns-drill
model:
  synthetic: {layers: 4, hidden_size: 256, heads: 8, kv_heads: 4, intermediate_size: 704, vocab_size: 320, dtype: bf16, seed: 1}
nodes:
  - {name: head, address: 10.77.7.1, port: 7300}
  - {name: engine-node-a, address: 10.77.7.2}
  - {name: engine-node-b, address: 10.77.7.3}
cluster:
  tls: {ca: certs/ca.pem, cert: "certs/{node}.pem", key: "certs/{node}.key"}
  secret_file: "certs/{node}.secret"
  heartbeat_interval_ms: 200
  heartbeat_timeout_ms: 1500
  connect_deadline_ms: 15000
trainer: {node: head, source: synthetic, step_time_ms: 250, perturb: 0.01, seed: 7}
engines:
  - {name: rollout-a, node: engine-node-a, tp: 1, max_batch: 16, queue_limit: 256}
  - {name: rollout-b, node: engine-node-b, tp: 1, max_batch: 16, queue_limit: 256}
router: {node: head, policy: least_outstanding}
coordinator: {node: head}
transfer: {backend: ucx, mode: sharded, ucx_transports: [tcp]}
sync:
  every_versions: 1
  staleness: 1
  deadlines_ms: {pause: 2000, flush: 1000, start: 2000, transfer: 10000, finish: 2000, continue: 1000}
  min_live_engines: 1
  max_restarts: 3
workload: {prompts: 2000, concurrency: 8, max_tokens: 24, temperature: 0.0, seed: 1}
drill:
  faults:
    - {at_sync: 6, phase: finish, action: kill, target: engine-node-a, duration_ms: 1500}
    - {at_sync: 40, phase: pause, action: partition, target: engine-node-b, duration_ms: 2500}
YAML
if part drill; then
set +e
"$rlsync" drill "$dir/netns-drill.yaml" --netns --netns-script "$root/deploy/netns.sh" --report "$dir/report" \
  --throughput report > "$dir/out" 2> "$dir/err"
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  cat "$dir/out"; tail -40 "$dir/err"; tail -40 "$dir/report/head.log" 2>/dev/null || true
  echo "FAIL: the drill exited $rc"; exit 1
fi
grep -q '"passed": true' "$dir/report/report.json" || { echo "FAIL: report.json does not say passed"; exit 1; }
grep -q 'VIOLATED' "$dir/out" && { cat "$dir/out"; echo "FAIL: an invariant is violated"; exit 1; }
grep -q 'namespaces rldrill[0-9]*-0..2 up' "$dir/err" || { cat "$dir/err"; echo "FAIL: no namespaces made"; exit 1; }
grep -q 'node engine-node-a: SIGKILL' "$dir/err" || { cat "$dir/err"; echo "FAIL: engine-node-a was not killed"; exit 1; }
grep -q 'node engine-node-b: link down' "$dir/err" || { cat "$dir/err"; echo "FAIL: engine-node-b's link was not cut"; exit 1; }
grep -q 'node engine-node-b link up' "$dir/err" || { cat "$dir/err"; echo "FAIL: engine-node-b's link was not restored"; exit 1; }
grep -q 'rollout-b silent for\|rollout-b left (down' "$dir/report/head.log" \
  || { tail -40 "$dir/report/head.log"; echo "FAIL: the partition was not detected"; exit 1; }
echo "partition detected: $(grep -o 'rollout-b silent for [0-9.]* ms\|rollout-b left (down[^)]*)' "$dir/report/head.log" | head -1)"
echo "$(grep -c '^  held' "$dir/out") invariants held"
# Ctrl-C mid-drill: the nodes stop and the namespaces go (exit 130).
"$rlsync" drill "$dir/netns-drill.yaml" --netns --netns-script "$root/deploy/netns.sh" --report "$dir/cut" \
  > "$dir/cut.out" 2> "$dir/cut.err" &
drill_pid=$!
for _ in $(seq 600); do # 60 s at most
  grep -q 'namespaces rldrill[0-9]*-0..2 up' "$dir/cut.err" && break
  sleep 0.1
done
cut_fail() {
  kill -9 "$drill_pid" 2>/dev/null || true
  "$root/deploy/netns.sh" down "rldrill$drill_pid" 2>/dev/null || true
  tail -20 "$dir/cut.err"
  echo "FAIL: $*"
  exit 1
}
grep -q 'namespaces rldrill[0-9]*-0..2 up' "$dir/cut.err" || cut_fail "no namespaces before the cut"
kill -INT "$drill_pid"
rc=0
timeout 90 tail --pid="$drill_pid" -f /dev/null || cut_fail "the drill outlived SIGINT by 90 s"
wait "$drill_pid" || rc=$?
[ "$rc" -eq 130 ] || { tail -20 "$dir/cut.err"; echo "FAIL: SIGINT: exit $rc, expected 130"; exit 1; }
if ip netns list | grep -q "^rldrill$drill_pid-"; then ip netns list; echo "FAIL: SIGINT left namespaces"; exit 1; fi
grep -q 'stopped by signal 2' "$dir/cut.err" || { tail -20 "$dir/cut.err"; echo "FAIL: SIGINT not reported"; exit 1; }
echo "SIGINT mid-drill: exit 130, namespaces removed"
fi
if part ranks; then
# The shipped rank drill: trainer rank 1's node cut off mid-transfer
# (configs/drills/process-rank-partition.yaml, which reads ../certs).
mkdir -p "$dir/r/drills"
cp "$root/configs/drills/process-rank-partition.yaml" "$dir/r/drills/"
"$rlsync" certs make --out "$dir/r/certs" --nodes head,engines-a,engines-b,trainer-node-0,trainer-node-1 > /dev/null
set +e
"$rlsync" drill "$dir/r/drills/process-rank-partition.yaml" --netns --netns-script "$root/deploy/netns.sh" \
  --report "$dir/ranks" --throughput report > "$dir/ranks.out" 2> "$dir/ranks.err"
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  cat "$dir/ranks.out"; tail -40 "$dir/ranks.err"; tail -60 "$dir/ranks/head.log" 2>/dev/null || true
  echo "FAIL: process-rank-partition exited $rc"; exit 1
fi
grep -q '"passed": true' "$dir/ranks/report.json" || { echo "FAIL: process-rank-partition: report.json does not say passed"; exit 1; }
grep -q 'node trainer-node-1: link down' "$dir/ranks.err" || { cat "$dir/ranks.err"; echo "FAIL: rank 1's link was not cut"; exit 1; }
grep -q 'VIOLATED' "$dir/ranks.out" && { cat "$dir/ranks.out"; echo "FAIL: process-rank-partition: an invariant is violated"; exit 1; }
# As an earlier phase of that round went out, rank 1 was armed to withhold
# a group of its version: the cut lands while an engine waits for it, and
# the round aborts.
grep -q 'withheld as the fault landed: trainer rank 1 withholds group [0-9]* of \(v[0-9]*\|any version\)' "$dir/ranks.err" \
  || { cat "$dir/ranks.err"; echo "FAIL: no group withheld before the cut"; exit 1; }
grep -q 'trainer rank 1 silent for\|trainer rank 1 is down' "$dir/ranks/head.log" \
  || { tail -60 "$dir/ranks/head.log"; echo "FAIL: the head never noticed rank 1 cut off"; exit 1; }
grep -q 'sync round [0-9]* v[0-9]*: ABORTED' "$dir/ranks/head.log" \
  || { tail -60 "$dir/ranks/head.log"; echo "FAIL: the round cut off mid-transfer did not abort"; exit 1; }
# When its connection dropped, the same process rejoins once the link is
# back and is followed again.
! grep -q 'trainer rank 1 is down' "$dir/ranks/head.log" || [ "$(grep -c 'trainer rank 1 (incarnation [0-9]*, node trainer-node-1, .*registered' "$dir/ranks/head.log")" -ge 2 ] \
  || { tail -60 "$dir/ranks/head.log"; echo "FAIL: rank 1 never registered again after the heal"; exit 1; }
echo "trainer rank partitioned mid-transfer: $(grep -o 'at [0-9]* ms: sync round [0-9]* v[0-9]*: ABORTED ([^)]*)' "$dir/ranks.err" | head -1); $(grep -c '^  held' "$dir/ranks.out") invariants held"
fi

# The namespaces this run made are gone.
left=$(comm -13 <(echo "$namespaces_before") <(drill_namespaces))
if [ -n "$left" ]; then echo "$left"; echo "FAIL: namespaces left behind"; exit 1; fi
# Without root, --netns is refused.
if command -v setpriv > /dev/null; then
  chmod 755 "$dir" && chmod 644 "$dir/netns-drill.yaml"
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$rlsync" drill "$dir/netns-drill.yaml" --netns \
          --report "$dir/never" 2>&1) && rc=0 || rc=$?
  [ "$rc" -eq 1 ] && grep -q -- "--netns needs root" <<<"$out" || { echo "FAIL: --netns without root: rc $rc: $out"; exit 1; }
  echo "--netns refused without root"
fi
echo ok
