#!/usr/bin/env bash
# rlsync drill with real processes: the shipped multi-node drills
# (configs/drills/process-*.yaml) run each node as its own `rlsync node`
# process on loopback:
#   process-engine-kill: engines-b's process is SIGKILLed during a round's
#     finish and started again; the head sees it leave and it rejoins;
#   process-head-restart: the head is SIGKILLed mid-transfer and started
#     again from its state file; the members rejoin it and no version goes
#     backwards;
#   process-rank-kill: trainer rank 1's node is SIGKILLed mid-transfer (it
#     withholds a group of that round first) and started again; the round
#     aborts and the first one after the rank rejoins completes;
#   corrupt faults: the producer of the head's trainer, and then of ranks on
#     member nodes, alters one group 0 an engine receives.
# (process-rank-partition needs namespaces: tests/netns/process_drill.sh.)
# Each must hold every judged invariant and write its report; faults that
# processes cannot stage are refused with their place.
# CASE (the third argument) runs one part: engine-kill, head-restart,
# rank-kill, corrupt, rank-corrupt or refusals; none runs them all. ctest runs each part as
# its own test: a drill's job generates its 600 prompts on the CPU, and on a
# loaded machine (four `yes` beside other builds on 2 cores) one part took
# 56-124 s where it takes 15-30 s idle, so all of them in one test ran past
# one test's timeout.
set -euo pipefail
rlsync=$1 root=$2 case=${3:-all}
case $case in all | engine-kill | head-restart | rank-kill | corrupt | rank-corrupt | refusals) ;;
  *) echo "FAIL: unknown part '$case'"; exit 1 ;;
esac
part() { [ "$case" = all ] || [ "$case" = "$1" ]; }
dir=$(mktemp -d)
# A failed run keeps its directory (every node's log, the report) for diagnosis.
trap 'rc=$?; if [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; then rm -rf "$dir"; else echo "kept for diagnosis: $dir" >&2; fi' EXIT
# The configs read ../certs (configs/certs in the source tree): copy them next
# to fresh credentials rather than write into the source tree.
mkdir -p "$dir/drills"
cp "$root"/configs/drills/process-*.yaml "$dir/drills/"
"$rlsync" certs make --out "$dir/certs" --nodes head,engines-a,engines-b,trainer-node-0,trainer-node-1 > /dev/null
run() { # name
  set +e
  "$rlsync" drill "$dir/drills/$1.yaml" --report "$dir/$1" --throughput report > "$dir/$1.out" 2> "$dir/$1.err"
  local rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    cat "$dir/$1.out"; tail -40 "$dir/$1.err"; tail -30 "$dir/$1/head.log" 2>/dev/null || true
    echo "FAIL: drill $1 exited $rc"; exit 1
  fi
  [ "$(tail -1 "$dir/$1.out")" = "$dir/$1" ] || { cat "$dir/$1.out"; echo "FAIL: $1: last line is not the report folder"; exit 1; }
  grep -q '"passed": true' "$dir/$1/report.json" || { echo "FAIL: $1: report.json does not say passed"; exit 1; }
  grep -q '<svg' "$dir/$1/report.html" || { echo "FAIL: $1: no timeline in report.html"; exit 1; }
  grep -q 'VIOLATED' "$dir/$1.out" && { cat "$dir/$1.out"; echo "FAIL: $1: an invariant is violated"; exit 1; }
  grep -q '^  held      no version went backwards' "$dir/$1.out" || { cat "$dir/$1.out"; echo "FAIL: $1: versions not watched"; exit 1; }
  grep -q '^  reported  throughput back to its pre-fault level: not measured with processes' "$dir/$1.out" \
    || { cat "$dir/$1.out"; echo "FAIL: $1: throughput not said to be unmeasured"; exit 1; }
  echo "$1: $(grep -c '^  held' "$dir/$1.out") invariants held"
}
if part engine-kill; then
run process-engine-kill
grep -q 'fault: kill engines-b (sync 8 finish) for 1500 ms: node engines-b: SIGKILL' "$dir/process-engine-kill.err" \
  || { cat "$dir/process-engine-kill.err"; echo "FAIL: engines-b was not killed"; exit 1; }
grep -q 'engines-b started again' "$dir/process-engine-kill.err" || { echo "FAIL: engines-b was not started again"; exit 1; }
grep -q 'rollout-b left (down\|evicted rollout-b\|rollout-b silent for' "$dir/process-engine-kill/head.log" \
  || { tail -40 "$dir/process-engine-kill/head.log"; echo "FAIL: the head never noticed rollout-b go"; exit 1; }
[ "$(grep -c 'admitted engines-b' "$dir/process-engine-kill/head.log")" -ge 2 ] \
  || { echo "FAIL: the restarted engines-b never rejoined"; exit 1; }
grep -q 'rejoined replicas are current: [1-9] rejoined' "$dir/process-engine-kill.out" \
  || { cat "$dir/process-engine-kill.out"; echo "FAIL: no rejoined replica checked"; exit 1; }
echo "engine node killed during finish: $(grep -o 'rollout-b left ([^)]*)\|evicted rollout-b' "$dir/process-engine-kill/head.log" | head -1); rejoined"
fi

if part head-restart; then
run process-head-restart
grep -q 'node head: SIGKILL' "$dir/process-head-restart.err" || { echo "FAIL: the head was not killed"; exit 1; }
grep -q 'coordinator: restored from .*coordinator-state.yaml' "$dir/process-head-restart/head.log" \
  || { tail -40 "$dir/process-head-restart/head.log"; echo "FAIL: the head did not resume from its state file"; exit 1; }
grep -q 'across 1 restarts of the head' "$dir/process-head-restart.out" || { echo "FAIL: the restart is not reported"; exit 1; }
echo "head killed mid-transfer: $(grep -o 'restored from [^:]*: v[0-9]* synced' "$dir/process-head-restart/head.log" | head -1)"
fi

if part rank-kill; then
# Trainer rank 1's node killed as round 8's transfer goes out. As an earlier
# phase of that round goes out the drill has rank 1 withhold a group of its
# version, so the kill lands mid-transfer however fast the transfer: the
# round aborts (both engines received part and stay dirty: min_live is
# reported, not judged; no dirty engine serves), and the first round after
# the rank rejoins completes with every engine byte-identical.
run process-rank-kill
grep -q 'node trainer-node-1: SIGKILL' "$dir/process-rank-kill.err" || { echo "FAIL: rank 1 was not killed"; exit 1; }
withheld=$(grep -o 'withheld as the fault landed: trainer rank 1 withholds group [0-9]* of \(v[0-9]*\|any version\)' "$dir/process-rank-kill.err") \
  || { cat "$dir/process-rank-kill.err"; echo "FAIL: no group withheld before the kill"; exit 1; }
grep -q 'ABORTED (trainer rank 1 is down)' "$dir/process-rank-kill/head.log" \
  || { tail -40 "$dir/process-rank-kill/head.log"; echo "FAIL: no round aborted"; exit 1; }
[ "$(grep -c 'trainer rank 1 (incarnation [0-9]*, node trainer-node-1, .*registered' "$dir/process-rank-kill/head.log")" -ge 2 ] \
  || { tail -40 "$dir/process-rank-kill/head.log"; echo "FAIL: the restarted rank 1 never registered"; exit 1; }
first_after=$(awk '/trainer rank 1 \(incarnation [0-9]*, node trainer-node-1, .*registered/ { n++ }
                   n >= 2 && /^sync (round )?[0-9]+ v[0-9]+: / { print; exit }' "$dir/process-rank-kill/head.log")
grep -q '^sync [0-9]* v[0-9]*: 2 engines' <<<"$first_after" \
  || { tail -60 "$dir/process-rank-kill/head.log"; echo "FAIL: the first round after rank 1 rejoined did not complete: $first_after"; exit 1; }
grep -q '^  held      no token produced by a dirty engine' "$dir/process-rank-kill.out" \
  || { cat "$dir/process-rank-kill.out"; echo "FAIL: dirty tokens not judged"; exit 1; }
grep -q '^  held      every live engine on the same version: .*2 live engines at it, byte-identical' "$dir/process-rank-kill.out" \
  || { cat "$dir/process-rank-kill.out"; echo "FAIL: engines not byte-identical"; exit 1; }
grep -q '^  reported  engines live and serving .*the drill takes out 2 of 2 engines at once' "$dir/process-rank-kill.out" \
  || { cat "$dir/process-rank-kill.out"; echo "FAIL: min_live not reported as the drill's doing"; exit 1; }
echo "trainer rank killed mid-transfer (${withheld#withheld as the fault landed: }): $(grep -o 'at [0-9]* ms: sync round [0-9]* v[0-9]*: ABORTED ([^)]*)' "$dir/process-rank-kill.err" | head -1); next: ${first_after%%,*}"
fi

if part corrupt; then
# corrupt: SIGRTMIN+2 (with the engine's index and the round's version) to the
# head, whose UCX producer alters the next group 0 rollout-a receives; the
# engine catches it (its checksum) and is evicted from that round, then
# re-synced.
sed 's/    - {at_sync: 8, phase: finish, action: kill, target: engines-b, duration_ms: 1500}/    - {at_sync: 4, phase: start, action: corrupt, target: rollout-a}/' \
  "$dir/drills/process-engine-kill.yaml" > "$dir/drills/process-corrupt.yaml"
run process-corrupt
grep -q 'SIGRTMIN+2 (corrupt group 0 of v[0-9]*) to the nodes hosting trainer ranks: head$' "$dir/process-corrupt.err" \
  || { cat "$dir/process-corrupt.err"; echo "FAIL: no corrupt signal sent"; exit 1; }
v=$(grep -o 'drill: trainer rank 0: the next group 0 rollout-a receives of v[0-9]* or later will be corrupted' \
      "$dir/process-corrupt/head.log" | grep -o 'of v[0-9]*' | head -1) \
  || { tail -40 "$dir/process-corrupt/head.log"; echo "FAIL: the head's producer was not armed"; exit 1; }
# A round of that version or later evicts it (the round of that version
# unless the signal was handled after its group 0 went out; a loaded machine
# may evict it again later for being slow).
evicted_from() { # LOG VERSION: a round of VERSION or later that evicted rollout-a
  awk -v from="$2" '/^sync [0-9]+ v[0-9]+: .*evicted rollout-a/ { v = substr($3, 2) + 0; if (v >= from) { print; exit } }' "$1"
}
[ -n "$(evicted_from "$dir/process-corrupt/head.log" "${v#of v}")" ] \
  || { tail -40 "$dir/process-corrupt/head.log"; echo "FAIL: the corrupted group (${v#of }) was not caught"; exit 1; }
echo "corrupted group caught: $(grep -o 'sync [0-9]* v[0-9]*: .*evicted rollout-a' "$dir/process-corrupt/head.log" | head -1 | sed 's/,.*evicted/: evicted/')"

fi

if part rank-corrupt; then
# corrupt with the ranks on member nodes (process-rank-kill's layout): both
# rank nodes are armed for the round's version; whichever serves rollout-a's
# group 0 alters it, so that round evicts rollout-a, and it ends
# byte-identical after a clean sync.
sed 's/    - {at_sync: 8, phase: transfer, action: kill, target: trainer-node-1, duration_ms: 2000}/    - {at_sync: 4, phase: start, action: corrupt, target: rollout-a}/' \
  "$dir/drills/process-rank-kill.yaml" > "$dir/drills/process-rank-corrupt.yaml"
run process-rank-corrupt
grep -q 'SIGRTMIN+2 (corrupt group 0 of v[0-9]*) to the nodes hosting trainer ranks: trainer-node-0, trainer-node-1' \
  "$dir/process-rank-corrupt.err" || { cat "$dir/process-rank-corrupt.err"; echo "FAIL: the rank nodes were not signalled"; exit 1; }
for n in 0 1; do
  v=$(grep -o "drill: trainer rank $n: the next group 0 rollout-a receives of v[0-9]* or later will be corrupted" \
        "$dir/process-rank-corrupt/trainer-node-$n.log" | grep -o 'of v[0-9]*' | head -1) \
    || { tail -20 "$dir/process-rank-corrupt/trainer-node-$n.log"; echo "FAIL: rank $n's producer was not armed"; exit 1; }
done
evicted_from() { # LOG VERSION: a round of VERSION or later that evicted rollout-a
  awk -v from="$2" '/^sync [0-9]+ v[0-9]+: .*evicted rollout-a/ { v = substr($3, 2) + 0; if (v >= from) { print; exit } }' "$1"
}
[ -n "$(evicted_from "$dir/process-rank-corrupt/head.log" "${v#of v}")" ] \
  || { grep 'evicted' "$dir/process-rank-corrupt/head.log"; echo "FAIL: the corrupted group (${v#of }) was not caught"; exit 1; }
grep -q '^  held      every live engine on the same version: .*2 live engines at it, byte-identical' "$dir/process-rank-corrupt.out" \
  || { cat "$dir/process-rank-corrupt.out"; echo "FAIL: rank corrupt: engines not byte-identical"; exit 1; }
echo "corrupted group from a member node's rank caught: $(grep -o 'sync [0-9]* v[0-9]*: .*evicted rollout-a' "$dir/process-rank-corrupt/head.log" | head -1 | sed 's/,.*evicted/: evicted/')"
fi

if part refusals; then
# Refused with their place: a partition without namespaces, the head killed
# for good, --netns on a one-node topology.
sed 's/action: kill, target: engines-b, duration_ms: 1500/action: partition, target: engines-b, duration_ms: 1500/' \
  "$dir/drills/process-engine-kill.yaml" > "$dir/drills/partition.yaml"
out=$("$rlsync" drill "$dir/drills/partition.yaml" --report "$dir/p" 2>&1) && rc=0 || rc=$?
[ "$rc" -eq 1 ] && grep -q "partition.yaml:[0-9]*:[0-9]*: drill.faults\[0\]: partition of engines-b .*only with --netns" <<<"$out" \
  || { echo "FAIL: partition without --netns: rc $rc: $out"; exit 1; }
sed 's/action: kill, target: coordinator, duration_ms: 1000/action: kill, target: coordinator/' \
  "$dir/drills/process-head-restart.yaml" > "$dir/drills/forever.yaml"
out=$("$rlsync" drill "$dir/drills/forever.yaml" --report "$dir/f" 2>&1) && rc=0 || rc=$?
[ "$rc" -eq 1 ] && grep -q "forever.yaml:[0-9]*:[0-9]*: drill.faults\[0\]: .*give it a duration_ms" <<<"$out" \
  || { echo "FAIL: head killed for good: rc $rc: $out"; exit 1; }
out=$("$rlsync" drill "$root/configs/drills/engine-kill.yaml" --netns --report "$dir/n" 2>&1) && rc=0 || rc=$?
[ "$rc" -eq 1 ] && grep -q -- "--netns: the topology has one node" <<<"$out" || { echo "FAIL: --netns on one node: rc $rc: $out"; exit 1; }
echo "faults processes cannot stage refused with their place"
fi
