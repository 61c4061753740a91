#pragma once
// `rlsync status`: the fleet as the head's coordinator and router see it.
// The view and its text and JSON are functions over plain values (tested
// apart); fetch_fleet joins the cluster as a member node does (through the
// gatekeeper, with that node's secret and TLS) and asks for both statuses.
#include "actors/interfaces.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/control/protocol.hpp"

#include <caf/actor_system.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace rlsync::jobs {

/// One engine of the fleet.
struct fleet_engine {
  std::string name;
  std::string node;
  /// serving (routable), syncing (registered, waiting for a round to bring
  /// it current), evicted (out of routing since its last eviction), dirty
  /// (holds a partial update), unreachable (silent past the heartbeat
  /// timeout), retired (past max_restarts).
  std::string state;
  std::uint64_t version = 0;
  std::uint64_t incarnation = 0;
  /// Requests the router has out on it; nullopt: the router did not answer.
  std::optional<std::uint32_t> outstanding;
  /// Its last eviction, "phase: why" (empty: never evicted).
  std::string last_eviction;
};

struct fleet_view {
  std::uint64_t version = 0; ///< of the last completed round
  std::uint64_t rounds = 0;
  std::uint32_t live = 0;
  std::uint64_t below_min_live_events = 0;
  std::vector<fleet_engine> engines; ///< by name; retired replicas included
  std::optional<sync_report> last_round;
  std::optional<router_status> router;
  /// transfer.backend nccl: the communicator (epoch 0 and no rebuild: none shown).
  std::uint64_t nccl_epoch = 0;
  std::uint32_t nccl_members = 0;
  std::uint64_t nccl_rebuilds = 0;
  bool nccl_healthy = false;
};

/// The view from the coordinator's status and, when it answered, the router's.
fleet_view fleet_view_of(const coordinator_status& c, const std::optional<router_status>& r);

/// A table, one engine a line, then the last round's figures and the router's queue.
std::string fleet_text(const fleet_view& v);
nlohmann::ordered_json fleet_json(const fleet_view& v);

/// Where `rlsync status` connects and as whom.
struct status_target {
  std::string host;
  std::uint16_t port = 0;
  /// The member node it proves to be (its secret admits it), and that secret.
  std::string node;
  std::string secret;
  std::chrono::milliseconds deadline{10000};
};

/// Joins through the head's gatekeeper and asks the coordinator and the
/// router for their status: the view, or nullopt with `why` set.
std::optional<fleet_view> fetch_fleet(caf::actor_system& sys, const status_target& target, std::string& why);

} // namespace rlsync::jobs
