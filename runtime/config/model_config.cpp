#include "runtime/config/model_config.hpp"

#include "runtime/base/checked.hpp"

#include <charconv>
#include <limits>
#include <utility>

namespace rlsync {

namespace {

std::string shortest(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

} // namespace

const char* to_string(model_arch a) {
  switch (a) {
    case model_arch::llama:
      return "llama";
    case model_arch::qwen3:
      return "qwen3";
    case model_arch::qwen3_moe:
      return "qwen3_moe";
  }
  return "?";
}

std::optional<model_arch> arch_of_model_type(const std::string& model_type) {
  if (model_type == "llama")
    return model_arch::llama;
  if (model_type == "qwen3")
    return model_arch::qwen3;
  if (model_type == "qwen3_moe")
    return model_arch::qwen3_moe;
  return std::nullopt;
}

bool model_config::sparse_layer(std::int64_t l) const {
  if (arch != model_arch::qwen3_moe || num_experts <= 0 || decoder_sparse_step <= 0)
    return false;
  for (auto d : mlp_only_layers)
    if (d == l)
      return false;
  return (l + 1) % decoder_sparse_step == 0;
}

std::optional<std::int64_t> parameter_count(const model_config& c) {
  using i64 = std::int64_t;
  if (c.hidden_size <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0
      || c.intermediate_size <= 0 || c.num_hidden_layers <= 0 || c.vocab_size <= 0)
    return std::nullopt;
  const i64 h = c.hidden_size, hd = c.head_dim();
  if (hd <= 0)
    return std::nullopt;
  auto kv_dim = checked_mul<i64>(c.num_key_value_heads, hd);
  auto q_dim = checked_mul<i64>(c.num_attention_heads, hd);
  auto hq = q_dim ? checked_mul<i64>(h, *q_dim) : std::nullopt;
  auto hkv = kv_dim ? checked_mul<i64>(h, *kv_dim) : std::nullopt;
  auto hi = checked_mul<i64>(h, c.intermediate_size);
  if (!hq || !hkv || !hi)
    return std::nullopt;
  // A sparse layer's MLP: the router (experts x h) and each expert's three
  // matrices of h x moe_intermediate_size, in place of 3 h i.
  std::optional<i64> moe_mlp;
  if (c.arch == model_arch::qwen3_moe) {
    auto per_expert = checked_mul<i64>(h, c.moe_intermediate_size);
    per_expert = per_expert ? checked_mul<i64>(3, *per_expert) : std::nullopt;
    auto experts = per_expert ? checked_mul<i64>(c.num_experts, *per_expert) : std::nullopt;
    auto router = checked_mul<i64>(c.num_experts, h);
    moe_mlp = experts && router ? checked_add<i64>(*experts, *router) : std::nullopt;
    if (!moe_mlp)
      return std::nullopt;
  }
  // 2 h q_dim (q, o) + 2 h kv_dim (k, v) + 2 h (norms) + 2 head_dim
  // (Qwen3's q/k head norms), and the MLP: 3 h i (gate, up, down) dense.
  std::optional<i64> attention = i64(0);
  const std::pair<i64, i64> terms[] = {{2, *hq}, {2, *hkv}, {2, h}, {c.qk_norm() ? 2 : 0, hd}};
  for (auto [times, term] : terms) {
    auto product = checked_mul<i64>(times, term);
    attention = product && attention ? checked_add<i64>(*attention, *product) : std::nullopt;
  }
  const auto dense_mlp = checked_mul<i64>(3, *hi);
  if (!attention || !dense_mlp)
    return std::nullopt;
  std::optional<i64> layers = i64(0);
  for (i64 l = 0; l < c.num_hidden_layers && layers; ++l) {
    auto layer = checked_add<i64>(*attention, c.sparse_layer(l) ? *moe_mlp : *dense_mlp);
    layers = layer ? checked_add<i64>(*layers, *layer) : std::nullopt;
  }
  auto embed = checked_mul<i64>(c.vocab_size, h);
  if (!layers || !embed)
    return std::nullopt;
  auto total = checked_add<i64>(*layers, *embed);
  total = total ? checked_add<i64>(*total, h) : std::nullopt;
  if (total && !c.tie_word_embeddings)
    total = checked_add<i64>(*total, *embed);
  return total;
}

std::vector<std::string> validate(const model_config& c) {
  std::vector<std::string> errs;
  // Positive and at most `max`; the message names the bound that was broken.
  auto bounded = [&](const char* name, std::int64_t v, std::int64_t max) {
    if (v <= 0)
      errs.push_back(std::string(name) + ": must be positive, got " + std::to_string(v));
    else if (v > max)
      errs.push_back(std::string(name) + ": must be at most " + std::to_string(max) + ", got "
                     + std::to_string(v));
    return v > 0 && v <= max;
  };
  bool ok = bounded("hidden_size", c.hidden_size, max_hidden_size)
            & bounded("num_attention_heads", c.num_attention_heads, max_attention_heads)
            & bounded("num_key_value_heads", c.num_key_value_heads, max_attention_heads);
  bool sizes_ok = bounded("intermediate_size", c.intermediate_size, max_intermediate_size);
  sizes_ok &= bounded("num_hidden_layers", c.num_hidden_layers, max_hidden_layers);
  bounded("max_position_embeddings", c.max_position_embeddings, max_position_embeddings_limit);
  if (c.vocab_size < min_vocab_size) {
    errs.push_back("vocab_size: must be at least " + std::to_string(min_vocab_size)
                   + " (256 bytes, BOS, EOS), got " + std::to_string(c.vocab_size));
    sizes_ok = false;
  } else if (c.vocab_size > max_vocab_size) {
    errs.push_back("vocab_size: must be at most " + std::to_string(max_vocab_size) + ", got "
                   + std::to_string(c.vocab_size));
    sizes_ok = false;
  }
  // Both are carried as floats by the engine: within a float's normal range.
  if (!(c.rms_norm_eps >= std::numeric_limits<float>::min() && c.rms_norm_eps <= 1))
    errs.push_back("rms_norm_eps: must be positive and at most 1 (a normal float), got " + shortest(c.rms_norm_eps));
  if (!(c.rope_theta >= 1 && c.rope_theta <= std::numeric_limits<float>::max()))
    errs.push_back("rope_theta: must be at least 1 and at most a float's largest value, got "
                   + shortest(c.rope_theta));
  if (c.arch == model_arch::qwen3_moe) {
    ok &= bounded("num_experts", c.num_experts, max_experts);
    ok &= bounded("moe_intermediate_size", c.moe_intermediate_size, max_intermediate_size);
    if (bounded("num_experts_per_tok", c.num_experts_per_tok, max_experts) && c.num_experts > 0
        && c.num_experts_per_tok > c.num_experts) {
      errs.push_back("num_experts_per_tok: must be at most num_experts (" + std::to_string(c.num_experts) + "), got "
                     + std::to_string(c.num_experts_per_tok));
      ok = false;
    }
    ok &= bounded("decoder_sparse_step", c.decoder_sparse_step, max_hidden_layers);
    for (auto l : c.mlp_only_layers)
      if (l < 0 || l >= c.num_hidden_layers) {
        errs.push_back("mlp_only_layers: layer " + std::to_string(l) + " is not in [0, "
                       + std::to_string(c.num_hidden_layers) + ")");
        ok = false;
      }
  } else if (c.num_experts != 0 || c.num_experts_per_tok != 0 || c.moe_intermediate_size != 0
             || !c.mlp_only_layers.empty() || c.fused_experts) {
    errs.push_back(std::string("num_experts: only qwen3_moe models have experts (this is a ") + to_string(c.arch)
                   + ")");
    ok = false;
  }
  if (c.explicit_head_dim != 0 && !c.qk_norm()) {
    errs.push_back(std::string("head_dim: only qwen3 and qwen3_moe models may set it (a ") + to_string(c.arch)
                   + " model's is hidden_size / num_attention_heads)");
    ok = false;
  } else if (c.explicit_head_dim < 0 || c.explicit_head_dim > max_head_dim) {
    errs.push_back("head_dim: must be positive and at most " + std::to_string(max_head_dim) + ", got "
                   + std::to_string(c.explicit_head_dim));
    ok = false;
  }
  if (!ok)
    return errs;
  if (c.explicit_head_dim > 0) {
    if (c.head_dim() % 2 != 0)
      errs.push_back("head_dim: must be even for rotary embeddings, got " + std::to_string(c.head_dim()));
  } else if (c.hidden_size % c.num_attention_heads != 0)
    errs.push_back("num_attention_heads: must divide hidden_size (" + std::to_string(c.hidden_size)
                   + "), got " + std::to_string(c.num_attention_heads));
  else if (c.head_dim() % 2 != 0)
    errs.push_back("num_attention_heads: head_dim (hidden_size / num_attention_heads = "
                   + std::to_string(c.head_dim()) + ") must be even for rotary embeddings");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    errs.push_back("num_key_value_heads: must divide num_attention_heads ("
                   + std::to_string(c.num_attention_heads) + "), got "
                   + std::to_string(c.num_key_value_heads));
  if (!errs.empty() || !sizes_ok)
    return errs;
  // Each size is bounded, but together they can still describe more than
  // any host holds.
  auto params = parameter_count(c);
  if (!params || *params > max_parameters)
    errs.push_back("num_hidden_layers: the model would have "
                   + (params ? std::to_string(*params) : std::string("more than 2^63"))
                   + " parameters, more than the limit of " + std::to_string(max_parameters)
                   + " (2^40)");
  std::int64_t sparse_layers = 0;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    sparse_layers += c.sparse_layer(l) ? 1 : 0;
  if (c.num_experts * sparse_layers > max_experts_in_all) // both bounded: no overflow
    errs.push_back("num_experts: " + std::to_string(c.num_experts) + " experts in each of " + std::to_string(sparse_layers)
                   + " sparse layers make " + std::to_string(c.num_experts * sparse_layers)
                   + ", more than the limit of " + std::to_string(max_experts_in_all) + " (2^17) in all");
  return errs;
}

std::vector<std::string> validate_dp(const model_config& c, std::int64_t tp, std::int64_t dp, bool expert_parallel) {
  std::vector<std::string> errs;
  if (expert_parallel && c.arch == model_arch::qwen3_moe && dp > 1 && tp > 0 && c.num_experts < dp * tp)
    errs.push_back("with expert parallelism, dp " + std::to_string(dp) + " x tp " + std::to_string(tp)
                   + " workers exceed the model's " + std::to_string(c.num_experts)
                   + " experts (every worker computes at least one)");
  return errs;
}

std::vector<std::string> validate_tp(const model_config& c, std::int64_t tp, bool expert_parallel) {
  std::vector<std::string> errs;
  if (tp <= 0) {
    errs.push_back("must be positive, got " + std::to_string(tp));
    return errs;
  }
  if (c.num_attention_heads > 0 && c.num_attention_heads % tp != 0)
    errs.push_back("must divide num_attention_heads (" + std::to_string(c.num_attention_heads)
                   + "), got " + std::to_string(tp));
  if (c.intermediate_size > 0 && c.intermediate_size % tp != 0)
    errs.push_back("must divide intermediate_size (" + std::to_string(c.intermediate_size)
                   + "), got " + std::to_string(tp));
  if (expert_parallel && c.arch != model_arch::qwen3_moe)
    errs.push_back("expert parallelism needs a mixture-of-experts model (arch qwen3_moe), not " + std::string(to_string(c.arch)));
  if (expert_parallel && c.arch == model_arch::qwen3_moe && c.num_experts > 0 && c.num_experts < tp)
    errs.push_back("with expert parallelism must be at most num_experts (" + std::to_string(c.num_experts)
                   + "), so that every worker holds an expert, got " + std::to_string(tp));
  if (!expert_parallel && c.arch == model_arch::qwen3_moe && c.moe_intermediate_size > 0
      && c.moe_intermediate_size % tp != 0)
    errs.push_back("must divide moe_intermediate_size (" + std::to_string(c.moe_intermediate_size)
                   + "), got " + std::to_string(tp));
  auto kv = c.num_key_value_heads;
  if (kv > 0 && kv % tp != 0 && tp % kv != 0)
    errs.push_back("must divide num_key_value_heads (" + std::to_string(kv)
                   + ") or be a multiple of it (kv heads are then replicated), got "
                   + std::to_string(tp));
  return errs;
}

} // namespace rlsync
