#pragma once
// Checkpoint directories as Hugging Face writes them:
//   config.json                       the model shape (runtime/model_config.hpp)
//   model.safetensors                 all tensors, or shards
//   model-00001-of-00003.safetensors  ...
//   model.safetensors.index.json      {"metadata": {"total_size": N},
//                                      "weight_map": {"name": "file", ...}}
// Reading maps every file; writing streams tensor by tensor, so neither
// ever holds a whole model in memory.
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/config/model_config.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace rlsync {

inline constexpr const char* config_file_name = "config.json";
inline constexpr const char* single_file_name = "model.safetensors";
inline constexpr const char* index_file_name = "model.safetensors.index.json";
/// Hugging Face's default max_shard_size is 5GB; 4 GiB keeps shards mappable
/// and quick to checksum.
inline constexpr std::uint64_t default_shard_bytes = 4ull << 30;
/// Elements generated and written per step by make/perturb.
inline constexpr std::size_t default_chunk_elements = 1 << 20;

/// The parameters of a Llama/Qwen decoder (no biases), in this order:
///   model.embed_tokens.weight                  [vocab, hidden]
///   per layer N:
///   model.layers.N.input_layernorm.weight      [hidden]
///   model.layers.N.self_attn.q_proj.weight     [heads*head_dim, hidden]
///   model.layers.N.self_attn.k_proj.weight     [kv_heads*head_dim, hidden]
///   model.layers.N.self_attn.v_proj.weight     [kv_heads*head_dim, hidden]
///   model.layers.N.self_attn.o_proj.weight     [hidden, heads*head_dim]
///   model.layers.N.self_attn.q_norm.weight     [head_dim]  (qwen3 only)
///   model.layers.N.self_attn.k_norm.weight     [head_dim]  (qwen3 only)
///   model.layers.N.post_attention_layernorm.weight [hidden]
///   model.layers.N.mlp.gate_proj.weight        [intermediate, hidden]
///   model.layers.N.mlp.up_proj.weight          [intermediate, hidden]
///   model.layers.N.mlp.down_proj.weight        [hidden, intermediate]
///   model.norm.weight                          [hidden]
///   lm_head.weight                             [vocab, hidden]  (absent when tied)
/// Pure: depends on nothing but its arguments. `c` should pass validate().
std::vector<tensor_spec> llama_parameter_specs(const model_config& c, dtype type);

/// True for checkpoint tensors that are no model parameter: rotary inv_freq
/// buffers some checkpoints carry, and lm_head.weight when embeddings are tied.
bool ignored_weight(const model_config& c, const std::string& name);

/// Those tensors at their usual shapes, `type` wide: an inv_freq of
/// head_dim/2 per layer, and lm_head.weight when embeddings are tied. What a
/// whole-group transfer of a checkpoint may carry beyond the parameters.
std::vector<tensor_spec> ignored_weight_specs(const model_config& c, dtype type);

/// A checkpoint directory, every safetensors file read into owned memory.
/// Movable; views stay valid while it lives.
class checkpoint {
public:
  struct entry {
    const tensor_view* tensor; // into files()[file]
    std::size_t file;
  };

  /// Opens `dir`: config.json, then model.safetensors if present, else the
  /// shards named by model.safetensors.index.json, each file read into
  /// `memory`'s (fresh memory when empty). Throws checkpoint_error
  /// on any problem: a missing or bad file, an index naming a tensor no
  /// shard holds or a file outside the directory, a tensor in two files or
  /// in a file the index does not map it to.
  static checkpoint open(const std::string& dir, const file_memory& memory = {});

  const std::string& dir() const { return dir_; }
  const model_config& config() const { return config_; }
  /// Shard order (file name order), one file when unsharded.
  const std::vector<safetensors_file>& files() const { return files_; }
  /// Every tensor: file by file, each in data order.
  const std::vector<entry>& tensors() const { return tensors_; }
  /// nullptr when absent.
  const tensor_view* find(const std::string& name) const;
  /// Throws checkpoint_error naming the directory when absent.
  const tensor_view& at(const std::string& name) const;
  /// Sum of all tensor bytes.
  std::uint64_t total_bytes() const { return total_bytes_; }
  /// True when the tensors came from model.safetensors.index.json.
  bool sharded() const { return sharded_; }

private:
  std::string dir_;
  model_config config_;
  std::vector<safetensors_file> files_;
  std::vector<entry> tensors_;
  std::unordered_map<std::string, std::size_t> by_name_; // into tensors_
  std::uint64_t total_bytes_ = 0;
  bool sharded_ = false;
};

/// Differences between a checkpoint and llama_parameter_specs() for its
/// config (in the dtype of its first tensor): missing or unexpected tensors,
/// wrong shapes, mixed dtypes. One message per problem; empty when it fits.
std::vector<std::string> check_llama_parameters(const checkpoint& ckpt);
/// The model's element type: the embedding's (an extra tensor may differ),
/// else the first tensor's. Throws checkpoint_error for an empty checkpoint.
dtype checkpoint_dtype(const checkpoint& ckpt);
/// The same for the checkpoint at `dir`, from the safetensors headers alone
/// (the embedding's file, else the first): a process that needs only the
/// dtype (an engine node) reads kilobytes, not the model.
dtype checkpoint_dtype_from_headers(const std::string& dir);
/// The same against the shape `c` and element type `type` the reader
/// expects; tensors for which `ignorable` is true may be present in excess
/// (e.g. rotary inv_freq buffers an engine skips).
std::vector<std::string> check_llama_parameters(const checkpoint& ckpt, const model_config& c, dtype type,
                                                const std::function<bool(const std::string&)>& ignorable = {});

/// What make/perturb wrote.
struct checkpoint_written {
  std::string dir;
  std::vector<std::string> files; // safetensors files, in order
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;        // tensor data
  double seconds = 0;
};

/// The value make_synthetic_checkpoint stores (before dtype rounding) for
/// elements [first, first + count) of tensor `spec`: a function of (seed,
/// spec.name, spec.shape, element index) only. Rank <= 1 tensors (norms):
/// 1 + uniform noise in [-0.1, 0.1]; matrices: uniform with standard
/// deviation 1/sqrt(shape.back()) (the fan-in), so that activations keep
/// unit scale and logits differ.
void synthetic_values(const tensor_spec& spec, std::uint64_t seed, std::uint64_t first,
                      std::size_t count, float* out);

/// Uniform noise in [-1, 1) for elements [first, first + count) of the
/// tensor called `name`: a function of (seed, name, index) only.
void perturbation_noise(const std::string& name, std::uint64_t seed, std::uint64_t first,
                        std::size_t count, float* out);

/// Writes a seeded synthetic checkpoint of shape `c` to `out_dir`: the
/// tensors of llama_parameter_specs(c, type), streamed in chunks of
/// `chunk_elements`; sharded with an index when the total exceeds
/// `shard_bytes`. Written under a temporary name and renamed at the end, so
/// a crash never leaves `out_dir` looking complete. `out_dir` must not exist
/// or be an empty directory. Same arguments, same bytes (chunking aside).
checkpoint_written make_synthetic_checkpoint(const std::string& out_dir, const model_config& c, dtype type,
                                             std::uint64_t seed,
                                             std::uint64_t shard_bytes = default_shard_bytes,
                                             std::size_t chunk_elements = default_chunk_elements);

/// Writes the next version of `from_dir` to `out_dir`: every element becomes
/// old + scale * perturbation_noise(seed, name, i), rounded to the tensor's
/// dtype (so changes under half a unit in the last place are lost, e.g.
/// 1.0 in bf16 needs |change| > 0.004). Same files, layout, dtypes and
/// metadata; config.json and the index copied. Streamed tensor by tensor,
/// written and renamed like make_synthetic_checkpoint.
checkpoint_written perturb_checkpoint(const std::string& from_dir, const std::string& out_dir, double scale,
                                      std::uint64_t seed,
                                      std::size_t chunk_elements = default_chunk_elements);

/// One tensor as inspect reports it.
struct tensor_summary {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0; // checksum64 of the tensor's bytes, seed 0
  std::string file;           // file name within the directory
};

struct checkpoint_summary {
  std::string dir;
  model_config config;
  std::vector<std::string> files;
  std::vector<tensor_summary> tensors; // in checkpoint::tensors() order
  std::uint64_t total_bytes = 0;
  std::vector<std::string> layout_problems; // check_llama_parameters()
};

checkpoint_summary inspect_checkpoint(const std::string& dir);

} // namespace rlsync
