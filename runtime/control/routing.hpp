#pragma once
// The router's choice of replica as pure functions over values,
// so that every policy is tested row by row without an actor system.
// actors/router.* keeps the routing table and calls these.
//
// A replica may serve a request when it is
//   routable  — the coordinator says so (it has completed a sync, is not paused),
//   current   — at most `staleness` versions behind the trainer's newest
//               published version (the coordinator tells the router; until
//               it has, the newest routable version stands in for it),
//   new enough — at or above the request's `min_version`.
// A request no replica may serve waits in the router's bounded queue.
// Among those, the policy picks one.
#include "runtime/config/topology.hpp"
#include "runtime/control/protocol.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlsync {

/// How the router is set up; `router_config_from` fills it from a topology.
struct router_config {
  std::string name = "router"; ///< answers heartbeats under this name
  router_policy policy = router_policy::least_outstanding;
  /// Requests that may wait while no replica can serve them; beyond it, queue_full.
  std::size_t queue_limit = 1024;
  /// Versions a replica may trail the trainer's newest published version and still serve.
  std::uint64_t staleness = 0;
  /// Prompt tokens that prefix_affinity hashes (the shared-prefix length that matters).
  std::size_t affinity_prefix_tokens = 32;
  /// Longest a request waits for a routable replica before not_routable.
  std::chrono::milliseconds queue_deadline{30000};
  /// Longest an engine may take to finish one request. Generous: a request
  /// stays frozen on its engine through a whole sync round.
  std::chrono::milliseconds engine_deadline{600000};
  /// Reroutes of one request after failed engines; one more and it fails.
  std::uint32_t max_reroutes = 3;
  /// Deadline of the router's small local calls (closing a request's relay, aborting on an engine).
  std::chrono::milliseconds control_deadline{5000};
  /// One line per reroute; empty: quiet.
  std::function<void(const std::string&)> log;
  /// Told the router's figures as they change (requests queued, sent,
  /// answered, rerouted): the metrics; empty: nobody.
  std::function<void(const router_status&)> on_status;
};

/// The router's settings from a topology: its policy and queue limit, and
/// the sync section's staleness bound.
router_config router_config_from(const topology& t);

/// What the router knows about one replica when it chooses.
struct replica_load {
  std::string name;
  std::uint64_t version = 0;     ///< weight version the replica serves
  bool routable = false;         ///< the coordinator's word
  std::uint32_t outstanding = 0; ///< requests sent to it, not yet finished
};

/// The fleet-wide facts a choice depends on.
struct routing_rules {
  router_policy policy = router_policy::least_outstanding;
  /// Newest version any replica has been announced routable at. The router
  /// keeps it monotonic: versions never go backwards.
  std::uint64_t newest_version = 0;
  std::uint64_t staleness = 0;
  /// Newest version the trainer published, as the coordinator reported it
  /// (0: not reported yet). Monotonic too.
  std::uint64_t published_version = 0;
};

/// The version staleness is measured against: the trainer's newest published
/// one, or the newest routable one when that is newer (or nothing was
/// reported yet).
std::uint64_t reference_version(const routing_rules& rules);

/// What one request asks of the replica that serves it.
struct route_query {
  std::uint64_t min_version = 0; ///< the request's own staleness bound
  std::uint64_t prefix = 0;      ///< prefix_hash of its prompt (prefix_affinity only)
  /// Replicas this request just left (they refused it, or failed it): a
  /// reroute goes elsewhere, or waits, rather than back at once.
  const std::vector<std::string>* avoid = nullptr;
};

/// Whether `r` is routable and within `staleness` of reference_version.
bool is_current(const replica_load& r, const routing_rules& rules);

/// Whether `r` may serve a request needing `min_version`.
bool can_serve(const replica_load& r, const routing_rules& rules, std::uint64_t min_version);

/// checksum64 (XXH3) of the first `k` tokens of `prompt` (all of it when shorter).
/// Stable across processes and restarts, so affinities survive a router restart.
std::uint64_t prefix_hash(const std::vector<std::int32_t>& prompt, std::size_t k);

/// Rendezvous (highest-random-weight) score of `replica` for a prefix: the
/// replica with the highest score among the candidates is preferred, so a
/// replica leaving moves only its own prefixes.
std::uint64_t affinity_score(std::uint64_t prefix, std::string_view replica);

/// The index in `replicas` of the replica to serve `q`, or nullopt when none
/// can serve it. Names in `replicas` are unique; their order does not matter.
///  - least_outstanding: fewest outstanding requests, ties by name.
///  - round_robin: the next name after `cursor` that can serve, wrapping around;
///    `cursor` (the name chosen last, empty at first) is updated on success.
///    Keyed by name, not index, so replicas joining or leaving keep the cycle fair.
///  - prefix_affinity: the highest affinity_score among routable replicas; when
///    that one cannot serve the request (stale, or below min_version), the
///    least-outstanding choice.
std::optional<std::size_t> choose_replica(const std::vector<replica_load>& replicas,
                                          const routing_rules& rules, const route_query& q,
                                          std::string& cursor);

} // namespace rlsync
