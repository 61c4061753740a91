#include "actors/land_on_device.hpp"

#include "runtime/transfer/bucket.hpp"
#include "runtime/transfer/store_in_place.hpp"

#include <cstring>
#include <set>
#include <stdexcept>
#include <string>

namespace rlsync {

void* landing_scratch::on(gpu::pack_device& packer) {
  if (memory_ && ordinal_ == packer.ordinal())
    return memory_.get();
  if (failed_ || memory_) // another device than the one it was made on: not moved, not remade
    return nullptr;
  try {
    memory_ = packer.allocate(bytes_);
    ordinal_ = packer.ordinal();
  } catch (const std::exception&) {
    failed_ = true; // out of device memory
  }
  return memory_.get();
}

std::shared_ptr<landing_scratch> worker_scratches::of(const std::string& engine, int worker) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& made = by_worker_[{engine, worker}];
  if (!made)
    made = std::make_shared<landing_scratch>(bytes_);
  return made;
}

void worker_scratches::forget(const std::string& engine) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = by_worker_.begin(); it != by_worker_.end();)
    it = it->first.first == engine ? by_worker_.erase(it) : std::next(it);
}

whole_group_landing whole_group_landing_for(const transfer::group_sink& sink,
                                            std::shared_ptr<const plan::grouped_plan> plan,
                                            std::shared_ptr<gpu::pack_device> packer, worker_scratches& scratches,
                                            const std::string& engine, int worker, bool recheck) {
  if (!sink.on_device || !plan || !packer || (sink.lands_from && !sink.lands_from(packer->ordinal())))
    return {};
  return {std::move(plan), std::move(packer), scratches.of(engine, worker), recheck};
}

void land_packed_runs(const std::vector<transfer::store_target>& targets, const void* device_bytes, int device,
                      const transfer::group_sink& sink) {
  if (sink.lands_from && !sink.lands_from(device))
    return;
  const auto* at = static_cast<const std::uint8_t*>(device_bytes);
  try {
    for (const auto& t : targets) {
      sink.on_device(t, at, device);
      at += t.bytes;
    }
  } catch (const std::exception&) {
    // A sink that broke its word: the host copy still carries the group,
    // and the link (whose turn the caller holds) is not the sink's to end.
  }
}

void land_whole_group(const whole_group_landing& to, int worker, std::uint32_t g,
                      const std::vector<tensor_view>& tensors, const std::uint8_t* host_bytes,
                      std::size_t host_size, const void* device_bytes, const transfer::group_sink& sink) {
  if (!to || !sink.on_device || (sink.lands_from && !sink.lands_from(to.packer->ordinal())))
    return;
  std::vector<const void*> sources, host_sources;
  std::set<std::string> names;
  sources.reserve(tensors.size());
  for (const auto& t : tensors) { // the same offsets on the device as in the host copy
    const auto* at = reinterpret_cast<const std::uint8_t*>(t.data);
    if (at < host_bytes || static_cast<std::size_t>(at - host_bytes) > host_size
        || t.size > host_size - static_cast<std::size_t>(at - host_bytes))
      return; // not views of that copy: nothing to find on the device
    const auto* source = static_cast<const std::uint8_t*>(device_bytes) + (at - host_bytes);
    // The kernels read whole elements, aligned (a misaligned read would end
    // the CUDA context); a name twice would land the first where the host
    // set keeps the last. The trainer's offsets are a peer's word.
    if (reinterpret_cast<std::uintptr_t>(source) % dtype_size(t.type) != 0 || !names.insert(t.name).second)
      return;
    sources.push_back(source);
    host_sources.push_back(at);
  }
  gpu::pack_layout layout;
  std::vector<transfer::store_target> targets;
  try {
    layout = gpu::layout_group(*to.plan, g, tensors);
    targets = transfer::landing_targets(sink, worker, g, static_cast<std::size_t>(layout.bytes));
  } catch (const std::invalid_argument&) {
    return; // not the plan's tensors: delivering them on the host says why
  }
  const auto with_sum = static_cast<std::size_t>(layout.bytes) + transfer::checksum_trailer_bytes; // pack() appends it
  if (targets.empty() || with_sum > to.scratch->bytes())
    return;
  std::lock_guard<std::mutex> hold(to.scratch->lock());
  void* packed = to.scratch->on(*to.packer);
  if (!packed)
    return;
  try {
    to.packer->pack(layout, sources, packed);
    if (to.recheck) {
      std::vector<std::uint8_t> host_packed(with_sum);
      gpu::host_pack_device()->pack(layout, host_sources, host_packed.data());
      std::uint8_t device_sum[transfer::checksum_trailer_bytes];
      to.packer->download(device_sum, static_cast<const std::uint8_t*>(packed) + layout.bytes, sizeof device_sum);
      if (std::memcmp(device_sum, host_packed.data() + layout.bytes, sizeof device_sum) != 0)
        return; // changed on the device since it was read: the upload carries what verified
    }
    land_packed_runs(targets, packed, to.packer->ordinal(), sink);
  } catch (const std::exception&) {
    // A failed pack or copy: these runs go up from the host at finish.
  }
}

} // namespace rlsync
