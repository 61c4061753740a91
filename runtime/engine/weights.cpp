#include "runtime/engine/weights.hpp"

#include "runtime/base/allocation.hpp"

#include <stdexcept>

namespace rlsync::engine {

std::int64_t parameter::numel() const {
  std::int64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

std::string layer_param_name(std::int64_t layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

std::string param::expert_suffix(std::int64_t expert, bool down) {
  return "mlp.experts." + std::to_string(expert) + (down ? ".down_proj.weight" : ".gate_up_proj.weight");
}

worker_weights::worker_weights(const shard_spec& s, dtype type, bool allocate)
    : shard_(s), type_(type), allocated_(allocate) {
  const auto& c = s.config;
  const std::int64_t d = c.hidden_size;
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    index_.emplace(name, params_.size());
    params_.push_back(parameter{std::move(name), std::move(shape), type, {}});
  };
  add(param::embed, {s.vocab(), d});
  // Each layer: the norms and attention, its MLP (dense, or the router and
  // each local expert's fused gate/up and down), then Qwen3's head norms.
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    layer_first_.push_back(params_.size());
    add(layer_param_name(l, param::input_norm), {d});
    add(layer_param_name(l, param::qkv), {s.qkv_rows(), d});
    add(layer_param_name(l, param::o), {d, s.heads * s.head_dim});
    add(layer_param_name(l, param::post_norm), {d});
    if (c.sparse_layer(l)) {
      add(layer_param_name(l, param::router), {c.num_experts, d});
      for (std::int64_t e = s.expert_begin; e < s.expert_begin + s.experts; ++e) {
        add(layer_param_name(l, param::expert_suffix(e, false).c_str()), {2 * s.moe_inter, d});
        add(layer_param_name(l, param::expert_suffix(e, true).c_str()), {d, s.moe_inter});
      }
    } else {
      add(layer_param_name(l, param::gate_up), {2 * s.inter, d});
      add(layer_param_name(l, param::down), {d, s.inter});
    }
    if (c.qk_norm()) {
      add(layer_param_name(l, param::q_norm), {s.head_dim});
      add(layer_param_name(l, param::k_norm), {s.head_dim});
    }
  }
  final_norm_ = params_.size();
  add(param::final_norm, {d});
  lm_head_ = 0; // tied: the embedding's rows
  if (!c.tie_word_embeddings) {
    lm_head_ = params_.size();
    add(param::lm_head, {s.vocab(), d});
  }
  if (allocate)
    for (auto& p : params_)
      p.bytes.assign(static_cast<std::size_t>(p.numel()) * dtype_size(type), 0);
}

parameter& worker_weights::at(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end())
    throw std::out_of_range("engine weights: no parameter named '" + name + "'");
  return params_[it->second];
}

const parameter& worker_weights::at(const std::string& name) const {
  return const_cast<worker_weights*>(this)->at(name);
}

const parameter* worker_weights::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &params_[it->second];
}

layer_weights worker_weights::layer(std::int64_t l) const {
  const auto& c = shard_.config;
  const parameter* p = &params_[layer_first_[static_cast<std::size_t>(l)]];
  layer_weights w;
  w.input_norm = p[0].ref();
  w.qkv = p[1].ref();
  w.o = p[2].ref();
  w.post_norm = p[3].ref();
  std::size_t next = 4;
  if (c.sparse_layer(l)) {
    w.router = p[next++].ref();
    w.experts = shard_.experts;
    w.expert_begin = shard_.expert_begin;
    w.expert_params = &p[next];
    next += static_cast<std::size_t>(2 * shard_.experts);
  } else {
    w.gate_up = p[next++].ref();
    w.down = p[next++].ref();
  }
  if (c.qk_norm()) {
    w.q_norm = p[next].ref();
    w.k_norm = p[next + 1].ref();
  }
  return w;
}

std::uint64_t worker_weights::bytes() const {
  std::uint64_t n = 0;
  for (auto& p : params_)
    n += static_cast<std::uint64_t>(p.numel()) * dtype_size(p.type) + p.q.size() + p.scales.size() * sizeof(float);
  return n;
}

std::shared_ptr<weight_set> weight_set::make(const model_config& c, int tp, dtype type, bool expert_parallel) {
  // Every worker's shard (replicated kv heads aside).
  const std::uint64_t bytes = static_cast<std::uint64_t>(parameter_count(c).value_or(0)) * dtype_size(type);
  return allocating("the engine's " + std::string(short_name(type)) + " weights (" + std::to_string(tp)
                      + " workers)", bytes, [&] {
    auto set = std::make_shared<weight_set>();
    set->workers.reserve(static_cast<std::size_t>(tp));
    for (int w = 0; w < tp; ++w)
      set->workers.emplace_back(shard_spec::make(c, tp, w, expert_parallel), type);
    return set;
  });
}

} // namespace rlsync::engine
