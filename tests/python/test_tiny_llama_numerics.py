"""TinyLlama's greedy decode equals rlsync's engine, token for token, and its logits within 1e-4.

Usage: python3 tools/python/tests/test_tiny_llama_numerics.py BUILD_DIR

Builds random tiny models (untied GQA, tied multi-query, one whose EOS row is
steered so that greedy decoding ends on EOS, two Qwen3s: per-head q/k
norms, a head_dim that is not hidden / heads, and a Qwen3-MoE: a dense and a
sparse layer of 8 experts, 2 per token), rounds them to bf16, writes each
as a Hugging Face checkpoint directory, runs ``BUILD_DIR/rlsync generate
--json`` greedily (tensor-parallel 1 and 2, the portable kernels, and for the
MoE model expert parallelism over 2 workers) on several prompts and asserts
that the prompt's token ids and the generated ones equal TinyLlama's, which
decodes with the bf16 weights widened to fp32, as the engine does, and that
the logits of every prompt position (``--logits``) are within 1e-4 of the
largest of TinyLlama's.

Exit 0: pass; 1: a mismatch or an error (each printed); 77: torch is missing
(ctest's skip code); 2: bad usage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "python", "examples"))

SKIP = 77
GENERATE_TIMEOUT_S = 120
MAX_TOKENS = 24
# (tensor-parallel size, RLSYNC_KERNELS, expert parallelism): the default kernels at tp 1 and 2, the
# portable ones at tp 1, and (mixture-of-experts models only) whole experts over 2 workers.
ENGINE_RUNS = [(1, None, False), (2, None, False), (1, "baseline", False), (2, None, True)]
# max |logit difference| / max |logit| of every prompt position, engine against TinyLlama.
LOGITS_TOLERANCE = 1e-4
PROMPTS = ["hello", "The quick brown fox", "h\u00e9llo w\u00f6rld \u2603", "a", "0123456789" * 3]


def find_rlsync(build_dir: str) -> str:
    for candidate in (os.path.join(build_dir, "rlsync"), os.path.join(build_dir, "tools", "rlsync")):
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit(f"test_tiny_llama_numerics: no rlsync executable in {build_dir} or {build_dir}/tools "
                     "(build it: ninja -C BUILD_DIR rlsync)")


def engine_generate(rlsync: str, checkpoint: str, prompt: str, max_tokens: int, tp: int, stop: bool,
                    kernels: str | None, extra: list[str] | None = None) -> dict:
    cmd = [rlsync, "generate", "--checkpoint", checkpoint, "--prompt", prompt, "--max-tokens", str(max_tokens),
           "--tp", str(tp), "--json"] + ([] if stop else ["--no-stop"]) + (extra or [])
    env = dict(os.environ)
    env.pop("RLSYNC_KERNELS", None)
    if kernels:
        env["RLSYNC_KERNELS"] = kernels  # the engine's portable kernels instead of AVX2
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"{' '.join(cmd)}: output is not one JSON object ({e}): {r.stdout[:200]!r}")


def top2_margin(model, ids: list[int], generated: list[int]) -> float:
    """The smallest gap between the best and second-best logit over the generated steps."""
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([ids + generated[:-1]]))[0, len(ids) - 1:]
        best2 = logits.topk(2, dim=-1).values
        return float((best2[:, 0] - best2[:, 1]).min())


def steer_eos(tl, state: dict, config, prompt: str, step: int) -> dict:
    """A copy of `state` whose EOS output row wins, by a wide margin, at `step` of greedy decoding `prompt`."""
    import torch
    model = tl.model_from_state(state, config)
    ids = tl.encode(prompt)
    generated = tl.greedy_decode(model, ids, step, stop_at_eos=False)
    context = torch.tensor([ids + generated[:step - 1]])
    with torch.no_grad():
        h = model.final_hidden(context)[0, -1]
        top = float(model(context)[0, -1].max())
    out = dict(state)
    name = "model.embed_tokens.weight" if tl.as_config(config).tie_word_embeddings else "lm_head.weight"
    weight = state[name].clone()
    weight[tl.TOKEN_EOS] = (h * ((abs(top) + 4.0) / float(h.dot(h)))).to(weight.dtype)
    out[name] = weight
    return out


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as e:
        print(f"SKIP test_tiny_llama_numerics: PyTorch is not importable by {sys.executable} ({e}); "
              "install python3-torch and run it with /usr/bin/python3")
        return SKIP
    import tiny_llama as tl

    rlsync = find_rlsync(sys.argv[1])
    base = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=128)
    # (name, config, how the bf16 state is changed, whether greedy decoding must end on EOS)
    variants = [
        ("untied-gqa", dict(base, num_key_value_heads=2), None, False),
        # Tied multi-query; 40 positions: the 31-token prompt stops at the context limit.
        ("tied-mqa", dict(base, num_key_value_heads=1, tie_word_embeddings=True, rms_norm_eps=1e-6,
                          rope_theta=500000.0, max_position_embeddings=40), None, False),
        ("untied-eos", dict(base, num_key_value_heads=2), ("hello", 5), True),
        ("tied-eos", dict(base, num_key_value_heads=2, tie_word_embeddings=True), ("a", 3), True),
        # Qwen3: per-head q/k norms, head_dim not hidden / heads (q wider than the hidden state).
        ("qwen3-gqa", dict(base, num_key_value_heads=2, model_type="qwen3", head_dim=24), None, False),
        ("qwen3-tied-mqa", dict(base, num_key_value_heads=1, tie_word_embeddings=True, model_type="qwen3",
                                head_dim=32), None, False),
        # Qwen3-MoE: layer 0 dense, layer 1 eight experts of 32, two per token, renormalised.
        ("qwen3-moe", dict(base, num_key_value_heads=2, model_type="qwen3_moe", head_dim=24, num_experts=8,
                           num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                           mlp_only_layers=[0]), None, False),
    ]
    failures, checked, min_margin, worst_logits = [], 0, float("inf"), 0.0
    with tempfile.TemporaryDirectory(prefix="rlsync-tiny-llama-") as tmp:
        for seed, (name, config, steer, must_end_on_eos) in enumerate(variants):
            torch.manual_seed(1000 + seed)
            # std 0.2 rather than HF's 0.02: logits far apart, so the argmax does not
            # hang on summation order (the engine's kernels sum in another order).
            model = tl.TinyLlama(config, initializer_range=0.2)
            state = tl.bf16_state_dict(model)
            for norm in [n for n in state if n.endswith(("q_norm.weight", "k_norm.weight"))]:
                # Qwen3's head norms start at 1 in HF's init: make q's and k's differ, so a swap shows.
                state[norm] = (1.0 + 0.4 * (torch.rand(state[norm].shape) - 0.5)).to(torch.bfloat16)
            if steer:
                state = steer_eos(tl, state, config, *steer)
            ckpt = os.path.join(tmp, name)
            tl.write_checkpoint(ckpt, state, config)
            widened = tl.model_from_state(state, config)
            ended_on_eos = False
            for prompt in PROMPTS:
                prompt_ids = tl.encode(prompt)
                for stop in (True, False) if steer else (True,):
                    want = tl.greedy_decode(widened, prompt_ids, MAX_TOKENS, stop_at_eos=stop)
                    if stop and want[-1] == tl.TOKEN_EOS:
                        ended_on_eos = True
                    min_margin = min(min_margin, top2_margin(widened, prompt_ids, want))
                    for tp, kernels, ep in ENGINE_RUNS:
                        if ep and "num_experts" not in config:
                            continue
                        label = f"{name} tp={tp}{' ' + kernels if kernels else ''}{' ep' if ep else ''} " \
                                f"stop_at_eos={stop} prompt={prompt!r}"
                        logits_file = os.path.join(tmp, "logits.f32")
                        try:
                            got = engine_generate(rlsync, ckpt, prompt, MAX_TOKENS, tp, stop, kernels,
                                                  (["--expert-parallel"] if ep else [])
                                                  + ["--logits", logits_file])
                        except (RuntimeError, subprocess.TimeoutExpired) as e:
                            failures.append(f"{label}: {e}")
                            continue
                        # Every prompt position's logits against TinyLlama's, in fp32.
                        with open(logits_file, "rb") as f:
                            engine_logits = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
                        with torch.no_grad():
                            ref = widened(torch.tensor([prompt_ids]))[0].float()
                        if engine_logits.numel() != ref.numel():
                            failures.append(f"{label}: --logits wrote {engine_logits.numel()} floats, "
                                            f"expected {ref.numel()}")
                        else:
                            ratio = float((engine_logits.view_as(ref) - ref).abs().max() / ref.abs().max())
                            worst_logits = max(worst_logits, ratio)
                            if not ratio <= LOGITS_TOLERANCE:
                                failures.append(f"{label}: max |dlogit| / max |logit| = {ratio:.3g} > "
                                                f"{LOGITS_TOLERANCE}")
                        checked += 1
                        if got.get("prompt_token_ids") != prompt_ids:
                            failures.append(f"{label}: prompt ids: engine {got.get('prompt_token_ids')}, "
                                            f"TinyLlama {prompt_ids}")
                        engine_ids = got.get("token_ids")
                        if engine_ids != want:
                            at = next((i for i, (a, b) in enumerate(zip(engine_ids or [], want)) if a != b),
                                      min(len(engine_ids or []), len(want)))
                            failures.append(f"{label}: differs at token {at}:\n  engine    {engine_ids}\n"
                                            f"  TinyLlama {want}")
                        else:
                            reason = "eos" if stop and want[-1] == tl.TOKEN_EOS else "length"
                            if got.get("finish_reason") != reason:
                                failures.append(f"{label}: finish_reason {got.get('finish_reason')!r}, "
                                                f"expected {reason!r}")
                            print(f"ok  {label}: {len(want)} tokens, finish {reason}")
            if must_end_on_eos and not ended_on_eos:
                failures.append(f"{name}: no prompt ended on EOS: the stop rule went unchecked")
        # The tied-mqa prompt of 31 tokens must have stopped at max_position_embeddings (40).
        long_ids = tl.encode(PROMPTS[-1])
        tied = tl.model_from_state(tl.bf16_state_dict(tl.TinyLlama(variants[1][1])), variants[1][1])
        if len(tl.greedy_decode(tied, long_ids, MAX_TOKENS, stop_at_eos=False)) != 40 - len(long_ids):
            failures.append("greedy_decode does not stop at max_position_embeddings")

    # A Qwen3-MoE's explicit head_dim survives config.json (Qwen3-30B-A3B: 128, hidden / heads 64), and a
    # rank holding some experts publishes its layers' dense tensors and only those experts.
    moe_config = variants[-1][1]
    if tl.LlamaConfig.from_dict(tl.as_config(moe_config).to_dict()).dim_per_head != 24:
        failures.append("LlamaConfig.from_dict drops a qwen3_moe head_dim")
    low = tl.names_of_layers(moe_config, [0, 1], experts=[0, 1, 2, 3])
    if "model.layers.1.mlp.experts.4.up_proj.weight" in low or "model.layers.1.mlp.experts.3.up_proj.weight" not in low \
            or "model.layers.1.mlp.gate.weight" not in low or "model.layers.0.mlp.up_proj.weight" not in low:
        failures.append("names_of_layers with experts: wrong tensors")
    # Each trainer rank publishes its layers' tensors: embedding with layer 0, norm and lm_head with the last.
    untied, tied = variants[0][1], variants[1][1]
    halves = [tl.names_of_layers(untied, [0]), tl.names_of_layers(untied, [1])]
    if sorted(halves[0] + halves[1]) != sorted(tl.expected_names(untied)) or set(halves[0]) & set(halves[1]):
        failures.append(f"names_of_layers: halves do not partition the parameters: {halves}")
    if "model.embed_tokens.weight" not in halves[0] or "lm_head.weight" not in halves[1] \
            or "model.norm.weight" not in halves[1] or "lm_head.weight" in tl.names_of_layers(tied, [1]):
        failures.append(f"names_of_layers: embedding, norm or lm_head in the wrong half: {halves}")
    print(f"{checked} engine runs compared; smallest top-2 logit gap in TinyLlama's decodes: {min_margin:.4g}; "
          f"worst max |dlogit| / max |logit| over the prompts: {worst_logits:.3g} (at most {LOGITS_TOLERANCE})")
    if failures:
        print(f"FAIL test_tiny_llama_numerics: {len(failures)} problem(s):")
        for f in failures:
            print("  " + f)
        return 1
    print("PASS test_tiny_llama_numerics: TinyLlama's greedy tokens equal rlsync generate's, and so do the "
          "prompts' logits within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
