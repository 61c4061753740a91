#pragma once
// The engine's parameters: per tensor-parallel worker, each shard as fp32,
// row-major, weight rows contiguous over the input dim (the layout the
// matmul kernels want, and Hugging Face's [out, in]).
//
// A weight_set is one complete copy of every worker's parameters plus the
// version they hold. The engine serves from one set while a weight update
// fills another (a staging copy), then swaps the pointer: a forward step
// holds its set for its whole duration, so a swap never tears a step.
#include "runtime/engine/shard.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace rlsync::engine {

/// One parameter of one worker. `data` is empty for shape-only parameters
/// (the ones the plan recorder writes into).
struct parameter {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> data;

  std::int64_t numel() const;
};

/// Engine parameter names (vLLM's fused names). Layer parameters of layer l:
std::string layer_param_name(std::int64_t layer, const char* suffix);
namespace param {
inline constexpr const char* embed = "model.embed_tokens.weight";
inline constexpr const char* final_norm = "model.norm.weight";
inline constexpr const char* lm_head = "lm_head.weight";
// suffixes for layer_param_name
inline constexpr const char* input_norm = "input_layernorm.weight";
inline constexpr const char* qkv = "self_attn.qkv_proj.weight";
inline constexpr const char* o = "self_attn.o_proj.weight";
inline constexpr const char* post_norm = "post_attention_layernorm.weight";
inline constexpr const char* gate_up = "mlp.gate_up_proj.weight";
inline constexpr const char* down = "mlp.down_proj.weight";
} // namespace param

/// Pointers to one layer's parameters, for the forward pass.
struct layer_weights {
  const float* input_norm; ///< [hidden]
  const float* qkv;        ///< [(heads + 2 kv_heads) * head_dim, hidden]: q rows, k rows, v rows
  const float* o;          ///< [hidden, heads * head_dim] (this worker's columns)
  const float* post_norm;  ///< [hidden]
  const float* gate_up;    ///< [2 * inter, hidden]: gate rows, then up rows
  const float* down;       ///< [hidden, inter] (this worker's columns)
};

/// Every parameter one worker holds.
class worker_weights {
public:
  /// Allocates (zero-filled) every parameter of this shard, or only records
  /// their shapes when `allocate` is false.
  explicit worker_weights(const shard_spec& shard, bool allocate = true);

  const shard_spec& shard() const { return shard_; }
  bool allocated() const { return allocated_; }
  const std::vector<parameter>& params() const { return params_; }
  /// Throws std::out_of_range naming the parameter when there is none.
  parameter& at(const std::string& name);
  const parameter& at(const std::string& name) const;
  const parameter* find(const std::string& name) const;

  const float* embed() const { return params_[0].data.data(); }   ///< [vocab slice, hidden]
  const float* final_norm() const { return params_[final_norm_].data.data(); }
  /// lm_head rows, or the embedding's when tied (same vocab slice).
  const float* lm_head() const { return params_[lm_head_].data.data(); }
  layer_weights layer(std::int64_t l) const;

  std::uint64_t bytes() const;

private:
  shard_spec shard_;
  bool allocated_;
  std::vector<parameter> params_;
  std::unordered_map<std::string, std::size_t> index_;
  std::size_t final_norm_ = 0, lm_head_ = 0;
};

/// One complete copy of an engine's weights: one worker_weights per tp rank.
struct weight_set {
  std::vector<worker_weights> workers;
  std::uint64_t version = 0;

  /// Allocates zeroed parameters for every worker.
  static std::shared_ptr<weight_set> make(const model_config& c, int tp);
  int tp() const { return static_cast<int>(workers.size()); }
  const model_config& config() const { return workers.front().shard().config; }
};

} // namespace rlsync::engine
