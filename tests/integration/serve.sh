#!/usr/bin/env bash
# rlsync serve on a synthetic checkpoint, driven as RL frameworks drive
# `vllm serve`: each client's exact sync sequence (vime, TRL, vLLM's
# HTTPVLLMWeightSyncClient, SkyRL, prime-rl's own shape) with curl and with
# Python's requests, a disk update whose weights then show in the weight
# checker's digests, the bearer token, and a clean stop on SIGTERM.
set -euo pipefail
rlsync=$1
dir=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$dir/serve.log" ] && sed 's/^/  serve: /' "$dir/serve.log" | tail -20; exit 1; }

"$rlsync" checkpoint make --out "$dir/v1" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --seed 3 >/dev/null
"$rlsync" checkpoint make --from "$dir/v1" --perturb 0.05 --seed 4 --out "$dir/v2" >/dev/null
"$rlsync" checkpoint make --from "$dir/v2" --perturb 0.05 --seed 5 --out "$dir/v3" >/dev/null

# Starts rlsync serve on v1 at tp 2 with ARGS on an ephemeral port; sets $url.
start_server() { start_server_on "$dir/v1" --tp 2 "$@"; }
# The same on checkpoint CK with ARGS.
start_server_on() {
  local ck=$1
  shift
  "$rlsync" serve --checkpoint "$ck" --port 0 "$@" >"$dir/serve.log" 2>&1 &
  server_pid=$!
  url=""
  for _ in $(seq 1 200); do
    url=$(sed -n 's/^rlsync serve: listening on \(http:[^ ]*\).*/\1/p' "$dir/serve.log")
    [ -n "$url" ] && return 0
    kill -0 "$server_pid" 2>/dev/null || fail "rlsync serve exited: $(cat "$dir/serve.log")"
    sleep 0.05
  done
  fail "rlsync serve did not print its URL"
}
stop_server() {
  kill -TERM "$server_pid"
  local rc=0
  wait "$server_pid" || rc=$?
  server_pid=""
  [ "$rc" -eq 0 ] || fail "rlsync serve exited $rc on SIGTERM"
  grep -q "stopping" "$dir/serve.log" || fail "no stop line"
}

# curl METHOD PATH [BODY] -> "STATUS BODY"; every answer must carry Content-Length.
call() {
  local method=$1 path=$2 body=${3-}
  local args=(-sS -X "$method" -D "$dir/headers" -o "$dir/body" -w '%{http_code}' "${auth[@]}")
  [ -n "$body" ] && args+=(-H 'Content-Type: application/json' --data "$body")
  local status
  status=$(curl "${args[@]}" "$url$path")
  grep -qi '^content-length:' "$dir/headers" || fail "$method $path: no Content-Length"
  echo "$status $(cat "$dir/body")"
}
expect() { # METHOD PATH BODY EXPECTED_STATUS [EXPECTED_BODY_SUBSTRING]
  local got
  got=$(call "$1" "$2" "$3")
  [ "${got%% *}" = "$4" ] || fail "$1 $2 $3: expected $4, got $got"
  if [ -n "${5-}" ]; then
    grep -qF -- "$5" <<<"${got#* }" || fail "$1 $2 $3: expected '$5' in: $got"
  fi
}
digest() { # the weight checker's checksums, one "key hex" per line, sorted
  call POST /weight_checker '{"action": "checksum"}' | cut -d' ' -f2- |
    python3 -c 'import json,sys; [print(k, v) for k, v in sorted(json.load(sys.stdin)["checksums"].items())]'
}

auth=()
start_server
# TRL's start-up: health until 200, models (max_model_len), world size, init.
expect GET /health "" 200
expect GET /v1/models "" 200 '"max_model_len":2048'
expect GET /get_world_size "" 200 '{"world_size":2}'
expect POST /init_weight_transfer_engine '{"init_info": {}}' 200 '"Weight transfer initialized"'
expect GET /weight_info "" 200 '{"weight_version":"default"}'
digest >"$dir/d1"
[ "$(wc -l <"$dir/d1")" -gt 10 ] || fail "too few digests: $(cat "$dir/d1")"
grep -q '^dp0:pp0:pcp0:tp1:model.embed_tokens.weight [0-9a-f]\{64\}$' "$dir/d1" || fail "digest keys: $(head -3 "$dir/d1")"

# vime: pause keep, reset_prefix_cache (Python's False), start, update, finish {}, resume.
expect POST '/pause?mode=keep&clear_cache=false' '{}' 200 '{"status":"paused"}'
expect GET /is_paused "" 200 '{"is_paused":true}'
expect POST '/reset_prefix_cache?reset_running_requests=False&reset_external=False' "" 200 '{"success":true}'
expect POST /start_weight_update '{"is_checkpoint_format": true}' 200 'Weight update started'
expect POST /update_weights "{\"update_info\": {\"path\": \"$dir/v2\"}}" 200 'Weights updated'
expect POST /finish_weight_update '{}' 200 'Weight update finished'
expect POST /resume '{}' 200 '{"status":"resumed"}'
expect GET /is_paused "" 200 '{"is_paused":false}'
digest >"$dir/d2"
cmp -s "$dir/d1" "$dir/d2" && fail "the disk update did not change the digests"
[ "$(wc -l <"$dir/d1")" = "$(wc -l <"$dir/d2")" ] || fail "digest key sets differ"
changed=$(paste "$dir/d1" "$dir/d2" | awk '$2 != $4' | wc -l)
[ "$changed" -eq "$(wc -l <"$dir/d1")" ] || fail "only $changed shards changed"

# Ordering mistakes: 409 in the envelope; bad bodies 400.
expect POST /finish_weight_update "" 409 '"code":409'
expect POST /update_weights "{\"update_info\": {\"path\": \"$dir/v2\"}}" 409 'Call start_weight_update first'
expect POST /update_weights '[]' 400 '"param":"body"'
expect POST /update_weights '{"update_info": 1}' 400 '"param":"body.update_info"'
expect POST /update_weights '{"weight_dir": "/tmp"}' 400 'prime-rl'

# TRL per sync: pause keep, start, update, finish (no body), resume; and a label.
expect POST '/pause?mode=keep' "" 200 paused
expect POST /start_weight_update '{"is_checkpoint_format": true}' 200 started
expect POST /update_weights "{\"update_info\": {\"path\": \"$dir/v3\"}}" 200 updated
expect POST /finish_weight_update "" 200 finished
expect POST /resume "" 200 resumed
expect POST /update_weight_version '{"new_version": "trl-3"}' 200 '"new_version":"trl-3"'
expect GET /weight_info "" 200 '"trl-3"'

# /metrics: vLLM's RL metric names, with the operations of the sync above observed.
curl -sf "${auth[@]}" -D "$dir/metrics.headers" "$url/metrics" > "$dir/metrics.prom" || fail "GET /metrics"
grep -qi '^content-type: text/plain; version=0.0.4' "$dir/metrics.headers" || fail "/metrics content type"
for op in start update finish; do
  grep -Eq "^vllm:rl_weight_update_operation_duration_seconds_count\{.*operation=\"$op\".*\} [1-9]" "$dir/metrics.prom" \
    || fail "/metrics: no observed '$op' operation"
done
grep -q '^vllm:rl_weight_update_operations_in_flight' "$dir/metrics.prom" || fail "/metrics: no in-flight gauge"
grep -q '^vllm:num_requests_running' "$dir/metrics.prom" || fail "/metrics: no running gauge"

# vLLM's HTTPVLLMWeightSyncClient with Python's requests (raise_for_status,
# timeout 300 s), then SkyRL's sequence through collective_rpc, then the
# weight checker compares against v1's digests taken above.
python3 - "$url" "$dir" <<'PY'
import json, sys, requests
url, d = sys.argv[1], sys.argv[2]
s = requests.Session()
def post(path, **kw):
    r = s.post(url + path, timeout=300, **kw)
    r.raise_for_status()
    return r.json() if r.content else {}
# vLLM's client: no pause, start without a body.
post("/init_weight_transfer_engine", json={"init_info": {}})
post("/start_weight_update")
post("/update_weights", json={"update_info": {"path": d + "/v1"}})
assert post("/finish_weight_update", json={"weight_version": "step-7"}) == {"message": "Weight update finished"}
assert s.get(url + "/weight_info", timeout=10).json() == {"weight_version": "step-7"}
assert s.get(url + "/is_paused", timeout=10).json() == {"is_paused": False}
# SkyRL: pause keep, reset with a JSON body, collective_rpc, resume; errors read body.error.message.
post("/pause", params={"mode": "keep", "clear_cache": "false"})
post("/reset_prefix_cache", json={"reset_running_requests": False})
rpc = lambda m, **kw: s.post(url + "/collective_rpc", json={"method": m, "args": [], "kwargs": kw, "timeout": 60}, timeout=300)
assert rpc("skyrl_start_weight_update").json() == {"results": [None, None]}
r = rpc("update_weights_nccl")
assert r.status_code == 400 and "update_weights_nccl" in r.json()["error"]["message"], r.text
post("/update_weights", json={"update_info": {"path": d + "/v2"}})
assert rpc("skyrl_finish_weight_update", weight_version="sky-2").status_code == 200
r = rpc("no_such_method")
assert r.status_code == 400 and "no_such_method" in r.json()["error"]["message"], r.text
post("/resume")
assert s.get(url + "/weight_info", timeout=10).json() == {"weight_version": "sky-2"}
# prime-rl: pause, its own update shape (answered clearly), resume.
post("/pause", params={"mode": "keep", "clear_cache": "false"})
r = s.post(url + "/update_weights", json={"weight_dir": d + "/v3"}, timeout=300)
assert r.status_code == 400 and "prime-rl" in r.json()["error"]["message"], r.text
post("/resume")
# Sleep and wake.
post("/sleep", params={"level": "1", "mode": "abort"})
assert s.get(url + "/is_sleeping", timeout=10).json() == {"is_sleeping": True}
post("/wake_up", params={"tags": "weights"})
assert s.get(url + "/is_sleeping", timeout=10).json() == {"is_sleeping": False}
PY
digest >"$dir/d4"
cmp -s "$dir/d2" "$dir/d4" || fail "after the SkyRL update to v2 the digests differ from the first v2 update"
stop_server

# With a bearer token: POST routes need it, GET routes do not.
echo "s3cret-token" >"$dir/key"
start_server --api-key-file "$dir/key" --strict-vllm
auth=()
expect POST '/pause?mode=keep' "" 401
expect GET /health "" 200
auth=(-H "Authorization: Bearer s3cret-token")
expect POST '/pause?mode=keep' "" 200 paused
expect POST /finish_weight_update "" 500 '"code":500' # --strict-vllm: 500, not 409
expect POST /resume "" 200 resumed
stop_server

# A Qwen3-MoE served with expert parallelism: the greedy completion is
# `rlsync generate` at tp 1 with sliced experts, token for token.
"$rlsync" checkpoint make --out "$dir/moe" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --arch qwen3_moe \
  --experts 6 --moe-intermediate 32 --seed 3 >/dev/null
# With --dp 2 the EP size is dp x tp = 4: the idle rank's workers compute
# their experts for the busy rank's tokens, and the output stays the same.
want=$("$rlsync" generate --checkpoint "$dir/moe" --prompt "hello rlsync" --max-tokens 12 --json \
         | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["token_ids"]))')
for dp in 1 2; do
  start_server_on "$dir/moe" --tp 2 --dp "$dp" --expert-parallel
  got=$(curl -sS -X POST "$url/v1/completions" -H 'Content-Type: application/json' \
          --data '{"prompt": "hello rlsync", "max_tokens": 12, "temperature": 0}' \
        | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["token_ids"]))')
  [ "$got" = "$want" ] || fail "MoE served with expert parallelism, dp $dp: $got, rlsync generate at tp 1: $want"
  stop_server
done
set +e
out=$("$rlsync" serve --checkpoint "$dir/moe" --tp 2 --dp 4 --expert-parallel --port 0 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q -- "--dp: with expert parallelism, dp 4 x tp 2 workers exceed the model's 6 experts" \
  <<<"$out" || fail "--dp 4 x --tp 2 over 6 experts: rc $rc: $out"

# Data parallelism: two scheduler ranks behind one address. The world size
# counts them (unless include_dp=false, as vLLM's), the weight checker names
# each rank, one pause covers both, a disk update reaches both, and a
# completion on either rank equals `rlsync generate` on the new weights.
start_server --dp 2
expect GET /get_world_size "" 200 '{"world_size":4}'
expect GET '/get_world_size?include_dp=false' "" 200 '{"world_size":2}'
digest >"$dir/dp"
grep -q '^dp1:pp0:pcp0:tp1:' "$dir/dp" || fail "no dp1 keys in the weight checker: $(head -3 "$dir/dp")"
[ "$(grep -c '^dp0:' "$dir/dp")" = "$(grep -c '^dp0:' "$dir/d1")" ] || fail "dp 2 lists other tensors than dp 1"
expect POST '/pause?mode=keep' "" 200 paused
expect POST /start_weight_update '{"is_checkpoint_format": true}' 200 'Weight update started'
expect POST /update_weights "{\"update_info\": {\"path\": \"$dir/v2\"}}" 200 'Weights updated'
expect POST /finish_weight_update "" 200 'Weight update finished'
expect POST /resume "" 200 resumed
want=$("$rlsync" generate --checkpoint "$dir/v2" --prompt "data parallel" --max-tokens 8 --json \
         | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["token_ids"]))')
# Two at once (least outstanding spreads them over the ranks): both equal it.
pids=()
for i in 1 2; do
  curl -sS --max-time 60 -X POST "$url/v1/completions" -H 'Content-Type: application/json' \
    --data '{"prompt": "data parallel", "max_tokens": 8, "temperature": 0}' >"$dir/dp$i.json" &
  pids+=($!)
done
wait "${pids[@]}"
for i in 1 2; do
  got=$(python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["token_ids"]))' <"$dir/dp$i.json")
  [ "$got" = "$want" ] || fail "dp 2, completion $i: $got, rlsync generate on v2: $want"
done
stop_server

# Flags refused clearly.
set +e
out=$("$rlsync" serve --checkpoint "$dir/v1" --dp 0 --port 0 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q -- "--dp: must be in 1..64" <<<"$out" || fail "--dp 0: rc $rc: $out"
set +e
out=$("$rlsync" serve --topology t.yaml --node n --dp 2 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q -- "--dp: with --topology" <<<"$out" || fail "--topology with --dp: rc $rc: $out"
set +e
out=$("$rlsync" serve --checkpoint "$dir/v1" --tp 2 --expert-parallel --port 0 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q -- "--expert-parallel: expert parallelism needs a mixture-of-experts model" <<<"$out" \
  || fail "--expert-parallel on a dense model: rc $rc: $out"
set +e
out=$("$rlsync" serve --topology t.yaml --node n --expert-parallel 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q -- "--expert-parallel: with --topology" <<<"$out" || fail "--topology with --expert-parallel: rc $rc: $out"
set +e
out=$("$rlsync" serve --topology t.yaml --node n --weights int8 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q -- "--weights: with --topology" <<<"$out" || fail "--topology with --weights: rc $rc: $out"
set +e
out=$("$rlsync" serve --topology t.yaml --node n --device cuda 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q -- "--device: with --topology" <<<"$out" || fail "--topology with --device: rc $rc: $out"
set +e
out=$("$rlsync" serve --checkpoint "$dir/v1" --device tpu --port 0 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q -- "--device: expected cpu or cuda, got 'tpu'" <<<"$out" || fail "--device tpu: rc $rc: $out"
if "$rlsync" devices | grep -q '^devices: 0'; then
  set +e
  out=$("$rlsync" serve --checkpoint "$dir/v1" --device cuda --port 0 2>&1); rc=$?
  set -e
  [ "$rc" -eq 1 ] && grep -q -- "engine device: " <<<"$out" || fail "--device cuda without a device: rc $rc: $out"
fi
set +e
out=$("$rlsync" serve --checkpoint "$dir/v1" --topology t.yaml --node n 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "leave --checkpoint out" <<<"$out" || fail "--topology with --checkpoint: rc $rc: $out"
set +e
out=$("$rlsync" serve --checkpoint "$dir/missing" --port 0 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "config.json" <<<"$out" || fail "missing checkpoint: rc $rc: $out"
echo "serve: OK"
