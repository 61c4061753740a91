#!/usr/bin/env bash
# Garbage to every port: the multi-process deployment (configs/multiprocess.yaml
# in a scratch copy: a head and two engine nodes on loopback, weights over
# UCX) runs; every TCP port each rlsync process listens on is found (ss), none
# is bound beyond loopback, and each gets 16 x 0xFF, random bytes, a
# connect-and-close and a long stream. Then every process must still be
# alive, and a sync that moves weights must still complete.
set -euo pipefail
rlsync=$1
src=$2
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "== $f"; tail -n 40 "$f"; done; exit 1; }
command -v ss >/dev/null || { echo "skip: no ss here"; exit 77; }

# Below the ephemeral range (32768+), so that no outgoing connection holds it.
port=$((20000 + ($$ % 6000) * 2 + 1))
sed -e "s/port: 7411/port: $port/" -e 's/step_time_ms: 200/step_time_ms: 300/' \
  "$src/configs/multiprocess.yaml" > "$dir/mp.yaml"
grep -q "port: $port" "$dir/mp.yaml" || fail "the scratch topology did not take port $port"
# The shipped config runs mutual TLS with per-node secrets: make them here.
"$rlsync" certs make --out "$dir/certs" --nodes head,engines-a,engines-b > /dev/null || fail "certs make"

"$rlsync" node --topology "$dir/mp.yaml" --node head > "$dir/head.log" 2>&1 &
pids+=($!)
for n in engines-a engines-b; do
  "$rlsync" node --topology "$dir/mp.yaml" --node "$n" > "$dir/$n.log" 2>&1 &
  pids+=($!)
done
for n in engines-a engines-b; do
  for _ in $(seq 1 300); do grep -q "engines registered" "$dir/$n.log" && break; sleep 0.1; done
  grep -q "1 engines registered" "$dir/$n.log" || fail "$n did not register"
done
# Syncs that move weights: every engine worker has pulled over UCX.
synced() { grep -E "sync [0-9]+ v[0-9]+( \(cold\))?: [1-9][0-9]* engines" "$dir/head.log" | grep -vc evicted || true; }
for _ in $(seq 1 300); do [ "$(synced)" -ge 2 ] && break; sleep 0.1; done
[ "$(synced)" -ge 2 ] || fail "no sync moved weights"

# Every listening TCP socket of our processes: "pid address port".
listening() {
  ss -ltnpH | while read -r _ _ _ local _ users; do
    for p in "${pids[@]}"; do
      if [[ "$users" == *"pid=$p,"* ]]; then echo "$p ${local%:*} ${local##*:}"; fi
    done
  done
}
listening > "$dir/ports"
cat "$dir/ports"
[ -s "$dir/ports" ] || fail "no listening socket found (ss sees no rlsync process)"
grep -q " $port\$" "$dir/ports" || fail "the gatekeeper's port $port is not in the list"
# An all-loopback topology listens on no other interface.
while read -r p addr prt; do
  case "$addr" in
    127.*|\[::1\]) ;;
    *) fail "process $p listens on $addr:$prt, beyond loopback" ;;
  esac
done < "$dir/ports"

# The garbage.
python3 - "$dir/ports" <<'PY'
import os, random, socket, sys, time
random.seed(12)
def attempt(host, port, payload, hold=0.0):
    try:
        with socket.create_connection((host, int(port)), timeout=3) as s:
            s.settimeout(3)
            if payload:
                s.sendall(payload)
            time.sleep(hold)
    except OSError as e:
        print(f"  {host}:{port}: {e}")
def stream(host, port, total=8 << 20):
    try:
        with socket.create_connection((host, int(port)), timeout=3) as s:
            s.settimeout(2)
            sent = 0
            while sent < total:
                sent += s.send(random.randbytes(65536))
    except OSError as e:
        print(f"  {host}:{port}: long stream ended: {e}")
for line in open(sys.argv[1]):
    pid, host, port = line.split()
    host = host.strip("[]")
    print(f"process {pid}: {host}:{port}")
    attempt(host, port, b"\xff" * 16, hold=0.2)
    attempt(host, port, random.randbytes(4096), hold=0.2)
    attempt(host, port, b"")
    attempt(host, port, b"\x00" * 64 + b"\xff" * 64, hold=0.2)
    stream(host, port)
PY
sleep 1
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "process $p died after the garbage"; done

# The job still syncs: new rounds move weights after the attack.
before=$(synced)
for _ in $(seq 1 300); do [ "$(synced)" -ge $((before + 2)) ] && break; sleep 0.1; done
[ "$(synced)" -ge $((before + 2)) ] || fail "no sync moved weights after the garbage"
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "process $p died"; done
# What UCX itself made of the garbage (it logs and drops the connections).
grep -h "UCX " "$dir"/*.log | sed -E 's/^.*UCX +//' | sort | uniq -c | head -n 20 || true
echo ok
