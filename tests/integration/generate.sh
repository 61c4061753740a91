#!/usr/bin/env bash
# rlsync generate on a synthetic checkpoint: JSON output, greedy determinism,
# identical tokens for tp 1/2/4 (Llama, Qwen3, Qwen3-MoE separate and fused,
# with and without expert parallelism), bad flags exit 2 naming the flag, a missing
# checkpoint exits 1. Also a smoke run of `rlsync bench engine` on a tiny model.
set -euo pipefail
rlsync=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$rlsync" checkpoint make --out "$dir/ck" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --seed 3 >/dev/null

tokens() { "$rlsync" generate --checkpoint "$dir/ck" --prompt "hello rlsync" --max-tokens 12 --no-stop --json "$@" \
  | sed -n 's/.*"token_ids":\(\[[^]]*\]\).*/\1/p'; }
t1=$(tokens --tp 1)
[ -n "$t1" ] || { echo "FAIL: no token_ids in --json output"; exit 1; }
[ "$(tokens --tp 1)" = "$t1" ] || { echo "FAIL: greedy generation is not deterministic"; exit 1; }
[ "$(tokens --tp 2)" = "$t1" ] || { echo "FAIL: tp 2 differs from tp 1"; exit 1; }
[ "$(tokens --tp 4)" = "$t1" ] || { echo "FAIL: tp 4 differs from tp 1"; exit 1; }
n=$(tr ',' '\n' <<<"$t1" | grep -c '[0-9]')
[ "$n" -eq 12 ] || { echo "FAIL: expected 12 tokens, got $n: $t1"; exit 1; }

# Qwen3 and Qwen3-MoE (separate and fused experts; 6 experts of 30 are placed
# 2, 2, 1, 1 over four workers with expert parallelism, and 30 cannot be
# sliced 4 ways without it): the same tokens for every tp, expert
# parallelism on and off.
"$rlsync" checkpoint make --out "$dir/q3" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --arch qwen3 --head-dim 32 \
  --seed 3 >/dev/null
"$rlsync" checkpoint make --out "$dir/moe" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --arch qwen3_moe \
  --experts 6 --moe-intermediate 30 --seed 3 >/dev/null
"$rlsync" checkpoint make --out "$dir/fused" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --arch qwen3_moe \
  --experts 6 --moe-intermediate 30 --expert-layout fused --seed 3 >/dev/null
for ck in q3 moe fused; do
  base=$(tokens --tp 1 --checkpoint "$dir/$ck")
  [ -n "$base" ] || { echo "FAIL: $ck: no tokens"; exit 1; }
  [ "$(tokens --tp 2 --checkpoint "$dir/$ck")" = "$base" ] || { echo "FAIL: $ck: tp 2 differs from tp 1"; exit 1; }
  [ "$ck" = q3 ] && continue
  for tp in 1 2 4; do
    [ "$(tokens --tp $tp --expert-parallel --checkpoint "$dir/$ck")" = "$base" ] \
      || { echo "FAIL: $ck: tp $tp with expert parallelism differs from tp 1"; exit 1; }
  done
done
"$rlsync" generate --checkpoint "$dir/moe" --prompt hi --max-tokens 2 --tp 2 --expert-parallel --json \
  | grep -q '"tp":2,"expert_parallel":true' || { echo "FAIL: --json does not mark expert parallelism"; exit 1; }

# The int8 process step: marked in --json, and it changes the logits (a
# test of its tolerance against bf16 is the engine's own).
q=$("$rlsync" generate --checkpoint "$dir/moe" --prompt "hello rlsync" --max-tokens 12 --no-stop --tp 2 \
      --expert-parallel --weights int8 --json)
grep -q '"expert_parallel":true,"weights":"int8"' <<<"$q" || { echo "FAIL: --json does not mark int8: $q"; exit 1; }
grep -q '"expert_parallel":false,"weights":"received"' <<<"$("$rlsync" generate --checkpoint "$dir/ck" --prompt hi \
  --max-tokens 2 --json)" || { echo "FAIL: --json does not mark the weights as received"; exit 1; }

# --logits: every prompt position's logits, float32 [prompt tokens, vocab]
# (BOS + "hi" = 3 tokens, vocabulary 320); an unwritable file is an error.
"$rlsync" generate --checkpoint "$dir/ck" --prompt hi --max-tokens 1 --logits "$dir/hi.f32" >/dev/null
[ "$(stat -c %s "$dir/hi.f32")" -eq $((3 * 320 * 4)) ] || { echo "FAIL: --logits wrote $(stat -c %s "$dir/hi.f32") bytes"; exit 1; }
set +e
out=$("$rlsync" generate --checkpoint "$dir/ck" --prompt hi --max-tokens 1 --logits "$dir/no/such/dir/l.f32" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q -- "--logits: cannot write" <<<"$out" || { echo "FAIL: unwritable --logits: rc $rc: $out"; exit 1; }

json=$("$rlsync" generate --checkpoint "$dir/ck" --prompt "hi" --max-tokens 3 --json)
for key in prompt_token_ids token_ids text finish_reason version_spans; do
  grep -q "\"$key\"" <<<"$json" || { echo "FAIL: --json lacks $key: $json"; exit 1; }
done
grep -q '"prompt_token_ids":\[256,104,105\]' <<<"$json" || { echo "FAIL: prompt ids: $json"; exit 1; }
s1=$("$rlsync" generate --checkpoint "$dir/ck" --prompt "hi" --max-tokens 8 --temperature 0.8 --seed 5 --no-stop --json | sed -n 's/.*"token_ids":\(\[[^]]*\]\).*/\1/p')
s2=$("$rlsync" generate --checkpoint "$dir/ck" --prompt "hi" --max-tokens 8 --temperature 0.8 --seed 5 --no-stop --json | sed -n 's/.*"token_ids":\(\[[^]]*\]\).*/\1/p')
[ "$s1" = "$s2" ] || { echo "FAIL: seeded sampling is not reproducible"; exit 1; }

expect_exit() { # CODE PATTERN ARGS...
  local code=$1 pattern=$2; shift 2
  set +e; out=$("$rlsync" "$@" 2>&1); rc=$?; set -e
  [ "$rc" -eq "$code" ] || { echo "FAIL: '$*' exited $rc, expected $code: $out"; exit 1; }
  grep -q -- "$pattern" <<<"$out" || { echo "FAIL: '$*' did not say '$pattern': $out"; exit 1; }
}
expect_exit 2 "--tp" generate --checkpoint "$dir/ck" --prompt x --tp 3
expect_exit 2 "--tp: must divide moe_intermediate_size (30)" generate --checkpoint "$dir/moe" --prompt x --tp 4
expect_exit 2 "--expert-parallel: expert parallelism needs a mixture-of-experts model" \
  generate --checkpoint "$dir/ck" --prompt x --tp 2 --expert-parallel
"$rlsync" checkpoint make --out "$dir/two" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --arch qwen3_moe \
  --experts 2 --moe-intermediate 32 --seed 3 >/dev/null
expect_exit 2 "--tp: with expert parallelism must be at most num_experts (2)" \
  generate --checkpoint "$dir/two" --prompt x --tp 4 --expert-parallel
expect_exit 2 "--weights: expected received or int8, got 'fp8'" generate --checkpoint "$dir/ck" --prompt x --weights fp8
expect_exit 2 "--temperature" generate --checkpoint "$dir/ck" --prompt x --temperature -1
expect_exit 2 "--temperature: must be in .0, 100." generate --checkpoint "$dir/ck" --prompt x --temperature 1e39
expect_exit 2 "--top-p: must be in (0, 1]" generate --checkpoint "$dir/ck" --prompt x --top-p 1e-50
expect_exit 2 "--prompt" generate --checkpoint "$dir/ck"
expect_exit 2 "unknown flag" generate --checkpoint "$dir/ck" --prompt x --bogus
expect_exit 1 "config.json" generate --checkpoint "$dir/missing" --prompt x

out=$("$rlsync" bench engine --layers 2 --hidden 64 --heads 4 --kv-heads 2 --intermediate 128 --tp 1,2 --batch 1,4 --steps 4 --prompt 32)
grep -q "decode batch   4" <<<"$out" || { echo "FAIL: bench engine printed no decode figure: $out"; exit 1; }
expect_exit 2 "--tp" bench engine --layers 2 --hidden 64 --heads 4 --kv-heads 2 --intermediate 128 --tp 3
echo ok
