#!/usr/bin/env bash
# `rlsync bench sync` and `rlsync bench control` run end to end on loopback
# and print their tables and JSON: a head in the bench's process and engine
# nodes as child processes, sharded, broadcast and control cases, every
# case without error. Figures are not checked (benchmarks print figures;
# tests check behaviour).
set -euo pipefail
rlsync=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
port=$((20001 + ($$ % 6000) * 2))
cat > "$dir/two.yaml" <<YAML
name: bench-two
model:
  synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 1}
nodes:
  - {name: head, address: 127.0.0.1, port: $port}
  - {name: workers, address: 127.0.0.1}
# The bench makes its own CA and certificates and runs every case over mutual TLS.
cluster: {secret_env: NOT_USED_BY_THE_BENCH, allow_insecure_network: true}
trainer: {node: head}
engines:
  - {name: local, node: head, tp: 2}
  - {name: remote, node: workers, replicas: 2, tp: 2}
router: {node: head}
coordinator: {node: head}
transfer: {backend: ucx, mode: sharded}
YAML
# tools/check installs Open MPI; run by hand without it, the bench goes without its baseline.
mpi=()
command -v mpirun > /dev/null && [ -x "$(dirname "$rlsync")/rlsync-mpi-bcast" ] || mpi=(--no-mpi)
timeout 240 "$rlsync" bench sync "${mpi[@]}" --topology "$dir/two.yaml" --model-bytes 8MiB --syncs 2 --json "$dir/sync.json" \
  > "$dir/sync.out" 2> "$dir/sync.err" || { cat "$dir/sync.err" "$dir/sync.out"; echo "FAIL: bench sync"; exit 1; }
for row in sharded broadcast control; do
  grep -Eq "^$row +[0-9.]+ +[0-9.]+" "$dir/sync.out" || { cat "$dir/sync.out"; echo "FAIL: no $row row"; exit 1; }
done
grep -Eq "^control +0\.0 +[0-9.]+" "$dir/sync.out" && grep -q "control plane: median zero-byte round" "$dir/sync.out" \
  || { cat "$dir/sync.out"; echo "FAIL: the control case moved bytes"; exit 1; }
grep -Eq "^measured before / after the cases: memcpy [0-9.]+ / [0-9.]+ GB/s \(spread [0-9]+%\)" "$dir/sync.out" \
  || { cat "$dir/sync.out"; echo "FAIL: no light before and after"; exit 1; }
if [ ${#mpi[@]} -eq 0 ]; then
  grep -Eq "^MPI_Bcast \(Open MPI\) of the 8 MB model to 3 ranks: median [0-9.]+ ms \(defaults ([0-9.]+ ms|failed), vader single copy off ([0-9.]+ ms|failed), buffers in huge pages ([0-9.]+ ms|failed): the fastest counts\)" "$dir/sync.out" \
    || { cat "$dir/sync.out"; echo "FAIL: no MPI_Bcast baseline"; exit 1; }
fi
grep -q "broadcast / sharded: 2.00x the bytes" "$dir/sync.out" || { cat "$dir/sync.out"; echo "FAIL: broadcast must move tp (2) x the bytes"; exit 1; }
grep -q '"cases": \[' "$dir/sync.json" || { cat "$dir/sync.json"; echo "FAIL: no JSON cases"; exit 1; }
! grep -q '"error": "[^"]' "$dir/sync.json" || { cat "$dir/sync.json"; echo "FAIL: a case failed"; exit 1; }
# Every round that moved bytes names its slowest engine's pull, and no more
# wait and store than it took (the slowest engine may be the local one, whose
# plane does not measure them: so zeros pass); a pull that measured them also
# says how long its thread ran on a core.
python3 -c 'import json,sys; cs=[c for c in json.load(open(sys.argv[1]))["cases"] if c["case"] in ("sharded","broadcast")]; ws=[w for c in cs for w in c["warm"]]; assert len(cs)==2 and ws and all(w["slowest_pull_ms"]>0 for w in ws) and all(w["slowest_wait_ms"]+w["slowest_store_ms"]<=w["slowest_pull_ms"] for w in ws) and all((w["slowest_ran_ms"]>0)==(w["slowest_wait_ms"]+w["slowest_store_ms"]>0) for w in ws), cs' \
  "$dir/sync.json" || { cat "$dir/sync.json"; echo "FAIL: no slowest pull in the rounds"; exit 1; }

# --ucx-transports tcp: the path between hosts, on this one. No group is lent
# in shared memory, the raw light and (with Open MPI) MPI_Bcast go over tcp too.
timeout 240 "$rlsync" bench sync "${mpi[@]}" --topology "$dir/two.yaml" --ucx-transports tcp --model-bytes 8MiB \
  --syncs 1 --modes sharded --json "$dir/tcp.json" > "$dir/tcp.out" 2> "$dir/tcp.err" \
  || { cat "$dir/tcp.err" "$dir/tcp.out"; echo "FAIL: bench sync --ucx-transports tcp"; exit 1; }
python3 -c 'import json,sys; c=[c for c in json.load(open(sys.argv[1]))["cases"] if c["case"]=="sharded"][0]; assert c["ucx_transports"]==["tcp"] and not c["lent"], c' \
  "$dir/tcp.json" && ! grep -q "lent in shared memory" "$dir/tcp.out" \
  || { cat "$dir/tcp.out"; echo "FAIL: --ucx-transports tcp: the engines' connections not over tcp alone"; exit 1; }
if [ ${#mpi[@]} -eq 0 ]; then
  grep -Eq "^MPI_Bcast \(Open MPI\) of the 8 MB model to 3 ranks: median [0-9.]+ ms \(btl tcp,self on loopback" "$dir/tcp.out" \
    && grep -q '"mpi_over_tcp": true' "$dir/tcp.json" || { cat "$dir/tcp.out"; echo "FAIL: MPI_Bcast not over tcp"; exit 1; }
fi
# Engines all in the bench's process pull without UCX: the flag would change nothing there.
sed 's/node: workers, replicas: 2/node: head, replicas: 2/' "$dir/two.yaml" > "$dir/in-process.yaml"
if "$rlsync" bench sync --no-mpi --topology "$dir/in-process.yaml" --ucx-transports tcp > "$dir/bad.out" 2>&1; then
  echo "FAIL: --ucx-transports accepted for engines in the bench's process"; exit 1
fi
grep -q "pulls without UCX" "$dir/bad.out" || { cat "$dir/bad.out"; echo "FAIL: no reason given"; exit 1; }
for bad in ib tcp,tcp "" tcp,; do
  if "$rlsync" bench sync --topology "$dir/two.yaml" --ucx-transports "$bad" > "$dir/bad.out" 2>&1; then
    echo "FAIL: --ucx-transports '$bad' accepted"; exit 1
  fi
  grep -q -- "--ucx-transports" "$dir/bad.out" || { cat "$dir/bad.out"; echo "FAIL: --ucx-transports not named"; exit 1; }
done

# Two trainer ranks, each holding one of the two layers: the sharded case
# with two producers, each rank's packs per (plan, group) per version, and
# a rank killed mid-transfer: the round aborted, no dirty engine served, a
# round completed after the rank returned (figures are printed, not judged).
timeout 300 "$rlsync" bench sync "${mpi[@]}" --topology "$dir/two.yaml" --model-bytes 8MiB --syncs 1 --modes sharded --ranks 2 \
  --json "$dir/ranks.json" > "$dir/ranks.out" 2> "$dir/ranks.err" \
  || { cat "$dir/ranks.err" "$dir/ranks.out"; echo "FAIL: bench sync --ranks 2"; exit 1; }
grep -Eq "^sharded/2r +[0-9.]+ +[0-9.]+" "$dir/ranks.out" || { cat "$dir/ranks.out"; echo "FAIL: no sharded/2r row"; exit 1; }
for rank in 0 1; do
  grep -Eq "^sharded/2r packs, rank $rank \(1 groups, 1 versions\): local [0-9]+ packs .* UCX [0-9]+ packs .*; each packed at most once per version$" "$dir/ranks.out" \
    || { cat "$dir/ranks.out"; echo "FAIL: rank $rank's packs"; exit 1; }
done
grep -Eq "^rank kill \(2 ranks, rank 1 killed as the transfer phase began\): round aborted [0-9.]+ ms after the kill \(transfer deadline [0-9]+ ms: within\)$" "$dir/ranks.out" \
  || { cat "$dir/ranks.out"; echo "FAIL: the kill's round was not aborted within the deadline"; exit 1; }
grep -q "no dirty engine served" "$dir/ranks.out" || { cat "$dir/ranks.out"; echo "FAIL: a dirty engine served"; exit 1; }
grep -Eq "^rank kill: restart [0-9.]+ ms; first complete round [0-9.]+ ms after the restart" "$dir/ranks.out" \
  || { cat "$dir/ranks.out"; echo "FAIL: no round completed after the restart"; exit 1; }
grep -q '"held": true' "$dir/ranks.json" || { cat "$dir/ranks.json"; echo "FAIL: rank kill JSON"; exit 1; }
# Without Open MPI (no mpirun on PATH) a cross-process bench refuses to start,
# saying how to get it or to pass --no-mpi.
if PATH=/nonexistent "$rlsync" bench sync --topology "$dir/two.yaml" > "$dir/nompi.out" 2>&1; then
  echo "FAIL: bench sync ran without mpirun"; exit 1
fi
grep -q "mpirun is not installed: apt-get install openmpi-bin libopenmpi-dev" "$dir/nompi.out" \
  && grep -q -- "--no-mpi" "$dir/nompi.out" || { cat "$dir/nompi.out"; echo "FAIL: no clear refusal without MPI"; exit 1; }
if "$rlsync" bench sync --topology "$dir/two.yaml" --ranks 2,x > "$dir/bad.out" 2>&1; then echo "FAIL: --ranks 2,x accepted"; exit 1; fi
grep -q -- "--ranks" "$dir/bad.out" || { cat "$dir/bad.out"; echo "FAIL: --ranks not named"; exit 1; }

timeout 120 "$rlsync" bench control --engines 2 --rounds 3 --json "$dir/control.json" > "$dir/control.out" 2>&1 \
  || { cat "$dir/control.out"; echo "FAIL: bench control"; exit 1; }
grep -q "six CAF round-trip waves" "$dir/control.out" || { cat "$dir/control.out"; echo "FAIL: no baseline row"; exit 1; }
# The trainer's steps change nothing: after the cold sync every engine skips the data plane.
grep -Eq "^zero-byte round \(pause..continue\) +[0-9.]+" "$dir/control.out" \
  && grep -Eq "^  of which transfer +[0-9.]+ ms \(0 kB moved per round\)" "$dir/control.out" \
  && grep -Eq "^round moving the model +[0-9.]+" "$dir/control.out" \
  && grep -Eq "^zero-byte round / six round trips: [0-9.]+x" "$dir/control.out" \
  || { cat "$dir/control.out"; echo "FAIL: no zero-byte round"; exit 1; }
python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["control"]; assert c["zero_byte"] and len(c["warm"])==3 and all(w["bytes"]==0 for w in c["warm"]), c' \
  "$dir/control.json" || { cat "$dir/control.json"; echo "FAIL: a zero-byte round moved bytes"; exit 1; }
grep -q '"engines": 2' "$dir/control.json" || { cat "$dir/control.json"; echo "FAIL: control JSON"; exit 1; }
# The HTTP case: both paths in one run, both figures and their ratio (reported, never asserted).
timeout 120 "$rlsync" bench control --http --engines 2 --rounds 3 --json "$dir/http.json" > "$dir/http.out" 2>&1 \
  || { cat "$dir/http.out"; echo "FAIL: bench control --http"; exit 1; }
grep -q "built-in engines (CAF requests) *[0-9.]* " "$dir/http.out" || { cat "$dir/http.out"; echo "FAIL: no built-in row"; exit 1; }
grep -q "the same engines over vLLM's HTTP *[0-9.]* " "$dir/http.out" || { cat "$dir/http.out"; echo "FAIL: no HTTP row"; exit 1; }
grep -q "HTTP / built-in: [0-9.]*x" "$dir/http.out" || { cat "$dir/http.out"; echo "FAIL: no ratio"; exit 1; }
grep -q "engines of kind vllm (HTTP, disk) *[0-9.]* " "$dir/http.out" || { cat "$dir/http.out"; echo "FAIL: no whole-round row"; exit 1; }
grep -q "HTTP engines / built-in: [0-9.]*x" "$dir/http.out" || { cat "$dir/http.out"; echo "FAIL: no round ratio"; exit 1; }
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert len(j["http_ms"])==3 and len(j["builtin_ms"])==3 and j["ratio"]>0 and len(j["http_round_ms"])==3 and len(j["builtin_round_ms"])==3 and j["round_ratio"]>0, j' \
  "$dir/http.json" || { cat "$dir/http.json"; echo "FAIL: http JSON"; exit 1; }
# Streaming through the fleet's endpoint vs the driver's direct path (figures reported, never asserted).
timeout 180 "$rlsync" bench http --engines 2 --prompts 8 --max-tokens 8 --concurrency 4 --repeats 2 \
  --json "$dir/stream.json" > "$dir/stream.out" 2>&1 || { cat "$dir/stream.out"; echo "FAIL: bench http"; exit 1; }
grep -q "workload driver -> router (CAF) *[0-9]* " "$dir/stream.out" || { cat "$dir/stream.out"; echo "FAIL: no direct row"; exit 1; }
grep -q "HTTP / direct: [0-9.]*x" "$dir/stream.out" || { cat "$dir/stream.out"; echo "FAIL: no streaming ratio"; exit 1; }
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert len(j["http_tokens_per_s"])==2 and j["ratio"]>0, j' \
  "$dir/stream.json" || { cat "$dir/stream.json"; echo "FAIL: bench http JSON"; exit 1; }
if "$rlsync" bench http --engines 0 > "$dir/bad-http.out" 2>&1; then echo "FAIL: bench http --engines 0 accepted"; exit 1; fi
grep -q -- "--engines" "$dir/bad-http.out" || { cat "$dir/bad-http.out"; echo "FAIL: bench http names no flag"; exit 1; }

# Bad input is refused with the flag named.
if "$rlsync" bench sync --topology "$dir/two.yaml" --syncs 0 > "$dir/bad.out" 2>&1; then echo "FAIL: --syncs 0 accepted"; exit 1; fi
grep -q -- "--syncs" "$dir/bad.out" || { cat "$dir/bad.out"; echo "FAIL: --syncs not named"; exit 1; }
echo ok
