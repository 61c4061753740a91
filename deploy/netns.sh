#!/usr/bin/env bash
# Local multi-node test cluster: N network namespaces joined by veth pairs to
# a bridge that lives in its own "switch" namespace, so the host's network
# configuration is never touched. Node i gets 10.77.<net>.(i+1)/24.
#
#   deploy/netns.sh up NAME N [NET]   create NAME-sw and NAME-0 .. NAME-(N-1)
#   deploy/netns.sh down NAME         remove them (idempotent)
#   deploy/netns.sh partition NAME I  cut node I off (its link down)
#   deploy/netns.sh heal NAME I       reconnect node I
#   deploy/netns.sh addr NAME I [NET] print node I's address
#   deploy/netns.sh can               exit 0 if namespaces can be made here
#
# Run commands inside a node with: ip netns exec NAME-I <command>
set -euo pipefail

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

addr() { echo "10.77.${3:-0}.$(( $2 + 1 ))"; }

# NAME goes into namespace names and down's grep -E pattern: only characters
# that are literal there, so "test.1" cannot match "testX1-*".
check_name() {
  [[ $1 =~ ^[A-Za-z0-9_-]+$ ]] && return
  echo "NAME must match ^[A-Za-z0-9_-]+\$: '$1'" >&2
  exit 2
}

cmd=${1:-}
case "$cmd" in
  can)
    probe="rlsync-probe-$$"
    if ip netns add "$probe" 2>/dev/null; then
      ip netns del "$probe"
      exit 0
    fi
    echo "network namespaces cannot be created here (needs root and iproute2)" >&2
    exit 1
    ;;
  up)
    [ $# -ge 3 ] || usage
    name=$2 n=$3 net=${4:-0}
    check_name "$name"
    if ! { [ "$n" -ge 1 ] && [ "$n" -le 200 ]; }; then
      echo "N must be in 1..200" >&2
      exit 2
    fi
    "$0" down "$name"
    # On failure, remove what this run made: its namespaces (with the links in
    # them) and any rl$$-* veth still in the host's, which down never sees.
    made=()
    up_failed() {
      local ns link
      for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
      for link in $(ip -o link show | awk -F': ' -v p="rl$$-" 'index($2, p) == 1 {sub(/@.*/, "", $2); print $2}' || true); do
        ip link del "$link" 2>/dev/null || true
      done
      echo "netns.sh up $name failed: removed what it made" >&2
    }
    trap 'up_failed' EXIT
    ip netns add "$name-sw"
    made+=("$name-sw")
    ip -n "$name-sw" link add br0 type bridge
    ip -n "$name-sw" link set br0 up
    ip -n "$name-sw" link set lo up
    for ((i = 0; i < n; i++)); do
      ns="$name-$i"
      ip netns add "$ns"
      made+=("$ns")
      ip link add "rl$$-$i" type veth peer name "rl$$-$i-p"
      ip link set "rl$$-$i" netns "$ns"
      ip link set "rl$$-$i-p" netns "$name-sw"
      ip -n "$ns" link set "rl$$-$i" name eth0
      ip -n "$name-sw" link set "rl$$-$i-p" name "port$i"
      ip -n "$name-sw" link set "port$i" master br0
      ip -n "$name-sw" link set "port$i" up
      ip -n "$ns" addr add "$(addr "$name" "$i" "$net")/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
    done
    trap - EXIT
    ;;
  down)
    [ $# -ge 2 ] || usage
    name=$2
    check_name "$name"
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^${name}-(sw|[0-9]+)$" || true); do
      ip netns del "$ns"
    done
    ;;
  partition|heal)
    [ $# -ge 3 ] || usage
    state=down
    check_name "$2"
    [ "$cmd" = heal ] && state=up
    ip -n "$2-sw" link set "port$3" "$state"
    ;;
  addr)
    [ $# -ge 3 ] || usage
    check_name "$2"
    addr "$2" "$3" "${4:-0}"
    ;;
  *) usage ;;
esac
