#pragma once
// The engine's parameters: per tensor-parallel worker, each shard row-major,
// weight rows contiguous over the input dim (the layout the matmul kernels
// want, and Hugging Face's [out, in]), in the dtype the weights arrive in
// (bf16, f16 or f32). The kernels widen 16-bit weights to fp32 in registers:
// widening is exact, so results are bit-identical to fp32 storage of the
// same values, while a decode step reads half the bytes and applying a
// version is a copy.
//
// A weight_set is one complete copy of every worker's parameters plus the
// version they hold. The engine serves from one set while a weight update
// fills another (a staging copy), then swaps the pointer: a forward step
// holds its set for its whole duration, so a swap never tears a step.
#include "runtime/base/dtype.hpp"
#include "runtime/engine/kernels.hpp"
#include "runtime/engine/shard.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace rlsync::engine {

/// One parameter of one worker. `bytes` is empty for shape-only parameters
/// (the ones the plan recorder writes into), else numel() elements of `type`.
struct parameter {
  std::string name;
  std::vector<std::int64_t> shape;
  dtype type = dtype::f32;
  std::vector<unsigned char> bytes;
  /// The int8 process step's form of a matrix [out, in] (process.hpp):
  /// q[j][k] * scales[j] approximates it; empty otherwise. `bytes` stay as
  /// received (what the weight checksums cover and the next update overwrites).
  std::vector<std::int8_t> q;
  std::vector<float> scales;

  std::int64_t numel() const;
  bool holds_data() const { return !bytes.empty() || numel() == 0; }
  /// What the kernels read: the int8 form once processed, else the bytes.
  kernels::typed_ptr ref() const {
    return q.empty() ? kernels::typed_ptr{bytes.data(), type} : kernels::typed_ptr{q.data(), type, scales.data()};
  }
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
inline constexpr const char* q_norm = "self_attn.q_norm.weight"; // qwen3
inline constexpr const char* k_norm = "self_attn.k_norm.weight"; // qwen3
inline constexpr const char* router = "mlp.gate.weight";          // qwen3_moe sparse layers
/// "mlp.experts.<e>.gate_up_proj.weight" / "...down_proj.weight" (qwen3_moe).
std::string expert_suffix(std::int64_t expert, bool down);
} // namespace param

/// Pointers to one layer's parameters, for the forward pass.
struct layer_weights {
  kernels::typed_ptr input_norm; ///< [hidden]
  kernels::typed_ptr qkv;        ///< [(heads + 2 kv_heads) * head_dim, hidden]: q rows, k rows, v rows
  kernels::typed_ptr o;          ///< [hidden, heads * head_dim] (this worker's columns)
  kernels::typed_ptr post_norm;  ///< [hidden]
  kernels::typed_ptr gate_up;    ///< [2 * inter, hidden]: gate rows, then up rows
  kernels::typed_ptr down;       ///< [hidden, inter] (this worker's columns)
  kernels::typed_ptr q_norm;     ///< [head_dim], Qwen3 only (null data otherwise): every q head's RMSNorm
  kernels::typed_ptr k_norm;     ///< [head_dim], Qwen3 only: every k head's
  // A sparse (mixture-of-experts) layer instead of gate_up/down (whose data is then null):
  kernels::typed_ptr router;     ///< [experts, hidden], whole on every worker
  std::int64_t experts = 0;      ///< local experts [expert_begin, expert_begin + experts); 0 for a dense layer
  std::int64_t expert_begin = 0;
  /// Local expert i's (expert expert_begin + i) fused gate/up rows
  /// [2 * moe_inter, hidden] at expert_params[2i], its down columns
  /// [hidden, moe_inter] at expert_params[2i + 1].
  const struct parameter* expert_params = nullptr;
};

/// Every parameter one worker holds.
class worker_weights {
public:
  /// Allocates (zero-filled) every parameter of this shard in `type`, or
  /// only records their shapes when `allocate` is false.
  worker_weights(const shard_spec& shard, dtype type, bool allocate = true);

  const shard_spec& shard() const { return shard_; }
  bool allocated() const { return allocated_; }
  const std::vector<parameter>& params() const { return params_; }
  /// Throws std::out_of_range naming the parameter when there is none.
  parameter& at(const std::string& name);
  const parameter& at(const std::string& name) const;
  const parameter* find(const std::string& name) const;

  dtype type() const { return type_; }
  kernels::typed_ptr embed() const { return params_[0].ref(); } ///< [vocab slice, hidden]
  kernels::typed_ptr final_norm() const { return params_[final_norm_].ref(); }
  /// lm_head rows, or the embedding's when tied (same vocab slice).
  kernels::typed_ptr lm_head() const { return params_[lm_head_].ref(); }
  layer_weights layer(std::int64_t l) const;

  /// Every parameter's bytes, and its int8 form when it has one.
  std::uint64_t bytes() const;

private:
  shard_spec shard_;
  dtype type_;
  bool allocated_;
  std::vector<parameter> params_;
  std::unordered_map<std::string, std::size_t> index_;
  std::size_t final_norm_ = 0, lm_head_ = 0;
  std::vector<std::size_t> layer_first_; // each layer's first parameter (layers follow the embedding)
};

class device_landing; // device_gemm.hpp

/// One complete copy of an engine's weights: one worker_weights per tp rank.
struct weight_set {
  std::vector<worker_weights> workers;
  std::uint64_t version = 0;
  /// The int8 form (parameter::q) is current for the bytes: set by
  /// process_weights(int8), cleared by every write of a session.
  bool processed = false;
  /// The device copy a data plane filled as this session's bytes arrived
  /// (device_gemm.hpp), which the engine's device takes instead of
  /// uploading them; null when none. Dropped by every write that does not
  /// go through it, and once the set is served.
  std::shared_ptr<device_landing> landed;

  /// Allocates zeroed parameters of `type` for every worker.
  static std::shared_ptr<weight_set> make(const model_config& c, int tp, dtype type, bool expert_parallel = false);
  int tp() const { return static_cast<int>(workers.size()); }
  bool expert_parallel() const { return workers.front().shard().expert_parallel; }
  const model_config& config() const { return workers.front().shard().config; }
  dtype type() const { return workers.front().type(); }
};

} // namespace rlsync::engine
