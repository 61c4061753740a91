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
#include <vector>

namespace rlsync {

/// Hands `targets`' runs, packed back to back from `device_bytes` on
/// `device`, to sink.on_device.
void land_packed_runs(const std::vector<transfer::store_target>& targets, const void* device_bytes, int device,
                      const transfer::group_sink& sink);

/// A whole group that lies on `packer`'s device, `tensors` being views of
/// its host copy (`host_size` bytes at `host_bytes`, which lie at
/// `device_bytes` there): packed on
/// that device as `plan` packs group `g` for `worker`, then landed as a
/// sharded group is. Does nothing when the sink lands nothing or converts
/// the group, or the tensors do not fit the plan (the host path reports
/// that); a device failure is swallowed, the upload covering it.
void land_whole_group(const plan::grouped_plan& plan, int worker, std::uint32_t g,
                      const std::vector<tensor_view>& tensors, const std::uint8_t* host_bytes,
                      std::size_t host_size, const void* device_bytes, gpu::pack_device& packer,
                      const transfer::group_sink& sink);

} // namespace rlsync
