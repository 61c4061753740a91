# Shared by the tests in tests/netns/, each run as `bash TEST.sh RLSYNC SOURCE_ROOT`
# and sourcing this file after `set -euo pipefail`. It sets $rlsync, $root and
# $netns (deploy/netns.sh), and ends the test with exit 77 and a message where
# network namespaces cannot be made (not root, no iproute2). Then:
#
#   netns_up PREFIX N [NET]   nodes $name-0 .. $name-(N-1) ($name is PREFIX and
#                             this shell's pid), on 10.77.NET.0/24, and a
#                             scratch directory $dir; all removed on exit
#   netns_addr I              node I's address
#   netns_start I LOG CMD...  runs CMD in node I in the background, its output
#                             appended to LOG (-: the test's own output); its
#                             pid goes to $started and is killed on exit (with
#                             $netns_kill_signal, TERM unless the test sets it)
#
#   cluster_yaml_rewritten OUT A0 A1 A2
#                             configs/cluster.yaml with only what a machine
#                             without its network must change: the three
#                             nodes' addresses (A0..A2), ucx_transports (tcp)
#                             and the state file's directory ($dir); fails when
#                             the shipped file no longer has those lines
#   netns_five_nodes PREFIX NET FILE NAME NODE1 NODE2 ROUTER TRAINER
#                             five nodes (netns_up), head, NODE1, NODE2,
#                             engine-node-a and engine-node-b at node 0..4's
#                             address, their certificates in $dir/certs, and
#                             topology $dir/FILE (validated): a tiny model, mutual
#                             TLS with per-node secrets, one tp-2 engine on each
#                             engine node, the coordinator on head, the router
#                             on ROUTER, UCX over tcp, 16 prompts; TRAINER is
#                             its trainer: block (YAML, two-space indented)
#
# A test that needs more at exit defines netns_cleanup_hook; it runs after the
# kills and before the namespaces go.

rlsync=${1:?usage: $0 RLSYNC_BINARY SOURCE_ROOT}
root=${2:?usage: $0 RLSYNC_BINARY SOURCE_ROOT}
netns="$root/deploy/netns.sh"

if ! "$netns" can 2>/dev/null; then
  echo "skipping netns test $(basename "$0"): network namespaces cannot be created here (needs root and iproute2)"
  exit 77
fi

name=
dir=
net=0
pids=()
started=
netns_kill_signal=TERM

netns_cleanup() {
  local p
  for p in "${pids[@]}"; do kill "-$netns_kill_signal" "$p" 2>/dev/null || true; done
  if [ "$netns_kill_signal" = KILL ]; then # dead at once: reaped quietly, or bash reports each kill
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  fi
  if declare -F netns_cleanup_hook > /dev/null; then netns_cleanup_hook || true; fi
  if [ -n "$name" ]; then "$netns" down "$name"; fi
  if [ -n "$dir" ]; then rm -rf "$dir"; fi
}
trap netns_cleanup EXIT

netns_up() { # PREFIX N [NET]
  name="$1$$"
  net=${3:-0}
  dir=$(mktemp -d)
  "$netns" up "$name" "$2" "$net"
}

netns_addr() { # I
  "$netns" addr "$name" "$1" "$net"
}

netns_start() { # I LOG CMD...
  local node=$1 log=$2
  shift 2
  if [ "$log" = - ]; then
    ip netns exec "$name-$node" "$@" &
  else
    ip netns exec "$name-$node" "$@" >> "$log" 2>&1 &
  fi
  started=$!
  pids+=("$started")
}

cluster_yaml_rewritten() { # OUT A0 A1 A2
  local out=$1 shipped="$root/configs/cluster.yaml" want changed
  for want in 'address: 10.0.0.1' 'address: 10.0.0.2' 'address: 10.0.0.3' 'ucx_transports: \[rdma, tcp\]' \
              'state_file: /var/lib/rlsync/coordinator.state'; do
    grep -q "$want" "$shipped" || { echo "FAIL: $shipped no longer has '$want': update tests/netns/lib.sh"; exit 1; }
  done
  sed -e "s/address: 10\.0\.0\.1/address: $2/" -e "s/address: 10\.0\.0\.2/address: $3/" \
      -e "s/address: 10\.0\.0\.3/address: $4/" -e "s/ucx_transports: \[rdma, tcp\]/ucx_transports: [tcp]/" \
      -e "s|state_file: /var/lib/rlsync/coordinator.state|state_file: $dir/coordinator.state|" \
      "$shipped" > "$out"
  # Only the lines rewritten above differ from the shipped file.
  changed=$(diff "$shipped" "$out" | grep -c '^>' || true)
  [ "$changed" -eq 5 ] || { diff "$shipped" "$out" || true; echo "FAIL: $changed lines changed, expected 5"; exit 1; }
}

netns_five_nodes() { # PREFIX NET FILE NAME NODE1 NODE2 ROUTER TRAINER
  local out topology_name=$4 node1=$5 node2=$6 router=$7 trainer=$8 a=() i
  netns_up "$1" 5 "$2"
  out="$dir/$3" # $dir exists only from here on
  for i in 0 1 2 3 4; do a+=("$(netns_addr $i)"); done
  "$rlsync" certs make --out "$dir/certs" --nodes "head,$node1,$node2,engine-node-a,engine-node-b" > /dev/null
  cat > "$out" <<YAML
name: $topology_name
model:
  synthetic: {layers: 4, hidden_size: 64, heads: 4, kv_heads: 2, intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 1}
nodes:
  - {name: head, address: ${a[0]}, port: 7400}
  - {name: $node1, address: ${a[1]}}
  - {name: $node2, address: ${a[2]}}
  - {name: engine-node-a, address: ${a[3]}}
  - {name: engine-node-b, address: ${a[4]}}
cluster:
  tls: {ca: certs/ca.pem, cert: "certs/{node}.pem", key: "certs/{node}.key"}
  secret_file: "certs/{node}.secret"
  heartbeat_interval_ms: 200
  heartbeat_timeout_ms: 2000
  connect_deadline_ms: 20000
trainer:
$trainer
engines:
  - {name: rollout-a, node: engine-node-a, tp: 2}
  - {name: rollout-b, node: engine-node-b, tp: 2}
router: {node: $router}
coordinator: {node: head}
transfer: {backend: ucx, mode: sharded, ucx_transports: [tcp]}
workload: {prompts: 16, concurrency: 4, max_tokens: 24}
YAML
  "$rlsync" validate "$out" > /dev/null
}
