#pragma once
// The data plane of last resort: weights through CAF itself. Each engine
// worker asks the trainer actor for every group of a version (full tensors,
// one checksummed bucket per group) and slices them with its own loader, as
// in broadcast mode. Works wherever the middleman reaches (it is what
// `rlsync node` uses until the UCX backend serves the topology's `ucx`), at
// CAF's ~0.6 GB/s and tp times the bytes of a sharded pull.
#include "actors/interfaces.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/transfer/puller.hpp"

#include <caf/actor_system.hpp>

namespace rlsync {

class caf_puller final : public transfer::weight_puller {
public:
  caf_puller(caf::actor_system& sys, trainer_actor trainer, model_config model);

  void register_worker(const std::string&, std::shared_ptr<const plan::worker_plan>) override {}
  void unregister_engine(const std::string&) override {}
  /// Blocks the calling thread (a pulling thread, never an actor's handler).
  transfer::pull_report pull(const transfer::pull_request& req, const transfer::group_sink& sink) override;

private:
  caf::actor_system& sys_;
  trainer_actor trainer_;
  model_config model_;
  /// How long one group may take. A request to a remote actor whose node is
  /// gone only ever times out (caf-0.17.md §4), so each group gets its own,
  /// shorter deadline: 2 s plus the largest group at 10 MB/s.
  std::chrono::milliseconds group_deadline_;
};

} // namespace rlsync
