#pragma once
// A whole topology in one process: the trainer (with the local data plane),
// every engine replica, the router and the coordinator, wired together and
// the engines registered. `rlsync run` and the end-to-end tests use it.
#include "actors/coordinator.hpp"
#include "actors/rollout_engine.hpp"
#include "actors/router.hpp"
#include "actors/trainer.hpp"
#include "runtime/config/topology.hpp"

#include <functional>
#include <string>
#include <vector>

namespace rlsync {

struct local_deployment {
  local_trainer trainer;
  std::vector<rollout_engine_impl> engines; ///< in topology order
  std::vector<std::string> engine_names;
  /// Per engine: its drill faults (deployment_options::fault_gates), else nullptr.
  std::vector<std::shared_ptr<engine_fault_gate>> gates;
  /// Per engine: the incarnation running now (1 at first, one more per restart).
  std::vector<std::uint64_t> incarnations;
  router_actor router;
  coordinator_actor coordinator;
  /// The dtype engines record their plans in (what the trainer sends).
  dtype source_dtype = dtype::bf16;
  /// The coordinator's configuration as first spawned (hooks included), for a restart.
  coordinator_config coordinator_cfg;

  /// Stops every actor (the trainer first, so no version appears mid-shutdown).
  void shutdown();

  /// Replaces engine `i` by a fresh process's worth of state: the old actor
  /// is killed (if alive), a new one spawned with the next incarnation and
  /// registered; it stays unroutable until its next sync. Returns the
  /// coordinator's refusal (e.g. retired past max_restarts), or empty.
  /// Blocking: call it from a thread that is not an actor.
  std::string restart_engine(caf::actor_system& sys, const topology& t, std::size_t i,
                             std::chrono::milliseconds deadline = std::chrono::milliseconds{10000});

  /// The router's configuration as first spawned, for a restart.
  router_config router_cfg;

  /// Kills the router (when alive) and spawns a new one, attached to the
  /// coordinator, which routes every current member to it. Returns it: the
  /// requesters must be told (set_workload_router) to resend what the dead
  /// one held.
  router_actor restart_router(caf::actor_system& sys);

  /// A trainer on the same source (its checkpoints survive it): spawned and
  /// attached to the coordinator, which retries the round it lost.
  void restart_trainer(caf::actor_system& sys, const topology& t);

  /// Kills the coordinator (when `kill_first`) and starts a new one from
  /// its state file, then re-registers every live engine as it is (same
  /// incarnation, the version it serves): those current at the synced
  /// version serve on at once. The router keeps routing meanwhile. Throws
  /// std::runtime_error without a state file or when it is malformed.
  /// Blocking: call it from a thread that is not an actor.
  void restart_coordinator(caf::actor_system& sys, const topology& t, bool kill_first = true);
};

struct deployment_options {
  /// Every round's figures as the round ends; may be empty.
  std::function<void(const sync_report&)> on_sync;
  /// One line per notable event (evictions, failures); empty: quiet.
  std::function<void(const std::string&)> log;
  /// Per registration; registration fails the deployment past it.
  std::chrono::milliseconds register_deadline{10000};
  /// Give every engine a fault gate (drills).
  bool fault_gates = false;
  /// The coordinator's phase and membership hooks (coordinator_config); may be empty.
  decltype(coordinator_config::on_phase) on_phase;
  decltype(coordinator_config::on_member) on_member;
  /// One line per reroute from the router; empty: quiet.
  std::function<void(const std::string&)> router_log;
};

/// An engine replica's configuration from the topology.
rollout_engine_config engine_config_from(const topology& t, const engine_spec& e,
                                         std::shared_ptr<transfer::weight_puller> puller, dtype source_dtype);

/// Spawns and wires everything the topology places anywhere (one process
/// plays every node). The coordinator heartbeats members as cluster.heartbeat_*
/// say and starts from coordinator.state_file when it exists. Throws
/// std::runtime_error naming the engine whose registration failed, or the
/// state file's place that is malformed.
local_deployment deploy_local(caf::actor_system& sys, const topology& t, deployment_options opts);

/// One engine's weights against the trainer's for the same version.
struct engine_verification {
  std::string engine;
  std::uint64_t version = 0;
  bool dirty = false;
  std::size_t shards = 0;     ///< parameter shards compared
  std::size_t mismatched = 0; ///< shards whose checksum differs
  std::string error;          ///< why nothing could be compared

  bool ok() const { return error.empty() && !dirty && mismatched == 0 && shards > 0; }
};

/// Compares every engine's weight checksums (the coordinator collects them
/// from local and remote members alike), shard by shard, with the trainer's
/// snapshot of the same version run through the same loader.
std::vector<engine_verification> verify_weights(const topology& t, const transfer::weight_source& source,
                                                const std::vector<weight_digest>& digests);

} // namespace rlsync
