#pragma once
// What a puller that holds a group on a CUDA device hands to an engine
// serving from one (group_sink::on_device, runtime/transfer/puller.hpp):
// the packed runs of a sharded group where they lie, or a whole group
// packed there first as the worker's plan packs it, so that both arrive as
// the same runs. Never required: what is not landed is uploaded from the
// host set at finish (runtime/engine/device_gemm.hpp).
#include "gpu/device_pack.hpp"
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/transfer/puller.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace rlsync {

/// A worker's scratch on a pack device for whole groups it lands: made at
/// its first use, as large as the model's largest group and its checksum,
/// and kept, so that no pull allocates or frees device memory per group (a
/// cudaFree waits for the whole device, NCCL's kernels of other members of
/// a collective included). Not thread-safe: one per worker.
class landing_scratch {
public:
  explicit landing_scratch(std::size_t bytes = 0) : bytes_(bytes) {}
  /// The scratch on `packer`'s device; nullptr when it cannot be made.
  void* on(gpu::pack_device& packer);
  std::size_t bytes() const { return bytes_; }

private:
  std::size_t bytes_;
  std::shared_ptr<void> memory_;
  int ordinal_ = -1;
  bool failed_ = false;
};

/// Hands `targets`' runs, packed back to back from `device_bytes` on
/// `device`, to sink.on_device.
void land_packed_runs(const std::vector<transfer::store_target>& targets, const void* device_bytes, int device,
                      const transfer::group_sink& sink);

/// A whole group that lies on `packer`'s device, `tensors` being views of
/// its host copy (`host_size` bytes at `host_bytes`, which lie at
/// `device_bytes` there): packed on
/// that device as `plan` packs group `g` for `worker`, then landed as a
/// sharded group is. Does nothing when the sink lands nothing from that
/// device or converts the group, the tensors do not fit the plan (the host
/// path reports that), are misaligned or named twice, or the group does
/// not fit the scratch; a device failure is swallowed, the upload covering
/// it.
void land_whole_group(const plan::grouped_plan& plan, int worker, std::uint32_t g,
                      const std::vector<tensor_view>& tensors, const std::uint8_t* host_bytes,
                      std::size_t host_size, const void* device_bytes, gpu::pack_device& packer,
                      landing_scratch& scratch, const transfer::group_sink& sink);

} // namespace rlsync
