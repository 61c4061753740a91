#pragma once
// The shape of a Llama/Qwen-style decoder, as Hugging Face's config.json
// names it. Shared by topologies, checkpoints and the engine.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rlsync {

/// The decoder architectures the engine runs, as config.json's model_type
/// names them:
///   llama  LlamaForCausalLM: head_dim = hidden / heads
///   qwen3  Qwen3ForCausalLM: an explicit head_dim (may differ from hidden /
///          heads) and an RMSNorm over each query and key head
///          (self_attn.q_norm / k_norm, [head_dim]) before the rotary
///          embedding; no attention bias
///   qwen3_moe  Qwen3MoeForCausalLM: qwen3's attention; in its sparse layers
///          the MLP is a router (mlp.gate, [experts, hidden]) choosing
///          num_experts_per_tok of num_experts SwiGLU experts
///          (mlp.experts.{e}.{gate,up,down}_proj, moe_intermediate_size)
enum class model_arch { llama, qwen3, qwen3_moe };

/// "llama", "qwen3", "qwen3_moe".
const char* to_string(model_arch a);
/// The architecture config.json's model_type names; nullopt for another.
std::optional<model_arch> arch_of_model_type(const std::string& model_type);

struct model_config {
  model_arch arch = model_arch::llama;
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  /// Qwen3's config.json head_dim; 0: hidden_size / num_attention_heads
  /// (Llama's rule, and Qwen3's when the field is absent).
  std::int64_t explicit_head_dim = 0;
  // qwen3_moe: the experts, as Hugging Face's Qwen3MoeConfig names them.
  std::int64_t num_experts = 0;
  std::int64_t num_experts_per_tok = 0;
  std::int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = true;          ///< renormalise the chosen experts' probabilities to sum to 1
  std::int64_t decoder_sparse_step = 1; ///< layer l is sparse when (l + 1) % step == 0 ...
  std::vector<std::int64_t> mlp_only_layers; ///< ... and not listed here (those keep the dense MLP)
  /// How a checkpoint stores a sparse layer's experts: separate (false,
  /// Hugging Face's Qwen3-MoE: mlp.experts.{e}.{gate,up,down}_proj.weight) or
  /// fused (true, as Llama-4: mlp.experts.gate_up_proj [experts, hidden,
  /// 2 * moe_intermediate], gate then up on the last axis, and
  /// mlp.experts.down_proj [experts, moe_intermediate, hidden], both
  /// transposed against the separate layout). Not in config.json: a
  /// checkpoint's tensors say which (checkpoint::open).
  bool fused_experts = false;
  /// config.json settings the built-in engine does not compute, each as
  /// "field: value: why" (rope_scaling, hidden_act, a sliding window).
  /// A vLLM server computes them and rlsync only moves the weights, so only
  /// a built-in engine refuses such a model.
  std::vector<std::string> not_computed;

  std::int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads;
  }
  /// Whether each layer normalises its query and key heads (Qwen3, Qwen3-MoE).
  bool qk_norm() const { return arch == model_arch::qwen3 || arch == model_arch::qwen3_moe; }
  /// Whether layer `l`'s MLP is a mixture of experts.
  bool sparse_layer(std::int64_t l) const;
};

/// The byte-level tokenizer's reserved ids: bytes 0..255, then BOS and EOS.
constexpr std::int64_t token_bos = 256;
constexpr std::int64_t token_eos = 257;
constexpr std::int64_t min_vocab_size = 258;

/// Upper bounds on a model's shape, from config.json or a topology. They sit
/// well above today's largest open models (Llama 3 405B: hidden 16384,
/// intermediate 53248, 126 layers, 128 heads, vocab 128256) and keep every
/// derived size (elements of a tensor, parameters, bytes) far inside 64 bits.
constexpr std::int64_t max_vocab_size = std::int64_t(1) << 24;
constexpr std::int64_t max_hidden_size = std::int64_t(1) << 16;
constexpr std::int64_t max_intermediate_size = std::int64_t(1) << 20;
constexpr std::int64_t max_hidden_layers = 1024;
constexpr std::int64_t max_attention_heads = 1024;
constexpr std::int64_t max_head_dim = 4096;
constexpr std::int64_t max_experts = 4096;
constexpr std::int64_t max_position_embeddings_limit = std::int64_t(1) << 24;
/// 2^40 (about 1.1 trillion) parameters.
constexpr std::int64_t max_parameters = std::int64_t(1) << 40;
/// Experts of all sparse layers together (2^17; DeepSeek-V3 has about 15k,
/// Kimi K2 23k): each is three tensors every reader lists, so a few hundred
/// bytes of config.json cannot ask for millions of them.
constexpr std::int64_t max_experts_in_all = std::int64_t(1) << 17;

/// Parameters of a Llama-style decoder without biases: embeddings, per layer
/// q/k/v/o, gate/up/down and two norms (Qwen3: and the q/k head norms), the
/// final norm, and the LM head unless tied. Computed with overflow checks: nullopt when it does not fit
/// in 64 bits or a size is not positive.
std::optional<std::int64_t> parameter_count(const model_config& c);

/// Checks the shape on its own (positive sizes within the max_* bounds above,
/// heads divide hidden unless head_dim is explicit (Qwen3 only), kv heads
/// divide heads, even head_dim for rotary,
/// vocab >= 258, at most max_parameters parameters and max_experts_in_all
/// experts over the sparse layers). Returns one message
/// per problem, each starting with the config.json field name, e.g.
/// "num_key_value_heads: must divide num_attention_heads (8), got 3".
std::vector<std::string> validate(const model_config& c);

/// Checks that tensor parallelism of size `tp` can shard this model:
/// tp divides num_attention_heads and intermediate_size, and kv heads are
/// either split (tp divides them) or replicated (they divide tp).
/// Returns one message per problem, without a field prefix, e.g.
/// "must divide num_attention_heads (8), got 3".
/// With `expert_parallel` (vLLM's --enable-expert-parallel) experts are not
/// sliced but placed whole, so tp need not divide moe_intermediate_size;
/// the model must then have experts, at least tp of them.
std::vector<std::string> validate_tp(const model_config& c, std::int64_t tp, bool expert_parallel = false);

/// Checks `dp` data-parallel ranks of `tp` workers (the model already passes
/// validate_tp): with expert parallelism on a mixture-of-experts model the
/// EP size is dp x tp (vLLM's), so the experts must number at least dp x tp.
/// Returns one message per problem, without a field prefix.
std::vector<std::string> validate_dp(const model_config& c, std::int64_t tp, std::int64_t dp, bool expert_parallel);

} // namespace rlsync

namespace rlsync {

/// Reads a Hugging Face config.json. Unknown keys are ignored (HF writes many
/// we do not need); num_key_value_heads defaults to num_attention_heads.
/// model_type picks the architecture (absent: llama); another model type,
/// or attention_bias true, is refused naming the field.
/// Throws std::runtime_error "<path>: <field>: <problem>" on a missing file,
/// invalid JSON, a missing required field or a value of the wrong type, and
/// on any problem validate() finds.
model_config read_config_json(const std::string& path);

/// Writes `c` as a Hugging Face-style config.json (LlamaForCausalLM or
/// Qwen3ForCausalLM, as c.arch says).
void write_config_json(const std::string& path, const model_config& c);

} // namespace rlsync
