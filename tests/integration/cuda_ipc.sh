#!/usr/bin/env bash
# transfer.backend cuda_ipc in a CUDA build: validation accepts it for one
# host in broadcast mode and refuses it sharded; start-up then needs a CUDA
# device: without one `rlsync run` exits 1 naming it, starting nothing. With
# one this script skips: a one-process run would not move weights over CUDA
# IPC (its engines use the local plane), and the two-process path is what
# rlsync-device-bench's cuda_ipc rows check on a device.
set -euo pipefail
rlsync=$1 root=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed -e 's/^  backend: local .*/  backend: cuda_ipc/' -e 's/^  mode: sharded .*/  mode: broadcast/' \
    -e 's/layers: 4/layers: 2/' -e 's/hidden_size: 256/hidden_size: 64/' \
    -e 's/intermediate_size: 704/intermediate_size: 128/' -e 's/step_time_ms: 200/step_time_ms: 50/' \
    "$root/configs/local.yaml" > "$dir/ipc.yaml"
grep -q 'backend: cuda_ipc' "$dir/ipc.yaml" && grep -q 'mode: broadcast' "$dir/ipc.yaml" \
  || { echo "FAIL: could not set the backend"; exit 1; }
"$rlsync" validate "$dir/ipc.yaml" > "$dir/validate.out" 2>&1 || { cat "$dir/validate.out"; echo "FAIL: validate refused cuda_ipc"; exit 1; }
grep -q 'backend: cuda_ipc' "$dir/validate.out" || { cat "$dir/validate.out"; echo "FAIL: the resolved topology lost the backend"; exit 1; }
sed 's/^  mode: broadcast/  mode: sharded/' "$dir/ipc.yaml" > "$dir/sharded.yaml"
if "$rlsync" validate "$dir/sharded.yaml" > "$dir/sharded.out" 2>&1; then
  echo "FAIL: cuda_ipc was accepted in sharded mode"; exit 1
fi
grep -q "sharded.yaml:[0-9]*:[0-9]*: transfer.backend: 'cuda_ipc' moves whole groups" "$dir/sharded.out" \
  || { cat "$dir/sharded.out"; echo "FAIL: the sharded refusal does not name its place"; exit 1; }
if ! "$rlsync" devices | grep -q '^devices: 0'; then
  echo "skipping the start-up refusal: this machine has a CUDA device"
  exit 77
fi
set +e
"$rlsync" run "$dir/ipc.yaml" --prompts 6 --concurrency 2 --max-tokens 8 --json "$dir/run.json" --no-progress \
  > "$dir/run.out" 2> "$dir/run.err"
rc=$?
set -e
[ $rc -eq 1 ] || { cat "$dir/run.out" "$dir/run.err"; echo "FAIL: without a device the run exited $rc, not 1"; exit 1; }
grep -q "transfer.backend cuda_ipc needs a CUDA device at start-up" "$dir/run.err" \
  || { cat "$dir/run.err"; echo "FAIL: the refusal does not name the missing device"; exit 1; }
grep -q '^sync ' "$dir/run.err" && { echo "FAIL: a refused start-up ran syncs"; exit 1; }
echo "no CUDA device: start-up refused: $(grep 'needs a CUDA device' "$dir/run.err")"
