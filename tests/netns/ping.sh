#!/usr/bin/env bash
# Two network namespaces joined through a bridge: rlsync's typed heartbeat
# crosses the veth link through CAF's middleman; a partition makes the ping
# fail by its deadline (naming the peer), and healing restores it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
netns_up rlp 2
a0=$(netns_addr 0)
"$rlsync" certs make --out "$dir/certs" --nodes n0,n1 > /dev/null
"$rlsync" certs make --out "$dir/other" --nodes n1 > /dev/null
tls() { echo --ca "$dir/certs/ca.pem" --cert "$dir/certs/$1.pem" --key "$dir/certs/$1.key"; }

# 1. A healthy link: 5 pings across namespaces, plaintext and mutual TLS.
netns_start 0 - "$rlsync" ping --listen "$a0:7100" --count 5 --deadline-ms 20000
listener=$started
ip netns exec "$name-1" "$rlsync" ping --connect "$a0:7100" --count 5 --deadline-ms 10000
wait "$listener"
netns_start 0 - "$rlsync" ping --listen "$a0:7102" --count 1 --deadline-ms 20000 $(tls n0)
listener=$started
# A certificate of another CA, and none at all, never complete the handshake.
if ip netns exec "$name-1" "$rlsync" ping --connect "$a0:7102" --count 1 --deadline-ms 1500 \
     --ca "$dir/other/ca.pem" --cert "$dir/other/n1.pem" --key "$dir/other/n1.key"; then
  echo "FAIL: a certificate of another CA was accepted"; exit 1
fi
if ip netns exec "$name-1" "$rlsync" ping --connect "$a0:7102" --count 1 --deadline-ms 1500; then
  echo "FAIL: a peer without a certificate was accepted"; exit 1
fi
ip netns exec "$name-1" "$rlsync" ping --connect "$a0:7102" --count 1 --deadline-ms 10000 $(tls n1)
wait "$listener"

# 2. A partitioned node: the connection attempt fails by its deadline and names the peer.
netns_start 0 - "$rlsync" ping --listen "$a0:7101" --count 1 --deadline-ms 20000
listener=$started
"$netns" partition "$name" 1
set +e
out=$(ip netns exec "$name-1" "$rlsync" ping --connect "$a0:7101" --count 1 --deadline-ms 1500 2>&1)
rc=$?
set -e
echo "$out"
[ "$rc" -ne 0 ] || { echo "FAIL: ping through a partition succeeded"; exit 1; }
grep -q "$a0:7101" <<<"$out" || { echo "FAIL: error does not name the peer"; exit 1; }

# 3. Healed: the same listener answers.
"$netns" heal "$name" 1
ip netns exec "$name-1" "$rlsync" ping --connect "$a0:7101" --count 1 --deadline-ms 10000
wait "$listener"
echo "ok"
