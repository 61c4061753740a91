#!/usr/bin/env bash
# rlsync drill end to end: each shipped drill (configs/drills/) runs to the
# end with every invariant held, writes report.json and report.html with its
# timeline, and names its report folder on its last line; bad drills are
# refused with their place. The throughput invariant compares tokens/s before
# and after the faults, which a shared CI machine's neighbours skew: it runs
# with --throughput report (printed and written, not judged); every other
# invariant is judged.
set -euo pipefail
rlsync=$1 root=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for drill in "$root"/configs/drills/*.yaml; do
  name=$(basename "$drill" .yaml)
  # Its engines never come back, so the invariants about live engines cannot
  # hold: tests/integration/fleet.sh checks what it must show instead.
  [ "$name" = fleet-loss-no-restart ] && continue
  # Several nodes, a process each, with credentials: tests/integration/process_drill.sh.
  case "$name" in process-*) continue ;; esac
  set +e
  "$rlsync" drill "$drill" --report "$dir/$name" --throughput report > "$dir/$name.out" 2> "$dir/$name.err"
  rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    cat "$dir/$name.out"; tail -40 "$dir/$name.err"
    echo "FAIL: drill $name exited $rc"; exit 1
  fi
  [ "$(tail -1 "$dir/$name.out")" = "$dir/$name" ] || { cat "$dir/$name.out"; echo "FAIL: $name: last line is not the report folder"; exit 1; }
  grep -q '"passed": true' "$dir/$name/report.json" || { echo "FAIL: $name: report.json does not say passed"; exit 1; }
  grep -q '<svg' "$dir/$name/report.html" || { echo "FAIL: $name: no timeline in report.html"; exit 1; }
  grep -q 'class="seg ' "$dir/$name/report.html" || { echo "FAIL: $name: no lane segments"; exit 1; }
  grep -q 'VIOLATED' "$dir/$name.out" && { cat "$dir/$name.out"; echo "FAIL: $name: an invariant is violated"; exit 1; }
  grep -q '^  reported  throughput back to its pre-fault level: .*reported, not judged' "$dir/$name.out" \
    || { cat "$dir/$name.out"; echo "FAIL: $name: throughput not marked reported, not judged"; exit 1; }
  grep -q '"judged": false' "$dir/$name/report.json" || { echo "FAIL: $name: report.json does not mark throughput not judged"; exit 1; }
  echo "$name: $(grep -c '^  held' "$dir/$name.out") invariants held; $(grep -E 'failover|detected|after /' "$dir/$name.out" | tr -s ' ' | paste -sd ';' -)"
done
# The drills themselves did what they say.
grep -q 'rerouted from rollout-0' "$dir/engine-kill.err" || { echo "FAIL: engine-kill rerouted nothing"; exit 1; }
grep -q 'coordinator: rollout-0 left (down: .*data-parallel rank 1, tp worker 1 died' "$dir/dp-worker-kill.err" \
  || { echo "FAIL: dp-worker-kill: the engine did not report its dead worker"; exit 1; }
grep -q 'rollout-0 restarted as incarnation 2' "$dir/dp-worker-kill.err" || { echo "FAIL: dp-worker-kill: no restart"; exit 1; }
grep -q 'rollout-1 silent for' "$dir/partition.err" || { echo "FAIL: partition was not detected"; exit 1; }
grep -q 'checksum' "$dir/partition.err" || { echo "FAIL: the corrupted group was not caught"; exit 1; }
grep -q 'ABORTED (the trainer is down)' "$dir/trainer-kill.err" || { echo "FAIL: trainer-kill aborted no round"; exit 1; }
grep -q 'coordinator: restored from .*coordinator-state.yaml' "$dir/coordinator-restart.err" || { echo "FAIL: the coordinator did not restart from its state file"; exit 1; }
grep -q 'coordinator: a new router attached' "$dir/router-restart.err" || { echo "FAIL: no new router attached"; exit 1; }
# Bad drills: nothing to rehearse, a fault one process cannot stage, a bad field.
sed '/^drill:/,$d' "$root/configs/drills/engine-kill.yaml" > "$dir/none.yaml"
set +e
out=$("$rlsync" drill "$dir/none.yaml" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q 'no drill.faults' <<<"$out" || { echo "FAIL: a drill without faults: rc $rc: $out"; exit 1; }
sed 's/target: rollout-2, duration_ms: 1000/target: local/' "$root/configs/drills/engine-kill.yaml" > "$dir/node.yaml"
set +e
out=$("$rlsync" drill "$dir/node.yaml" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q 'drill.faults\[1\]: kill of a whole node' <<<"$out" || { echo "FAIL: node kill: rc $rc: $out"; exit 1; }
sed 's/phase: transfer/phase: later/' "$root/configs/drills/engine-kill.yaml" > "$dir/phase.yaml"
set +e
out=$("$rlsync" drill "$dir/phase.yaml" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q 'phase.yaml:[0-9]*:[0-9]*: drill.faults\[0\].phase: must be one of' <<<"$out" || { echo "FAIL: bad phase: rc $rc: $out"; exit 1; }
out=$("$rlsync" drill "$root/configs/drills/engine-kill.yaml" --throughput maybe 2>&1) && rc=0 || rc=$?
[ "$rc" -eq 2 ] && grep -q -- '--throughput' <<<"$out" || { echo "FAIL: a bad --throughput: rc $rc: $out"; exit 1; }
echo "bad drills refused with their place"
