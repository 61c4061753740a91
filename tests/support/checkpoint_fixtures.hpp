#pragma once
// Checkpoints shaped as real writers leave them, for tests of what readers make of them.
#include "runtime/checkpoint/checkpoint.hpp"

#include <filesystem>
#include <string>
#include <vector>

namespace rlsync::test {

/// The single-file checkpoint `base` written again to `out` with an f32
/// rotary inv_freq buffer first in data order, as Hugging Face's writer may
/// put a higher-precision extra.
inline void write_with_leading_f32_extra(const std::string& base, const std::string& out,
                                         const std::string& extra = "model.layers.0.self_attn.rotary_emb.inv_freq") {
  auto ck = checkpoint::open(base);
  std::vector<float> inv_freq(4, 0.5f);
  std::vector<tensor_bytes> tensors{{tensor_spec{extra, dtype::f32, {4}}, inv_freq.data()}};
  for (const auto& e : ck.tensors())
    tensors.push_back({tensor_spec{e.tensor->name, e.tensor->type, e.tensor->shape}, e.tensor->data});
  std::filesystem::create_directories(out);
  std::filesystem::copy_file(base + "/" + config_file_name, out + "/" + config_file_name);
  write_safetensors(out + "/" + single_file_name, tensors);
}

} // namespace rlsync::test
