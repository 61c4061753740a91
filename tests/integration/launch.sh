#!/usr/bin/env bash
# rlsync launch: --dry-run prints one `rlsync node` command line per selected
# node (the topology path made absolute, --secret-file passed on as given);
# an unknown node in --nodes is a usage error naming it (exit 2); a topology
# with no node on this machine exits 1 and says so. (The supervision itself
# — output, stop, grace, kill — is tested in tests/process/test_launcher.cpp.)
set -euo pipefail
rlsync=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
exe=$(readlink -f "$rlsync")
cluster="$src/configs/cluster.yaml"
cluster_abs=$(realpath -s "$cluster") # made absolute as written, links kept

# --dry-run with --nodes: exactly the chosen nodes, in the order given.
"$rlsync" launch "$cluster" --dry-run --nodes engine-node-b,trainer-node >"$tmp/out" 2>"$tmp/err" \
  || { cat "$tmp/err"; fail "dry run exited non-zero"; }
[ ! -s "$tmp/err" ] || { cat "$tmp/err"; fail "dry run wrote to stderr"; }
printf '%s\n' "$exe node --topology $cluster_abs --node engine-node-b --supervised" \
              "$exe node --topology $cluster_abs --node trainer-node --supervised" >"$tmp/want"
diff -u "$tmp/want" "$tmp/out" || fail "dry run: unexpected command lines"

# --allow-nonfinite goes to every node hosting a trainer rank, and only there.
sed -e '0,/    - node: trainer-node/s//    - node: engine-node-b/' "$cluster" >"$tmp/ranks.yaml"
"$rlsync" launch "$tmp/ranks.yaml" --dry-run --nodes trainer-node,engine-node-a,engine-node-b --allow-nonfinite >"$tmp/out"
printf '%s\n' "$exe node --topology $tmp/ranks.yaml --node trainer-node --supervised --allow-nonfinite" \
              "$exe node --topology $tmp/ranks.yaml --node engine-node-a --supervised" \
              "$exe node --topology $tmp/ranks.yaml --node engine-node-b --supervised --allow-nonfinite" >"$tmp/want"
diff -u "$tmp/want" "$tmp/out" || fail "dry run: --allow-nonfinite not on exactly the nodes hosting ranks"

# A relative topology path becomes absolute; --secret-file goes through untouched (quoted for the shell).
(cd "$src" && "$rlsync" launch configs/cluster.yaml --dry-run --nodes=engine-node-a --secret-file "my secret") >"$tmp/out"
[ "$(cat "$tmp/out")" = "$exe node --topology $(cd "$src" && pwd -P)/configs/cluster.yaml --node engine-node-a --supervised --secret-file 'my secret'" ] \
  || { cat "$tmp/out"; fail "dry run: relative path or --secret-file"; }

# The printed command lines are runnable shell: they read back into the same words.
eval "set -- $(cat "$tmp/out")"
[ "$#" -eq 9 ] && [ "$9" = "my secret" ] || fail "dry run output does not read back as 9 words"

# An unknown node: usage error (2) naming it; nothing started.
set +e
"$rlsync" launch "$cluster" --dry-run --nodes trainer-node,gpu9 >"$tmp/out" 2>"$tmp/err"; rc=$?
set -e
[ "$rc" -eq 2 ] || { cat "$tmp/err"; fail "unknown node: expected exit 2, got $rc"; }
grep -q "unknown node 'gpu9'" "$tmp/err" || { cat "$tmp/err"; fail "unknown node not named"; }
[ ! -s "$tmp/out" ] || fail "unknown node: printed commands anyway"

# cluster.yaml's nodes are at 10.0.0.x: none is on this machine (unless one really is: skip that check then).
if ip -o addr 2>/dev/null | grep -qE 'inet 10\.0\.0\.[123]/'; then
  echo "skip: this machine has a 10.0.0.1-3 address; the no-local-node check does not apply"
else
  set +e
  "$rlsync" launch "$cluster" >"$tmp/out" 2>"$tmp/err"; rc=$?
  set -e
  [ "$rc" -eq 1 ] || { cat "$tmp/out" "$tmp/err"; fail "no local node: expected exit 1, got $rc"; }
  grep -q "no node of .* is on this machine" "$tmp/err" || { cat "$tmp/err"; fail "no local node: no message"; }
fi

# A loopback node is local: without --nodes, --dry-run picks it (and only it).
sed -e 's/address: 10.0.0.2/address: 127.0.0.1/' "$cluster" >"$tmp/mixed.yaml"
"$rlsync" launch "$tmp/mixed.yaml" --dry-run >"$tmp/out"
[ "$(cat "$tmp/out")" = "$exe node --topology $tmp/mixed.yaml --node engine-node-a --supervised" ] \
  || { cat "$tmp/out"; fail "loopback node not selected alone"; }

# Usage errors: no topology, a bad --grace-ms, an unknown flag.
set +e
"$rlsync" launch 2>/dev/null; rc1=$?
"$rlsync" launch "$cluster" --grace-ms soon 2>/dev/null; rc2=$?
"$rlsync" launch "$cluster" --no-such-flag 2>/dev/null; rc3=$?
# A millisecond count takes no byte unit (10MB would be 10,000,000 ms).
"$rlsync" launch "$cluster" --dry-run --grace-ms 10MB 2>"$tmp/unit"; rc4=$?
set -e
[ "$rc1" -eq 2 ] && [ "$rc2" -eq 2 ] && [ "$rc3" -eq 2 ] && [ "$rc4" -eq 2 ] \
  || fail "usage errors: got $rc1 $rc2 $rc3 $rc4, expected 2 2 2 2"
grep -q -- "--grace-ms: expected a whole number without a unit, got '10MB'" "$tmp/unit" || fail "unit: $(cat "$tmp/unit")"
# The main job's flags: only with --run, checked before any node starts, and
# --run only where the coordinator's node is launched.
expect_usage() {
  local needle=$1 rc=0
  shift
  "$rlsync" launch "$cluster" --dry-run "$@" >/dev/null 2>"$tmp/err" || rc=$?
  [ "$rc" -eq 2 ] || fail "'$*': expected exit 2, got $rc ($(cat "$tmp/err"))"
  grep -qF -- "$needle" "$tmp/err" || fail "'$*': message lacks '$needle': $(cat "$tmp/err")"
}
expect_usage "--prompts goes to the main job: give --run too" --nodes trainer-node --prompts 5
expect_usage "--prompts: expected a non-negative number, got 'abc'" --run --nodes trainer-node --prompts abc
expect_usage "--concurrency and --max-tokens must be positive" --run --nodes trainer-node --concurrency 0
expect_usage "--run: the main job runs on the coordinator's node, trainer-node" --run --nodes engine-node-a --prompts 5
"$rlsync" launch "$cluster" --dry-run --run --nodes trainer-node --prompts 5 >"$tmp/out" \
  || fail "--run with the coordinator's node and a good --prompts"
grep -q -- "--run --no-progress --prompts 5" "$tmp/out" || { cat "$tmp/out"; fail "--prompts not passed to the head"; }
"$rlsync" launch --help | grep -q 'usage: rlsync launch' || fail "--help"
echo "ok"
