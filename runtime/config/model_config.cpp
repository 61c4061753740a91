#include "runtime/config/model_config.hpp"

#include "runtime/base/checked.hpp"

#include <utility>

namespace rlsync {

const char* to_string(model_arch a) {
  switch (a) {
    case model_arch::llama:
      return "llama";
    case model_arch::qwen3:
      return "qwen3";
  }
  return "?";
}

std::optional<model_arch> arch_of_model_type(const std::string& model_type) {
  if (model_type == "llama")
    return model_arch::llama;
  if (model_type == "qwen3")
    return model_arch::qwen3;
  return std::nullopt;
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
  // 2 h q_dim (q, o) + 2 h kv_dim (k, v) + 3 h i (gate, up, down) + 2 h
  // (norms) + 2 head_dim (Qwen3's q/k head norms).
  std::optional<i64> per_layer = i64(0);
  const std::pair<i64, i64> terms[] = {{2, *hq}, {2, *hkv}, {3, *hi}, {2, h}, {c.qk_norm() ? 2 : 0, hd}};
  for (auto [times, term] : terms) {
    auto product = checked_mul<i64>(times, term);
    per_layer = product && per_layer ? checked_add<i64>(*per_layer, *product) : std::nullopt;
  }
  auto layers = per_layer ? checked_mul<i64>(c.num_hidden_layers, *per_layer) : std::nullopt;
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
  if (!(c.rms_norm_eps > 0))
    errs.push_back("rms_norm_eps: must be positive");
  if (!(c.rope_theta > 0))
    errs.push_back("rope_theta: must be positive");
  if (c.explicit_head_dim != 0 && c.arch != model_arch::qwen3) {
    errs.push_back(std::string("head_dim: only qwen3 models may set it (a ") + to_string(c.arch)
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
  return errs;
}

std::vector<std::string> validate_tp(const model_config& c, std::int64_t tp) {
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
  auto kv = c.num_key_value_heads;
  if (kv > 0 && kv % tp != 0 && tp % kv != 0)
    errs.push_back("must divide num_key_value_heads (" + std::to_string(kv)
                   + ") or be a multiple of it (kv heads are then replicated), got "
                   + std::to_string(tp));
  return errs;
}

} // namespace rlsync
