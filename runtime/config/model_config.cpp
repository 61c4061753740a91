#include "runtime/config/model_config.hpp"

namespace rlsync {

std::vector<std::string> validate(const model_config& c) {
  std::vector<std::string> errs;
  auto positive = [&](const char* name, std::int64_t v) {
    if (v <= 0)
      errs.push_back(std::string(name) + ": must be positive, got " + std::to_string(v));
    return v > 0;
  };
  bool ok = positive("hidden_size", c.hidden_size) & positive("num_attention_heads", c.num_attention_heads)
            & positive("num_key_value_heads", c.num_key_value_heads);
  positive("intermediate_size", c.intermediate_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("max_position_embeddings", c.max_position_embeddings);
  if (c.vocab_size < min_vocab_size)
    errs.push_back("vocab_size: must be at least " + std::to_string(min_vocab_size)
                   + " (256 bytes, BOS, EOS), got " + std::to_string(c.vocab_size));
  if (!(c.rms_norm_eps > 0))
    errs.push_back("rms_norm_eps: must be positive");
  if (!(c.rope_theta > 0))
    errs.push_back("rope_theta: must be positive");
  if (!ok)
    return errs;
  if (c.hidden_size % c.num_attention_heads != 0)
    errs.push_back("num_attention_heads: must divide hidden_size (" + std::to_string(c.hidden_size)
                   + "), got " + std::to_string(c.num_attention_heads));
  else if (c.head_dim() % 2 != 0)
    errs.push_back("num_attention_heads: head_dim (hidden_size / num_attention_heads = "
                   + std::to_string(c.head_dim()) + ") must be even for rotary embeddings");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    errs.push_back("num_key_value_heads: must divide num_attention_heads ("
                   + std::to_string(c.num_attention_heads) + "), got "
                   + std::to_string(c.num_key_value_heads));
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
