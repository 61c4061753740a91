#!/usr/bin/env bash
# tools/device-check's plumbing, on a machine without a GPU: --pack copies
# the binaries and the libraries they load; --from runs them and, with no
# device, says so and exits 77 (a machine with one runs the checks for real).
set -euo pipefail
rlsync="$1" root="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build=$(dirname "$(dirname "$rlsync")")
[ "$build" = "$root/build" ] || { echo "skipping: device-check packs from $root/build, this build is $build"; exit 77; }
"$root/tools/device-check" --pack "$tmp/pack"
test -x "$tmp/pack/test_gpu"
test -x "$tmp/pack/rlsync-device-bench"
test -x "$tmp/pack/test_gpu_nccl"
ls "$tmp/pack/lib" | grep -q '^libcudart' || { echo "libcudart was not packed"; exit 1; }
# Past what the device tool carries: the device machine's own are used.
if ls "$tmp/pack/lib" | grep -q '^libnccl\|^libcublas'; then echo "libnccl or cuBLAS was packed"; exit 1; fi
[ "$(du -sm "$tmp/pack" | cut -f1)" -lt 64 ] || { echo "the pack is past the device tool's 64 MiB"; exit 1; }
set +e
out=$("$root/tools/device-check" --from "$tmp/pack" 2>&1)
rc=$?
set -e
echo "$out"
if "$build/tests/test_gpu" > /dev/null 2>&1; [ $? -ne 77 ]; then
  echo "skipping the no-device expectation: this machine has a CUDA device (exit $rc)"
  exit 77
fi
[ $rc -eq 77 ] || { echo "expected exit 77 without a device, got $rc"; exit 1; }
grep -q "no CUDA device here; nothing was checked" <<< "$out"
"$root/tools/device-check" --from "$tmp/missing" > "$tmp/err" 2>&1 && { echo "a missing folder passed"; exit 1; }
grep -q "is missing" "$tmp/err"
echo "ok"
