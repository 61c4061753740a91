#!/usr/bin/env bash
# Fleet loss is survivable:
#  1. `rlsync launch --run` with `restart: on-failure` on an engine node: that
#     node is SIGKILLed mid-job; the launcher restarts it (the others keep
#     running) and the job completes: exit 0, every request completed.
#  2. The head drains on SIGTERM with no engine alive: both engine nodes are
#     SIGKILLed (no restart), then the head gets SIGTERM; it prints its
#     summary and exits within a bound.
#  3. `rlsync soak` runs and prints its figures (a smoke test; not judged).
#  4. The fleet-loss drill without restart: every engine killed for good;
#     every request finished or was explicitly rejected and no token was lost.
#     (fleet-loss.yaml, with restart, runs in tests/integration/drill.sh with
#     every shipped drill: every invariant holds.)
set -euo pipefail
rlsync=$1
src=$2
tmp=$(mktemp -d)
launcher=""
cleanup() {
  [ -n "$launcher" ] && kill "$launcher" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -n 40 "$tmp/out" 2>/dev/null || true; exit 1; }

# The multiprocess topology on free ports, its engine nodes restarted on failure.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
sed -e "s/port: 7411/port: $port/" \
    -e 's/^  - name: engines-a$/  - name: engines-a\n    restart: on-failure/' \
    -e 's/^  - name: engines-b$/  - name: engines-b\n    restart: on-failure/' \
    -e 's/^  prompts: 64$/  prompts: 400/' \
    -e 's/^  max_tokens: 32$/  max_tokens: 24\n  request_deadline_ms: 60000/' \
    "$src/configs/multiprocess.yaml" >"$tmp/t.yaml"
# The shipped config runs mutual TLS with per-node secrets: make them here.
"$rlsync" certs make --out "$tmp/certs" --nodes head,engines-a,engines-b >/dev/null || fail "certs make"
"$rlsync" validate "$tmp/t.yaml" >/dev/null || fail "the test topology does not validate"

# Waits (bounded, $2 s) for a line matching $1 in $tmp/out.
wait_line() {
  local i=0
  while ! grep -qE "$1" "$tmp/out" 2>/dev/null; do
    i=$((i + 1))
    [ "$i" -le $(($2 * 10)) ] || fail "no line matching '$1' within $2 s"
    sleep 0.1
  done
}
pid_of() { grep -oE "^\[$1\] started: pid [0-9]+" "$tmp/out" | tail -n1 | grep -oE '[0-9]+$'; }

# 1. One engine node SIGKILLed under launch --run: restarted, the job completes.
"$rlsync" launch "$tmp/t.yaml" --run >"$tmp/out" 2>&1 &
launcher=$!
wait_line '^\[head\] sync [0-9]+ v[0-9]+.*: [0-9]+ engines, stall' 120
sleep 1
victim=$(pid_of engines-a)
[ -n "$victim" ] || fail "no pid for engines-a"
kill -KILL "$victim"
set +e
timeout 300 tail --pid="$launcher" -f /dev/null
wait "$launcher"; rc=$?
set -e
launcher=""
grep -q '^\[engines-a\] killed by signal 9' "$tmp/out" || fail "engines-a was not killed"
grep -q '^\[engines-a\] restarting in 500 ms (restart 1 of 3)' "$tmp/out" || fail "engines-a was not restarted"
grep -q '^\[engines-a\] restarted: pid' "$tmp/out" || fail "engines-a did not start again"
! grep -q 'stopped the others' "$tmp/out" || fail "the launcher stopped the job"
[ "$rc" -eq 0 ] || fail "launch --run exited $rc, expected 0"
grep -qE '^\[head\] requests: 400 — 400 completed, 0 failed, 0 rejected' "$tmp/out" \
  || fail "not every request completed"
echo "ok: an engine node SIGKILLed under launch --run was restarted and the job completed"

# 2. No engine left, then SIGTERM to the head: it drains, prints its summary, exits.
# Enough requests that the job is still running when the engines die (400
# complete in under 2 s here).
sed -e '/restart: on-failure/d' -e 's/^  prompts: 400$/  prompts: 100000/' "$tmp/t.yaml" >"$tmp/norestart.yaml"
"$rlsync" node --topology "$tmp/norestart.yaml" --node head --run --no-progress >"$tmp/out" 2>&1 &
head_pid=$!
launcher=$head_pid
"$rlsync" node --topology "$tmp/norestart.yaml" --node engines-a >"$tmp/a.out" 2>&1 &
a_pid=$!
"$rlsync" node --topology "$tmp/norestart.yaml" --node engines-b >"$tmp/b.out" 2>&1 &
b_pid=$!
wait_line '^sync [0-9]+ v[0-9]+.*: [0-9]+ engines, stall' 120
sleep 2
kill -KILL "$a_pid" "$b_pid"
sleep 3
start=$(date +%s)
kill -TERM "$head_pid"
set +e
timeout 60 tail --pid="$head_pid" -f /dev/null
wait "$head_pid"; rc=$?
set -e
launcher=""
took=$(( $(date +%s) - start ))
[ "$took" -le 20 ] || fail "the head took $took s to exit after SIGTERM"
[ "$rc" -eq 143 ] || fail "the head exited $rc after SIGTERM, expected 143"
grep -q '^SIGTERM: no new requests; waiting up to 5000 ms' "$tmp/out" || fail "no drain line"
grep -qE '^== rlsync run .* \(interrupted\)' "$tmp/out" || fail "no summary after SIGTERM"
grep -qE '^drain: ' "$tmp/out" || fail "no drain figure in the summary"
echo "ok: the head drained on SIGTERM with no engine alive (${took} s) and printed its summary"

# 3. soak: runs, prints samples and slopes.
"$rlsync" soak "$src/configs/local.yaml" --minutes 0.1 --sample-every 5 >"$tmp/out" 2>&1 || fail "soak failed"
grep -qE '^syncs	rss_kb	fds	threads	actors$' "$tmp/out" || fail "soak: no sample header"
grep -qE '^soak: [0-9]+ syncs in ' "$tmp/out" || fail "soak: no totals"
grep -qE '^per 1000 syncs: rss -?[0-9.]+ kB, fds -?[0-9.]+, threads -?[0-9.]+, actors -?[0-9.]+' "$tmp/out" || fail "soak: no slopes"
echo "ok: soak printed its figures"

# 4. Drills: the whole fleet killed at once.
set +e
"$rlsync" drill "$src/configs/drills/fleet-loss-no-restart.yaml" --throughput report --report "$tmp/drill2" >"$tmp/out" 2>&1
set -e
python3 - "$tmp/drill2/report.json" <<'PY' || fail "fleet-loss-no-restart drill: requests lost or failed"
import json, sys
r = json.load(open(sys.argv[1]))
inv = {i["name"]: i for i in r["invariants"]}
for name in ("every request finished or was explicitly rejected", "no token lost or duplicated in any stream"):
    assert inv[name]["held"], (name, inv[name])
print("requests:", inv["every request finished or was explicitly rejected"]["evidence"])
PY
echo "ok: fleet-loss drill (no restart): every request finished or explicitly rejected, nothing lost"
