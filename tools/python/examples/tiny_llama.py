"""A small Llama, Qwen3 or Qwen3-MoE decoder in plain PyTorch, numerically matched to rlsync's engine.

The parameter names are Hugging Face's (LlamaForCausalLM, Qwen3ForCausalLM),
so ``state_dict()`` is exactly what rlsync loads from a checkpoint or takes
through ``TrainerRank.publish``::

    model.embed_tokens.weight                      [vocab, hidden]
    model.layers.{i}.input_layernorm.weight        [hidden]
    model.layers.{i}.self_attn.q_proj.weight       [heads * head_dim, hidden]
    model.layers.{i}.self_attn.k_proj.weight       [kv_heads * head_dim, hidden]
    model.layers.{i}.self_attn.v_proj.weight       [kv_heads * head_dim, hidden]
    model.layers.{i}.self_attn.o_proj.weight       [hidden, heads * head_dim]
    model.layers.{i}.self_attn.q_norm.weight       [head_dim]  (qwen3 only)
    model.layers.{i}.self_attn.k_norm.weight       [head_dim]  (qwen3 only)
    model.layers.{i}.post_attention_layernorm.weight [hidden]
    model.layers.{i}.mlp.gate_proj.weight          [intermediate, hidden]
    model.layers.{i}.mlp.up_proj.weight            [intermediate, hidden]
    model.layers.{i}.mlp.down_proj.weight          [hidden, intermediate]
    model.norm.weight                              [hidden]
    lm_head.weight                                 [vocab, hidden]  (absent when tied)

Numerics, as the engine computes them (everything in fp32; bf16 weights are
widened to fp32 exactly, so decoding with bf16-rounded weights reproduces what
an engine serving those weights computes, up to summation order):

* RMSNorm: ``weight * (x * rsqrt(mean(x^2) + eps))``, eps = rms_norm_eps.
* Rotary embedding, rotate-half layout: dimension i pairs with i + head_dim/2;
  ``inv_freq[i] = 1 / rope_theta^(2i / head_dim)``; positions count from 0,
  and the first prompt token (BOS when the prompt came from text) is
  position 0.
* Qwen3 (``model_type="qwen3"``): head_dim may differ from hidden / heads, and
  each q and k head goes through its own RMSNorm (q_norm, k_norm, over
  head_dim) before the rotary embedding, as Hugging Face's Qwen3Attention.
* Qwen3-MoE (``model_type="qwen3_moe"``): Qwen3's attention; in sparse layers
  ((i + 1) % decoder_sparse_step == 0, i not in mlp_only_layers) the MLP is a
  router ``mlp.gate`` and ``num_experts`` SwiGLU experts
  (``mlp.experts.{e}.{gate,up,down}_proj``): softmax over all experts in fp32,
  the top ``num_experts_per_tok``, renormalised when ``norm_topk_prob``, the
  experts' outputs weighted and added in ascending expert order.
* Attention: grouped-query (q head h reads kv head h // (heads / kv_heads)),
  scores ``q.k * head_dim^-0.5``, causal, softmax in fp32.
* MLP: ``down(silu(gate(x)) * up(x))``. No biases anywhere.
* Tokenizer: byte-level, ids 0..255 are bytes, BOS = 256, EOS = 257
  (vocab_size >= 258). Text prompts get a BOS in front; prompts given as
  token ids are used as they are.
* Greedy: argmax of the last position's logits, the lowest id on a tie. The
  generated EOS is part of the output and ends generation (unless told not
  to stop); generation also ends at max_tokens or when the context reaches
  max_position_embeddings.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from typing import Iterable, Mapping, Optional, Sequence, Union

import torch
from torch import nn
import torch.nn.functional as F

TOKEN_BOS = 256
TOKEN_EOS = 257
MIN_VOCAB_SIZE = 258


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """The config.json fields rlsync reads, with Hugging Face's names and rlsync's defaults."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    head_dim: int | None = None  # qwen3 may set it; else hidden_size / num_attention_heads
    # qwen3_moe (Hugging Face's Qwen3MoeConfig names and defaults)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple = ()

    def __post_init__(self):
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.model_type not in ("llama", "qwen3", "qwen3_moe"):
            raise ValueError(f"model config: model_type: expected llama, qwen3 or qwen3_moe, got {self.model_type!r}")
        if self.head_dim is not None and not self.qk_norm:
            raise ValueError("model config: head_dim: only qwen3 and qwen3_moe models may set it")
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        if self.model_type == "qwen3_moe" and not (0 < self.num_experts_per_tok <= self.num_experts
                                                    and self.moe_intermediate_size > 0):
            raise ValueError("model config: qwen3_moe needs 0 < num_experts_per_tok <= num_experts and a positive "
                             "moe_intermediate_size")
        problems = []
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name}: expected a positive integer, got {value!r}")
        if problems:
            raise ValueError("model config: " + "; ".join(problems))
        if self.vocab_size < MIN_VOCAB_SIZE:
            problems.append(f"vocab_size: must be at least {MIN_VOCAB_SIZE} (bytes, BOS, EOS), "
                            f"got {self.vocab_size}")
        if self.head_dim is not None:
            if not isinstance(self.head_dim, int) or self.head_dim <= 0 or self.head_dim % 2:
                problems.append(f"head_dim: expected a positive even integer, got {self.head_dim!r}")
        elif self.hidden_size % self.num_attention_heads:
            problems.append(f"num_attention_heads: must divide hidden_size ({self.hidden_size}), "
                            f"got {self.num_attention_heads}")
        elif (self.hidden_size // self.num_attention_heads) % 2:
            problems.append(f"hidden_size / num_attention_heads: head_dim "
                            f"{self.hidden_size // self.num_attention_heads} must be even for rotary embeddings")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"num_key_value_heads: must divide num_attention_heads "
                            f"({self.num_attention_heads}), got {self.num_key_value_heads}")
        if not (self.rms_norm_eps > 0 and math.isfinite(self.rms_norm_eps)):
            problems.append(f"rms_norm_eps: expected a positive number, got {self.rms_norm_eps!r}")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            problems.append(f"rope_theta: expected a positive number, got {self.rope_theta!r}")
        if problems:
            raise ValueError("model config: " + "; ".join(problems))

    @property
    def dim_per_head(self) -> int:
        """head_dim as the model uses it: the explicit one (qwen3), else hidden_size / num_attention_heads."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def qk_norm(self) -> bool:
        return self.model_type in ("qwen3", "qwen3_moe")

    def sparse_layer(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is a mixture of experts (Hugging Face's rule)."""
        return (self.model_type == "qwen3_moe" and self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @classmethod
    def from_dict(cls, d: Mapping) -> "LlamaConfig":
        """From a config.json-style mapping; unknown keys (HF writes many) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [n for n in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if n not in d]
        if missing:
            raise ValueError("model config: missing " + ", ".join(missing))
        fields = {k: v for k, v in d.items() if k in names and v is not None}
        if fields.get("model_type", "llama") not in ("qwen3", "qwen3_moe"):
            fields.pop("head_dim", None)  # a Llama's is hidden / heads (newer transformers write it too)
        return cls(**fields)

    def to_dict(self) -> dict:
        """config.json fields, as transformers writes them for LlamaForCausalLM or Qwen3ForCausalLM."""
        arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM"}[self.model_type]
        out = {"architectures": [arch], "model_type": self.model_type, "hidden_act": "silu"}
        fields = dataclasses.asdict(self)
        del fields["model_type"], fields["head_dim"]
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                     "decoder_sparse_step", "mlp_only_layers"):
            if self.model_type != "qwen3_moe":
                del fields[name]
        if self.model_type == "qwen3_moe":
            fields["mlp_only_layers"] = list(self.mlp_only_layers)
        out.update(fields)
        out.update({"bos_token_id": TOKEN_BOS, "eos_token_id": TOKEN_EOS})
        if self.qk_norm:
            out.update({"head_dim": self.dim_per_head, "attention_bias": False})
        return out


def as_config(config: Union[LlamaConfig, Mapping]) -> LlamaConfig:
    return config if isinstance(config, LlamaConfig) else LlamaConfig.from_dict(config)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        return self.weight.float() * (x32 * torch.rsqrt(variance + self.eps))


def rotary_tables(config: LlamaConfig, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, [positions, head_dim], each half repeated (rotate-half layout), fp32."""
    hd = config.dim_per_head
    # As the engine: inv_freq in fp32 from a fp32 theta, then position * inv_freq in fp32.
    theta = torch.tensor(config.rope_theta, dtype=torch.float32)
    inv_freq = 1.0 / torch.pow(theta, torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    freqs = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.dim_per_head
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        if config.qk_norm:  # Qwen3: one RMSNorm over each head's head_dim values
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        if self.qk_norm:  # before the rotary embedding, as Qwen3Attention
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads
        if group > 1:  # q head h reads kv head h // group, as HF's repeat_kv
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * (self.head_dim ** -0.5)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    """SwiGLU: a dense layer's MLP, or (intermediate_size = moe_intermediate_size) one expert."""

    def __init__(self, config: LlamaConfig, intermediate_size: Optional[int] = None):
        super().__init__()
        h, i = config.hidden_size, intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(nn.Module):
    """Qwen3MoeSparseMoeBlock: a router over all experts, the top k per token, weighted and summed."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(config, config.moe_intermediate_size) for _ in range(config.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        flat = x.reshape(-1, h)
        probs = torch.softmax(self.gate(flat).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):  # ascending expert order, as Hugging Face's loop
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, expert(flat[rows]) * weights[rows, slot, None].to(flat.dtype))
        return out.reshape(b, t, h)


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SparseMoE(config) if config.sparse_layer(layer) else MLP(config)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class TinyLlama(nn.Module):
    """LlamaForCausalLM's structure and names; ``forward(ids [B, T]) -> logits [B, T, vocab]`` (fp32)."""

    def __init__(self, config: Union[LlamaConfig, Mapping], initializer_range: float = 0.02):
        super().__init__()
        self.config = as_config(config)
        self.model = LlamaModel(self.config)
        if not self.config.tie_word_embeddings:
            self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        self.reset_parameters(initializer_range)

    def reset_parameters(self, std: float) -> None:
        """HF's initialisation: matrices ~ N(0, std), norm weights 1."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, std)

    def output_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def final_hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The normed last hidden states [B, T, hidden]: what the output projection multiplies."""
        t = ids.shape[-1]
        if t > self.config.max_position_embeddings:
            raise ValueError(f"TinyLlama: {t} positions exceed max_position_embeddings "
                             f"({self.config.max_position_embeddings})")
        cos, sin = rotary_tables(self.config, t)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.linear(self.final_hidden(ids), self.output_weight())


# -- weights ---------------------------------------------------------------------------

def bf16_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A bf16 copy of the weights (round to nearest even), contiguous on the CPU: what to publish."""
    return {name: t.detach().to(device="cpu", dtype=torch.bfloat16).contiguous().clone()
            for name, t in model.state_dict().items()}


def expected_names(config: Union[LlamaConfig, Mapping]) -> list[str]:
    """The parameter names rlsync's engine loads for this config, in checkpoint order."""
    c = as_config(config)
    names = ["model.embed_tokens.weight"]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight"]
        if c.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names.append(p + "post_attention_layernorm.weight")
        if c.sparse_layer(i):
            names.append(p + "mlp.gate.weight")
            for e in range(c.num_experts):
                names += [f"{p}mlp.experts.{e}.{m}_proj.weight" for m in ("gate", "up", "down")]
        else:
            names += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
    names.append("model.norm.weight")
    if not c.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def names_of_layers(config: Union[LlamaConfig, Mapping], layers: Iterable[int],
                    experts: Optional[Iterable[int]] = None) -> list[str]:
    """The parameters a trainer rank holding `layers` publishes, in checkpoint order.

    As rlsync groups parameters: the embedding travels with layer 0, the final
    norm and lm_head with the last layer, the rest with their own layer. With
    `experts` (a topology's trainer.ranks[].experts) a sparse layer's experts
    are only those; its router and dense tensors stay.
    """
    c = as_config(config)
    held = set()
    for layer in layers:
        if not 0 <= layer < c.num_hidden_layers:
            raise ValueError(f"layer {layer} outside the model's {c.num_hidden_layers} layers")
        held.add(layer)
    last = c.num_hidden_layers - 1

    def group(name: str) -> int:
        if name == "model.embed_tokens.weight":
            return 0
        if name in ("model.norm.weight", "lm_head.weight"):
            return last
        return int(name.split(".")[2])

    kept = None if experts is None else set(experts)

    def expert_held(name: str) -> bool:
        parts = name.split(".")  # model.layers.N.mlp.experts.E.<proj>.weight
        if kept is None or len(parts) < 7 or parts[3:5] != ["mlp", "experts"] or not parts[5].isdigit():
            return True
        return int(parts[5]) in kept

    return [n for n in expected_names(c) if group(n) in held and expert_held(n)]


def model_from_state(state: Mapping[str, torch.Tensor], config: Union[LlamaConfig, Mapping]) -> TinyLlama:
    """An fp32 TinyLlama holding `state` widened to fp32 (exact for bf16 and f16), as the engine loads it."""
    model = TinyLlama(config)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"state dict does not fit the config: missing {missing[:4]}, unexpected {unexpected[:4]}")
    with torch.no_grad():
        for name, dest in own.items():
            src = state[name]
            if tuple(src.shape) != tuple(dest.shape):
                raise ValueError(f"{name}: shape {tuple(src.shape)}, the config implies {tuple(dest.shape)}")
            dest.copy_(src.detach().to(device="cpu", dtype=torch.float32))
    return model.eval()


# -- tokenizer and greedy decoding -----------------------------------------------------

def encode(text: Union[str, bytes]) -> list[int]:
    """rlsync's byte-level tokenizer: BOS, then one id per UTF-8 byte."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return [TOKEN_BOS] + list(data)


def decode(ids: Iterable[int]) -> bytes:
    """Bytes of the ids below 256 (BOS, EOS and ids past 257 have no text)."""
    return bytes(t for t in ids if 0 <= t < 256)


def argmax_lowest(logits: torch.Tensor) -> int:
    """The engine's greedy rule: the largest logit, the lowest id on a tie."""
    top = logits.max()
    return int(torch.nonzero(logits == top)[0, 0])


@torch.no_grad()
def greedy_decode(model_or_state: Union[TinyLlama, Mapping[str, torch.Tensor]], prompt_ids: Sequence[int],
                  max_tokens: int, config: Union[LlamaConfig, Mapping, None] = None,
                  stop_at_eos: bool = True) -> list[int]:
    """The tokens an rlsync engine generates greedily after `prompt_ids` (used as given: no BOS added).

    `model_or_state` is a TinyLlama (its weights used as they are, fp32 math)
    or a state dict of any float dtype with `config`: widened to fp32, as the
    engine does with published bf16 weights. Generation stops after EOS (EOS
    included) when `stop_at_eos`, after `max_tokens`, or when the context
    reaches max_position_embeddings. Full recompute each step: the models are tiny.
    """
    if isinstance(model_or_state, TinyLlama):
        model = model_or_state
    else:
        if config is None:
            raise ValueError("greedy_decode: a state dict needs its config")
        model = model_from_state(model_or_state, config)
    c = model.config
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("greedy_decode: empty prompt")
    for i, t in enumerate(ids):
        if not 0 <= t < c.vocab_size:
            raise ValueError(f"greedy_decode: prompt[{i}]: token id {t} outside the vocabulary [0, {c.vocab_size})")
    if len(ids) >= c.max_position_embeddings:
        raise ValueError(f"greedy_decode: a prompt of {len(ids)} tokens leaves no room under "
                         f"max_position_embeddings ({c.max_position_embeddings})")
    if max_tokens < 1:
        raise ValueError(f"greedy_decode: max_tokens must be at least 1, got {max_tokens}")
    was_training = model.training
    model.eval()
    out: list[int] = []
    try:
        while True:
            logits = model(torch.tensor([ids], dtype=torch.long))[0, -1].float()
            if not torch.isfinite(logits).all():
                raise FloatingPointError(f"greedy_decode: non-finite logits after {len(out)} tokens")
            token = argmax_lowest(logits)
            out.append(token)
            ids.append(token)
            if (token == TOKEN_EOS and stop_at_eos) or len(out) >= max_tokens \
                    or len(ids) >= c.max_position_embeddings:
                return out
    finally:
        model.train(was_training)


# -- Hugging Face checkpoint directory (config.json + model.safetensors) ---------------

_SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def write_safetensors(path: str, tensors: Mapping[str, torch.Tensor]) -> None:
    """Writes safetensors by hand (Debian packages no safetensors for Python).

    Layout: 8-byte little-endian header length, a JSON header (padded with
    spaces to 8 bytes, as the reference writer does) mapping each name to
    dtype, shape and [begin, end) data offsets, then the tensors' bytes.
    """
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} is not one of bf16, f16, f32")
        t = t.detach().to("cpu").contiguous()
        # numpy has no bf16: view the bytes as int16 (same width) to get them.
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def write_checkpoint(directory: str, state: Mapping[str, torch.Tensor],
                     config: Union[LlamaConfig, Mapping]) -> None:
    """A Hugging Face checkpoint directory rlsync reads: config.json and model.safetensors."""
    c = as_config(config)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(c.to_dict(), f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(directory, "model.safetensors"),
                      {name: state[name] for name in expected_names(c)})
