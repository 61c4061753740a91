#pragma once
// Test weights generated in memory from a seed, tiny model shapes, and an
// independent reference implementation of LlamaForCausalLM's and
// Qwen3ForCausalLM's forward pass.
#include "runtime/base/dtype.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/engine/loader.hpp"
#include "runtime/engine/model.hpp"

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rlsync::test {

inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// A small seeded generator (splitmix64), uniform floats in [-1, 1).
struct prng {
  std::uint64_t state;
  explicit prng(std::uint64_t seed) : state(seed) {}
  float uniform() {
    state = mix64(state);
    return static_cast<float>(static_cast<double>(state >> 40) / double(1ull << 24) * 2.0 - 1.0);
  }
};

/// A 2-layer model small enough for naive loops.
inline model_config tiny_config(std::int64_t heads = 4, std::int64_t kv_heads = 2, bool tied = false) {
  model_config c;
  c.vocab_size = 301; // not a multiple of tp: the last vocab shard is shorter
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  return c;
}

/// tiny_config as a Qwen3: q/k head norms, and a head_dim (24) that is not
/// hidden / heads, so q is wider than the hidden state.
inline model_config tiny_qwen3_config(std::int64_t heads = 4, std::int64_t kv_heads = 2, bool tied = false,
                                      std::int64_t head_dim = 24) {
  model_config c = tiny_config(heads, kv_heads, tied);
  c.arch = model_arch::qwen3;
  c.explicit_head_dim = head_dim;
  return c;
}

/// tiny_qwen3_config as a Qwen3-MoE: 8 experts of intermediate 32, 2 per
/// token; layer 0 dense (mlp_only_layers), layer 1 sparse.
inline model_config tiny_moe_config(std::int64_t kv_heads = 2, bool norm_topk_prob = true, bool fused = false) {
  model_config c = tiny_qwen3_config(4, kv_heads);
  c.fused_experts = fused;
  c.arch = model_arch::qwen3_moe;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.norm_topk_prob = norm_topk_prob;
  c.mlp_only_layers = {0};
  return c;
}

/// The same with `experts` experts (6: placed 2, 2, 1, 1 over four workers).
inline model_config tiny_moe_config_with(std::int64_t experts, bool fused = false) {
  model_config c = tiny_moe_config(2, true, fused);
  c.num_experts = experts;
  return c;
}

/// A checkpoint's tensors, in memory, in one dtype.
struct source_weights {
  model_config config;
  dtype type = dtype::bf16;
  std::vector<tensor_spec> specs;
  std::map<std::string, std::vector<unsigned char>> bytes;

  const void* data(const std::string& name) const { return bytes.at(name).data(); }

  /// Views for engine::load_weights (valid while this lives).
  std::vector<rlsync::tensor_view> views() const {
    std::vector<rlsync::tensor_view> out;
    for (const auto& s : specs) {
      rlsync::tensor_view v;
      static_cast<tensor_spec&>(v) = s;
      v.data = reinterpret_cast<const std::byte*>(bytes.at(s.name).data());
      v.size = bytes.at(s.name).size();
      out.push_back(v);
    }
    return out;
  }

  /// A tensor as fp32 (after the dtype's rounding).
  std::vector<float> f32(const std::string& name) const {
    const auto& b = bytes.at(name);
    std::vector<float> out(b.size() / dtype_size(type));
    convert_to_f32(type, b.data(), out.data(), out.size());
    return out;
  }

  std::shared_ptr<engine::weight_set> load(int tp, bool expert_parallel = false) const {
    auto set = engine::weight_set::make(config, tp, type, expert_parallel);
    engine::load_weights(views(), *set);
    return set;
  }
};

/// Seeded weights: norms 1 + noise, matrices with standard deviation about
/// 1/sqrt(fan in) (embeddings: 1) so activations keep unit scale and the
/// logits are spread out enough for greedy decoding to be interesting.
inline source_weights make_source(const model_config& c, dtype type, std::uint64_t seed) {
  source_weights s;
  s.config = c;
  s.type = type;
  s.specs = llama_parameter_specs(c, type);
  for (const auto& spec : s.specs) {
    prng g(mix64(seed) ^ std::hash<std::string>{}(spec.name));
    std::vector<float> v(static_cast<std::size_t>(spec.numel()));
    const bool norm = spec.shape.size() == 1;
    const bool embed = spec.name == "model.embed_tokens.weight" || spec.name == "lm_head.weight";
    const float scale = embed ? 1.7f : 1.7f / std::sqrt(static_cast<float>(spec.shape.back()));
    for (auto& x : v)
      x = norm ? 1.0f + 0.2f * g.uniform() : scale * g.uniform();
    auto& b = s.bytes[spec.name];
    b.resize(static_cast<std::size_t>(spec.bytes()));
    convert_from_f32(type, v.data(), b.data(), v.size());
  }
  return s;
}

/// LlamaForCausalLM's (and Qwen3ForCausalLM's: q/k head norms before the
/// rotary embedding, an explicit head_dim) forward pass over a whole
/// sequence, written from the Hugging Face code with naive loops and double
/// accumulators, sharing nothing with the engine: logits of every position,
/// [T][vocab].
inline std::vector<std::vector<float>> reference_logits(const source_weights& w,
                                                        const std::vector<std::int32_t>& tokens) {
  using mat = std::vector<std::vector<double>>;
  const auto& c = w.config;
  const std::size_t T = tokens.size(), D = c.hidden_size, H = c.num_attention_heads, KV = c.num_key_value_heads,
                    hd = c.explicit_head_dim > 0 ? std::size_t(c.explicit_head_dim) : D / H,
                    I = c.intermediate_size, V = c.vocab_size;
  auto zeros = [](std::size_t rows, std::size_t cols) { return mat(rows, std::vector<double>(cols)); };
  auto linear = [&](const mat& x, const std::string& name, std::size_t out, std::size_t in) {
    auto W = w.f32(name); // [out, in]
    mat y = zeros(x.size(), out);
    for (std::size_t t = 0; t < x.size(); ++t)
      for (std::size_t o = 0; o < out; ++o)
        for (std::size_t i = 0; i < in; ++i)
          y[t][o] += x[t][i] * W[o * in + i];
    return y;
  };
  // RMSNorm over `n` values at v with weights g.
  auto rmsnorm_span = [&](double* v, const std::vector<float>& g, std::size_t n) {
    double ss = 0;
    for (std::size_t i = 0; i < n; ++i)
      ss += v[i] * v[i];
    const double r = 1.0 / std::sqrt(ss / double(n) + c.rms_norm_eps);
    for (std::size_t i = 0; i < n; ++i)
      v[i] = g[i] * (v[i] * r);
  };
  auto rmsnorm = [&](const mat& x, const std::string& name) {
    auto g = w.f32(name);
    mat y = x;
    for (auto& row : y)
      rmsnorm_span(row.data(), g, D);
    return y;
  };
  // rotate_half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), inv_freq = theta^(-2i/d).
  auto rope = [&](double* v, std::size_t pos) {
    for (std::size_t i = 0; i < hd / 2; ++i) {
      const double f = double(pos) / std::pow(c.rope_theta, 2.0 * double(i) / double(hd));
      const double a = v[i], b = v[i + hd / 2];
      v[i] = a * std::cos(f) - b * std::sin(f);
      v[i + hd / 2] = b * std::cos(f) + a * std::sin(f);
    }
  };

  auto embed = w.f32("model.embed_tokens.weight");
  mat x = zeros(T, D);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t i = 0; i < D; ++i)
      x[t][i] = embed[std::size_t(tokens[t]) * D + i];
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    mat h = rmsnorm(x, p + "input_layernorm.weight");
    mat q = linear(h, p + "self_attn.q_proj.weight", H * hd, D);
    mat k = linear(h, p + "self_attn.k_proj.weight", KV * hd, D);
    mat v = linear(h, p + "self_attn.v_proj.weight", KV * hd, D);
    if (c.qk_norm()) { // Qwen3Attention: q_norm / k_norm over each head, then rope
      auto qn = w.f32(p + "self_attn.q_norm.weight"), kn = w.f32(p + "self_attn.k_norm.weight");
      for (std::size_t t = 0; t < T; ++t) {
        for (std::size_t j = 0; j < H; ++j)
          rmsnorm_span(&q[t][j * hd], qn, hd);
        for (std::size_t j = 0; j < KV; ++j)
          rmsnorm_span(&k[t][j * hd], kn, hd);
      }
    }
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t j = 0; j < H; ++j)
        rope(&q[t][j * hd], t);
      for (std::size_t j = 0; j < KV; ++j)
        rope(&k[t][j * hd], t);
    }
    mat att = zeros(T, H * hd);
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t j = 0; j < H; ++j) {
        const std::size_t g = j / (H / KV); // GQA: the kv head of q head j
        std::vector<double> prob(t + 1);
        double top = -INFINITY, sum = 0;
        for (std::size_t s = 0; s <= t; ++s) {
          for (std::size_t i = 0; i < hd; ++i)
            prob[s] += q[t][j * hd + i] * k[s][g * hd + i];
          prob[s] /= std::sqrt(double(hd));
          top = std::max(top, prob[s]);
        }
        for (auto& e : prob)
          sum += (e = std::exp(e - top));
        for (std::size_t s = 0; s <= t; ++s)
          for (std::size_t i = 0; i < hd; ++i)
            att[t][j * hd + i] += prob[s] / sum * v[s][g * hd + i];
      }
    mat o = linear(att, p + "self_attn.o_proj.weight", D, H * hd);
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t i = 0; i < D; ++i)
        x[t][i] += o[t][i];
    h = rmsnorm(x, p + "post_attention_layernorm.weight");
    if (c.sparse_layer(l)) { // Qwen3MoeSparseMoeBlock
      const std::size_t E = std::size_t(c.num_experts), K = std::size_t(c.num_experts_per_tok),
                        MI = std::size_t(c.moe_intermediate_size);
      mat router = linear(h, p + "mlp.gate.weight", E, D);
      for (std::size_t t = 0; t < T; ++t) {
        double top = -INFINITY, sum = 0;
        for (double v : router[t])
          top = std::max(top, v);
        std::vector<double> prob(E);
        for (std::size_t e = 0; e < E; ++e)
          sum += (prob[e] = std::exp(router[t][e] - top));
        std::vector<std::size_t> idx(E);
        for (std::size_t e = 0; e < E; ++e) {
          prob[e] /= sum;
          idx[e] = e;
        }
        std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return prob[a] > prob[b]; });
        double picked = 0;
        for (std::size_t j = 0; j < K; ++j)
          picked += prob[idx[j]];
        for (std::size_t j = 0; j < K; ++j) {
          const std::size_t e = idx[j];
          const double wgt = c.norm_topk_prob ? prob[e] / picked : prob[e];
          // Expert e's gate [MI][D], up [MI][D], down [D][MI], from either layout.
          std::vector<double> gate(MI * D), up(MI * D), down(D * MI);
          if (c.fused_experts) { // gate_up [E][D][2 MI], down [E][MI][D]
            auto gu = w.f32(p + "mlp.experts.gate_up_proj"), dn = w.f32(p + "mlp.experts.down_proj");
            for (std::size_t i = 0; i < MI; ++i)
              for (std::size_t d = 0; d < D; ++d) {
                gate[i * D + d] = gu[(e * D + d) * 2 * MI + i];
                up[i * D + d] = gu[(e * D + d) * 2 * MI + MI + i];
                down[d * MI + i] = dn[(e * MI + i) * D + d];
              }
          } else {
            const std::string x_ = p + "mlp.experts." + std::to_string(e) + ".";
            auto g = w.f32(x_ + "gate_proj.weight"), u = w.f32(x_ + "up_proj.weight"), dn = w.f32(x_ + "down_proj.weight");
            gate.assign(g.begin(), g.end());
            up.assign(u.begin(), u.end());
            down.assign(dn.begin(), dn.end());
          }
          std::vector<double> act(MI);
          for (std::size_t i = 0; i < MI; ++i) {
            double g = 0, u = 0;
            for (std::size_t d = 0; d < D; ++d) {
              g += h[t][d] * gate[i * D + d];
              u += h[t][d] * up[i * D + d];
            }
            act[i] = g / (1.0 + std::exp(-g)) * u;
          }
          for (std::size_t d = 0; d < D; ++d) {
            double y = 0;
            for (std::size_t i = 0; i < MI; ++i)
              y += act[i] * down[d * MI + i];
            x[t][d] += wgt * y;
          }
        }
      }
      continue;
    }
    mat gate = linear(h, p + "mlp.gate_proj.weight", I, D);
    mat up = linear(h, p + "mlp.up_proj.weight", I, D);
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t i = 0; i < I; ++i)
        gate[t][i] = gate[t][i] / (1.0 + std::exp(-gate[t][i])) * up[t][i];
    mat down = linear(gate, p + "mlp.down_proj.weight", D, I);
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t i = 0; i < D; ++i)
        x[t][i] += down[t][i];
  }
  mat logits = linear(rmsnorm(x, "model.norm.weight"),
                      c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", V, D);
  std::vector<std::vector<float>> out;
  for (const auto& row : logits)
    out.emplace_back(row.begin(), row.end());
  return out;
}

} // namespace rlsync::test
