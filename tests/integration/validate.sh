#!/usr/bin/env bash
# rlsync validate: every shipped topology passes and prints its resolved
# form; a broken one fails with exit 1 and every error located as
# file:line:col: field: message.
set -euo pipefail
rlsync=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

shopt -s nullglob
configs=("$src"/configs/*.yaml)
[ "${#configs[@]}" -gt 0 ] || fail "no configs/*.yaml found"
for f in "${configs[@]}"; do
  "$rlsync" validate "$f" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; fail "validate $f"; }
  [ ! -s "$tmp/err" ] || { cat "$tmp/err"; fail "validate $f wrote to stderr"; }
  grep -q '^engines:' "$tmp/out" || fail "$f: no engines in the resolved output"
  grep -q '^  - name: ' "$tmp/out" || fail "$f: no named entries in the resolved output"
  grep -q 'bucket_bytes: [0-9][0-9]*' "$tmp/out" || fail "$f: bucket_bytes not shown in bytes"
  echo "ok: $f"
done

# local.yaml: replicas expanded, model shape shown.
"$rlsync" validate "$src/configs/local.yaml" >"$tmp/out"
grep -q '^  - name: rollout-0$' "$tmp/out" || fail "rollout-0 not expanded"
grep -q '^  - name: rollout-1$' "$tmp/out" || fail "rollout-1 not expanded"
grep -q '^  head_dim: 32$' "$tmp/out" || fail "model dimensions not shown"

# A broken file: two errors, both reported, with the file as given and 1-based positions.
cat >"$tmp/bad.yaml" <<'YAML'
name: bad
model:
  synthetic: {layers: 4, hidden_size: 256, heads: 8, intermediate_size: 704}
nodes:
  - name: a
trainer:
  node: a
engines:
  - name: e
    node: gpu9
    tpp: 2
YAML
set +e
"$rlsync" validate "$tmp/bad.yaml" >"$tmp/out" 2>"$tmp/err"
rc=$?
set -e
[ "$rc" -eq 1 ] || { cat "$tmp/err"; fail "bad.yaml: expected exit 1, got $rc"; }
[ ! -s "$tmp/out" ] || fail "bad.yaml: printed a topology"
grep -qxF "$tmp/bad.yaml:10:11: engines[0].node: unknown node 'gpu9' (defined: a)" "$tmp/err" \
  || { cat "$tmp/err"; fail "bad.yaml: unknown node not reported"; }
grep -qF "$tmp/bad.yaml:11:5: engines[0].tpp: unknown key, did you mean 'tp'?" "$tmp/err" \
  || { cat "$tmp/err"; fail "bad.yaml: unknown key not reported"; }
[ "$(wc -l <"$tmp/err")" -eq 2 ] || { cat "$tmp/err"; fail "bad.yaml: expected exactly 2 errors"; }

# Syntax errors are located too.
printf 'name: x\nnodes: [a, b\n' >"$tmp/syntax.yaml"
set +e
"$rlsync" validate "$tmp/syntax.yaml" 2>"$tmp/err" >/dev/null
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "syntax.yaml: expected exit 1, got $rc"
grep -qE "^$tmp/syntax.yaml:[0-9]+:[0-9]+: syntax error: " "$tmp/err" || { cat "$tmp/err"; fail "syntax error not located"; }

# A missing file fails with exit 1; a missing argument is a usage error (2).
set +e
"$rlsync" validate "$tmp/none.yaml" 2>/dev/null; rc1=$?
"$rlsync" validate 2>/dev/null; rc2=$?
set -e
[ "$rc1" -eq 1 ] || fail "missing file: expected exit 1, got $rc1"
[ "$rc2" -eq 2 ] || fail "no argument: expected exit 2, got $rc2"
"$rlsync" validate --help | grep -q 'usage: rlsync validate' || fail "--help"
echo "ok"
