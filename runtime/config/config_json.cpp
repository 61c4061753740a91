// config.json in Hugging Face's style, read with nlohmann-json through
// read_json_strict (duplicate keys and deep nesting refused); every field we
// use is checked for its JSON type.
#include "runtime/base/json.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/base/regular_file.hpp"
#include "runtime/config/model_config.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <stdexcept>

namespace rlsync {

namespace {

using nlohmann::json;

// Hugging Face's config.json files are a few kB; nesting (quantization and
// rope settings) stays within a handful of levels.
constexpr std::size_t max_config_bytes = 16 << 20;
constexpr json_read_limits config_limits{32, 1'000'000};

[[noreturn]] void fail(const std::string& path, const std::string& field, const std::string& why) {
  throw std::runtime_error(path + ": " + field + ": " + why);
}

std::int64_t read_int(const json& root, const std::string& path, const char* field,
                      const std::int64_t* fallback) {
  auto it = root.find(field);
  if (it == root.end()) {
    if (fallback)
      return *fallback;
    fail(path, field, "missing required field");
  }
  if (it->is_number_unsigned() && it->get<std::uint64_t>() > std::uint64_t(INT64_MAX))
    fail(path, field, it->dump() + " is too large");
  if (!it->is_number_integer())
    fail(path, field, "expected an integer, got " + json_describe(*it));
  return it->get<std::int64_t>();
}

double read_double(const json& root, const std::string& path, const char* field, double fallback) {
  auto it = root.find(field);
  if (it == root.end())
    return fallback;
  if (!it->is_number() || !std::isfinite(it->get<double>()))
    fail(path, field, "expected a number, got " + json_describe(*it));
  return it->get<double>();
}

bool read_bool(const json& root, const std::string& path, const char* field, bool fallback) {
  auto it = root.find(field);
  if (it == root.end())
    return fallback;
  if (!it->is_boolean())
    fail(path, field, "expected true or false, got " + json_describe(*it));
  return it->get<bool>();
}

} // namespace

model_config read_config_json(const std::string& path) {
  json root;
  try {
    root = read_json_strict(read_regular_file(path, max_config_bytes, "config.json"), config_limits);
  } catch (const json_read_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  if (!root.is_object())
    throw std::runtime_error(path + ": expected a JSON object, got " + json_describe(root));
  model_config c;
  if (auto it = root.find("model_type"); it != root.end()) {
    if (!it->is_string())
      fail(path, "model_type", "expected a string, got " + json_describe(*it));
    auto arch = arch_of_model_type(it->get<std::string>());
    if (!arch)
      fail(path, "model_type", "'" + printable(it->get<std::string>()) + "' is not an architecture rlsync runs "
                                   "(llama, qwen3, qwen3_moe)");
    c.arch = *arch;
  }
  if (read_bool(root, path, "attention_bias", false))
    fail(path, "attention_bias", "true: rlsync's engine has no attention biases");
  // Weights rlsync cannot move (bias tensors, quantized formats): refused.
  if (read_bool(root, path, "mlp_bias", false))
    fail(path, "mlp_bias", "true: rlsync's models have no MLP biases");
  if (auto it = root.find("quantization_config"); it != root.end() && !it->is_null())
    fail(path, "quantization_config", "quantized checkpoints are not supported (bf16, f16 or f32 weights)");
  // What the built-in engine does not compute (a vLLM server does): noted,
  // and refused where a built-in engine would run it as plain RoPE, SiLU and
  // full attention.
  auto not_computed = [&](const char* field, const std::string& what) {
    c.not_computed.push_back(std::string(field) + ": " + what);
  };
  if (auto it = root.find("hidden_act"); it != root.end() && *it != "silu")
    not_computed("hidden_act", json_describe(*it) + ": the built-in engine runs silu only");
  if (auto it = root.find("rope_scaling"); it != root.end() && !it->is_null()) {
    const auto type = [&](const char* key) { return it->is_object() && it->contains(key) && it->at(key) == "default"; };
    if (!(type("rope_type") || type("type"))) {
      auto shown = it->dump(); // its kind and factor say what the model expects
      if (shown.size() > 120)
        shown = shown.substr(0, 117) + "...";
      not_computed("rope_scaling", printable(shown) + ": the built-in engine runs unscaled RoPE only (null or "
                                                      "rope_type default)");
    }
  }
  if (read_bool(root, path, "use_sliding_window", false))
    not_computed("use_sliding_window", "true: the built-in engine attends to the whole context");
  c.vocab_size = read_int(root, path, "vocab_size", nullptr);
  c.hidden_size = read_int(root, path, "hidden_size", nullptr);
  c.intermediate_size = read_int(root, path, "intermediate_size", nullptr);
  c.num_hidden_layers = read_int(root, path, "num_hidden_layers", nullptr);
  c.num_attention_heads = read_int(root, path, "num_attention_heads", nullptr);
  c.num_key_value_heads = read_int(root, path, "num_key_value_heads", &c.num_attention_heads);
  c.max_position_embeddings = read_int(root, path, "max_position_embeddings", &c.max_position_embeddings);
  c.rms_norm_eps = read_double(root, path, "rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = read_double(root, path, "rope_theta", c.rope_theta);
  c.tie_word_embeddings = read_bool(root, path, "tie_word_embeddings", c.tie_word_embeddings);
  if (c.arch == model_arch::qwen3_moe) {
    c.num_experts = read_int(root, path, "num_experts", nullptr);
    c.num_experts_per_tok = read_int(root, path, "num_experts_per_tok", nullptr);
    c.moe_intermediate_size = read_int(root, path, "moe_intermediate_size", nullptr);
    c.norm_topk_prob = read_bool(root, path, "norm_topk_prob", false); // Hugging Face's default
    const std::int64_t one = 1;
    c.decoder_sparse_step = read_int(root, path, "decoder_sparse_step", &one);
    if (auto it = root.find("mlp_only_layers"); it != root.end() && !it->is_null()) {
      if (!it->is_array())
        fail(path, "mlp_only_layers", "expected a list of layer indices, got " + json_describe(*it));
      if (it->size() > static_cast<std::size_t>(max_hidden_layers))
        fail(path, "mlp_only_layers", "more than " + std::to_string(max_hidden_layers) + " layers");
      for (const auto& l : *it) {
        if (!l.is_number_integer())
          fail(path, "mlp_only_layers", "expected integers, got " + json_describe(l));
        c.mlp_only_layers.push_back(l.get<std::int64_t>());
      }
    }
  }
  // Qwen3 names its head_dim; Llama derives it, and one that names another
  // would be run with the derived one.
  if (root.contains("head_dim") && (c.qk_norm() || !root.at("head_dim").is_null())) {
    const std::int64_t none = 0;
    const auto named = read_int(root, path, "head_dim", &none);
    if (c.qk_norm()) {
      c.explicit_head_dim = named;
      if (named <= 0)
        fail(path, "head_dim", "must be positive, got " + std::to_string(named));
    } else if (c.num_attention_heads > 0 && named != c.hidden_size / c.num_attention_heads) { // no product: no overflow
      fail(path, "head_dim", std::to_string(named) + ": rlsync's engine runs hidden_size / num_attention_heads = "
                               + std::to_string(c.hidden_size / c.num_attention_heads) + " for " + to_string(c.arch));
    }
  }
  auto errs = validate(c);
  if (!errs.empty())
    throw std::runtime_error(path + ": " + errs.front());
  return c;
}

void write_config_json(const std::string& path, const model_config& c) {
  // Field order as transformers writes it for LlamaForCausalLM.
  const bool qwen3 = c.qk_norm();
  const char* architecture = c.arch == model_arch::qwen3_moe ? "Qwen3MoeForCausalLM"
                             : qwen3                         ? "Qwen3ForCausalLM"
                                                             : "LlamaForCausalLM";
  nlohmann::ordered_json config = {
    {"architectures", nlohmann::ordered_json::array({architecture})},
    {"model_type", to_string(c.arch)},
    {"hidden_act", "silu"},
    {"vocab_size", c.vocab_size},
    {"hidden_size", c.hidden_size},
    {"intermediate_size", c.intermediate_size},
    {"num_hidden_layers", c.num_hidden_layers},
    {"num_attention_heads", c.num_attention_heads},
    {"num_key_value_heads", c.num_key_value_heads},
    {"max_position_embeddings", c.max_position_embeddings},
    {"rms_norm_eps", c.rms_norm_eps},
    {"rope_theta", c.rope_theta},
    {"tie_word_embeddings", c.tie_word_embeddings},
    {"bos_token_id", token_bos},
    {"eos_token_id", token_eos},
  };
  if (qwen3) {
    config["head_dim"] = c.head_dim();
    config["attention_bias"] = false;
  }
  if (c.arch == model_arch::qwen3_moe) {
    config["num_experts"] = c.num_experts;
    config["num_experts_per_tok"] = c.num_experts_per_tok;
    config["moe_intermediate_size"] = c.moe_intermediate_size;
    config["norm_topk_prob"] = c.norm_topk_prob;
    config["decoder_sparse_step"] = c.decoder_sparse_step;
    config["mlp_only_layers"] = c.mlp_only_layers;
  }
  std::ofstream out(path, std::ios::trunc);
  out << config.dump(2) << "\n";
  out.flush();
  if (!out)
    throw std::runtime_error(path + ": cannot write file");
}

} // namespace rlsync
