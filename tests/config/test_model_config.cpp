// Model shape validation, tensor-parallel compatibility, and config.json.
#include "runtime/config/model_config.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <unistd.h>

using namespace rlsync;

namespace {

model_config small() {
  model_config c;
  c.vocab_size = 320;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  return c;
}

bool mentions(const std::vector<std::string>& errs, const std::string& text) {
  for (auto& e : errs)
    if (e.find(text) != std::string::npos)
      return true;
  return false;
}

std::string temp_path(const std::string& stem) {
  return "/tmp/rlsync-test-" + std::to_string(::getpid()) + "-" + stem;
}

/// Tiny experts, 4096 of them in each of `layers` sparse layers.
void many_experts(model_config& c, std::int64_t layers) {
  c.arch = model_arch::qwen3_moe;
  c.num_experts = 4096;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 1;
  c.decoder_sparse_step = 1;
  c.num_hidden_layers = layers;
}

} // namespace

TEST_CASE("model shape validation: one row per rule") {
  CHECK(validate(small()).empty());
  struct row {
    const char* what;
    void (*mutate)(model_config&);
    const char* expect;
  };
  const row rows[] = {
    {"zero hidden", [](model_config& c) { c.hidden_size = 0; }, "hidden_size: must be positive, got 0"},
    {"negative layers", [](model_config& c) { c.num_hidden_layers = -1; }, "num_hidden_layers: must be positive"},
    {"small vocab", [](model_config& c) { c.vocab_size = 100; }, "vocab_size: must be at least 258"},
    {"heads do not divide hidden", [](model_config& c) { c.num_attention_heads = 6; },
     "num_attention_heads: must divide hidden_size (64), got 6"},
    {"odd head_dim", [](model_config& c) { c.hidden_size = 72; c.num_attention_heads = 8; },
     "head_dim"},
    {"kv heads do not divide heads", [](model_config& c) { c.num_key_value_heads = 3; },
     "num_key_value_heads: must divide num_attention_heads (8), got 3"},
    {"zero eps", [](model_config& c) { c.rms_norm_eps = 0; }, "rms_norm_eps"},
    {"zero theta", [](model_config& c) { c.rope_theta = 0; }, "rope_theta"},
    {"eps below a float's normal range", [](model_config& c) { c.rms_norm_eps = 1e-50; }, "rms_norm_eps"},
    {"eps above 1", [](model_config& c) { c.rms_norm_eps = 2; }, "rms_norm_eps"},
    {"theta beyond a float", [](model_config& c) { c.rope_theta = 1e39; }, "rope_theta"},
    {"intermediate that wrapped the parameter count", [](model_config& c) { c.intermediate_size = 9223372036854775800; },
     "intermediate_size: must be at most 1048576, got 9223372036854775800"},
    {"vocab INT64_MAX", [](model_config& c) { c.vocab_size = INT64_MAX; },
     "vocab_size: must be at most 16777216, got 9223372036854775807"},
    {"layers 100000000", [](model_config& c) { c.num_hidden_layers = 100000000; },
     "num_hidden_layers: must be at most 1024, got 100000000"},
    {"hidden too large", [](model_config& c) { c.hidden_size = 1 << 20; }, "hidden_size: must be at most 65536"},
    {"heads too many", [](model_config& c) { c.num_attention_heads = 2048; },
     "num_attention_heads: must be at most 1024"},
    {"positions too many", [](model_config& c) { c.max_position_embeddings = INT64_MAX; },
     "max_position_embeddings: must be at most 16777216"},
    {"each size in range, too many parameters",
     [](model_config& c) {
       c.hidden_size = 65536;
       c.num_attention_heads = 512;
       c.num_key_value_heads = 512;
       c.intermediate_size = 1 << 20;
       c.num_hidden_layers = 1024;
     },
     "more than the limit of 1099511627776 (2^40)"},
    {"experts in all past the limit", [](model_config& c) { many_experts(c, 33); },
     "num_experts: 4096 experts in each of 33 sparse layers make 135168, more than the limit of 131072 (2^17) in all"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto c = small();
    r.mutate(c);
    CHECK(mentions(validate(c), r.expect));
  }
  auto at_limit = small();
  many_experts(at_limit, 32); // 4096 x 32 = 2^17
  CHECK(validate(at_limit).empty());
}

TEST_CASE("parameter_count: exact for the Llama layout, nullopt on overflow or a bad shape") {
  auto c = small(); // h 64, i 128, 2 layers, 8 heads, 2 kv heads (kv_dim 16), vocab 320, untied
  const std::int64_t per_layer = 2 * 64 * 64 + 2 * 64 * 16 + 3 * 64 * 128 + 2 * 64;
  CHECK(parameter_count(c) == 2 * per_layer + 64 + 2 * 320 * 64);
  c.tie_word_embeddings = true;
  CHECK(parameter_count(c) == 2 * per_layer + 64 + 320 * 64);
  c.intermediate_size = 9223372036854775800;
  CHECK_FALSE(parameter_count(c));
  c = small();
  c.vocab_size = INT64_MAX;
  CHECK_FALSE(parameter_count(c));
  c = small();
  c.num_hidden_layers = 0;
  CHECK_FALSE(parameter_count(c));
}

TEST_CASE("tensor parallelism: tp must split heads and intermediate, kv split or replicated") {
  auto c = small(); // 8 heads, 2 kv heads, intermediate 128
  CHECK(validate_tp(c, 1).empty());
  CHECK(mentions(validate_tp(c, 2, /*expert_parallel=*/true), "needs a mixture-of-experts model (arch qwen3_moe), not llama"));
  CHECK(validate_tp(c, 2).empty());
  CHECK(validate_tp(c, 4).empty()); // kv 2 < tp 4: replicated
  CHECK(validate_tp(c, 8).empty());
  CHECK(mentions(validate_tp(c, 3), "must divide num_attention_heads (8), got 3"));
  CHECK(mentions(validate_tp(c, 0), "must be positive"));
  c.intermediate_size = 100;
  CHECK(mentions(validate_tp(c, 8), "must divide intermediate_size (100)"));
  c = small();
  c.num_attention_heads = 12;
  c.hidden_size = 96;
  c.num_key_value_heads = 4;
  CHECK(mentions(validate_tp(c, 6), "num_key_value_heads (4)")); // 6 neither divides nor is divided by 4
}

TEST_CASE("config.json round trip keeps every field") {
  auto c = small();
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 500000;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 4096;
  auto path = temp_path("config.json");
  write_config_json(path, c);
  auto r = read_config_json(path);
  std::remove(path.c_str());
  CHECK(r.vocab_size == c.vocab_size);
  CHECK(r.hidden_size == c.hidden_size);
  CHECK(r.intermediate_size == c.intermediate_size);
  CHECK(r.num_hidden_layers == c.num_hidden_layers);
  CHECK(r.num_attention_heads == c.num_attention_heads);
  CHECK(r.num_key_value_heads == c.num_key_value_heads);
  CHECK(r.max_position_embeddings == 4096);
  CHECK(r.rms_norm_eps == c.rms_norm_eps);
  CHECK(r.rope_theta == c.rope_theta);
  CHECK(r.tie_word_embeddings);
}

TEST_CASE("config.json errors name the file and the field") {
  struct row {
    const char* what;
    std::string json;
    const char* expect;
  };
  const row rows[] = {
    {"invalid JSON", "{\"vocab_size\": 320,", "invalid JSON"},
    {"missing field", "{\"vocab_size\": 320}", "hidden_size: missing required field"},
    {"wrong type", "{\"vocab_size\": \"many\", \"hidden_size\": 64}", "vocab_size: expected an integer"},
    {"bad bool",
     "{\"vocab_size\": 320, \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
     " \"num_attention_heads\": 8, \"tie_word_embeddings\": \"yes\"}",
     "tie_word_embeddings: expected true or false"},
    {"shape invalid",
     "{\"vocab_size\": 320, \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
     " \"num_attention_heads\": 8, \"num_key_value_heads\": 3}",
     "num_key_value_heads: must divide"},
    {"duplicate field", "{\"vocab_size\": 320, \"vocab_size\": 640}", "duplicate key 'vocab_size'"},
    {"duplicate in a nested object", "{\"rope_scaling\": {\"type\": \"a\", \"type\": \"b\"}}",
     "rope_scaling: duplicate key 'type'"},
    {"too deep", "{\"x\": " + std::string(40, '[') + std::string(40, ']') + "}",
     "JSON nested deeper than 32 levels"},
    {"not an object", "[320]", "expected a JSON object, got an array"},
    {"integer as a string", "{\"vocab_size\": \"320\"}", "vocab_size: expected an integer, got the string '320'"},
    {"integer as a float", "{\"vocab_size\": 320.0}", "vocab_size: expected an integer, got '320.0'"},
    {"integer too large", "{\"vocab_size\": 9223372036854775808}", "vocab_size: 9223372036854775808 is too large"},
    {"number as a string",
     "{\"vocab_size\": 320, \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
     " \"num_attention_heads\": 8, \"rope_theta\": \"1e4\"}",
     "rope_theta: expected a number, got the string '1e4'"},
    {"too large a file", std::string((16 << 20) + 1, ' '), "config.json: larger than the limit of 16777216 bytes"},
    {"another architecture", "{\"model_type\": \"qwen2\"}", "model_type: 'qwen2' is not an architecture rlsync runs"},
    {"model_type not a string", "{\"model_type\": 3}", "model_type: expected a string"},
    {"attention bias", "{\"model_type\": \"qwen3\", \"attention_bias\": true}",
     "attention_bias: true: rlsync's engine has no attention biases"},
    {"qwen3 head_dim zero",
     "{\"model_type\": \"qwen3\", \"vocab_size\": 320, \"hidden_size\": 64, \"intermediate_size\": 128,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"head_dim\": 0}",
     "head_dim: must be positive, got 0"},
    // What changes the model's numerics and the engine does not run: refused.
    {"mlp bias", "{\"mlp_bias\": true}", "mlp_bias: true: rlsync's models have no MLP biases"},
    {"quantized", "{\"quantization_config\": {\"quant_method\": \"fp8\"}}",
     "quantization_config: quantized checkpoints are not supported"},
    {"llama head_dim other than hidden / heads",
     "{\"vocab_size\": 320, \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
     " \"num_attention_heads\": 8, \"head_dim\": 16}",
     "head_dim: 16: rlsync's engine runs hidden_size / num_attention_heads = 8 for llama"},
    {"qwen3 head_dim odd",
     "{\"model_type\": \"qwen3\", \"vocab_size\": 320, \"hidden_size\": 64, \"intermediate_size\": 128,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"head_dim\": 7}",
     "head_dim: must be even for rotary embeddings, got 7"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto path = temp_path("bad-config.json");
    std::ofstream(path) << r.json;
    std::string msg;
    try {
      read_config_json(path);
    } catch (const std::runtime_error& e) {
      msg = e.what();
    }
    std::remove(path.c_str());
    CHECK(msg.find(path) == 0);
    CHECK_MESSAGE(msg.find(r.expect) != std::string::npos, msg);
  }
  std::string missing;
  try {
    read_config_json("/nonexistent/config.json");
  } catch (const std::runtime_error& e) {
    missing = e.what();
  }
  CHECK(missing.find("cannot open") != std::string::npos);
}

TEST_CASE("config.json: a Qwen3 config keeps its architecture and head_dim, which may differ from hidden / heads") {
  auto c = small();
  c.arch = model_arch::qwen3;
  c.explicit_head_dim = 32; // hidden 64 / 8 heads would be 8
  CHECK(validate(c).empty());
  // q and o are [8 * 32, 64], k and v [2 * 32, 64], plus the two head norms of 32.
  const std::int64_t per_layer = 2 * 64 * 256 + 2 * 64 * 64 + 3 * 64 * 128 + 2 * 64 + 2 * 32;
  CHECK(parameter_count(c) == 2 * per_layer + 64 + 2 * 320 * 64);
  auto path = temp_path("qwen3-config.json");
  write_config_json(path, c);
  auto r = read_config_json(path);
  std::remove(path.c_str());
  CHECK(r.arch == model_arch::qwen3);
  CHECK(r.head_dim() == 32);
  CHECK(r.qk_norm());
  // A Qwen3 config without head_dim: hidden / heads, as Hugging Face's default.
  std::ofstream(path) << R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 320,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})";
  r = read_config_json(path);
  std::remove(path.c_str());
  CHECK(r.arch == model_arch::qwen3);
  CHECK(r.head_dim() == 16);
  // head_dim belongs to Qwen3: a Llama shape that names one is refused.
  auto llama = small();
  llama.explicit_head_dim = 32;
  CHECK(mentions(validate(llama), "head_dim: only qwen3 and qwen3_moe models may set it"));
  CHECK(std::string(to_string(model_arch::llama)) == "llama");
  CHECK(arch_of_model_type("llama") == model_arch::llama);
  CHECK_FALSE(arch_of_model_type("mistral"));
}

TEST_CASE("config.json: a Qwen3-MoE config keeps its experts, the dense and sparse layers follow HF's rule") {
  auto c = small();
  c.arch = model_arch::qwen3_moe;
  c.explicit_head_dim = 16;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.norm_topk_prob = false;
  c.decoder_sparse_step = 1;
  c.mlp_only_layers = {1};
  CHECK(validate(c).empty());
  CHECK(c.sparse_layer(0));
  CHECK_FALSE(c.sparse_layer(1)); // mlp_only_layers
  // Layer 0: router 8 x 64 and 8 experts of 3 x 64 x 32; layer 1 dense.
  const std::int64_t attention = 2 * 64 * 128 + 2 * 64 * 32 + 2 * 64 + 2 * 16;
  CHECK(parameter_count(c) == attention + 8 * 64 + 8 * 3 * 64 * 32 + attention + 3 * 64 * 128 + 64 + 2 * 320 * 64);
  CHECK(validate_tp(c, 2).empty());
  c.moe_intermediate_size = 30;
  CHECK(mentions(validate_tp(c, 4), "must divide moe_intermediate_size (30)"));
  CHECK(validate_tp(c, 4, /*expert_parallel=*/true).empty()); // whole experts: no slicing
  CHECK(mentions(validate_tp(c, 16, true), "at most num_experts (8)"));
  c.moe_intermediate_size = 32;
  auto path = temp_path("qwen3-moe-config.json");
  write_config_json(path, c);
  auto r = read_config_json(path);
  std::remove(path.c_str());
  CHECK(r.arch == model_arch::qwen3_moe);
  CHECK(r.num_experts == 8);
  CHECK(r.num_experts_per_tok == 2);
  CHECK(r.moe_intermediate_size == 32);
  CHECK_FALSE(r.norm_topk_prob);
  CHECK(r.mlp_only_layers == std::vector<std::int64_t>{1});
  CHECK(r.head_dim() == 16);
  // Refusals name the field.
  auto bad = c;
  bad.num_experts_per_tok = 9;
  CHECK(mentions(validate(bad), "num_experts_per_tok: must be at most num_experts (8), got 9"));
  bad = c;
  bad.mlp_only_layers = {2};
  CHECK(mentions(validate(bad), "mlp_only_layers: layer 2 is not in [0, 2)"));
  bad = small();
  bad.num_experts = 8;
  CHECK(mentions(validate(bad), "num_experts: only qwen3_moe models have experts"));
  std::ofstream(path) << R"({"model_type": "qwen3_moe", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "mlp_only_layers": "none"})";
  std::string msg;
  try {
    read_config_json(path);
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  std::remove(path.c_str());
  CHECK(msg.find("mlp_only_layers: expected a list of layer indices") != std::string::npos);
}

TEST_CASE("config.json: what the built-in engine does not compute is noted, not refused") {
  const std::string shape = R"("vocab_size": 320, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4)";
  struct row {
    const char* what;
    std::string extra;
    std::vector<std::string> noted;
  };
  const std::vector<row> rows = {
    {"llama3 rope scaling", R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})",
     {R"(rope_scaling: {"factor":8.0,"rope_type":"llama3"}: the built-in engine runs unscaled RoPE only (null or rope_type default))"}},
    {"rope scaling not an object", R"("rope_scaling": 2)",
     {"rope_scaling: 2: the built-in engine runs unscaled RoPE only (null or rope_type default)"}},
    {"gelu", R"("hidden_act": "gelu")", {"hidden_act: the string 'gelu': the built-in engine runs silu only"}},
    {"sliding window", R"("use_sliding_window": true, "sliding_window": 16)",
     {"use_sliding_window: true: the built-in engine attends to the whole context"}},
    {"defaults", R"("rope_scaling": {"rope_type": "default"}, "hidden_act": "silu", "use_sliding_window": false)", {}},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto path = temp_path("noted-config.json");
    std::ofstream(path) << "{" << shape << ", " << r.extra << "}";
    auto c = read_config_json(path);
    std::remove(path.c_str());
    CHECK(c.not_computed == r.noted);
  }
}

TEST_CASE("config.json: kv heads default to attention heads, unknown HF keys are ignored") {
  auto path = temp_path("hf-config.json");
  std::ofstream(path) << R"({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
    "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "rope_scaling": null, "hidden_act": "silu", "mlp_bias": false, "head_dim": 16,
    "use_sliding_window": false, "sliding_window": 4096, "quantization_config": null, "pretraining_tp": 1})";
  auto c = read_config_json(path);
  std::remove(path.c_str());
  CHECK(c.num_key_value_heads == 4);
  CHECK(c.rope_theta == 10000.0);
}
