#include "runtime/transfer/external_source.hpp"

#include "runtime/base/allocation.hpp"
#include "runtime/base/parallel.hpp"
#include "runtime/base/tensor.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/plan/groups.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <stdexcept>

#include <sys/mman.h>

namespace rlsync::transfer {

namespace {

/// "0-3, 6": the layers held (layer l is group l).
std::string ranges_of(const std::vector<std::uint32_t>& groups) {
  return format_layers(std::vector<std::int64_t>(groups.begin(), groups.end()));
}

/// Copies are cut into pieces of this size so that two threads share even a
/// model made of one large tensor.
constexpr std::uint64_t copy_piece_bytes = std::uint64_t{8} << 20;

} // namespace

struct external_source::host_buffer {
  std::uint8_t* data = nullptr;
  std::uint64_t bytes = 0;      ///< allocated: held_bytes_ rounded up to huge pages
  std::shared_ptr<void> pinned; ///< the page lock; dropped before the memory is freed
  host_buffer(std::uint8_t* d, std::uint64_t n) : data(d), bytes(n) {}
  ~host_buffer() {
    pinned.reset();
    std::free(data);
  }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
};

std::shared_ptr<external_source::host_buffer> external_source::buffer_for(const std::string& what) {
  // Huge pages (host_buffer.hpp's size): 512 times fewer page faults on a fresh buffer.
  const std::uint64_t rounded = (std::max<std::uint64_t>(held_bytes_, 1) + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
  auto [buffer, size] = spares_.take(rounded); // every buffer has this size today
  if (!buffer) {
    auto* memory = allocating(what, rounded, [&] {
      void* p = std::aligned_alloc(static_cast<std::size_t>(huge_page_bytes), static_cast<std::size_t>(rounded));
      if (!p)
        throw std::bad_alloc();
      ::madvise(p, static_cast<std::size_t>(rounded), MADV_HUGEPAGE); // a hint: without THP, plain pages
      return static_cast<std::uint8_t*>(p);
    });
    buffer = std::make_unique<host_buffer>(memory, rounded);
    size = rounded;
  }
  // Back to the spares when the version is dropped, while this source lives.
  return spares_.share(std::move(buffer), size);
}

external_source::external_source(external_options o)
    : weight_source(o.config, o.held_layers, o.keep_versions, o.held_experts), options_(std::move(o)),
      spares_(max_spare_buffers), lendable_(options_.shared_small_pages) {
  for (auto& s : llama_parameter_specs(config(), options_.type)) {
    parameter_names_.insert(s.name);
    if (holds(s.name)) {
      held_bytes_ += s.bytes(); // bounded: the model's parameter count was validated
      specs_.push_back(std::move(s));
    }
  }
}

std::uint64_t external_source::last_pushed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_pushed_;
}

void external_source::raise_floor(std::uint64_t version) {
  std::lock_guard<std::mutex> lock(mutex_);
  cluster_floor_ = std::max(cluster_floor_, version);
}

snapshot_ptr external_source::advance() {
  snapshot_ptr next;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    next = std::move(pending_);
    pending_.reset();
  }
  if (next)
    publish(next);
  return next;
}

void external_source::push(std::uint64_t version, const std::vector<tensor_input>& tensors) {
  std::lock_guard<std::mutex> one_push(push_mutex_);
  const std::string& who = options_.who;
  if (version == 0 || version > max_step_version)
    throw std::invalid_argument("version " + std::to_string(version) + ": must be in [1, 2^62]");
  std::uint64_t last = 0, floor = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last = last_pushed_;
    floor = cluster_floor_;
  }
  if (version <= last)
    throw std::invalid_argument("version " + std::to_string(version) + ": must exceed the last version published ("
                                + std::to_string(last) + ")");
  if (version <= floor)
    throw std::invalid_argument("version " + std::to_string(version) + ": the fleet already serves version "
                                + std::to_string(floor) + " (a trainer restarted from a checkpoint continues above it)");
  // Match every input to a held parameter, naming the first tensor at fault.
  std::map<std::string, const tensor_input*> given;
  const tensor_input* embedding = nullptr;
  for (const auto& t : tensors)
    if (t.name == "model.embed_tokens.weight")
      embedding = &t;
  for (const auto& t : tensors) {
    const std::string where = "tensor '" + t.name + "'";
    if (!parameter_names_.count(t.name) && !(config().tie_word_embeddings && t.name == "lm_head.weight"))
      throw std::invalid_argument(where + ": not a parameter of the topology's model (Hugging Face Llama names: "
                                          "model.embed_tokens.weight, model.layers.N.{input_layernorm, self_attn.q_proj, "
                                          "...}.weight, model.norm.weight, lm_head.weight)");
    const std::uint32_t group = plan::group_of(config(), t.name);
    if (config().tie_word_embeddings && t.name == "lm_head.weight") {
      // A tied module's state_dict lists the embedding twice, one storage.
      if (embedding && embedding->data == t.data && embedding->bytes == t.bytes)
        continue;
      throw std::invalid_argument(where + ": the model ties its embeddings (tie_word_embeddings) but this tensor is "
                                          "not model.embed_tokens.weight's storage: leave it out");
    }
    if (!std::binary_search(held_groups().begin(), held_groups().end(), group))
      throw std::invalid_argument(where + ": layer " + std::to_string(group) + " is not held by " + who
                                  + " (it holds layers " + ranges_of(held_groups()) + ")");
    if (!holds(t.name)) // a held layer, but another rank's expert
      throw std::invalid_argument(where + ": expert " + std::to_string(plan::expert_of(t.name).value_or(-1))
                                  + " is not held by " + who + " (it holds experts "
                                  + format_layers(*held_experts()) + ")");
    if (!given.emplace(t.name, &t).second)
      throw std::invalid_argument(where + ": given twice");
  }
  std::uint64_t total = 0;
  std::vector<std::uint64_t> offsets;
  std::vector<const tensor_input*> inputs;
  std::vector<std::string> missing;
  for (const auto& spec : specs_) {
    auto it = given.find(spec.name);
    if (it == given.end()) {
      missing.push_back(spec.name);
      continue;
    }
    const tensor_input& t = *it->second;
    const std::string where = "tensor '" + t.name + "'";
    if (t.shape != spec.shape)
      throw std::invalid_argument(where + ": shape " + shape_string(t.shape) + ", the model's is "
                                  + shape_string(spec.shape));
    if (t.type != spec.type)
      throw std::invalid_argument(where + ": dtype " + std::string(safetensors_name(t.type)) + ", the topology's weights are "
                                  + std::string(safetensors_name(spec.type)));
    if (t.bytes != spec.bytes() || (t.bytes > 0 && !t.data))
      throw std::invalid_argument(where + ": " + std::to_string(t.bytes) + " bytes given, its shape and dtype take "
                                  + std::to_string(spec.bytes()));
    if (t.device >= 0 && !options_.device)
      throw std::invalid_argument(where + ": on cuda:" + std::to_string(t.device) + ", and " + who
                                  + " reads host tensors only (a build without CUDA)");
    offsets.push_back(total);
    inputs.push_back(&t);
    total += spec.bytes(); // bounded: the model's parameter count was validated
  }
  if (!missing.empty()) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 3; ++i)
      list += (i ? ", '" : "'") + missing[i] + "'";
    if (missing.size() > 3)
      list += " and " + std::to_string(missing.size() - 3) + " more";
    throw std::invalid_argument("missing tensor" + std::string(missing.size() > 1 ? "s " : " ") + list + " (held by "
                                + who + ": layers " + ranges_of(held_groups()) + ")");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    device_copy_problem_.clear();
  }
  const bool any_on_device =
    std::any_of(inputs.begin(), inputs.end(), [](const tensor_input* t) { return t->device >= 0; });
  const bool all_on_device =
    any_on_device && std::all_of(inputs.begin(), inputs.end(), [](const tensor_input* t) { return t->device >= 0; });
  // The device copy first, so that the host bytes are read from it: the
  // trainer's tensors are read once, and what is checked is what is served.
  std::shared_ptr<const device_resident> on_device;
  if (all_on_device && options_.device_copy_on) {
    on_device = device_copy_of(inputs);
  } else if (any_on_device && options_.device_copy_on) {
    std::lock_guard<std::mutex> lock(mutex_);
    device_copy_problem_ = "some tensors are in host memory: publish every tensor from the device for a device copy";
  }
  // The one host copy: into shareable memory a UCX producer lends in place
  // (host pushes; a device push keeps its page-locked buffer, reused), else
  // into a dropped version's buffer or fresh memory never zero-filled (its
  // page faults are paid inside the copy).
  const std::string what = who + "'s weights, version " + std::to_string(version);
  std::shared_ptr<transfer::host_buffer> lendable;
  if (options_.shared_memory && !any_on_device)
    lendable = lendable_.take(what, held_bytes_);
  std::shared_ptr<host_buffer> buffer;
  if (!lendable)
    buffer = buffer_for(what);
  std::uint8_t* const base = lendable ? lendable->data() : buffer->data;
  if (any_on_device)
    copy_from_device(inputs, offsets, on_device.get(), *buffer);
  struct piece {
    std::size_t input;
    std::uint64_t from, bytes;
  };
  std::vector<piece> pieces;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    for (std::uint64_t from = 0; from < inputs[i]->bytes; from += copy_piece_bytes)
      pieces.push_back({i, from, std::min(copy_piece_bytes, inputs[i]->bytes - from)});
  // Host tensors are copied here, on two threads, each piece checked for
  // NaN and infinity right after it is copied, while it is in cache, on the
  // copy: what is checked is what is served. Device tensors were copied
  // above; only their check runs here.
  std::vector<std::optional<nonfinite_element>> nonfinite(pieces.size());
  parallel_for(pieces.size(), std::max(1u, options_.copy_threads), [&](std::size_t k) {
    const piece& p = pieces[k];
    auto* to = base + offsets[p.input] + p.from;
    if (inputs[p.input]->device < 0)
      std::memcpy(to, static_cast<const std::uint8_t*>(inputs[p.input]->data) + p.from, static_cast<std::size_t>(p.bytes));
    if (!options_.allow_nonfinite) {
      const auto element = dtype_size(inputs[p.input]->type);
      nonfinite[k] = first_nonfinite_element(inputs[p.input]->type, reinterpret_cast<const std::byte*>(to),
                                             static_cast<std::size_t>(p.bytes / element));
      if (nonfinite[k]) // pieces start at multiples of copy_piece_bytes: whole elements
        nonfinite[k]->index += static_cast<std::size_t>(p.from / element);
    }
  });
  for (std::size_t k = 0; k < pieces.size(); ++k) // pieces in tensor order: the first problem
    if (nonfinite[k])
      throw std::invalid_argument(nonfinite_message(inputs[pieces[k].input]->name, *nonfinite[k]) + " (version "
                                  + std::to_string(version) + ")");
  snapshot_ptr snapshot;
  if (lendable) {
    snapshot = weight_snapshot::from_shared(version, config(), specs_, std::move(lendable), total);
  } else {
    std::shared_ptr<const std::uint8_t> storage(buffer, buffer->data);
    snapshot = weight_snapshot::from_buffer(version, config(), specs_, std::move(storage), total, on_device);
  }
  std::uint64_t superseded = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_)
      superseded = pending_->version();
    pending_ = std::move(snapshot); // a newer version supersedes one not yet published
    last_pushed_ = version;
  }
  // The superseded version is never served: its copy goes (device_copy_of made room for this one).
  device_copies_.erase(std::remove_if(device_copies_.begin(), device_copies_.end(),
                                      [&](const auto& held) { return held.first == superseded; }),
                       device_copies_.end());
  if (on_device)
    device_copies_.emplace_back(version, std::move(on_device));
}

void external_source::make_room_for_device_copy() {
  const std::size_t most = std::max<std::size_t>(options_.device_copies, 1);
  if (device_copies_.size() < most)
    return;
  // First the copies of versions this source no longer serves (a round
  // that adopted one still holds it), then the oldest.
  const auto held = versions();
  std::uint64_t pending = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_)
      pending = pending_->version();
  }
  device_copies_.erase(std::remove_if(device_copies_.begin(), device_copies_.end(),
                                      [&](const auto& copy) {
                                        return copy.first != pending
                                               && !std::binary_search(held.begin(), held.end(), copy.first);
                                      }),
                       device_copies_.end());
  while (device_copies_.size() >= most)
    device_copies_.pop_front();
}

void external_source::copy_from_device(const std::vector<const tensor_input*>& inputs,
                                       const std::vector<std::uint64_t>& offsets, const device_resident* from,
                                       host_buffer& to) {
  if (!to.pinned) {
    try {
      to.pinned = options_.device->pin_host(to.data, static_cast<std::size_t>(to.bytes));
    } catch (const std::exception&) {
      // A memlock limit: the copies still work from pageable memory, slower.
    }
  }
  // On the caller's thread, whose current device is the trainer's own: a
  // fresh thread would make a context on device 0 (and the copies of one
  // device's default stream run one at a time anyway).
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const tensor_input& t = *inputs[i];
    if (t.device < 0)
      continue;
    const int device = from ? from->device : t.device;
    try {
      options_.device->to_host(to.data + offsets[i], from ? from->tensors.at(t.name) : t.data,
                               static_cast<std::size_t>(t.bytes), device);
    } catch (const std::exception& e) {
      throw std::runtime_error("tensor '" + t.name + "': copying it from cuda:" + std::to_string(device)
                               + " to host memory failed: " + e.what());
    }
  }
}

std::shared_ptr<const device_resident> external_source::device_copy_of(const std::vector<const tensor_input*>& inputs) {
  auto refuse = [&](std::string why) {
    std::lock_guard<std::mutex> lock(mutex_);
    device_copy_problem_ = std::move(why);
    return nullptr;
  };
  make_room_for_device_copy(); // at most device_copies held while this one is made
  std::vector<std::uint64_t> at;
  std::uint64_t bytes = 0;
  for (const auto* t : inputs) { // bounded: the model's parameter count was validated
    at.push_back(bytes);
    bytes = device_copy_aligned(bytes + t->bytes);
  }
  const int device = *options_.device_copy_on;
  std::shared_ptr<void> memory;
  try {
    memory = options_.device->allocate(static_cast<std::size_t>(std::max<std::uint64_t>(bytes, 1)), device);
  } catch (const std::exception& e) {
    return refuse("cuda:" + std::to_string(device) + " could not hold a copy of " + std::to_string(bytes)
                  + " bytes: " + e.what());
  }
  auto resident = std::make_shared<device_resident>();
  resident->device = device;
  resident->bytes = bytes;
  auto* base = static_cast<std::uint8_t*>(memory.get());
  resident->memory = std::move(memory);
  try {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      options_.device->device_to_device(base + at[i], device, inputs[i]->data, static_cast<std::size_t>(inputs[i]->bytes));
      resident->tensors[inputs[i]->name] = base + at[i];
    }
  } catch (const std::exception& e) {
    return refuse(std::string("copying to cuda:") + std::to_string(device) + " failed: " + e.what()); // frees it
  }
  return resident;
}

std::string external_source::device_copy_problem() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return device_copy_problem_;
}

dtype external_weights_dtype(const topology& t) {
  if (t.model.weights_dtype)
    return *t.model.weights_dtype;
  return checkpoint_dtype_from_headers(t.model.checkpoint);
}

std::shared_ptr<external_source> make_external_source(const topology& t, std::size_t rank, bool allow_nonfinite,
                                                      std::shared_ptr<tensor_device> device) {
  if (rank >= t.trainer.ranks.size())
    throw std::out_of_range("trainer rank " + std::to_string(rank) + ": the topology has "
                            + std::to_string(t.trainer.ranks.size()) + " rank(s)");
  external_options o;
  o.config = t.model.config;
  o.type = external_weights_dtype(t);
  o.held_layers = t.trainer.ranks[rank].layers;
  o.held_experts = t.trainer.ranks[rank].experts;
  o.allow_nonfinite = allow_nonfinite;
  o.who = "trainer rank " + std::to_string(rank);
  o.device = std::move(device);
  if (o.device && (t.transfer.backend == transfer_backend::nccl || t.transfer.backend == transfer_backend::cuda_ipc))
    o.device_copy_on = 0;
  o.shared_memory = trainer_versions_lendable(t.transfer); // same-host engines are lent groups in place
  return std::make_shared<external_source>(std::move(o));
}

} // namespace rlsync::transfer
