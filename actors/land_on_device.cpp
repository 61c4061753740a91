#include "actors/land_on_device.hpp"

#include "runtime/transfer/store_in_place.hpp"

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
    failed_ = true; // out of device memory: whole groups go up from the host
  }
  return memory_.get();
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

void land_whole_group(const plan::grouped_plan& plan, int worker, std::uint32_t g,
                      const std::vector<tensor_view>& tensors, const std::uint8_t* host_bytes,
                      std::size_t host_size, const void* device_bytes, gpu::pack_device& packer,
                      landing_scratch& scratch, const transfer::group_sink& sink) {
  if (!sink.on_device || (sink.lands_from && !sink.lands_from(packer.ordinal())))
    return;
  std::vector<const void*> sources;
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
  }
  gpu::pack_layout layout;
  std::vector<transfer::store_target> targets;
  try {
    layout = gpu::layout_group(plan, g, tensors);
    targets = transfer::group_targets(sink, worker, g, static_cast<std::size_t>(layout.bytes));
  } catch (const std::invalid_argument&) {
    return; // not the plan's tensors: delivering them on the host says why
  }
  if (targets.empty())
    return;
  if (layout.bytes + 8 > scratch.bytes()) // and the mixsum64 pack() appends
    return;
  void* packed = scratch.on(packer);
  if (!packed)
    return;
  try {
    packer.pack(layout, sources, packed);
    land_packed_runs(targets, packed, packer.ordinal(), sink);
  } catch (const std::exception&) {
    // Out of device memory, say: these runs go up from the host at finish.
  }
}

} // namespace rlsync
