#!/usr/bin/env bash
# rlsync run end to end on a tiny model, in both transfer modes (and, sharded,
# on Qwen3 and Qwen3-MoE, experts separate or fused, placed whole or sliced,
# served as received or as int8): every
# request completes, syncs happen, and every engine ends byte-identical to the
# trainer (the --json summary says so); a bad topology exits 1 with its place.
set -euo pipefail
rlsync=$1 root=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for mode in sharded broadcast; do
  sed -e "s/mode: sharded .*/mode: $mode/" -e 's/layers: 4/layers: 2/' -e 's/hidden_size: 256/hidden_size: 64/' \
      -e 's/intermediate_size: 704/intermediate_size: 128/' -e 's/step_time_ms: 200/step_time_ms: 50/' \
      "$root/configs/local.yaml" > "$dir/$mode.yaml"
  grep -q "mode: $mode" "$dir/$mode.yaml" || { echo "FAIL: could not set mode $mode"; exit 1; }
  "$rlsync" run "$dir/$mode.yaml" --prompts 12 --concurrency 4 --max-tokens 24 --json "$dir/$mode.json" --no-progress \
    > "$dir/$mode.out" 2> "$dir/$mode.err" || { cat "$dir/$mode.out" "$dir/$mode.err"; echo "FAIL: run ($mode) exited non-zero"; exit 1; }
  j="$dir/$mode.json"
  grep -q '"completed": 12' "$j" || { cat "$j"; echo "FAIL: not every request completed ($mode)"; exit 1; }
  grep -q '"weights_verified": true' "$j" || { cat "$j"; echo "FAIL: weights not verified ($mode)"; exit 1; }
  grep -q '"identical": false' "$j" && { cat "$j"; echo "FAIL: an engine differs ($mode)"; exit 1; }
  # The cold sync brings v1 to the engines. When the trainer publishes v1 before
  # they register, a first round over nobody ("every engine already current")
  # comes before it, so its round number is not always 1.
  grep -q '^sync [0-9]* v1 (cold): ' "$dir/$mode.err" || { cat "$dir/$mode.err"; echo "FAIL: no cold sync line ($mode)"; exit 1; }
  grep -q "byte-identical to the trainer" "$dir/$mode.out" || { cat "$dir/$mode.out"; echo "FAIL: summary ($mode)"; exit 1; }
  echo "$mode: $(grep -c '^sync ' "$dir/$mode.err") sync lines"
done
# Sharded moves less than broadcast: tp 2 shards about halve the bytes each
# engine receives (the cold sync may take one engine or both: compare per engine).
# The first round that moved weights (a round over nobody may come before it).
per_engine() {
  python3 -c 'import json, sys
rounds = [r for r in json.load(open(sys.argv[1]))["syncs"] if r["engines"] > 0]
if rounds:
    print(rounds[0]["bytes"] // rounds[0]["engines"])' "$1"
}
sb=$(per_engine "$dir/sharded.json")
bb=$(per_engine "$dir/broadcast.json")
[ -n "$sb" ] && [ -n "$bb" ] && [ "$sb" -lt "$bb" ] || { echo "FAIL: sharded cold sync moved $sb bytes per engine, broadcast $bb"; exit 1; }
echo "cold sync bytes per engine: sharded $sb, broadcast $bb"
# Data-parallel engines: 2 and 4 scheduler ranks per engine share one copy of
# the weights, so each engine pulls the same bytes as with dp 1 (once, not
# once per rank), and every request still completes on byte-identical engines.
for dp in 2 4; do
  sed "s/^    tp: 2$/    tp: 2\n    dp: $dp/" "$dir/sharded.yaml" > "$dir/dp$dp.yaml"
  grep -q "dp: $dp" "$dir/dp$dp.yaml" || { echo "FAIL: could not set dp $dp"; exit 1; }
  "$rlsync" run "$dir/dp$dp.yaml" --prompts 12 --concurrency 4 --max-tokens 24 --json "$dir/dp$dp.json" --no-progress \
    > "$dir/dp$dp.out" 2> "$dir/dp$dp.err" || { cat "$dir/dp$dp.out" "$dir/dp$dp.err"; echo "FAIL: run (dp $dp) exited non-zero"; exit 1; }
  grep -q '"completed": 12' "$dir/dp$dp.json" || { cat "$dir/dp$dp.json"; echo "FAIL: not every request completed (dp $dp)"; exit 1; }
  grep -q '"weights_verified": true' "$dir/dp$dp.json" || { echo "FAIL: weights not verified (dp $dp)"; exit 1; }
  db=$(per_engine "$dir/dp$dp.json")
  [ "$db" = "$sb" ] || { echo "FAIL: dp $dp: $db bytes per engine, dp 1: $sb"; exit 1; }
done
# Keys for the other ways of running a topology are said, not passed over:
# a drill's faults and a node's metrics port.
sed "s/^    address: 127.0.0.1$/    address: 127.0.0.1\n    metrics_port: 0/" "$dir/sharded.yaml" > "$dir/keys.yaml"
printf 'drill:\n  faults:\n    - {at_sync: 100, action: kill, target: rollout-0}\n' >> "$dir/keys.yaml"
"$rlsync" run "$dir/keys.yaml" --prompts 2 --concurrency 2 --max-tokens 4 --no-progress > /dev/null 2> "$dir/keys.err" \
  || { cat "$dir/keys.err"; echo "FAIL: run with drill and metrics keys exited non-zero"; exit 1; }
grep -q "1 drill fault(s) are injected by rlsync drill, not by run" "$dir/keys.err" \
  || { cat "$dir/keys.err"; echo "FAIL: run did not say it injects no drill faults"; exit 1; }
grep -q "metrics_port is served by rlsync node and launch" "$dir/keys.err" \
  || { cat "$dir/keys.err"; echo "FAIL: run did not say it serves no node metrics port"; exit 1; }
echo "bytes pulled per engine: dp 1 $sb, dp 2 $sb, dp 4 $sb"
# Every architecture and expert layout, sharded: Qwen3; Qwen3-MoE with its
# experts placed whole over each engine's workers; fused experts served as int8.
for arch in qwen3 moe fused; do
  case $arch in
    qwen3) model='    arch: qwen3\n    head_dim: 32' engine='' ;;
    moe) model='    arch: qwen3_moe\n    experts: 4\n    moe_intermediate_size: 32' engine='\n    expert_parallel: true' ;;
    fused) model='    arch: qwen3_moe\n    experts: 4\n    moe_intermediate_size: 32\n    expert_layout: fused'
           engine='\n    weights: int8' ;;
  esac
  sed -e 's/layers: 4/layers: 2/' -e 's/hidden_size: 256/hidden_size: 64/' -e 's/intermediate_size: 704/intermediate_size: 128/' \
      -e 's/step_time_ms: 200/step_time_ms: 50/' -e "s/^    seed: 1\$/    seed: 1\n$model/" -e "s/^    tp: 2\$/    tp: 2$engine/" \
      "$root/configs/local.yaml" > "$dir/$arch.yaml"
  "$rlsync" run "$dir/$arch.yaml" --prompts 12 --concurrency 4 --max-tokens 24 --json "$dir/$arch.json" --no-progress \
    > "$dir/$arch.out" 2> "$dir/$arch.err" || { cat "$dir/$arch.out" "$dir/$arch.err"; echo "FAIL: run ($arch) exited non-zero"; exit 1; }
  grep -q '"completed": 12' "$dir/$arch.json" || { cat "$dir/$arch.json"; echo "FAIL: not every request completed ($arch)"; exit 1; }
  grep -q '"weights_verified": true' "$dir/$arch.json" || { cat "$dir/$arch.json"; echo "FAIL: weights not verified ($arch)"; exit 1; }
  grep -q "byte-identical to the trainer" "$dir/$arch.out" || { cat "$dir/$arch.out"; echo "FAIL: summary ($arch)"; exit 1; }
  echo "$arch: $(grep -c '^sync ' "$dir/$arch.err") sync lines"
done
grep -q "arch: qwen3_moe" "$dir/fused.yaml" && grep -q "expert_layout: fused" "$dir/fused.yaml" && grep -q "weights: int8" "$dir/fused.yaml" \
  && grep -q "expert_parallel: true" "$dir/moe.yaml" || { cat "$dir/moe.yaml" "$dir/fused.yaml"; echo "FAIL: topologies not as meant"; exit 1; }
printf 'name: bad\nnodes: []\n' > "$dir/bad.yaml"
set +e
out=$("$rlsync" run "$dir/bad.yaml" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] || { echo "FAIL: a bad topology exited $rc: $out"; exit 1; }
grep -q "bad.yaml:" <<<"$out" || { echo "FAIL: no location in: $out"; exit 1; }
echo ok
