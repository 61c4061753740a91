#pragma once
// A whole topology in one process: the trainer (with the local data plane),
// every engine replica, the router and the coordinator, wired together and
// the engines registered. `rlsync run` and the end-to-end tests use it.
#include "actors/coordinator.hpp"
#include "actors/rollout_engine.hpp"
#include "actors/router.hpp"
#include "actors/trainer.hpp"
#include "runtime/topology.hpp"

#include <functional>
#include <string>
#include <vector>

namespace rlsync {

struct local_deployment {
  local_trainer trainer;
  std::vector<rollout_engine_impl> engines; ///< in topology order
  std::vector<std::string> engine_names;
  router_actor router;
  coordinator_actor coordinator;

  /// Stops every actor (the trainer first, so no version appears mid-shutdown).
  void shutdown();
};

struct deployment_options {
  /// Every round's figures as the round ends; may be empty.
  std::function<void(const sync_report&)> on_sync;
  /// One line per notable event (evictions, failures); empty: quiet.
  std::function<void(const std::string&)> log;
  /// Per registration; registration fails the deployment past it.
  std::chrono::milliseconds register_deadline{10000};
};

/// An engine replica's configuration from the topology.
rollout_engine_config engine_config_from(const topology& t, const engine_spec& e,
                                         std::shared_ptr<transfer::weight_puller> puller, dtype source_dtype);

/// Spawns and wires everything the topology places anywhere (one process
/// plays every node). Throws std::runtime_error naming the engine whose
/// registration failed.
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
