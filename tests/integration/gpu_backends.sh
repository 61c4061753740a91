#!/usr/bin/env bash
# transfer.backend cuda_ipc and nccl in a CUDA build (nccl with NCCL linked
# too): validation accepts each in broadcast mode; cuda_ipc it refuses
# sharded, nccl it accepts sharded and with transfer.collective (refused
# sharded);
# start-up then needs a CUDA device: without one `rlsync run` exits 1
# naming it, starting nothing. With one this script skips: a one-process
# run would not move weights over either (its engines use the local
# plane); rlsync-device-bench's cuda_ipc rows check the device path.
set -euo pipefail
rlsync=$1 root=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
backends=(cuda_ipc)
if "$rlsync" devices | grep -q '^nccl: *compiled in'; then
  backends+=(nccl)
else
  echo "nccl: skipped, this build has no NCCL"
fi
"$rlsync" devices | grep -q '^devices: 0' && no_device=1 || no_device=0
for b in "${backends[@]}"; do
  sed -e "s/^  backend: local .*/  backend: $b/" -e 's/^  mode: sharded .*/  mode: broadcast/' \
      -e 's/layers: 4/layers: 2/' -e 's/hidden_size: 256/hidden_size: 64/' \
      -e 's/intermediate_size: 704/intermediate_size: 128/' -e 's/step_time_ms: 200/step_time_ms: 50/' \
      "$root/configs/local.yaml" > "$dir/$b.yaml"
  grep -q "backend: $b" "$dir/$b.yaml" && grep -q 'mode: broadcast' "$dir/$b.yaml" \
    || { echo "FAIL: could not set the backend $b"; exit 1; }
  "$rlsync" validate "$dir/$b.yaml" > "$dir/validate.out" 2>&1 \
    || { cat "$dir/validate.out"; echo "FAIL: validate refused $b"; exit 1; }
  grep -q "backend: $b" "$dir/validate.out" || { cat "$dir/validate.out"; echo "FAIL: the resolved topology lost $b"; exit 1; }
  sed 's/^  mode: broadcast/  mode: sharded/' "$dir/$b.yaml" > "$dir/sharded.yaml"
  if [ "$b" = nccl ]; then
    # nccl moves each worker's shard too, and on request broadcasts whole
    # groups collectively (broadcast mode only).
    "$rlsync" validate "$dir/sharded.yaml" > "$dir/sharded.out" 2>&1 \
      || { cat "$dir/sharded.out"; echo "FAIL: validate refused nccl in sharded mode"; exit 1; }
    sed 's/^  # collective: true .*/  collective: true/' "$dir/$b.yaml" > "$dir/collective.yaml"
    sed 's/^  # collective: true .*/  collective: true/' "$dir/sharded.yaml" > "$dir/collective_sharded.yaml"
    grep -q '^  collective: true' "$dir/collective.yaml" || { echo "FAIL: could not set transfer.collective"; exit 1; }
    "$rlsync" validate "$dir/collective.yaml" > "$dir/collective.out" 2>&1 \
      || { cat "$dir/collective.out"; echo "FAIL: validate refused the nccl collective"; exit 1; }
    if "$rlsync" validate "$dir/collective_sharded.yaml" > "$dir/collective_sharded.out" 2>&1; then
      echo "FAIL: a collective was accepted in sharded mode"; exit 1
    fi
    grep -Eq "collective_sharded.yaml:[0-9]+:[0-9]+: transfer.collective: a collective broadcast runs over NCCL" \
      "$dir/collective_sharded.out" \
      || { cat "$dir/collective_sharded.out"; echo "FAIL: the collective's refusal does not name its place"; exit 1; }
  else
    if "$rlsync" validate "$dir/sharded.yaml" > "$dir/sharded.out" 2>&1; then
      echo "FAIL: $b was accepted in sharded mode"; exit 1
    fi
    grep -Eq "sharded.yaml:[0-9]+:[0-9]+: transfer.backend: '$b' moves whole groups" "$dir/sharded.out" \
      || { cat "$dir/sharded.out"; echo "FAIL: the sharded refusal of $b does not name its place"; exit 1; }
  fi
  if [ $no_device -eq 0 ]; then
    echo "$b: skipping the start-up refusal: this machine has a CUDA device"
    continue
  fi
  set +e
  "$rlsync" run "$dir/$b.yaml" --prompts 6 --concurrency 2 --max-tokens 8 --json "$dir/run.json" --no-progress \
    > "$dir/run.out" 2> "$dir/run.err"
  rc=$?
  set -e
  [ $rc -eq 1 ] || { cat "$dir/run.out" "$dir/run.err"; echo "FAIL: $b without a device: the run exited $rc, not 1"; exit 1; }
  grep -q "transfer.backend $b needs a CUDA device at start-up" "$dir/run.err" \
    || { cat "$dir/run.err"; echo "FAIL: the refusal of $b does not name the missing device"; exit 1; }
  grep -q '^sync ' "$dir/run.err" && { echo "FAIL: a refused start-up ran syncs"; exit 1; }
  echo "$b, no CUDA device: start-up refused: $(grep 'needs a CUDA device' "$dir/run.err")"
done
# The built-in engine on a GPU: validation takes engines[].device: cuda in a
# CUDA build; without a device the run is refused naming the engine, and
# rlsync generate --device cuda names the missing device.
sed -e 's/layers: 4/layers: 2/' -e 's/hidden_size: 256/hidden_size: 64/' \
    -e 's/intermediate_size: 704/intermediate_size: 128/' -e 's/^    tp: 2$/    tp: 2\n    device: cuda/' \
    "$root/configs/local.yaml" > "$dir/engine_cuda.yaml"
grep -q '^    device: cuda' "$dir/engine_cuda.yaml" || { echo "FAIL: could not set the engine's device"; exit 1; }
"$rlsync" validate "$dir/engine_cuda.yaml" > "$dir/engine_cuda.out" 2>&1 \
  || { cat "$dir/engine_cuda.out"; echo "FAIL: validate refused device: cuda"; exit 1; }
grep -q "device: cuda" "$dir/engine_cuda.out" || { cat "$dir/engine_cuda.out"; echo "FAIL: the resolved topology lost device: cuda"; exit 1; }
"$rlsync" checkpoint make --out "$dir/ck" --layers 1 --hidden 64 --heads 4 --kv-heads 2 --seed 1 > /dev/null
if [ $no_device -eq 1 ]; then
  set +e
  "$rlsync" run "$dir/engine_cuda.yaml" --prompts 6 --concurrency 2 --max-tokens 8 --no-progress \
    > "$dir/run.out" 2> "$dir/run.err"
  rc=$?
  set -e
  [ $rc -eq 1 ] || { cat "$dir/run.out" "$dir/run.err"; echo "FAIL: device cuda without a device: the run exited $rc, not 1"; exit 1; }
  grep -q "engine 'rollout-0' runs on device cuda, and this process sees no CUDA device" "$dir/run.err" \
    || { cat "$dir/run.err"; echo "FAIL: the refusal does not name the engine"; exit 1; }
  set +e
  "$rlsync" generate --checkpoint "$dir/ck" --prompt hi --max-tokens 2 --device cuda > "$dir/gen.out" 2> "$dir/gen.err"
  rc=$?
  set -e
  [ $rc -eq 1 ] && grep -q "rlsync generate: --device cuda: engine device: no CUDA device 0" "$dir/gen.err" \
    || { cat "$dir/gen.out" "$dir/gen.err"; echo "FAIL: generate --device cuda without a device (exit $rc)"; exit 1; }
  echo "engine device cuda, no CUDA device: start-up and generate refused"
fi
if "$rlsync" generate --checkpoint "$dir/ck" --prompt hi --device tpu > "$dir/gen.out" 2>&1; then
  echo "FAIL: --device tpu was accepted"; exit 1
fi
grep -q -- "--device: expected cpu or cuda, got 'tpu'" "$dir/gen.out" || { cat "$dir/gen.out"; echo "FAIL: --device tpu"; exit 1; }
[ $no_device -eq 1 ] || exit 77
