#pragma once
// The consumer side of the cuda_ipc backend, for engines in other processes
// on the trainer's host: each engine worker asks the trainer for every
// group of a version (ipc_pull_atom); the trainer writes the group's bucket
// into the worker's slot of its exported device buffer and answers with
// the buffer's handle, where the bytes lie and the bucket's layout and
// checksum. The worker maps the buffer once per session, copies the bytes
// out, verifies them and slices whole tensors as the CAF path does; for an
// engine serving from a device it also packs the group where it lies, by
// the worker's plan, and lands it in the engine's device copy
// (land_on_device.hpp), checked against the bytes that verified.
// A session ends with a release (ipc_release_atom), on success and on
// failure, and the mapping with it.
//
// Peers can lie: a handle of the wrong size, a session that does not grow,
// a chunk out of order, a range outside the buffer or larger than the
// model's largest group, a handle that changes mid-session are refused
// before any byte is read.
#include "actors/caf_puller.hpp"
#include "actors/interfaces.hpp"
#include "actors/land_on_device.hpp"
#include "gpu/ipc_memory.hpp"
#include "gpu/ipc_session.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/transfer/puller.hpp"

#include <caf/actor_system.hpp>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace rlsync {

class ipc_puller final : public transfer::weight_puller {
public:
  /// `trainer()` is asked at each pull (a node that rejoins a restarted
  /// head swaps it); `groups`: those the trainer (rank) holds, none: all.
  ipc_puller(caf::actor_system& sys, std::function<trainer_actor()> trainer, model_config model,
             std::shared_ptr<gpu::ipc_memory> memory, std::optional<std::vector<std::uint32_t>> groups = std::nullopt);

  /// The trainer sends whole groups, which each worker slices; the plan
  /// packs a group on the device for an engine that lands it there
  /// (land_on_device.hpp).
  void register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) override;
  void unregister_engine(const std::string& engine) override;
  /// Blocks the calling thread (a pulling thread, never an actor's handler).
  transfer::pull_report pull(const transfer::pull_request& req, const transfer::group_sink& sink) override;
  bool lands_on_device() const override { return true; }

private:
  caf::actor_system& sys_;
  std::function<trainer_actor()> trainer_;
  model_config model_;
  group_tensors expected_; ///< each group's tensors in model_: what a whole group may hold
  std::vector<std::uint32_t> groups_; ///< pulled, in order
  std::shared_ptr<gpu::ipc_memory> memory_;
  std::chrono::milliseconds group_deadline_;
  std::uint64_t largest_group_bytes_ = 0; ///< as f32: what no chunk may exceed
  std::mutex mutex_;
  /// Per "engine/worker": the sessions it has seen (they only grow).
  std::map<std::string, gpu::ipc_consumer_session> books_;
  /// Per "engine/worker": its plan.
  std::map<std::string, std::shared_ptr<const plan::grouped_plan>> plans_;
  worker_scratches scratches_; ///< where groups are packed to land (land_on_device.hpp)
};

} // namespace rlsync
