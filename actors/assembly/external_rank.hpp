#pragma once
// A trainer rank whose weights an outside program publishes (trainer.source:
// external): what the `rlsync` Python module's TrainerRank wraps. The
// program's process becomes that rank's node process for the rank alone:
// it joins the head's gatekeeper under the rank's node name with that node's
// secret (over mutual TLS when the cluster has it), exactly as `rlsync node`
// does, registers the rank (incarnation: this process's start, so a new
// process for the rank replaces a dead one), serves its versions to the
// engines (the data plane's producer: UCX, or whole groups over CAF) and
// rejoins when the link to the head is lost.
//
//   constructor ──join+register──▶ ready ──publish(v)──▶ source queues v,
//        │                           │                  trainer steps: v published
//        └─ failure: throws why      └─ close(): stops the rank, leaves the cluster
//
// publish copies the tensors (one copy) and returns: it never waits for a
// round. wait_synced and status ask the coordinator.
#include "actors/assembly/local_deployment.hpp"
#include "actors/assembly/rank_drill_arms.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/control/protocol.hpp"
#include "runtime/transfer/external_source.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

namespace caf {
class actor_system;
}

namespace rlsync {

class system_config;

struct external_rank_options {
  /// Overrides cluster.secret_file ({node} allowed); empty: the topology's.
  std::string secret_file;
  /// Publish weights holding NaN or infinity instead of refusing them.
  bool allow_nonfinite = false;
  /// One line per event (admitted, registered, rejoined, why it stops);
  /// called from several threads. Empty: quiet.
  std::function<void(const std::string&)> log;
};

/// Whether every live engine serves a version, as the coordinator says.
struct sync_progress {
  bool synced = false;
  coordinator_status status; ///< the last answer (empty when none came)
  bool answered = false;     ///< the coordinator answered at least once
};

class external_rank {
public:
  /// Joins the cluster of `t` as trainer rank `rank` and registers it,
  /// waiting up to 3 × cluster.connect_deadline_ms. Throws
  /// std::invalid_argument when `t` does not make `rank` external, and
  /// std::runtime_error saying why it could not join (secret, TLS files,
  /// the head unreachable or refusing, the registration refused).
  external_rank(const topology& t, std::uint32_t rank, external_rank_options o = {});
  ~external_rank();
  external_rank(const external_rank&) = delete;
  external_rank& operator=(const external_rank&) = delete;

  /// Checks and copies `tensors` as version `version` (external_source::push:
  /// throws std::invalid_argument naming the tensor at fault) and asks the
  /// rank's trainer to publish it. Throws std::logic_error once closed.
  void publish(std::uint64_t version, const std::vector<transfer::tensor_input>& tensors);

  /// Asks the coordinator until every live engine serves `version` or
  /// later (coordinator_status::version, with at least one live engine),
  /// `timeout` has passed or `interrupted()` says so (checked every poll).
  sync_progress wait_synced(std::uint64_t version, std::chrono::milliseconds timeout,
                            const std::function<bool()>& interrupted = {}) const;

  /// The coordinator's status. Throws std::runtime_error when it does not
  /// answer within `deadline`.
  coordinator_status status(std::chrono::milliseconds deadline = std::chrono::seconds(5)) const;

  /// Stops the rank and leaves the cluster (the coordinator sees it go).
  /// Idempotent; the destructor calls it.
  void close();
  bool closed() const { return closed_; }

  /// A drill's hook, as `rlsync drill` arms a node's ranks: the rank
  /// withholds the first group it holds of `version` until `release_after`
  /// has passed (a kill then lands while an engine waits for it). One line
  /// saying so; none when the rank's producer is not up.
  std::vector<std::string> drill_withhold(std::uint64_t version, std::chrono::milliseconds release_after);

  std::uint32_t rank() const { return rank_; }
  const std::string& node() const { return node_; }
  std::uint64_t last_published() const { return source_->last_pushed(); }
  const transfer::external_source& source() const { return *source_; }
  /// Whether publish takes CUDA tensors as they are (a CUDA build); else
  /// the caller copies them to host memory first.
  bool reads_device_tensors() const { return source_->reads_device(); }

private:
  void serve(); // the member-node loop, on serving_

  topology topology_;
  std::uint32_t rank_;
  std::string node_;
  external_rank_options options_;
  std::shared_ptr<transfer::external_source> source_;
  std::unique_ptr<system_config> config_;
  std::unique_ptr<caf::actor_system> system_;
  std::shared_ptr<coordinator_ref> coordinator_ = std::make_shared<coordinator_ref>();
  std::shared_ptr<rank_drill_arms> drill_arms_ = std::make_shared<rank_drill_arms>();
  std::string secret_;

  mutable std::mutex mutex_;
  /// Held shared by every call that uses the actor system (publish, status),
  /// exclusively by close() before it lets the system go: a close from
  /// another thread waits for those calls instead of pulling the system from
  /// under them.
  mutable std::shared_mutex in_use_;
  std::condition_variable changed_;
  bool ready_ = false;    ///< registered: the constructor may return
  bool finished_ = false; ///< the serving loop ended
  std::string failure_;   ///< why it ended early
  trainer_actor trainer_;

  std::atomic<bool> stop_{false};
  std::atomic<bool> closed_{false};
  std::thread serving_;
};

} // namespace rlsync
