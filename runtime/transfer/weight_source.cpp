#include "runtime/transfer/weight_source.hpp"

#include "runtime/base/allocation.hpp"
#include "runtime/base/parallel.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/plan/groups.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace rlsync::transfer {

namespace {

// Elements generated or perturbed per step (bounded scratch memory).
constexpr std::size_t chunk_elements = std::size_t(1) << 16;

unsigned thread_count(unsigned requested, std::size_t jobs) {
  unsigned n = requested ? requested : std::min(8u, std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min<std::size_t>(n, jobs)));
}

std::vector<std::uint32_t> all_groups(const model_config& c) {
  std::vector<std::uint32_t> v(plan::group_count(c));
  for (std::uint32_t g = 0; g < v.size(); ++g)
    v[g] = g;
  return v;
}

// The fields of config.json a step must share with the model.
std::vector<std::string> config_differences(const model_config& model, const model_config& step) {
  std::vector<std::string> out;
  auto cmp = [&](const char* field, auto want, auto got) {
    if (want != got)
      out.push_back(std::string(field) + " is " + std::to_string(got) + ", the model has " + std::to_string(want));
  };
  cmp("vocab_size", model.vocab_size, step.vocab_size);
  cmp("hidden_size", model.hidden_size, step.hidden_size);
  cmp("intermediate_size", model.intermediate_size, step.intermediate_size);
  cmp("num_hidden_layers", model.num_hidden_layers, step.num_hidden_layers);
  cmp("num_attention_heads", model.num_attention_heads, step.num_attention_heads);
  cmp("num_key_value_heads", model.num_key_value_heads, step.num_key_value_heads);
  cmp("rms_norm_eps", model.rms_norm_eps, step.rms_norm_eps);
  cmp("rope_theta", model.rope_theta, step.rope_theta);
  cmp("head_dim", model.head_dim(), step.head_dim());
  cmp("num_experts", model.num_experts, step.num_experts);
  cmp("num_experts_per_tok", model.num_experts_per_tok, step.num_experts_per_tok);
  cmp("moe_intermediate_size", model.moe_intermediate_size, step.moe_intermediate_size);
  cmp("max_position_embeddings", model.max_position_embeddings, step.max_position_embeddings);
  cmp("decoder_sparse_step", model.decoder_sparse_step, step.decoder_sparse_step);
  if (model.norm_topk_prob != step.norm_topk_prob)
    out.push_back(std::string("norm_topk_prob is ") + (step.norm_topk_prob ? "true" : "false") + ", the model has "
                  + (model.norm_topk_prob ? "true" : "false"));
  if (model.mlp_only_layers != step.mlp_only_layers)
    out.push_back("mlp_only_layers differ from the model's");
  if (model.not_computed != step.not_computed)
    out.push_back("rope_scaling, hidden_act or use_sliding_window differ from the model's");
  if (model.fused_experts != step.fused_experts)
    out.push_back(std::string("the experts are ") + (step.fused_experts ? "fused" : "separate") + ", the model's "
                  + (model.fused_experts ? "fused" : "separate"));
  if (model.arch != step.arch)
    out.push_back(std::string("model_type is ") + to_string(step.arch) + ", the model is " + to_string(model.arch));
  if (model.tie_word_embeddings != step.tie_word_embeddings)
    out.push_back(std::string("tie_word_embeddings is ") + (step.tie_word_embeddings ? "true" : "false")
                  + ", the model has " + (model.tie_word_embeddings ? "true" : "false"));
  return out;
}

std::string join_lines(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v)
    s += (s.empty() ? "" : "; ") + x;
  return s;
}

// The first tensor of `tensors` holding NaN or infinity, as a message; "".
template <class Tensors>
std::string first_nonfinite(const Tensors& tensors) {
  for (const auto& t : tensors)
    if (auto problem = nonfinite_problem(t); !problem.empty())
      return problem + " (--allow-nonfinite publishes it anyway)";
  return "";
}

} // namespace

namespace {

/// Whether any of `n` elements at `data` has an all-ones exponent, without
/// an early exit, so that the compiler vectorizes it.
template <class Bits>
bool any_all_ones_exponent(const std::byte* data, std::size_t n, Bits exponent) {
  Bits seen = 0;
  for (std::size_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, data + sizeof(Bits) * i, sizeof(Bits));
    seen |= static_cast<Bits>((bits & exponent) == exponent);
  }
  return seen != 0;
}

template <class Bits>
std::optional<nonfinite_element> scan(const std::byte* data, std::size_t count, Bits exponent, Bits mantissa) {
  constexpr std::size_t block = 4096; // clean blocks in one vectorized pass; a flagged one element by element
  for (std::size_t first = 0; first < count; first += block) {
    const std::size_t n = std::min(block, count - first);
    if (!any_all_ones_exponent(data + sizeof(Bits) * first, n, exponent))
      continue;
    for (std::size_t i = first; i < first + n; ++i) {
      Bits bits;
      std::memcpy(&bits, data + sizeof(Bits) * i, sizeof(Bits));
      if ((bits & exponent) == exponent)
        return nonfinite_element{i, (bits & mantissa) != 0};
    }
  }
  return std::nullopt;
}

} // namespace

std::optional<nonfinite_element> first_nonfinite_element(dtype type, const std::byte* data, std::size_t count) {
  // By the bits: an all-ones exponent is infinity (zero mantissa) or NaN.
  switch (type) {
    case dtype::f32:
      return scan<std::uint32_t>(data, count, 0x7f800000u, 0x007fffffu);
    case dtype::bf16:
      return scan<std::uint16_t>(data, count, 0x7f80, 0x007f);
    case dtype::f16:
      return scan<std::uint16_t>(data, count, 0x7c00, 0x03ff);
  }
  return std::nullopt;
}

std::string nonfinite_message(const std::string& tensor, const nonfinite_element& e) {
  return "tensor '" + printable(tensor) + "' element " + std::to_string(e.index) + " is "
         + (e.nan ? "NaN" : "infinite");
}

std::string nonfinite_problem(const tensor_view& t) {
  const std::size_t n = dtype_size(t.type) == 0 ? 0 : t.size / dtype_size(t.type);
  auto found = first_nonfinite_element(t.type, t.data, n);
  return found ? nonfinite_message(t.name, *found) : std::string{};
}

// -- weight_snapshot ------------------------------------------------------------------

void weight_snapshot::index(std::vector<tensor_view> views) {
  const std::uint32_t L = plan::group_count(config_);
  by_group_.assign(L, {});
  for (auto& v : views)
    by_group_.at(plan::group_of(config_, v.name)).push_back(std::move(v));
  for (std::uint32_t g = 0; g < L; ++g) {
    if (by_group_[g].empty())
      continue;
    held_.push_back(g);
    for (const auto& v : by_group_[g]) {
      if (!by_name_.emplace(v.name, tensors_.size()).second)
        throw std::invalid_argument("weight snapshot: tensor '" + v.name + "' given twice");
      tensors_.push_back(v);
      total_bytes_ += v.size;
    }
  }
}

std::shared_ptr<const weight_snapshot> weight_snapshot::from_bytes(std::uint64_t version, const model_config& c,
                                                                   std::vector<tensor_spec> specs,
                                                                   std::vector<std::uint8_t> storage) {
  auto bytes = std::make_shared<std::vector<std::uint8_t>>(std::move(storage));
  const auto size = static_cast<std::uint64_t>(bytes->size());
  std::shared_ptr<const std::uint8_t> data(bytes, bytes->data()); // aliases the vector: it lives as long
  return from_buffer(version, c, std::move(specs), std::move(data), size);
}

std::shared_ptr<const weight_snapshot> weight_snapshot::from_buffer(std::uint64_t version, const model_config& c,
                                                                    std::vector<tensor_spec> specs,
                                                                    std::shared_ptr<const std::uint8_t> storage,
                                                                    std::uint64_t size,
                                                                    std::shared_ptr<const device_resident> on_device) {
  std::vector<tensor_view> views;
  std::uint64_t offset = 0;
  for (auto& s : specs) {
    tensor_view v;
    static_cast<tensor_spec&>(v) = std::move(s);
    v.size = static_cast<std::size_t>(v.bytes());
    if (v.size > size || offset > size - v.size)
      throw std::invalid_argument("weight snapshot: tensor '" + v.name + "' beyond the " + std::to_string(size)
                                  + " bytes given");
    v.data = reinterpret_cast<const std::byte*>(storage.get() + offset);
    v.offset = offset;
    offset += v.size;
    views.push_back(std::move(v));
  }
  if (offset != size)
    throw std::invalid_argument("weight snapshot: " + std::to_string(size) + " bytes given, the tensors take "
                                + std::to_string(offset));
  std::shared_ptr<weight_snapshot> s(new weight_snapshot);
  s->version_ = version;
  s->config_ = c;
  s->storage_ = std::move(storage);
  s->index(std::move(views));
  if (on_device)
    for (const auto& t : s->tensors_)
      if (!on_device->tensors.count(t.name))
        throw std::invalid_argument("weight snapshot: tensor '" + t.name + "' is missing from the device copy");
  s->on_device_ = std::move(on_device);
  return s;
}

std::shared_ptr<const weight_snapshot> weight_snapshot::from_shared(std::uint64_t version, const model_config& c,
                                                                    std::vector<tensor_spec> specs,
                                                                    std::shared_ptr<const host_buffer> buffer,
                                                                    std::uint64_t size) {
  if (!buffer || !buffer->shared() || size > buffer->capacity())
    throw std::invalid_argument("weight snapshot: " + std::to_string(size) + " bytes in no shareable buffer that large");
  std::shared_ptr<const std::uint8_t> data(buffer, buffer->data()); // aliases the buffer: it lives as long
  auto s = std::const_pointer_cast<weight_snapshot>(from_buffer(version, c, std::move(specs), std::move(data), size));
  s->shared_ = std::move(buffer); // made just now: nobody else sees it yet
  return s;
}

std::shared_ptr<const weight_snapshot> weight_snapshot::from_checkpoint(std::uint64_t version, checkpoint ckpt,
                                                                        const std::function<bool(const std::string&)>& held) {
  auto owned = std::make_shared<checkpoint>(std::move(ckpt));
  std::shared_ptr<weight_snapshot> s(new weight_snapshot);
  s->version_ = version;
  s->config_ = owned->config();
  std::vector<tensor_view> views;
  for (const auto& e : owned->tensors()) {
    if (!held(e.tensor->name))
      continue; // another rank's, or an extra the engines drop (a layer's inv_freq, any layer)
    plan::group_of(s->config_, e.tensor->name); // throws for a name in no group
    views.push_back(*e.tensor);
  }
  // Parameter order within a group, whatever the files' order.
  auto order = llama_parameter_specs(s->config_, dtype::bf16);
  std::unordered_map<std::string, std::size_t> rank;
  for (std::size_t i = 0; i < order.size(); ++i)
    rank.emplace(order[i].name, i);
  std::stable_sort(views.begin(), views.end(), [&](const tensor_view& a, const tensor_view& b) {
    auto ra = rank.find(a.name), rb = rank.find(b.name);
    return (ra == rank.end() ? order.size() : ra->second) < (rb == rank.end() ? order.size() : rb->second);
  });
  s->storage_ = owned;
  s->index(std::move(views));
  return s;
}

std::shared_ptr<const weight_snapshot> weight_snapshot::relabeled(const std::shared_ptr<const weight_snapshot>& from,
                                                                  std::uint64_t version) {
  std::shared_ptr<weight_snapshot> s(new weight_snapshot(*from));
  s->version_ = version;
  s->on_device_.reset();
  return s;
}

const tensor_view* weight_snapshot::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const tensor_view& weight_snapshot::at(const std::string& name) const {
  if (auto* t = find(name))
    return *t;
  throw std::out_of_range("weight snapshot: version " + std::to_string(version_) + " holds no tensor '" + name + "'");
}

const std::vector<tensor_view>& weight_snapshot::group(std::uint32_t g) const {
  static const std::vector<tensor_view> none;
  return g < by_group_.size() ? by_group_[g] : none;
}

std::uint64_t weight_snapshot::group_bytes(std::uint32_t g) const {
  std::uint64_t n = 0;
  for (const auto& t : group(g))
    n += t.size;
  return n;
}

// -- weight_source ----------------------------------------------------------------------

weight_source::weight_source(model_config c, const std::optional<std::vector<std::int64_t>>& held_layers,
                             std::size_t keep_versions, std::optional<std::vector<std::int64_t>> held_experts)
    : config_(std::move(c)), experts_(std::move(held_experts)), keep_(std::max<std::size_t>(1, keep_versions)) {
  if (auto problems = validate(config_); !problems.empty())
    throw std::invalid_argument("weight source: invalid model: " + join_lines(problems));
  held_ = held_layers ? plan::groups_of_layers(config_, *held_layers) : all_groups(config_);
  if (held_.empty())
    throw std::invalid_argument("weight source: holds no layer");
  if (experts_) {
    if (config_.arch != model_arch::qwen3_moe || config_.fused_experts)
      throw std::invalid_argument("weight source: holds some experts, but the model has no separate expert tensors");
    std::sort(experts_->begin(), experts_->end());
    experts_->erase(std::unique(experts_->begin(), experts_->end()), experts_->end());
    if (experts_->empty())
      throw std::invalid_argument("weight source: holds no expert (leave held experts out to hold all)");
    if (experts_->front() < 0 || experts_->back() >= config_.num_experts)
      throw std::invalid_argument("weight source: held experts must be in [0, "
                                  + std::to_string(config_.num_experts) + ")");
  }
}

bool weight_source::holds(const std::string& name) const {
  try {
    if (!std::binary_search(held_.begin(), held_.end(), plan::group_of(config_, name)))
      return false;
  } catch (const std::invalid_argument&) {
    return false;
  }
  if (!experts_)
    return true;
  const auto e = plan::expert_of(name);
  return !e || std::binary_search(experts_->begin(), experts_->end(), *e);
}

namespace {

/// Version `v` among those kept and the pinned one (the caller holds the
/// source's lock); nullptr when not held.
template <class Held>
const Held* held_version_of(const std::deque<Held>& kept, const Held& pinned, std::uint64_t v) {
  for (const auto& h : kept)
    if (h.snapshot->version() == v)
      return &h;
  return pinned.snapshot && pinned.snapshot->version() == v ? &pinned : nullptr;
}

} // namespace

snapshot_ptr weight_source::latest() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return versions_.empty() ? nullptr : versions_.back().snapshot;
}

snapshot_ptr weight_source::find(std::uint64_t v) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto* h = held_version_of(versions_, pinned_, v);
  return h ? h->snapshot : nullptr;
}

std::uint64_t weight_source::same_bytes_since(std::uint64_t v) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto* h = held_version_of(versions_, pinned_, v);
  return h ? h->same_since : 0;
}

std::vector<std::uint64_t> weight_source::versions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::uint64_t> out;
  for (const auto& h : versions_)
    out.push_back(h.snapshot->version());
  if (pinned_.snapshot && std::find(out.begin(), out.end(), pinned_.snapshot->version()) == out.end())
    out.insert(out.begin(), pinned_.snapshot->version()); // older than every kept one
  return out;
}

bool weight_source::pin(std::uint64_t v) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto* h = held_version_of(versions_, pinned_, v);
  if (h && h != &pinned_)
    pinned_ = *h;
  return h != nullptr;
}

std::uint64_t weight_source::pinned() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pinned_.snapshot ? pinned_.snapshot->version() : 0;
}

namespace {

/// Whether two versions hold the same tensors with the same bytes.
bool same_bytes(const weight_snapshot& a, const weight_snapshot& b) {
  const auto& x = a.tensors();
  const auto& y = b.tensors();
  if (x.size() != y.size())
    return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (x[i].name != y[i].name || x[i].type != y[i].type || x[i].shape != y[i].shape || x[i].size != y[i].size)
      return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (x[i].data != y[i].data && std::memcmp(x[i].data, y[i].data, x[i].size) != 0)
      return false;
  return true;
}

} // namespace

void weight_source::publish(snapshot_ptr s) {
  held_version before;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!versions_.empty())
      before = versions_.back();
  }
  if (before.snapshot && s->version() <= before.snapshot->version())
    throw std::logic_error("weight source: version " + std::to_string(s->version()) + " after "
                           + std::to_string(before.snapshot->version()));
  // Outside the lock: transfers look versions up meanwhile (one publish at a time).
  const bool unchanged = before.snapshot && same_bytes(*before.snapshot, *s);
  std::vector<std::shared_ptr<const std::function<void()>>> wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!versions_.empty() && versions_.back().snapshot != before.snapshot) // one publish at a time, or this breaks
      throw std::logic_error("weight source: version " + std::to_string(s->version()) + " published while "
                             + std::to_string(versions_.back().snapshot->version()) + " was");
    const auto since = unchanged ? before.same_since : s->version();
    versions_.push_back(held_version{std::move(s), since});
    while (versions_.size() > keep_)
      versions_.pop_front(); // freed once no transfer holds it
    for (auto it = publish_listeners_.begin(); it != publish_listeners_.end();)
      if (auto w = it->lock()) {
        wake.push_back(std::move(w));
        ++it;
      } else {
        it = publish_listeners_.erase(it);
      }
  }
  for (const auto& w : wake) // outside the lock: a listener may look versions up
    (*w)();
}

void weight_source::on_publish(std::weak_ptr<const std::function<void()>> wake) const {
  std::lock_guard<std::mutex> lock(mutex_);
  publish_listeners_.push_back(std::move(wake));
}

// -- synthetic_source -------------------------------------------------------------------

synthetic_source::synthetic_source(synthetic_options o)
    : weight_source(o.config, o.held_layers, o.keep_versions, o.held_experts), options_(std::move(o)),
      lendable_(options_.shared_small_pages) {
  if (!std::isfinite(options_.perturb))
    throw std::invalid_argument("synthetic weight source: perturbation must be finite");
  if (!options_.initial_checkpoint.empty()) {
    auto ck = checkpoint::open(options_.initial_checkpoint);
    if (auto d = config_differences(config(), ck.config()); !d.empty())
      throw checkpoint_error(options_.initial_checkpoint + "/" + config_file_name + ": " + join_lines(d));
    if (ck.tensors().empty())
      throw checkpoint_error(options_.initial_checkpoint + ": no tensors");
    if (!options_.allow_nonfinite) {
      std::vector<tensor_view> views;
      for (const auto& e : ck.tensors())
        views.push_back(*e.tensor);
      if (auto problem = first_nonfinite(views); !problem.empty())
        throw checkpoint_error(options_.initial_checkpoint + ": " + problem);
    }
    options_.type = checkpoint_dtype(ck); // the embedding's: an extra tensor may differ
  }
  for (auto& s : llama_parameter_specs(config(), options_.type))
    if (holds(s.name))
      specs_.push_back(std::move(s));
}

snapshot_ptr synthetic_source::produce_next() {
  auto prev = latest();
  // No perturbation: a step that changes nothing (the zero-byte round).
  auto next = !prev ? make_initial()
                    : options_.perturb == 0 ? weight_snapshot::relabeled(prev, prev->version() + 1) : perturbed(*prev);
  publish(next);
  return next;
}

snapshot_ptr synthetic_source::make_initial() const {
  std::vector<std::uint64_t> offsets;
  std::uint64_t total = 0;
  for (const auto& s : specs_) {
    offsets.push_back(total);
    total += s.bytes();
  }
  auto storage = new_version_memory(1, total);
  if (!options_.initial_checkpoint.empty()) {
    auto ck = checkpoint::open(options_.initial_checkpoint);
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      const tensor_view& t = ck.at(specs_[i].name);
      if (t.shape != specs_[i].shape || t.type != specs_[i].type)
        throw checkpoint_error(options_.initial_checkpoint + ": tensor '" + t.name + "' is "
                               + std::string(safetensors_name(t.type)) + " " + shape_string(t.shape) + ", expected "
                               + std::string(safetensors_name(specs_[i].type)) + " " + shape_string(specs_[i].shape));
      std::copy(t.data, t.data + t.size, reinterpret_cast<std::byte*>(storage.data() + offsets[i]));
    }
  } else {
    parallel_for(specs_.size(), thread_count(options_.threads, specs_.size()), [&](std::size_t i) {
      const tensor_spec& spec = specs_[i];
      const std::size_t es = dtype_size(spec.type);
      std::vector<float> values(chunk_elements);
      const auto n = static_cast<std::uint64_t>(spec.numel());
      for (std::uint64_t first = 0; first < n; first += chunk_elements) {
        auto count = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_elements, n - first));
        synthetic_values(spec, options_.model_seed, first, count, values.data());
        convert_from_f32(spec.type, values.data(), storage.data() + offsets[i] + first * es, count);
      }
    });
  }
  return snapshot_of(1, specs_, std::move(storage), total);
}

namespace {

/// Fresh memory for lendable_pool::take; nullptr when none can be had.
std::shared_ptr<host_buffer> lendable_version_memory(const std::string& what, std::uint64_t total, bool small_pages) {
  // Only in huge pages: every version is new memory that each consumer
  // maps and faults in inside the round, once per 2 MiB here but once per
  // 4 KiB otherwise (measured: a 256 MiB sharded sync took 270 ms lent in
  // place from 4 KiB pages, 45 ms packed). The pool may be short or absent,
  // so each version tries again. Ordinary pages only where asked (tests).
  std::vector<shared_pages> tries;
  if (total >= huge_page_bytes)
    tries.push_back(shared_pages::huge);
  if (small_pages)
    tries.push_back(shared_pages::normal);
  for (auto pages : tries) {
    try {
      return allocating(what, total, [&] {
        return std::make_shared<host_buffer>(static_cast<std::size_t>(std::max<std::uint64_t>(total, 1)), shareable,
                                             pages);
      });
    } catch (const std::runtime_error&) {
    }
  }
  return nullptr;
}

} // namespace

struct lendable_pool::spares {
  std::mutex mutex;
  std::vector<host_buffer> free; // at most `most`, reserved: the deleter never allocates
  std::size_t most = 0;
  std::set<std::uint64_t> alive;   // every buffer made and not freed
  std::set<std::uint64_t> retired; // alive, never to be kept
};

lendable_pool::lendable_pool(bool small_pages, std::size_t max_spares)
    : small_pages_(small_pages), spares_(std::make_shared<spares>()) {
  spares_->most = max_spares;
  spares_->free.reserve(max_spares);
}

std::shared_ptr<host_buffer> lendable_pool::take(const std::string& what, std::uint64_t bytes) {
  host_buffer buffer;
  std::vector<host_buffer> unfit; // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(spares_->mutex);
    while (!spares_->free.empty() && !buffer.data()) {
      host_buffer b = std::move(spares_->free.back());
      spares_->free.pop_back();
      if (b.capacity() >= bytes) {
        buffer = std::move(b);
      } else { // a source's versions keep their size; a smaller one only holds pool pages
        spares_->alive.erase(b.id());
        unfit.push_back(std::move(b));
      }
    }
  }
  unfit.clear();
  if (!buffer.data()) {
    auto fresh = lendable_version_memory(what, bytes, small_pages_);
    if (!fresh)
      return nullptr;
    buffer = std::move(*fresh);
    std::lock_guard<std::mutex> lock(spares_->mutex);
    spares_->alive.insert(buffer.id());
  }
  std::weak_ptr<spares> back = spares_;
  return std::shared_ptr<host_buffer>(new host_buffer(std::move(buffer)), [back](host_buffer* p) {
    std::unique_ptr<host_buffer> owned(p);
    if (auto s = back.lock()) {
      std::lock_guard<std::mutex> lock(s->mutex);
      const bool keep = !s->retired.count(p->id()) && s->free.size() < s->most;
      if (keep) {
        s->free.push_back(std::move(*owned));
      } else {
        s->retired.erase(p->id());
        s->alive.erase(p->id());
      }
    } // the buffer not kept is unmapped here, outside the lock
  });
}

std::vector<std::uint64_t> lendable_pool::ids() const {
  std::lock_guard<std::mutex> lock(spares_->mutex);
  return {spares_->alive.begin(), spares_->alive.end()};
}

void lendable_pool::retire(std::uint64_t id) const {
  std::lock_guard<std::mutex> lock(spares_->mutex);
  if (spares_->alive.count(id))
    spares_->retired.insert(id);
}

synthetic_source::version_memory synthetic_source::new_version_memory(std::uint64_t version,
                                                                     std::uint64_t total) const {
  const std::string what = "the trainer's weights, version " + std::to_string(version);
  version_memory m;
  if (options_.shared_memory)
    m.shared = lendable_.take(what, total);
  if (!m.shared)
    m.bytes = allocating(what, total, [&] { return std::vector<std::uint8_t>(static_cast<std::size_t>(total)); });
  return m;
}

snapshot_ptr synthetic_source::snapshot_of(std::uint64_t version, std::vector<tensor_spec> specs, version_memory m,
                                           std::uint64_t total) const {
  if (m.shared)
    return weight_snapshot::from_shared(version, config(), std::move(specs), std::move(m.shared), total);
  return weight_snapshot::from_bytes(version, config(), std::move(specs), std::move(m.bytes));
}

namespace {

/// A version's tensors laid out back to back, in its order (group by group,
/// as from_buffer and from_shared lay out the specs they are given).
struct back_to_back_layout {
  std::vector<tensor_spec> specs;
  std::vector<std::uint64_t> offsets;
  std::uint64_t total = 0;
};

back_to_back_layout back_to_back(const std::vector<tensor_view>& tensors) {
  back_to_back_layout out;
  out.specs.reserve(tensors.size());
  out.offsets.reserve(tensors.size());
  for (const auto& t : tensors) {
    out.specs.push_back(t);
    out.offsets.push_back(out.total);
    out.total += t.size; // each held in memory: no overflow
  }
  return out;
}

} // namespace

snapshot_ptr synthetic_source::perturbed(const weight_snapshot& from) const {
  const auto& tensors = from.tensors();
  auto layout = back_to_back(tensors);
  const auto& offsets = layout.offsets;
  const std::uint64_t total = layout.total;
  auto storage = new_version_memory(from.version() + 1, total);
  const std::uint64_t seed = options_.trainer_seed + from.version();
  // The same arithmetic as perturb_checkpoint: old + scale * noise in f32,
  // rounded to the tensor's dtype.
  const float scale = static_cast<float>(options_.perturb);
  parallel_for(tensors.size(), thread_count(options_.threads, tensors.size()), [&](std::size_t i) {
    const tensor_view& t = tensors[i];
    const std::size_t es = dtype_size(t.type);
    std::vector<float> values(chunk_elements), noise(chunk_elements);
    const auto n = static_cast<std::uint64_t>(t.numel());
    for (std::uint64_t first = 0; first < n; first += chunk_elements) {
      auto count = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_elements, n - first));
      convert_to_f32(t.type, t.data + first * es, values.data(), count);
      perturbation_noise(t.name, seed, first, count, noise.data());
      for (std::size_t k = 0; k < count; ++k)
        values[k] += scale * noise[k];
      convert_from_f32(t.type, values.data(), storage.data() + offsets[i] + first * es, count);
    }
  });
  return snapshot_of(from.version() + 1, std::move(layout.specs), std::move(storage), total);
}

// -- checkpoint_dir_source --------------------------------------------------------------

std::string step_dir_name(std::uint64_t step) {
  std::string digits = std::to_string(step);
  if (digits.size() < 6)
    digits.insert(0, 6 - digits.size(), '0');
  return "step-" + digits;
}

namespace {

enum class step_name { other, in_range, out_of_range };

// "step-<digits>": its step, checked against the version range with no
// overflow however many digits there are.
step_name classify_step_dir_name(const std::string& name, std::uint64_t& step) {
  static const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0)
    return step_name::other;
  step = 0;
  bool too_large = false;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9')
      return step_name::other;
    const auto digit = static_cast<std::uint64_t>(name[i] - '0');
    if (step > (max_step_version - digit) / 10)
      too_large = true;
    else
      step = step * 10 + digit;
  }
  return too_large || step == 0 ? step_name::out_of_range : step_name::in_range;
}

} // namespace

std::optional<std::uint64_t> parse_step_dir_name(const std::string& name) {
  std::uint64_t step = 0;
  if (classify_step_dir_name(name, step) != step_name::in_range)
    return std::nullopt;
  return step;
}

std::string step_name_problem(const std::string& name) {
  std::uint64_t step = 0;
  if (classify_step_dir_name(name, step) != step_name::out_of_range)
    return "";
  return "step directory '" + printable(name) + "' is outside the version range: steps run from 1 to "
         + std::to_string(max_step_version) + " (2^62); it is skipped";
}

void mark_step_complete(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / step_complete_marker).string();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw checkpoint_error(path + ": cannot create the step marker");
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  if (!ok)
    throw checkpoint_error(path + ": cannot sync the step marker");
  // The marker's directory entry must be durable too.
  if (int dfd = ::open(step_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

step_read_memory::step_read_memory() : spares_(std::numeric_limits<std::size_t>::max(), 0) {}

file_memory step_read_memory::memory() const {
  return [pool = spares_](std::size_t bytes) {
    auto [block, size] = pool.take(bytes);
    if (!block) {
      size = bytes;
      try { // not zero-filled: the file is read over it
        block.reset(new std::byte[bytes]);
      } catch (const std::bad_alloc&) {
        pool.clear(); // spares that do not fit may be what is missing
        block.reset(new std::byte[bytes]);
      }
    }
    std::shared_ptr<std::byte[]> shared = pool.share(std::move(block), size);
    return std::shared_ptr<std::byte>(shared, shared.get());
  };
}

void step_read_memory::keep_at_most(std::uint64_t bytes) { spares_.raise_byte_limit(bytes); }

std::uint64_t step_read_memory::spare_bytes() const { return spares_.bytes(); }

checkpoint_dir_source::checkpoint_dir_source(checkpoint_dir_options o)
    : weight_source(o.config, o.held_layers, o.keep_versions, o.held_experts), options_(std::move(o)),
      lendable_(options_.shared_small_pages) {
  if (options_.dir.empty())
    throw std::invalid_argument("checkpoint directory source: no directory");
  seen_type_ = options_.type;
}

std::vector<tensor_spec> checkpoint_dir_source::parameters() const {
  std::vector<tensor_spec> out;
  if (auto s = latest()) {
    for (const auto& t : s->tensors())
      out.push_back(t);
    return out;
  }
  dtype type = dtype::bf16;
  {
    std::lock_guard<std::mutex> lock(type_mutex_);
    type = seen_type_.value_or(dtype::bf16);
  }
  for (auto& s : llama_parameter_specs(config(), type))
    if (holds(s.name))
      out.push_back(std::move(s));
  return out;
}

snapshot_ptr checkpoint_dir_source::poll() {
  auto current = latest();
  const std::uint64_t after = current ? current->version() : 0;
  const auto now = std::chrono::steady_clock::now();
  std::optional<std::uint64_t> newest;
  std::string path; // of the newest
  // Said once per name: they are marked reported only when thrown.
  std::vector<std::string> notes, noted_names;
  std::set<std::uint64_t> complete; // this scan's complete steps
  std::set<std::string> still_there; // reported names this scan saw again
  // Complete steps by the first name seen for each, and the numbers two
  // names share ("step-42" and "step-000042"): which one is meant is
  // unknowable, so neither is published.
  std::map<std::uint64_t, std::string> named;
  std::set<std::uint64_t> ambiguous;
  std::map<std::uint64_t, std::string> choosable; // step -> path, above the published version
  std::error_code ec;
  for (fs::directory_iterator it(options_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (reported_names_.count(name))
      still_there.insert(name);
    auto step = parse_step_dir_name(name);
    if (!step) {
      if (auto problem = step_name_problem(name); !problem.empty() && !reported_names_.count(name)) {
        notes.push_back(problem);
        noted_names.push_back(name);
      }
      continue;
    }
    std::error_code ec2;
    if (!it->is_directory(ec2) || !fs::is_regular_file(it->path() / step_complete_marker, ec2))
      continue;
    complete.insert(*step);
    if (*step <= after) {
      // Completed only after a newer version was published (a step seen
      // complete before was merely superseded): versions only move forward.
      if (*step < after && !complete_last_scan_.count(*step) && !reported_names_.count(name)) {
        notes.push_back("step directory '" + printable(name) + "' appeared out of order, after version "
                        + std::to_string(after) + " was published; it is skipped");
        noted_names.push_back(name);
      }
      continue;
    }
    if (auto [first, fresh] = named.try_emplace(*step, name); !fresh) {
      ambiguous.insert(*step);
      // Said once per step, whichever name the listing gives second.
      const std::string key = "/two names: " + std::to_string(*step); // no file name holds '/'
      if (reported_names_.count(key)) {
        still_there.insert(key);
      } else if (std::find(noted_names.begin(), noted_names.end(), key) == noted_names.end()) {
        notes.push_back("step directories '" + printable(first->second) + "' and '" + printable(name)
                        + "' both name step " + std::to_string(*step) + "; neither is published");
        noted_names.push_back(key);
      }
      continue;
    }
    if (rejected_.count(*step))
      continue;
    if (auto r = retrying_.find(*step); r != retrying_.end() && now < r->second.next_try)
      continue;
    choosable.emplace(*step, it->path().string());
  }
  for (auto c = choosable.rbegin(); c != choosable.rend() && !newest; ++c)
    if (!ambiguous.count(c->first)) {
      newest = c->first;
      path = c->second;
    }
  // A directory that cannot be listed (not a directory, no permission) is
  // said once, not taken for an empty one; one not made yet is just empty.
  if (ec && ec != std::errc::no_such_file_or_directory) {
    const std::string key = "/scan: " + ec.message(); // no file name holds '/'
    if (!reported_names_.count(key)) {
      notes.push_back("cannot list the directory: " + ec.message());
      noted_names.push_back(key);
    }
  }
  complete_last_scan_ = std::move(complete);
  // What can no longer be chosen (at or below the published version), and
  // names gone from the directory, are forgotten: over a long run, these
  // hold only what the directory still shows.
  if (!ec) // a scan cut short saw only some names: forgetting the rest would say them again
    reported_names_ = std::move(still_there);
  rejected_.erase(rejected_.begin(), rejected_.upper_bound(after));
  for (auto it = retrying_.begin(); it != retrying_.end();)
    it = it->first <= after ? retrying_.erase(it) : std::next(it);
  auto mark_noted = [&] { reported_names_.insert(noted_names.begin(), noted_names.end()); };
  if (!newest) {
    if (!notes.empty()) {
      mark_noted();
      throw checkpoint_error(options_.dir + ": " + join_lines(notes));
    }
    return nullptr; // nothing new, or no directory yet
  }
  // A failure of this step is retried with backoff until retry_for has passed.
  auto failed = [&] {
    auto [it, fresh] = retrying_.try_emplace(*newest);
    auto& f = it->second;
    if (fresh) {
      f.first_failure = now;
      f.backoff = options_.retry_initial;
    } else {
      f.backoff = std::min(options_.retry_max, f.backoff * 2);
    }
    f.next_try = now + f.backoff;
    if (now - f.first_failure >= options_.retry_for) {
      rejected_.insert(*newest);
      retrying_.erase(it);
      return std::string(" (failing for ") + std::to_string(options_.retry_for.count())
             + " ms: skipped for good)";
    }
    return " (retrying in " + std::to_string(f.backoff.count()) + " ms)";
  };
  try {
    checkpoint ck = checkpoint::open(path, read_memory_.memory());
    std::uint64_t file_bytes = 0;
    for (const auto& f : ck.files())
      file_bytes += f.file_size(); // each held in memory: no overflow
    if (auto d = config_differences(config(), ck.config()); !d.empty())
      throw checkpoint_error((fs::path(path) / config_file_name).string() + ": " + join_lines(d));
    // Every parameter with its shape, nothing unknown, one dtype.
    const dtype type = checkpoint_dtype(ck);
    std::optional<dtype> want;
    {
      std::lock_guard<std::mutex> lock(type_mutex_);
      want = seen_type_;
    }
    std::vector<std::string> problems;
    if (want && *want != type)
      problems.push_back("tensors are " + std::string(safetensors_name(type)) + ", earlier steps "
                         + std::string(safetensors_name(*want)));
    // Extra tensors the engine ignores (rotary inv_freq) may stay.
    auto layout = check_llama_parameters(ck, config(), type,
                                         [&](const std::string& name) { return ignored_weight(config(), name); });
    problems.insert(problems.end(), layout.begin(), layout.end());
    if (!problems.empty())
      throw checkpoint_error(path + ": " + join_lines(problems));
    // Extras stay behind: engines drop them anyway, and everything sized
    // from the model's parameters (registered names, slots, budgets) would
    // be short by them.
    auto snapshot = weight_snapshot::from_checkpoint(*newest, std::move(ck), [this](const std::string& n) {
      return holds(n) && !ignored_weight(config(), n);
    });
    if (!options_.allow_nonfinite)
      if (auto problem = first_nonfinite(snapshot->tensors()); !problem.empty())
        throw checkpoint_error(path + ": " + problem);
    read_memory_.keep_at_most(file_bytes); // an accepted step's files: a dropped one's, for the next
    if (options_.shared_memory)
      snapshot = lendable_copy(std::move(snapshot)); // the files' memory goes with the first snapshot
    retrying_.erase(*newest);
    {
      std::lock_guard<std::mutex> lock(type_mutex_);
      seen_type_ = type;
    }
    publish(snapshot);
    return snapshot;
  } catch (const checkpoint_error& e) {
    notes.insert(notes.begin(), e.what() + failed());
  } catch (const std::exception& e) {
    notes.insert(notes.begin(), path + ": " + e.what() + failed());
  }
  mark_noted();
  throw checkpoint_error(join_lines(notes));
}

snapshot_ptr checkpoint_dir_source::lendable_copy(snapshot_ptr read) const {
  // Group by group: a sharded plan's pieces of a group come in long runs.
  const auto& tensors = read->tensors();
  auto layout = back_to_back(tensors);
  const auto& offsets = layout.offsets;
  const std::uint64_t total = layout.total;
  auto buffer = lendable_.take("step " + std::to_string(read->version()) + " in shareable memory", total);
  if (!buffer)
    return read;
  parallel_for(tensors.size(), 2, [&](std::size_t i) {
    std::memcpy(buffer->data() + offsets[i], tensors[i].data, tensors[i].size);
  });
  return weight_snapshot::from_shared(read->version(), read->config(), std::move(layout.specs), std::move(buffer),
                                      total);
}

// -- from a topology -------------------------------------------------------------------

std::shared_ptr<weight_source> make_weight_source(const topology& t, std::size_t rank) {
  const trainer_spec& tr = t.trainer;
  std::optional<std::vector<std::int64_t>> held, experts;
  if (rank < tr.ranks.size()) {
    held = tr.ranks[rank].layers;
    experts = tr.ranks[rank].experts;
  }
  else if (!tr.ranks.empty())
    throw std::out_of_range("weight source: trainer rank " + std::to_string(rank) + " of "
                            + std::to_string(tr.ranks.size()));
  if (tr.source == trainer_source::external)
    throw std::invalid_argument("trainer rank " + std::to_string(rank)
                                + " is external (trainer.source: external): its own process provides it "
                                  "(rlsync.TrainerRank in Python)");
  if (tr.source == trainer_source::checkpoint_dir) {
    checkpoint_dir_options o;
    o.config = t.model.config;
    o.dir = tr.dir;
    o.type = t.model.weights_dtype;
    o.held_layers = held;
    o.held_experts = experts;
    o.allow_nonfinite = tr.allow_nonfinite;
    // A copy per step: only where engines may be on this rank's host to be lent it.
    o.shared_memory = trainer_versions_lendable(t.transfer) && engine_near_trainer_rank(t, rank);
    return std::make_shared<checkpoint_dir_source>(std::move(o));
  }
  synthetic_options o;
  o.config = t.model.config;
  o.type = t.model.weights_dtype.value_or(dtype::bf16);
  o.model_seed = t.model.seed;
  o.initial_checkpoint = t.model.checkpoint;
  o.trainer_seed = tr.seed;
  o.perturb = tr.perturb;
  o.held_layers = held;
  o.held_experts = experts;
  o.allow_nonfinite = tr.allow_nonfinite;
  o.shared_memory = trainer_versions_lendable(t.transfer); // same-host engines are lent groups in place
  return std::make_shared<synthetic_source>(std::move(o));
}

} // namespace rlsync::transfer
