#!/usr/bin/env bash
# rlsync checkpoint: make -> inspect -> perturb -> inspect shows new checksums
# for every tensor; same seed, same checksums; bad flags exit 2 naming the flag.
set -euo pipefail
rlsync=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

shape=(--layers 2 --hidden 64 --heads 4 --kv-heads 2)

# make, sharded (the model is ~370 KB)
"$rlsync" checkpoint make --out "$tmp/a" "${shape[@]}" --seed 1 --shard-bytes 100KiB >"$tmp/make.out"
grep -q "^wrote $tmp/a: .* 21 tensors" "$tmp/make.out" || fail "make output: $(cat "$tmp/make.out")"
[ -f "$tmp/a/model.safetensors.index.json" ] || fail "no index for a sharded checkpoint"
[ -f "$tmp/a/config.json" ] || fail "no config.json"
ls "$tmp" | grep -q tmp && fail "temporary directory left behind"

# inspect: one row per tensor with a 16-hex-digit xxh3 checksum, then the total
"$rlsync" checkpoint inspect "$tmp/a" >"$tmp/a.txt"
grep -q "^total: 21 tensors, " "$tmp/a.txt" || fail "inspect total: $(tail -1 "$tmp/a.txt")"
rows() { grep -E '^(model|lm_head)\.' "$1" | awk '{print $1, $NF}'; }
[ "$(rows "$tmp/a.txt" | wc -l)" -eq 21 ] || fail "expected 21 tensor rows"
[ "$(rows "$tmp/a.txt" | grep -cE ' [0-9a-f]{16}$')" -eq 21 ] || fail "checksum column"
grep -q "^model.embed_tokens.weight  *BF16  *\[320, 64\]  *40960 " "$tmp/a.txt" || fail "embed row"
grep -q warning "$tmp/a.txt" && fail "layout warning on a synthetic checkpoint"
grep -qE '^name  +dtype  +shape  +bytes  +xxh3$' "$tmp/a.txt" || fail "header does not name xxh3: $(grep ^name "$tmp/a.txt")"

# same seed, unsharded: same checksums
"$rlsync" checkpoint make --out "$tmp/same" "${shape[@]}" --seed 1 >/dev/null
"$rlsync" checkpoint inspect "$tmp/same" >"$tmp/same.txt"
diff <(rows "$tmp/a.txt") <(rows "$tmp/same.txt") >/dev/null || fail "same seed gave different checksums"

# perturb: every checksum changes, names and order stay
"$rlsync" checkpoint make --from "$tmp/a" --perturb 0.05 --seed 2 --out "$tmp/b" >"$tmp/perturb.out"
grep -q "^wrote $tmp/b: " "$tmp/perturb.out" || fail "perturb output"
"$rlsync" checkpoint inspect "$tmp/b" >"$tmp/b.txt"
paste -d' ' <(rows "$tmp/a.txt") <(rows "$tmp/b.txt") >"$tmp/pairs"
[ "$(wc -l <"$tmp/pairs")" -eq 21 ] || fail "perturbed checkpoint has other tensors"
awk '$1 != $3 || $2 == $4 {print; bad=1} END {exit bad}' "$tmp/pairs" || fail "a tensor kept its checksum"

# --json: one object with the total
"$rlsync" checkpoint inspect "$tmp/b" --json >"$tmp/b.json"
[ "$(wc -l <"$tmp/b.json")" -eq 1 ] || fail "--json is not one line"
grep -q '^{"dir":.*"total_bytes":[0-9]*,' "$tmp/b.json" || fail "--json: $(cut -c1-200 "$tmp/b.json")"
[ "$(grep -o '"xxh3":"[0-9a-f]\{16\}"' "$tmp/b.json" | wc -l)" -eq 21 ] || fail "--json xxh3 checksums"

# --help for each form exits 0
for args in "--help" "make --help" "inspect --help"; do
  # shellcheck disable=SC2086
  "$rlsync" checkpoint $args | grep -q "^usage: rlsync checkpoint" || fail "help: $args"
done

# usage errors: exit 2, message names the flag
expect_usage() {
  local needle=$1
  shift
  local rc=0
  "$rlsync" checkpoint "$@" >/dev/null 2>"$tmp/err" || rc=$?
  [ "$rc" -eq 2 ] || fail "'$*': expected exit 2, got $rc ($(cat "$tmp/err"))"
  grep -qF -- "$needle" "$tmp/err" || fail "'$*': message lacks '$needle': $(cat "$tmp/err")"
}
out=(--out "$tmp/never")
expect_usage "--kv-heads: must divide num_attention_heads (4), got 3" make "${out[@]}" --layers 2 --hidden 64 --heads 4 --kv-heads 3 --seed 1
expect_usage "--heads: must divide hidden_size (64), got 3" make "${out[@]}" --layers 2 --hidden 64 --heads 3 --kv-heads 1 --seed 1
expect_usage "--hidden: must be positive" make "${out[@]}" --layers 2 --hidden 0 --heads 4 --kv-heads 2 --seed 1
expect_usage "--vocab: must be at least 258" make "${out[@]}" "${shape[@]}" --vocab 100 --seed 1
expect_usage "--layers: expected a non-negative number" make "${out[@]}" --layers two --hidden 64 --heads 4 --kv-heads 2 --seed 1
expect_usage "--layers: expected a whole number without a unit" make "${out[@]}" --layers 2K --hidden 64 --heads 4 --kv-heads 2 --seed 1
expect_usage "--dtype: expected bf16, f16 or f32, got 'f64'" make "${out[@]}" "${shape[@]}" --dtype f64 --seed 1
expect_usage "--shard-bytes: unknown unit" make "${out[@]}" "${shape[@]}" --shard-bytes 5XB --seed 1
expect_usage "--shard-bytes: must be positive" make "${out[@]}" "${shape[@]}" --shard-bytes 0 --seed 1
expect_usage "missing required flag --seed" make "${out[@]}" "${shape[@]}"
expect_usage "missing required flag --out" make "${shape[@]}" --seed 1
expect_usage "unknown flag '--bogus'" make "${out[@]}" "${shape[@]}" --seed 1 --bogus
expect_usage "--layers cannot be combined with --from" make --from "$tmp/a" --perturb 0.1 --seed 1 "${out[@]}" --layers 2
expect_usage "missing required flag --perturb" make --from "$tmp/a" --seed 1 "${out[@]}"
expect_usage "missing required flag --from" make --perturb 0.1 --seed 1 "${out[@]}"
expect_usage "--perturb: expected a number, got 'lots'" make --from "$tmp/a" --perturb lots --seed 1 "${out[@]}"
expect_usage "inspect: missing checkpoint directory" inspect
expect_usage "unknown flag '--yaml'" inspect "$tmp/a" --yaml
expect_usage "--arch: expected llama, qwen3 or qwen3_moe, got 'mistral'" make --out "$tmp/never" "${shape[@]}" --seed 1 --arch mistral
expect_usage "--head-dim: only with --arch qwen3" make --out "$tmp/never" "${shape[@]}" --seed 1 --head-dim 32
expect_usage "--head-dim: must be even for rotary embeddings, got 7" make --out "$tmp/never" "${shape[@]}" --seed 1 \
  --arch qwen3 --head-dim 7
expect_usage "unknown checkpoint subcommand 'frobnicate'" frobnicate
expect_usage "expected 'make' or 'inspect'"
[ -e "$tmp/never" ] && fail "a failed make left its output directory"

# a Qwen3: config.json names it, every layer adds its q/k head norms of head_dim, inspect says so
"$rlsync" checkpoint make --out "$tmp/q" "${shape[@]}" --arch qwen3 --head-dim 32 --seed 1 >"$tmp/q.out"
grep -q "^wrote $tmp/q: .* 25 tensors" "$tmp/q.out" || fail "qwen3 make output: $(cat "$tmp/q.out")"
grep -q '"model_type": "qwen3"' "$tmp/q/config.json" || fail "qwen3 config.json: $(cat "$tmp/q/config.json")"
grep -q '"head_dim": 32' "$tmp/q/config.json" || fail "qwen3 config.json head_dim"
"$rlsync" checkpoint inspect "$tmp/q" >"$tmp/q.txt"
grep -q "arch=qwen3 .* head_dim=32 " "$tmp/q.txt" || fail "qwen3 inspect header: $(head -1 "$tmp/q.txt")"
grep -q "^model.layers.1.self_attn.k_norm.weight  *BF16  *\[32\] " "$tmp/q.txt" || fail "qwen3 k_norm row"
grep -q "^model.layers.0.self_attn.q_proj.weight  *BF16  *\[128, 64\] " "$tmp/q.txt" || fail "qwen3 q_proj row"
grep -q warning "$tmp/q.txt" && fail "layout warning on a synthetic qwen3 checkpoint"
"$rlsync" generate --checkpoint "$tmp/q" --prompt hi --max-tokens 4 --tp 2 >/dev/null || fail "generate on a qwen3"

# Greedy tokens of checkpoint $1 at tp 1 and tp 2 are the same.
same_tokens_across_tp() {
  for tp in 1 2; do
    "$rlsync" generate --checkpoint "$1" --prompt "hello moe" --max-tokens 8 --tp $tp --json \
      | sed 's/.*"token_ids":\(\[[^]]*\]\).*/\1/' >"$1.tp$tp" || fail "generate on $1, tp $tp"
  done
  cmp -s "$1.tp1" "$1.tp2" || fail "$1: tokens differ between tp 1 and 2: $(cat "$1.tp1") $(cat "$1.tp2")"
}

# a Qwen3-MoE: the router and every expert's three tensors in each layer
"$rlsync" checkpoint make --out "$tmp/m" "${shape[@]}" --arch qwen3_moe --experts 4 --moe-intermediate 32 --seed 1 >"$tmp/m.out"
grep -q "^wrote $tmp/m: .* 45 tensors" "$tmp/m.out" || fail "qwen3_moe make output: $(cat "$tmp/m.out")"
grep -q '"num_experts": 4' "$tmp/m/config.json" || fail "qwen3_moe config.json: $(cat "$tmp/m/config.json")"
"$rlsync" checkpoint inspect "$tmp/m" >"$tmp/m.txt"
grep -q "arch=qwen3_moe .* experts=4 per_tok=2 moe_intermediate=32" "$tmp/m.txt" || fail "moe header: $(head -1 "$tmp/m.txt")"
grep -q "^model.layers.1.mlp.experts.3.down_proj.weight  *BF16  *\[64, 32\] " "$tmp/m.txt" || fail "expert row"
grep -q "^model.layers.0.mlp.gate.weight  *BF16  *\[4, 64\] " "$tmp/m.txt" || fail "router row"
grep -q warning "$tmp/m.txt" && fail "layout warning on a synthetic qwen3_moe checkpoint"
same_tokens_across_tp "$tmp/m"
# fused experts (as Llama-4): two tensors per sparse layer; the loader selects, transposes and splits
"$rlsync" checkpoint make --out "$tmp/f" "${shape[@]}" --arch qwen3_moe --experts 4 --moe-intermediate 32 \
  --expert-layout fused --seed 1 >"$tmp/f.out"
grep -q "^wrote $tmp/f: .* 25 tensors" "$tmp/f.out" || fail "fused make output: $(cat "$tmp/f.out")"
"$rlsync" checkpoint inspect "$tmp/f" >"$tmp/f.txt"
grep -q "^model.layers.0.mlp.experts.gate_up_proj  *BF16  *\[4, 64, 64\] " "$tmp/f.txt" || fail "fused gate_up row"
grep -q "^model.layers.1.mlp.experts.down_proj  *BF16  *\[4, 32, 64\] " "$tmp/f.txt" || fail "fused down row"
grep -q warning "$tmp/f.txt" && fail "layout warning on a fused checkpoint"
same_tokens_across_tp "$tmp/f"
expect_usage "--expert-layout: expected separate or fused, got 'packed'" make --out "$tmp/never" "${shape[@]}" \
  --seed 1 --arch qwen3_moe --experts 4 --expert-layout packed
expect_usage "--experts: only with --arch qwen3_moe" make --out "$tmp/never" "${shape[@]}" --seed 1 --experts 4
expect_usage "--experts-per-tok: must be at most num_experts (4), got 5" make --out "$tmp/never" "${shape[@]}" \
  --seed 1 --arch qwen3_moe --experts 4 --experts-per-tok 5

# runtime errors: exit 1 with the reason
rc=0
"$rlsync" checkpoint make --out "$tmp/a" "${shape[@]}" --seed 3 >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "already exists" "$tmp/err" || fail "overwrite: rc $rc, $(cat "$tmp/err")"
rc=0
"$rlsync" checkpoint inspect "$tmp/nowhere" >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "nowhere/config.json" "$tmp/err" || fail "missing dir: rc $rc, $(cat "$tmp/err")"
echo "ok"
