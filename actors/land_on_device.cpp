#include "actors/land_on_device.hpp"

#include "runtime/transfer/store_in_place.hpp"

#include <stdexcept>

namespace rlsync {

void land_packed_runs(const std::vector<transfer::store_target>& targets, const void* device_bytes, int device,
                      const transfer::group_sink& sink) {
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
                      const transfer::group_sink& sink) {
  if (!sink.on_device)
    return;
  std::vector<const void*> sources;
  sources.reserve(tensors.size());
  for (const auto& t : tensors) { // the same offsets on the device as in the host copy
    const auto offset = static_cast<std::size_t>(reinterpret_cast<const std::uint8_t*>(t.data) - host_bytes);
    if (reinterpret_cast<const std::uint8_t*>(t.data) < host_bytes || offset > host_size || t.size > host_size - offset)
      return; // not views of that copy: nothing to find on the device
    sources.push_back(static_cast<const std::uint8_t*>(device_bytes) + offset);
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
  try {
    auto packed = packer.allocate(static_cast<std::size_t>(layout.bytes) + 8); // and the mixsum64 pack() appends
    packer.pack(layout, sources, packed.get());
    land_packed_runs(targets, packed.get(), packer.ordinal(), sink);
  } catch (const std::exception&) {
    // Out of device memory, say: these runs go up from the host at finish.
  }
}

} // namespace rlsync
