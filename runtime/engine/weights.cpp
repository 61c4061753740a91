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

namespace {
// Layer parameters come in this order after the embedding: six per layer,
// and Qwen3's two head norms after them.
constexpr std::size_t max_per_layer = 8;
constexpr const char* layer_suffixes[max_per_layer] = {param::input_norm, param::qkv,     param::o,
                                                       param::post_norm,  param::gate_up, param::down,
                                                       param::q_norm,     param::k_norm};
} // namespace

worker_weights::worker_weights(const shard_spec& s, dtype type, bool allocate)
    : shard_(s), type_(type), allocated_(allocate) {
  const auto& c = s.config;
  const std::int64_t d = c.hidden_size;
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    index_.emplace(name, params_.size());
    params_.push_back(parameter{std::move(name), std::move(shape), type, {}});
  };
  add(param::embed, {s.vocab(), d});
  const std::vector<std::int64_t> layer_shapes[max_per_layer] = {
      {d}, {s.qkv_rows(), d}, {d, s.heads * s.head_dim}, {d}, {2 * s.inter, d}, {d, s.inter}, {s.head_dim},
      {s.head_dim}};
  per_layer_ = c.qk_norm() ? 8 : 6;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (std::size_t i = 0; i < per_layer_; ++i)
      add(layer_param_name(l, layer_suffixes[i]), layer_shapes[i]);
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
  const parameter* p = &params_[1 + static_cast<std::size_t>(l) * per_layer_];
  layer_weights w{p[0].ref(), p[1].ref(), p[2].ref(), p[3].ref(), p[4].ref(), p[5].ref(), {}, {}};
  if (per_layer_ == 8) {
    w.q_norm = p[6].ref();
    w.k_norm = p[7].ref();
  }
  return w;
}

std::uint64_t worker_weights::bytes() const {
  std::uint64_t n = 0;
  for (auto& p : params_)
    n += static_cast<std::uint64_t>(p.numel()) * dtype_size(p.type);
  return n;
}

std::shared_ptr<weight_set> weight_set::make(const model_config& c, int tp, dtype type) {
  // Every worker's shard (replicated kv heads aside).
  const std::uint64_t bytes = static_cast<std::uint64_t>(parameter_count(c).value_or(0)) * dtype_size(type);
  return allocating("the engine's " + std::string(short_name(type)) + " weights (" + std::to_string(tp)
                      + " workers)", bytes, [&] {
    auto set = std::make_shared<weight_set>();
    set->workers.reserve(static_cast<std::size_t>(tp));
    for (int w = 0; w < tp; ++w)
      set->workers.emplace_back(shard_spec::make(c, tp, w), type);
    return set;
  });
}

} // namespace rlsync::engine
