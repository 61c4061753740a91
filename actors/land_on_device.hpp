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
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace rlsync {

/// Hands `targets`' runs, packed back to back from `device_bytes` on
/// `device`, to sink.on_device (nothing when the sink does not take runs
/// from that device).
void land_packed_runs(const std::vector<transfer::store_target>& targets, const void* device_bytes, int device,
                      const transfer::group_sink& sink);

/// A worker's scratch on a pack device for the whole groups it lands: made
/// at its first use, as large as the model's largest group and its
/// checksum, and kept, so that no pull allocates a group's worth of device
/// memory. One pack and landing at a time (an aborted pull of the worker
/// may still run beside the next): hold lock() from on() to the last run.
class landing_scratch {
public:
  explicit landing_scratch(std::size_t bytes) : bytes_(bytes) {}
  std::mutex& lock() { return mutex_; }
  /// The scratch on `packer`'s device; nullptr when it cannot be made (once
  /// failed, never retried: that worker's whole groups go up from the host).
  void* on(gpu::pack_device& packer);
  std::size_t bytes() const { return bytes_; }

private:
  std::mutex mutex_;
  std::size_t bytes_;
  std::shared_ptr<void> memory_;
  int ordinal_ = -1;
  bool failed_ = false;
};

/// The scratches of every worker a puller serves (thread-safe).
class worker_scratches {
public:
  /// Each `bytes` large: the model's largest group, its checksum after it.
  explicit worker_scratches(std::size_t bytes) : bytes_(bytes) {}
  std::shared_ptr<landing_scratch> of(const std::string& engine, int worker);
  /// Frees `engine`'s (it unregistered).
  void forget(const std::string& engine);

private:
  std::mutex mutex_;
  std::size_t bytes_;
  std::map<std::pair<std::string, int>, std::shared_ptr<landing_scratch>> by_worker_;
};

/// What landing a worker's whole groups takes, decided once per pull: its
/// plan, the pack device that reads where the group lies, its scratch.
/// Empty (false) when its groups are not landed.
struct whole_group_landing {
  std::shared_ptr<const plan::grouped_plan> plan;
  std::shared_ptr<gpu::pack_device> packer;
  std::shared_ptr<landing_scratch> scratch;
  /// The device bytes may change after the host copy was read (a cuda_ipc
  /// mapping the trainer writes): the device pack's mixsum64 is compared
  /// with the host bytes packed the same way, and a mismatch lands nothing.
  bool recheck = false;
  explicit operator bool() const { return plan && packer && scratch; }
};

/// The landing of `engine`'s worker `worker`: its `plan`, packed by
/// `packer` into its scratch of `scratches`. Empty when the sink takes no
/// runs, either is missing, or the sink takes none from the packer's device.
whole_group_landing whole_group_landing_for(const transfer::group_sink& sink,
                                            std::shared_ptr<const plan::grouped_plan> plan,
                                            std::shared_ptr<gpu::pack_device> packer, worker_scratches& scratches,
                                            const std::string& engine, int worker, bool recheck = false);

/// A whole group that lies on `to.packer`'s device, `tensors` being views
/// of its verified host copy (`host_size` bytes at `host_bytes`, which lie
/// at `device_bytes` there): packed on that device as the plan packs group
/// `g` for `worker`, then landed as a sharded group is. Does nothing when
/// the sink takes nothing from that device or converts the group, the
/// tensors do not fit the plan (the host path reports that), are
/// misaligned or named twice, the group does not fit the scratch, or the
/// recheck fails; a device failure is swallowed, the upload covering it.
void land_whole_group(const whole_group_landing& to, int worker, std::uint32_t g,
                      const std::vector<tensor_view>& tensors, const std::uint8_t* host_bytes,
                      std::size_t host_size, const void* device_bytes, const transfer::group_sink& sink);

} // namespace rlsync
