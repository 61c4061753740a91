#pragma once
// The consumer side of the nccl backend: each engine worker is a member of
// the current NCCL communicator (its link), and asks the trainer (rank) for
// every group of a version (nccl_pull_atom). The trainer queues the group's
// bucket for its sender (gpu/nccl_sender.hpp) and answers with the bucket's
// layout, checksum and size; the worker posts the matching receive, waits
// for it against the group's deadline (never blindly: comm_wait.hpp), copies
// the bytes out of its device staging, verifies them and slices whole
// tensors as the CAF path does (the built-in engine computes on the CPU).
//
// A worker that is in no communicator (it joined after the last boundary)
// fails its pull; so does any failure of the link, which is then aborted:
// NCCL cannot mend a communicator, the coordinator rebuilds it at the next
// boundary. A trainer that lies (another epoch, a root that is no
// producer, more bytes than the largest group or the staging) is refused
// before a receive is posted.
#include "actors/interfaces.hpp"
#include "gpu/nccl_link.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/transfer/puller.hpp"

#include <caf/actor_system.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rlsync {

class nccl_puller final : public transfer::weight_puller {
public:
  /// The worker's link to the current communicator; null when it is in none.
  using link_of = std::function<std::shared_ptr<gpu::p2p_link>(const std::string& engine, int worker)>;

  /// `trainer()` is asked at each pull (a node that rejoins a restarted
  /// head swaps it); `groups`: those the trainer (rank) holds, none: all;
  /// `hooks`: comm_wait's world (tests).
  nccl_puller(caf::actor_system& sys, std::function<trainer_actor()> trainer, model_config model, link_of links,
              std::optional<std::vector<std::uint32_t>> groups = std::nullopt, gpu::wait_hooks hooks = {});

  /// No plans needed: the trainer sends whole groups, each worker slices them.
  void register_worker(const std::string&, std::shared_ptr<const plan::worker_plan>) override {}
  void unregister_engine(const std::string&) override {}
  /// Blocks the calling thread (a pulling thread, never an actor's handler).
  transfer::pull_report pull(const transfer::pull_request& req, const transfer::group_sink& sink) override;

private:
  caf::actor_system& sys_;
  std::function<trainer_actor()> trainer_;
  model_config model_;
  link_of links_;
  std::vector<std::uint32_t> groups_; ///< pulled, in order
  gpu::wait_hooks hooks_;
  std::chrono::milliseconds group_deadline_;
  std::uint64_t largest_group_bytes_ = 0; ///< as f32: what no group may exceed
};

} // namespace rlsync
