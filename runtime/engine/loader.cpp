#include "runtime/engine/loader.hpp"

#include "runtime/base/parallel.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

#include <exception>
#include <functional>
#include <set>
#include <stdexcept>
#include <thread>

namespace rlsync::engine {

namespace {

[[noreturn]] void fail(const weight_view& src, const std::string& what) {
  throw std::invalid_argument("engine loader: '" + src.name() + "': " + what);
}

void expect_shape(const weight_view& src, const std::vector<std::int64_t>& want) {
  if (src.shape() != want)
    fail(src, "shape " + shape_string(src.shape()) + ", the model config implies " + shape_string(want));
}

// -- one loader per checkpoint parameter -------------------------------------------

// Vocab-parallel: this worker's rows.
void load_vocab_rows(const weight_view& src, worker_weights& dst, const char* param_name) {
  const shard_spec& s = dst.shard();
  expect_shape(src, {s.config.vocab_size, s.config.hidden_size});
  src.narrow(0, s.vocab_begin, s.vocab())->copy_into(dst.at(param_name), 0);
}

// A norm every worker holds whole: [hidden], or Qwen3's [head_dim] head norms.
void load_replicated(const weight_view& src, worker_weights& dst, const std::string& param_name,
                     std::int64_t size) {
  expect_shape(src, {size});
  src.copy_into(dst.at(param_name), 0);
}

enum class qkv_part { q, k, v };

// Column-parallel q/k/v, fused into qkv_proj: [q heads; k heads; v heads].
void load_qkv(const weight_view& src, worker_weights& dst, std::int64_t layer, qkv_part part) {
  const shard_spec& s = dst.shard();
  const std::int64_t D = s.config.hidden_size, hd = s.head_dim;
  const std::int64_t total = part == qkv_part::q ? s.config.num_attention_heads : s.config.num_key_value_heads;
  expect_shape(src, {total * hd, D});
  const std::int64_t first = part == qkv_part::q ? s.head_begin : s.kv_begin;
  const std::int64_t count = part == qkv_part::q ? s.heads : s.kv_heads;
  const std::int64_t row = part == qkv_part::q ? 0 : part == qkv_part::k ? s.heads * hd : (s.heads + s.kv_heads) * hd;
  src.view({total, hd, D})                    // (2) per head
      ->narrow(0, first, count)               // (4) this worker's heads (one replicated kv head when kv < tp)
      ->view({count * hd, D})                 //     back to rows
      ->copy_into(dst.at(layer_param_name(layer, param::qkv)), row * D); // (1) at its rows in qkv
}

// Row-parallel o_proj: the input columns of this worker's heads.
void load_o(const weight_view& src, worker_weights& dst, std::int64_t layer) {
  const shard_spec& s = dst.shard();
  const std::int64_t D = s.config.hidden_size, hd = s.head_dim;
  expect_shape(src, {D, s.config.num_attention_heads * hd});
  src.narrow(1, s.head_begin * hd, s.heads * hd)->copy_into(dst.at(layer_param_name(layer, param::o)), 0);
}

// An MLP's gate or up rows [begin, begin + count) (column-parallel) into its
// fused gate_up parameter: gate rows first, then up rows.
void load_gate_up_rows(const weight_view& src, parameter& gate_up, std::int64_t begin, std::int64_t count, bool up) {
  src.narrow(0, begin, count)->copy_into(gate_up, up ? count * src.shape()[1] : 0);
}

// An MLP's down columns [begin, begin + count) (row-parallel).
void load_down_columns(const weight_view& src, parameter& down, std::int64_t begin, std::int64_t count) {
  src.narrow(1, begin, count)->copy_into(down, 0);
}

// A dense layer's gate/up: this worker's intermediate rows.
void load_gate_up(const weight_view& src, worker_weights& dst, std::int64_t layer, bool up) {
  const shard_spec& s = dst.shard();
  expect_shape(src, {s.config.intermediate_size, s.config.hidden_size});
  load_gate_up_rows(src, dst.at(layer_param_name(layer, param::gate_up)), s.inter_begin, s.inter, up);
}

// A dense layer's down_proj: this worker's intermediate columns.
void load_down(const weight_view& src, worker_weights& dst, std::int64_t layer) {
  const shard_spec& s = dst.shard();
  expect_shape(src, {s.config.hidden_size, s.config.intermediate_size});
  load_down_columns(src, dst.at(layer_param_name(layer, param::down)), s.inter_begin, s.inter);
}

// Qwen3-MoE: the router, whole on every worker.
void load_router(const weight_view& src, worker_weights& dst, std::int64_t layer) {
  const auto& c = dst.shard().config;
  expect_shape(src, {c.num_experts, c.hidden_size});
  src.copy_into(dst.at(layer_param_name(layer, param::router)), 0);
}

// Qwen3-MoE expert e, sliced by tp as a dense MLP: gate/up column-parallel,
// fused into the expert's gate_up_proj; down row-parallel. With expert
// parallelism (3) selects: a worker loads only the experts it holds, whole.
void load_expert(const weight_view& src, worker_weights& dst, std::int64_t layer, std::int64_t expert,
                 const std::string& part) {
  const shard_spec& s = dst.shard();
  const std::int64_t D = s.config.hidden_size, mi = s.config.moe_intermediate_size;
  expect_shape(src, part == "down_proj.weight" ? std::vector<std::int64_t>{D, mi} : std::vector<std::int64_t>{mi, D});
  if (!s.holds_expert(expert))
    return;
  const bool down = part == "down_proj.weight";
  auto& target = dst.at(layer_param_name(layer, param::expert_suffix(expert, down).c_str()));
  if (down)
    load_down_columns(src, target, s.moe_inter_begin, s.moe_inter);
  else
    load_gate_up_rows(src, target, s.moe_inter_begin, s.moe_inter, part == "up_proj.weight");
}

// "<prefix><N>.<rest>" -> N and rest; false when `name` is not of that form
// (N: 1 to 9 decimal digits).
bool split_indexed(const std::string& name, const std::string& prefix, std::int64_t& index, std::string& rest) {
  if (name.compare(0, prefix.size(), prefix) != 0)
    return false;
  std::size_t i = prefix.size(), digits = 0;
  std::int64_t n = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 9) {
    n = n * 10 + (name[i++] - '0');
    ++digits;
  }
  if (digits == 0 || i >= name.size() || name[i] != '.')
    return false;
  index = n;
  rest = name.substr(i + 1);
  return true;
}

// Qwen3-MoE, fused layout (as Llama-4): one tensor holds every expert,
// transposed against the separate layout. For each expert this worker
// selects each expert it holds (3: all of them, or with expert parallelism
// its own), transposes and splits gate from up (2), and takes its
// intermediate slice (4: the whole of it with expert parallelism).
void load_fused_experts(const weight_view& src, worker_weights& dst, std::int64_t layer, bool down) {
  const shard_spec& s = dst.shard();
  const std::int64_t D = s.config.hidden_size, mi = s.config.moe_intermediate_size, E = s.config.num_experts;
  expect_shape(src, down ? std::vector<std::int64_t>{E, mi, D} : std::vector<std::int64_t>{E, D, 2 * mi});
  for (std::int64_t e = s.expert_begin; e < s.expert_begin + s.experts; ++e) {
    auto expert = src.narrow(0, e, 1); // (3) select
    auto& param = dst.at(layer_param_name(layer, param::expert_suffix(e, down).c_str()));
    if (down) { // [mi, D] -> this worker's rows, transposed to [D, moe_inter]
      expert->view({mi, D})->narrow(0, s.moe_inter_begin, s.moe_inter)->transpose(0, 1)->copy_into(param, 0);
      continue;
    }
    auto both = expert->view({D, 2 * mi}); // gate columns [0, mi), up columns [mi, 2 mi)
    both->narrow(1, s.moe_inter_begin, s.moe_inter)->transpose(0, 1)->copy_into(param, 0);
    both->narrow(1, mi + s.moe_inter_begin, s.moe_inter)->transpose(0, 1)->copy_into(param, s.moe_inter * D);
  }
}

// "mlp.experts.<E>.<part>" -> E and part; false when not an expert's tensor.
bool split_expert_name(const std::string& suffix, std::int64_t& expert, std::string& part) {
  return split_indexed(suffix, "mlp.experts.", expert, part)
         && (part == "gate_proj.weight" || part == "up_proj.weight" || part == "down_proj.weight");
}

// "model.layers.<N>.<suffix>" -> N and suffix; false when not a layer name.
bool split_layer_name(const std::string& name, std::int64_t& layer, std::string& suffix) {
  return split_indexed(name, "model.layers.", layer, suffix);
}

} // namespace

void load_weight(const weight_view& src, worker_weights& dst) {
  const std::string& name = src.name();
  const model_config& c = dst.shard().config;
  if (name == "model.embed_tokens.weight")
    return load_vocab_rows(src, dst, param::embed);
  if (name == "lm_head.weight" && !c.tie_word_embeddings)
    return load_vocab_rows(src, dst, param::lm_head);
  if (name == "model.norm.weight")
    return load_replicated(src, dst, param::final_norm, c.hidden_size);
  std::int64_t l = 0;
  std::string suffix;
  if (split_layer_name(name, l, suffix) && l < c.num_hidden_layers) {
    if (suffix == "input_layernorm.weight")
      return load_replicated(src, dst, layer_param_name(l, param::input_norm), c.hidden_size);
    if (suffix == "post_attention_layernorm.weight")
      return load_replicated(src, dst, layer_param_name(l, param::post_norm), c.hidden_size);
    if (c.qk_norm() && (suffix == param::q_norm || suffix == param::k_norm))
      return load_replicated(src, dst, layer_param_name(l, suffix.c_str()), c.head_dim());
    if (suffix == "self_attn.q_proj.weight")
      return load_qkv(src, dst, l, qkv_part::q);
    if (suffix == "self_attn.k_proj.weight")
      return load_qkv(src, dst, l, qkv_part::k);
    if (suffix == "self_attn.v_proj.weight")
      return load_qkv(src, dst, l, qkv_part::v);
    if (suffix == "self_attn.o_proj.weight")
      return load_o(src, dst, l);
    if (c.sparse_layer(l)) { // (3) select: expert e's tensors go to expert e
      std::int64_t e = 0;
      std::string part;
      if (suffix == param::router)
        return load_router(src, dst, l);
      if (c.fused_experts && (suffix == "mlp.experts.gate_up_proj" || suffix == "mlp.experts.down_proj"))
        return load_fused_experts(src, dst, l, suffix == "mlp.experts.down_proj");
      if (!c.fused_experts && split_expert_name(suffix, e, part) && e < c.num_experts)
        return load_expert(src, dst, l, e, part);
      fail(src, "not a parameter of this model (layer " + std::to_string(l) + " is a mixture of experts)");
    }
    if (suffix == "mlp.gate_proj.weight")
      return load_gate_up(src, dst, l, false);
    if (suffix == "mlp.up_proj.weight")
      return load_gate_up(src, dst, l, true);
    if (suffix == "mlp.down_proj.weight")
      return load_down(src, dst, l);
  }
  fail(src, "not a parameter of this model");
}

void load_weights(const std::vector<const rlsync::tensor_view*>& tensors, weight_set& set) {
  if (set.workers.empty())
    throw std::invalid_argument("engine loader: empty weight set");
  const model_config& c = set.config();
  // Completeness first, so that a bad checkpoint fails before any copy.
  std::set<std::string> missing;
  for (const auto& spec : llama_parameter_specs(c, dtype::f32))
    missing.insert(spec.name);
  std::vector<weight_ptr> views;
  for (const auto* t : tensors) {
    if (ignored_weight(c, t->name))
      continue;
    if (!missing.erase(t->name))
      throw std::invalid_argument("engine loader: '" + t->name + "': not a parameter of this model, or given twice");
    views.push_back(real_weight(t->name, t->type, t->shape, t->data));
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& n : missing)
      names += (names.empty() ? "" : ", ") + n;
    throw std::invalid_argument("engine loader: missing tensors: " + names);
  }

  // Workers write disjoint parameters: load them in parallel.
  parallel_for(set.workers.size(), set.workers.size(), [&](std::size_t w) {
    for (const auto& v : views)
      load_weight(*v, set.workers[w]);
  });
}

void load_weights(const std::vector<rlsync::tensor_view>& tensors, weight_set& set) {
  std::vector<const rlsync::tensor_view*> ptrs;
  for (const auto& t : tensors)
    ptrs.push_back(&t);
  load_weights(ptrs, set);
}

void load_checkpoint(const rlsync::checkpoint& ckpt, weight_set& set) {
  std::vector<const rlsync::tensor_view*> ptrs;
  for (const auto& e : ckpt.tensors())
    ptrs.push_back(e.tensor);
  load_weights(ptrs, set);
}

std::shared_ptr<weight_set> load_checkpoint(const std::string& dir, int tp, bool expert_parallel) {
  auto ckpt = rlsync::checkpoint::open(dir);
  auto set = weight_set::make(ckpt.config(), tp, checkpoint_dtype(ckpt), expert_parallel);
  load_checkpoint(ckpt, *set);
  return set;
}

} // namespace rlsync::engine
