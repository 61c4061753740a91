#!/usr/bin/env bash
# The hostile-peer suite: a head and two engine nodes from a scratch copy of
# configs/multiprocess.yaml (mutual TLS with credentials from `rlsync certs
# make`, per-node secrets), attacked by rlsync-hostile-peer (a client that
# speaks CAF's wire protocol, without the cluster secret). Each check asserts
# the fixed behaviour: the attack is refused, the head keeps serving (a sync
# round with both engines completes after it), its memory stays bounded, and
# legitimate joins succeed during an admit flood.
# Then the HTTP ports, `rlsync serve`'s and the fleet's endpoint
# (router.http_port): slow headers, huge bodies, many connections, garbage
# and missing tokens are refused, and each keeps serving (serve:NAME,
# router-http:NAME).
#
# The attacks run twice: as an outsider (TLS without a certificate; also
# once with a certificate another CA signed), which TLS must turn away
# before anything reaches BASP, and as a member-credentialed but unadmitted
# peer (engines-a's certificate from the cluster's CA, no secret), which
# only the gatekeeper and authorization stop. Check names say which:
# outsider:NAME, member:NAME.
#
#   hostile_peer.sh RLSYNC HOSTILE_PEER SOURCE_DIR [--allow-caf-limits]
#
# Every failed check is reported by name and the script goes on; it exits 1
# if any failed. --allow-caf-limits: exit 0 when the only checks that fail are
# listed in caf_limits (what CAF 0.17 owns and TLS turns into a members-only
# or firewall problem; README "Security model"), naming any that now pass.
set -uo pipefail
rlsync=$1
peer=$2
src=$3
allow_caf_limits=0
[ "${4:-}" = "--allow-caf-limits" ] && allow_caf_limits=1

# What CAF 0.17 owns and rlsync cannot refuse; each name is a check below.
caf_limits=(
  # CAF 0.17 keeps a TCP connection that never starts its TLS handshake (no
  # handshake deadline, no connection cap); TLS keeps it away from BASP, and
  # outsider:idle-rss bounds its cost. The firewall's job.
  outsider:idle-refused
  # A member certificate gets past TLS: CAF 0.17 then allocates whatever a
  # BASP header announces and accepts any node id (members are trusted not
  # to be hostile). huge-header-refused passes only when TLS happens to time
  # out first; the 1 GiB allocations can stall a loaded 2-core head past the
  # next round's deadlines (huge-header-head-serves); replay-member-serves
  # depends on timing and sometimes passes.
  member:huge-header-refused
  member:huge-header-rss
  member:huge-header-head-serves
  member:replay-refused
  member:replay-member-serves
)

dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

# Below the ephemeral range (32768+), away from cluster.sh's (20000-31999).
port=$((14000 + ($$ % 3000) * 2))
sed -e "s/^\( *port:\) 7411/\1 $port/" "$src/configs/multiprocess.yaml" > "$dir/topology.yaml"
grep -q "port: $port" "$dir/topology.yaml" || { echo "FAIL: could not set the head's port in the scratch topology"; exit 1; }
grep -qE '^  tls: \{ca: certs/ca.pem' "$dir/topology.yaml" \
  || { echo "FAIL: configs/multiprocess.yaml no longer has cluster.tls under certs/"; exit 1; }
# The cluster's credentials (certs/, next to the topology) and another
# CA's, for a peer whose certificate the head must not accept.
"$rlsync" certs make --out "$dir/certs" --nodes head,engines-a,engines-b > /dev/null \
  || { echo "FAIL: certs make"; exit 1; }
"$rlsync" certs make --out "$dir/other" --nodes engines-a > /dev/null || { echo "FAIL: certs make (other CA)"; exit 1; }
target="127.0.0.1:$port"

failed=()
mode=outsider
check() { # NAME CONDITION-STATUS MESSAGE (the name gets the mode: outsider:NAME)
  if [ "$2" -eq 0 ]; then
    echo "ok   [$mode:$1] $3"
  else
    echo "FAIL [$mode:$1] $3"
    failed+=("$mode:$1")
  fi
}

head_pid=""
engine_a_pid=""
engine_b_pid=""
start_head() { # TAG
  log="$dir/$1-head.log"
  "$rlsync" node --topology "$dir/topology.yaml" --node head > "$log" 2>&1 &
  head_pid=$!
  pids+=("$head_pid")
  for _ in $(seq 1 100); do grep -q "gatekeeper on" "$log" && return 0; sleep 0.1; done
  cat "$log"; echo "FAIL: the head did not come up"; exit 1
}
start_engine() { # TAG NODE -> pid in $started
  "$rlsync" node --topology "$dir/topology.yaml" --node "$2" > "$dir/$1-$2.log" 2>&1 &
  started=$!
  pids+=("$started")
}
# Lines of a completed round with both engines: "sync N vV: 2 engines, ...".
rounds() { grep -cE '^sync [0-9]+ v[0-9]+( \(cold\))?: 2 engines' "$log" || true; }
# True when a round with both engines completes within 10 s from now.
serves() {
  local before
  before=$(rounds)
  for _ in $(seq 1 100); do
    kill -0 "$head_pid" 2>/dev/null || return 1
    [ "$(rounds)" -gt "$before" ] && return 0
    sleep 0.1
  done
  return 1
}
start_cluster() { # TAG
  start_head "$1"
  start_engine "$1" engines-a; engine_a_pid=$started
  start_engine "$1" engines-b; engine_b_pid=$started
  serves || { cat "$log"; echo "FAIL: the cluster did not sync with both engines"; exit 1; }
}
stop_cluster() {
  for p in "$engine_a_pid" "$engine_b_pid" "$head_pid"; do kill "$p" 2>/dev/null || true; done
  for p in "$engine_a_pid" "$engine_b_pid" "$head_pid"; do wait "$p" 2>/dev/null || true; done
}
# After an attack that left the head not serving, a fresh cluster, so that
# the next attack's checks are its own.
recover() { # TAG STATUS-OF-THE-LAST-SERVES
  [ "$2" -eq 0 ] && return 0
  echo "(the head stopped serving: a fresh cluster for the next attack)"
  stop_cluster
  start_cluster "$1"
}
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# Runs the peer in the background while sampling the head's RSS; sets
# $peer_rc and $rss_growth_kb (peak during the attack minus before it).
attack_sampling_rss() { # OUTPUT-FILE PEER-ARGS...
  local out=$1; shift
  local before peak now
  before=$(rss_kb "$head_pid"); peak=$before
  timeout 120 "$peer" "$@" > "$out" 2>&1 &
  local p=$!
  while kill -0 "$p" 2>/dev/null; do
    now=$(rss_kb "$head_pid"); [ "$now" -gt "$peak" ] && peak=$now
    sleep 0.2
  done
  wait "$p"; peer_rc=$?
  rss_growth_kb=$((peak - before))
  cat "$out"
}
max_growth_kb=$((64 * 1024))

for mode in outsider member; do
if [ "$mode" = outsider ]; then
  tls_args=(--tls-anonymous) # TLS without a certificate
else
  # engines-a's own certificate from the cluster's CA, but not its secret.
  tls_args=(--tls-ca "$dir/certs/ca.pem" --tls-cert "$dir/certs/engines-a.pem" --tls-key "$dir/certs/engines-a.key")
fi

echo "== $mode, cluster 1: admit flood during joins, huge header, idle connections, garbage"
start_head "$mode-c1"
flood_from=$(wc -c < "$log")
gatekeeper_lines=$(grep -c "gatekeeper:" "$log" || true)
timeout 60 "$peer" admit-flood "$target" "${tls_args[@]}" --seconds 8 --rate 2000 --names engines-a,engines-b \
  > "$dir/$mode-flood.out" 2>&1 &
flood=$!
sleep 1
start_engine "$mode-c1" engines-a; engine_a_pid=$started
start_engine "$mode-c1" engines-b; engine_b_pid=$started
wait "$flood"; flood_rc=$?
cat "$dir/$mode-flood.out"
check flood-refused "$flood_rc" "admit flood: every wrong proof refused (exit $flood_rc)"
# TLS may turn the flood away at once: give the joins their own time.
for _ in $(seq 1 200); do
  joined=0
  for n in engines-a engines-b; do grep -q "engines registered" "$dir/$mode-c1-$n.log" || joined=1; done
  [ "$joined" -eq 0 ] && break
  sleep 0.1
done
check flood-joins "$joined" "both engine nodes joined during the admit flood"
[ "$joined" -eq 0 ] || for n in engines-a engines-b; do tail -n 3 "$dir/$mode-c1-$n.log"; done
new_lines=$(( $(grep -c "gatekeeper:" "$log" || true) - gatekeeper_lines ))
grew=$(( $(wc -c < "$log") - flood_from ))
[ "$new_lines" -le 100 ]; check flood-log-bounded $? "admit flood: the head logged $new_lines gatekeeper lines ($grew bytes in all; at most 100 lines: rate-limited)"
# Later checks need both engines: restart those the flood kept out.
for n in a b; do
  var=engine_${n}_pid
  if ! kill -0 "${!var}" 2>/dev/null || ! grep -q "engines registered" "$dir/$mode-c1-engines-$n.log"; then
    kill "${!var}" 2>/dev/null; wait "${!var}" 2>/dev/null
    start_engine "$mode-c1-again" "engines-$n"; printf -v "$var" '%s' "$started"
  fi
done
serves; check flood-head-serves $? "after the admit flood: a round with both engines completes"

attack_sampling_rss "$dir/$mode-huge.out" huge-header "$target" "${tls_args[@]}" --connections 2 --hold-ms 4000
check huge-header-refused "$peer_rc" "huge header (1 GiB announced, twice): refused (exit $peer_rc)"
[ "$rss_growth_kb" -lt "$max_growth_kb" ]
check huge-header-rss $? "huge header: the head's RSS grew $((rss_growth_kb / 1024)) MiB (limit $((max_growth_kb / 1024)) MiB)"
serves; rc=$?; check huge-header-head-serves $rc "after the huge header: a round with both engines completes"
if [ "$mode" = outsider ]; then
  # A handshake TLS refused must not cost a member its connection.
  lost=$(cat "$dir/$mode-c1-"*engines-*.log | grep -c "lost the link" || true)
  [ "$lost" -eq 0 ]; check links-kept $? "after the refused attacks: no engine node lost its link to the head ($lost did)"
fi
recover "$mode-c1-idle" $rc

if [ "$mode" = outsider ]; then # raw TCP: the same whoever sends it
  attack_sampling_rss "$dir/$mode-idle.out" idle "$target" --connections 200 --seconds 5
  check idle-refused "$peer_rc" "200 idle connections: closed by the head within 5 s (exit $peer_rc)"
  [ "$rss_growth_kb" -lt "$max_growth_kb" ]
  check idle-rss $? "idle connections: the head's RSS grew $((rss_growth_kb / 1024)) MiB (limit $((max_growth_kb / 1024)) MiB)"
  serves; rc=$?; check idle-head-serves $rc "after the idle connections: a round with both engines completes"
  recover "$mode-c1-garbage" $rc

  # Garbage to every TCP port every rlsync process listens on (CAF's, UCX's
  # producer and UCX's own tcp interface); the head's CAF port first, since a
  # crash ends the rest.
  survived=0
  for who in head engines-a engines-b; do
    case $who in head) p=$head_pid ;; engines-a) p=$engine_a_pid ;; engines-b) p=$engine_b_pid ;; esac
    ports=$(ss -Hltnp 2>/dev/null | awk -v pat="pid=$p," 'index($0, pat) {print $4}' \
            | sed -e 's/^\*:/127.0.0.1:/' -e 's/^0\.0\.0\.0:/127.0.0.1:/' -e 's/^\[::\]:/[::1]:/' \
            | grep -v '%' | sort -u | sort -t: -k1,1 -s)
    [ "$who" = head ] && ports=$(printf '%s\n' "$target" $(printf '%s\n' $ports | grep -vx "$target"))
    echo "garbage: $who (pid $p) listens on: $(echo $ports)"
    for ep in $ports; do
      timeout 60 "$peer" garbage "$ep" --wait-ms 500
      sleep 0.3 # a process that aborts on what it read does so within this
      if ! kill -0 "$p" 2>/dev/null; then
        survived=1
        echo "garbage: $who died after garbage to $ep"
        tail -n 3 "$log"
        break 2
      fi
    done
  done
  check garbage-survives "$survived" "garbage to every listening port of every rlsync process: all survive"
  if [ "$survived" -eq 0 ]; then
    serves; check garbage-head-serves $? "after the garbage: a round with both engines completes"
  else
    echo "skip [garbage-head-serves]: a process died"
  fi
fi
stop_cluster

echo "== $mode, cluster 2: a member's node id replayed"
start_cluster "$mode-c2"
member_id=$(sed -n 's/.*gatekeeper: admitted engines-a (\(.*\))$/\1/p' "$log" | tail -n 1)
if [ -z "$member_id" ]; then
  check replay-refused 1 "no 'admitted engines-a (NODE-ID)' line in the head's log"
else
  timeout 60 "$peer" replay-node-id "$target" "$member_id" "${tls_args[@]}" --listen-ms 3000; rc=$?
  check replay-refused "$rc" "replayed node id $member_id: none of the member's traffic reached the attacker (exit $rc)"
fi
serves; check replay-member-serves $? "after the replay: a round with both engines (the real member included) completes"
stop_cluster

echo "== $mode, cluster 3: direct messages to every actor id, unadmitted"
start_cluster "$mode-c3"
if [ "$mode" = outsider ]; then
  # A certificate another CA signed (no --tls-ca: an attacker does not care
  # who answers): the head must refuse it in the TLS handshake.
  timeout 60 "$peer" direct "$target" --tls-cert "$dir/other/engines-a.pem" --tls-key "$dir/other/engines-a.key" \
    --max-id 8 --read-only > "$dir/other-ca.out" 2>&1; rc=$?
  cat "$dir/other-ca.out"
  [ "$rc" -eq 0 ] && grep -q '^direct: refused' "$dir/other-ca.out"
  check other-ca-refused $? "a certificate of another CA: refused before BASP (exit $rc)"
fi
timeout 120 "$peer" direct "$target" "${tls_args[@]}" --max-id 64 --deregister rollout-a --deregister rollout-b \
  > "$dir/$mode-direct.out" 2>&1; rc=$?
grep -v 'unexpected_message' "$dir/$mode-direct.out"
check direct-refused "$rc" "direct messages to actor ids 1..64: none answered (exit $rc)"
serves; check direct-head-serves $? "after the direct messages: a round with both engines completes"
stop_cluster
done

# The HTTP ports (vLLM's API): rlsync serve's and the fleet's endpoint
# (router.http_port). Slow headers, a huge body, many connections, garbage,
# no token. After each, the port keeps serving (serve:NAME, router-http:NAME).
http_port_of() { # URL -> its port
  echo "${1##*:}"
}
http_ok() { [ "$(curl -s -o /dev/null -m 5 -w '%{http_code}' "$http_url/health")" = 200 ]; }
http_attack() { # NAME PYTHON: the snippet gets `port`, `connect()`, `key`, `path`; exits 0 when refused as it should be
  timeout 60 python3 - "$(http_port_of "$http_url")" "$http_key" "$http_path" <<PY
import socket, sys, time
port = int(sys.argv[1]); key = sys.argv[2].encode(); path = sys.argv[3].encode()
def connect():
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    return s
def read_all(s):
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b: return out
            out += b
    except (socket.timeout, ConnectionResetError):
        return out
$2
PY
}
# http_suite: attacks $http_url, whose mutating route $http_path needs the
# bearer token $http_key; check names get the prefix $mode.
http_suite() {
  http_attack slow 'import time
s = connect(); s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n"); t0 = time.time()
try:
    while s.recv(100): pass
except ConnectionResetError: pass
took = time.time() - t0; print("slow headers: cut after %.1f s" % took); sys.exit(0 if took < 15 else 1)'
  check slow-headers-cut $? "slow headers: the connection is cut at the read deadline"
  http_ok; check slow-headers-serves $? "after slow headers: /health answers"
  http_attack huge 's = connect(); s.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key + b"\r\nContent-Length: 4000000000\r\n\r\n")
a = read_all(s); print(a[:40]); sys.exit(0 if a.startswith(b"HTTP/1.1 413") else 1)'
  check huge-body-refused $? "a 4 GB body announced: 413 before it arrives"
  http_attack chunked 's = connect(); s.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
try:
    for i in range(20): s.sendall(b"100000\r\n" + b"x" * 0x100000 + b"\r\n")
except (BrokenPipeError, ConnectionResetError): pass
a = read_all(s); print(a[:40]); sys.exit(0 if a.startswith(b"HTTP/1.1 413") or a == b"" else 1)'
  check huge-chunked-refused $? "a chunked body past the bound: refused"
  http_ok; check huge-body-serves $? "after huge bodies: /health answers"
  http_attack many 'held = [connect() for i in range(200)]
time.sleep(0.5)
busy = 0
for s in held[-20:]:
    s.settimeout(2)
    try:
        if s.recv(100).startswith(b"HTTP/1.1 503"): busy += 1
    except socket.timeout: pass
print("connections over the bound answered 503:", busy); sys.exit(0 if busy > 0 else 1)'
  check many-connections-refused $? "200 connections: those over the bound get 503"
  http_ok; check many-connections-serves $? "after many connections: /health answers"
  http_attack garbage 'import os
for junk in [os.urandom(4096), b"\x16\x03\x01" + os.urandom(300), b"GET / HTTP/9.9\r\n\r\n", b"\r\n" * 5000]:
    s = connect(); s.sendall(junk); a = read_all(s); print(a[:30])
    if a and not a.startswith(b"HTTP/1.1 4"): sys.exit(1)
sys.exit(0)'
  check garbage-refused $? "garbage: 4xx or closed"
  http_ok; check garbage-serves $? "after garbage: /health answers"
  code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' -X POST -d '{}' "$http_url$http_path")
  [ "$code" = 401 ]; check no-token-refused $? "POST $http_path without the bearer token: $code"
  code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' -X POST -d '{}' -H "Authorization: Bearer wrong" "$http_url$http_path")
  [ "$code" = 401 ]; check wrong-token-refused $? "POST $http_path with a wrong token: $code"
  http_ok; check keeps-serving $? "the port keeps serving"
}
url_in_log() { # LOG SED-EXPRESSION: waits up to 20 s for the URL the log prints
  local url=""
  for _ in $(seq 1 400); do
    url=$(sed -n "$2" "$1" | head -1)
    [ -n "$url" ] && break
    sleep 0.05
  done
  echo "$url"
}

echo "== serve: rlsync serve's HTTP port"
mode=serve
"$rlsync" checkpoint make --out "$dir/serve-ck" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --seed 3 >/dev/null
echo "hostile-key" > "$dir/serve.key"
"$rlsync" serve --checkpoint "$dir/serve-ck" --port 0 --api-key-file "$dir/serve.key" > "$dir/serve.log" 2>&1 &
pids+=($!)
http_url=$(url_in_log "$dir/serve.log" 's/^rlsync serve: listening on \(http:[^ ]*\).*/\1/p')
http_key=hostile-key
http_path=/start_weight_update
if [ -z "$http_url" ]; then
  check started 1 "rlsync serve did not start: $(tail -5 "$dir/serve.log")"
else
  http_suite
  code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' -X POST "$http_url/pause")
  [ "$code" = 401 ]; check pause-no-token-refused $? "POST /pause without the bearer token: $code"
fi

echo "== router-http: the fleet's endpoint (router.http_port)"
mode=router-http
echo "hostile-fleet-key" > "$dir/fleet.key"
chmod 600 "$dir/fleet.key"
cat > "$dir/fleet.yaml" <<YAML
name: fleet
model:
  synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, intermediate_size: 128, vocab_size: 320}
nodes: [{name: a}]
cluster: {http_api_key_file: fleet.key}
trainer: {node: a, step_time_ms: 1000}
engines: [{name: e, node: a}]
router: {http_port: 0}
YAML
"$rlsync" node --topology "$dir/fleet.yaml" --node a > "$dir/fleet.log" 2>&1 &
pids+=($!)
http_url=$(url_in_log "$dir/fleet.log" 's/.*completions on \(http:[^ ]*\)\/v1\/completions.*/\1/p')
http_key=hostile-fleet-key
http_path=/v1/completions
if [ -z "$http_url" ]; then
  check started 1 "the fleet's endpoint did not start: $(tail -5 "$dir/fleet.log")"
else
  http_suite
  code=$(curl -s -o /dev/null -m 30 -w '%{http_code}' -H "Authorization: Bearer $http_key" \
    -d '{"model": "fleet", "prompt": [1, 2], "max_tokens": 2}' "$http_url/v1/completions")
  [ "$code" = 200 ]; check completes $? "a legitimate completion after the attacks: $code"
fi

echo
if [ "${#failed[@]}" -eq 0 ]; then
  echo "hostile peer: every check passed"
  [ "$allow_caf_limits" -eq 1 ] && echo "note: no CAF limit showed this time"
  exit 0
fi
echo "hostile peer: ${#failed[@]} checks failed: ${failed[*]}"
[ "$allow_caf_limits" -eq 1 ] || exit 1
unexpected=()
for f in "${failed[@]}"; do
  [[ " ${caf_limits[*]} " == *" $f "* ]] || unexpected+=("$f")
done
for k in "${caf_limits[@]}"; do
  [[ " ${failed[*]} " == *" $k "* ]] || echo "note: [$k] passed this time"
done
if [ "${#unexpected[@]}" -gt 0 ]; then
  echo "FAIL: failures beyond the CAF limits: ${unexpected[*]}"
  exit 1
fi
echo "ok: only CAF 0.17's documented limits failed (--allow-caf-limits)"
exit 0
