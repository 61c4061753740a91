#!/usr/bin/env bash
# Hostile inputs, each run through the rlsync binary under `timeout`: every
# case must end with its expected exit status and message; a hang (124), a
# crash signal (128+N) or a missing message fails the test.
set -uo pipefail
rlsync=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect STATUS MESSAGE -- COMMAND...: runs COMMAND (20 s at most) and checks
# its exit status and that stderr+stdout contain MESSAGE (a fixed string).
expect() {
  local want=$1 message=$2
  shift 3
  local rc=0
  timeout 20 "$@" >"$tmp/out" 2>&1 || rc=$?
  [ "$rc" -ne 124 ] || fail "hang (killed after 20 s): $*"
  [ "$rc" -lt 128 ] || fail "crashed with signal $((rc - 128)): $*"$'\n'"$(tail -5 "$tmp/out")"
  [ "$rc" -eq "$want" ] || fail "exit $rc, expected $want: $*"$'\n'"$(tail -5 "$tmp/out")"
  grep -qF -- "$message" "$tmp/out" || fail "no '$message' from: $*"$'\n'"$(tail -5 "$tmp/out")"
  echo "ok: $message"
}

# A topology with the given synthetic model fields and extra sections.
topology() { # FILE MODEL_FIELDS [EXTRA]
  cat >"$1" <<YAML
name: hostile
model:
  synthetic: {$2}
nodes: [{name: a}]
trainer: {node: a}
engines: [{name: e, node: a}]
${3:-}
YAML
}
shape='layers: 2, hidden_size: 64, heads: 4, intermediate_size: 128'

# --- topologies --------------------------------------------------------------
topology "$tmp/inter.yaml" 'layers: 2, hidden_size: 256, heads: 8, intermediate_size: 9223372036854775800'
expect 1 "model.synthetic.intermediate_size: must be at most 1048576, got 9223372036854775800" -- \
  "$rlsync" validate "$tmp/inter.yaml"
topology "$tmp/vocab.yaml" "$shape, vocab_size: 9223372036854775807"
expect 1 "model.synthetic.vocab_size: must be at most 16777216" -- "$rlsync" validate "$tmp/vocab.yaml"
expect 1 "model.synthetic.vocab_size: must be at most 16777216" -- "$rlsync" run "$tmp/vocab.yaml"
topology "$tmp/layers.yaml" 'layers: 100000000, hidden_size: 64, heads: 4, intermediate_size: 128'
expect 1 "model.synthetic.layers: must be at most 1024, got 100000000" -- "$rlsync" validate "$tmp/layers.yaml"
topology "$tmp/deadline.yaml" "$shape" "sync: {deadlines_ms: {transfer: 9223372036854775000}}"
expect 1 "sync.deadlines_ms.transfer: must be between 1 and 86400000" -- "$rlsync" validate "$tmp/deadline.yaml"
topology "$tmp/tokens.yaml" "$shape" "workload: {max_tokens: 4294967297}"
expect 1 "workload.max_tokens: must be between 1 and 1048576, got 4294967297" -- \
  "$rlsync" validate "$tmp/tokens.yaml"
# Within every bound, but far more memory than any host has (200 layers of
# Llama 3 405B's shape, about 0.7 trillion parameters): the allocation that
# fails is named, with its size. Skipped where memory overcommit is unlimited.
if [ "$(cat /proc/sys/vm/overcommit_memory 2>/dev/null)" != 1 ]; then
  topology "$tmp/huge.yaml" \
    'layers: 200, hidden_size: 16384, heads: 128, kv_heads: 8, intermediate_size: 53248, vocab_size: 128256'
  expect 1 "cannot allocate" -- "$rlsync" run "$tmp/huge.yaml" --prompts 1
fi
# YAML nested 100,000 deep: refused by the parser, no stack overflow.
python3 -c 'print("name: " + "["*100000 + "]"*100000)' >"$tmp/deep.yaml"
expect 1 "deep.yaml:1:" -- "$rlsync" validate "$tmp/deep.yaml"
mkfifo "$tmp/fifo.yaml"
expect 1 "fifo.yaml: is a FIFO, not a regular file" -- "$rlsync" validate "$tmp/fifo.yaml"
expect 1 "fifo.yaml: is a FIFO, not a regular file" -- "$rlsync" run "$tmp/fifo.yaml"
expect 1 "/dev/zero: is a character device, not a regular file" -- "$rlsync" validate /dev/zero

# Control characters in names are escaped, never echoed raw.
printf 'name: "a\\e[2Jb"\nmodel:\n  synthetic: {%s}\nnodes: [{name: a}]\ntrainer: {node: a}\nengines: [{name: e, node: a}]\n' \
  "$shape" >"$tmp/escape.yaml"
expect 1 "got 'a\\x1b[2Jb'" -- "$rlsync" validate "$tmp/escape.yaml"
if grep -q $'\x1b' "$tmp/out"; then fail "a raw escape character was echoed"; fi

# --- flags -------------------------------------------------------------------
topology "$tmp/ok.yaml" "$shape"
expect 2 "--max-tokens: must be at most 1048576, got 4294967297" -- \
  "$rlsync" run "$tmp/ok.yaml" --max-tokens 4294967297
expect 2 "--concurrency: must be at most 65536" -- "$rlsync" run "$tmp/ok.yaml" --concurrency 100000000
expect 2 "--max-tokens: number out of range" -- "$rlsync" run "$tmp/ok.yaml" --max-tokens 99999999999999999999999
expect 2 "--layers: must be at most 1024" -- \
  "$rlsync" checkpoint make --out "$tmp/never" --layers 100000000 --hidden 64 --heads 4 --kv-heads 2 --intermediate 128 --seed 1
expect 2 "--max-tokens: must be in 1..1048576" -- \
  "$rlsync" generate --checkpoint "$tmp/none" --prompt x --max-tokens 4294967297

# --- checkpoints -------------------------------------------------------------
"$rlsync" checkpoint make --out "$tmp/good" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --intermediate 128 --seed 1 \
  >/dev/null || fail "checkpoint make"
hostile_checkpoint() { # NAME: a copy of the good checkpoint
  cp -r "$tmp/good" "$tmp/$1"
  echo "$tmp/$1"
}
deep=$(hostile_checkpoint deep)
python3 -c 'import sys; d=100000; sys.stdout.write("{\"a\": " + "["*d + "]"*d + "}")' >"$deep/config.json"
expect 1 "JSON nested deeper than 32 levels" -- "$rlsync" checkpoint inspect "$deep"
expect 1 "JSON nested deeper than 32 levels" -- "$rlsync" generate --checkpoint "$deep" --prompt hi
fifo=$(hostile_checkpoint fifo)
rm "$fifo/config.json" && mkfifo "$fifo/config.json"
expect 1 "config.json: config.json: is a FIFO, not a regular file" -- "$rlsync" checkpoint inspect "$fifo"
expect 1 "config.json: config.json: is a FIFO, not a regular file" -- "$rlsync" generate --checkpoint "$fifo" --prompt hi
fifo_st=$(hostile_checkpoint fifo_st)
rm "$fifo_st/model.safetensors" && mkfifo "$fifo_st/model.safetensors"
expect 1 "model.safetensors: is a FIFO, not a regular file" -- "$rlsync" checkpoint inspect "$fifo_st"
big=$(hostile_checkpoint big)
sed -i 's/"intermediate_size": 128/"intermediate_size": 9223372036854775800/' "$big/config.json"
expect 1 "intermediate_size: must be at most 1048576, got 9223372036854775800" -- "$rlsync" checkpoint inspect "$big"
# NaN weights: served with an error, never as a success.
nan=$(hostile_checkpoint nan)
python3 - "$nan/model.safetensors" <<'PY'
import struct, sys, json
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    begin = header["model.norm.weight"]["data_offsets"][0]
    f.seek(8 + n + begin)
    f.write(b"\xc0\x7f" * 64)  # bf16 NaN over the final norm
PY
expect 1 "the model produced NaN or infinite logits" -- "$rlsync" generate --checkpoint "$nan" --prompt hi
# A tensor name with control characters is escaped in inspect's table.
evil=$(hostile_checkpoint evil)
python3 - "$evil/model.safetensors" <<'PY'
import struct, sys, json
path = sys.argv[1]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
header["evil\u001b[2Jname"] = {"dtype": "BF16", "shape": [0], "data_offsets": [0, 0]}
text = json.dumps(header).encode()
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
expect 0 'evil\x1b[2Jname' -- "$rlsync" checkpoint inspect "$evil"
if grep -q $'\x1b' "$tmp/out"; then fail "inspect echoed a raw escape character"; fi

# --- published steps (trainer.source: checkpoint_dir) --------------------------
mkdir -p "$tmp/steps"
cp -r "$tmp/good" "$tmp/steps/step-000001" && touch "$tmp/steps/step-000001/COMPLETE"
mkdir -p "$tmp/steps/step-9999999999999999999" && touch "$tmp/steps/step-9999999999999999999/COMPLETE"
cp -r "$nan" "$tmp/steps/step-000002" && touch "$tmp/steps/step-000002/COMPLETE"
cat >"$tmp/steps.yaml" <<YAML
name: steps
model: {checkpoint: good}
nodes: [{name: a}]
trainer: {node: a, source: checkpoint_dir, dir: steps, step_time_ms: 50}
engines: [{name: e, node: a}]
workload: {prompts: 4, concurrency: 2, max_tokens: 4}
YAML
expect_run_rc=0
timeout 60 "$rlsync" run "$tmp/steps.yaml" --no-progress >"$tmp/out" 2>&1 || expect_run_rc=$?
[ "$expect_run_rc" -ne 124 ] || fail "run with hostile steps hung"
[ "$expect_run_rc" -lt 128 ] || fail "run with hostile steps crashed (signal $((expect_run_rc - 128)))"
grep -qF "'step-9999999999999999999' is outside the version range" "$tmp/out" \
  || fail "no message for the out-of-range step"$'\n'"$(tail -20 "$tmp/out")"
grep -qF "is NaN (--allow-nonfinite publishes it anyway)" "$tmp/out" \
  || fail "NaN step not refused"$'\n'"$(tail -20 "$tmp/out")"
echo "ok: run refuses hostile steps (exit $expect_run_rc)"
echo "all hostile inputs refused"
