#pragma once
// What a cluster node other than the coordinator's runs, in this process:
// it connects to the head's gatekeeper (retrying with backoff up to
// cluster.connect_deadline_ms), proves the cluster secret, spawns the
// engines the topology places on it and registers them with the
// coordinator. Its engines pull from the trainer's UCX producer when the
// join grant names one, else whole groups over CAF. A lost link is not the
// end: it rejoins and registers the same engines again. Used by `rlsync node`.
#include "actors/assembly/local_deployment.hpp"
#include "actors/assembly/rank_drill_arms.hpp"
#include "actors/interfaces.hpp"
#include "gpu/nccl_membership.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/metrics/registry.hpp"

#include <caf/actor_system.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rlsync {

/// Whether a TCP connection to `host`:`port` is accepted by `until`: empty
/// when it is (`reached`, when given, set to the address that answered),
/// else why not (a host name that does not resolve in time, refused, no
/// answer by `until`, or `stop` returned true, asked every 100 ms). CAF
/// connects with a blocking connect(2), and resolves names with a blocking
/// lookup: the kernel retries a connection for about two minutes when nobody
/// answers (a partition, a full listen backlog), past any deadline and deaf
/// to a stop. Joining probes first, then has CAF connect to `reached`.
std::string probe_tcp(const std::string& host, std::uint16_t port, std::chrono::steady_clock::time_point until,
                      const std::function<bool()>& stop, std::string* reached = nullptr);

/// Connects to `head`'s gatekeeper (retrying with backoff up to
/// cluster.connect_deadline_ms, or until `stop_requested`) and proves the
/// secret as `node`: the cluster's handles, or nullopt with `why` set.
std::optional<join_grant> join_cluster(caf::actor_system& sys, const topology& t, const node_spec& node,
                                       const node_spec& head, const std::string& secret,
                                       const std::function<bool()>& stop_requested, std::string& why);

struct member_node_options {
  /// Polled every 50 ms while serving (a signal handler's flag); empty: never.
  std::function<bool()> stop_requested;
  /// One line per event (admitted, registered, rejoined, why it stops), and
  /// the UCX puller's lines prefixed "ucx: "; called from several threads.
  std::function<void(const std::string&)> log;
  /// Attached to the trainer ranks hosted here while their producers are
  /// up (a drill's signals arm them); nullptr: none.
  std::shared_ptr<rank_drill_arms> drill_arms;
  /// Where this node's router and engines record their metrics; nullptr: nowhere.
  std::shared_ptr<metrics::registry> metrics;
  /// Called once, after this node's engines first registered, with their
  /// names and handles (`rlsync serve --topology` puts its HTTP routes in
  /// front of one). A non-empty answer is why the node cannot go on: it
  /// stops its actors and ends with exit code 1. Empty: nothing is called.
  std::function<std::string(const std::vector<std::pair<std::string, caf::actor>>&)> on_registered;
  /// Set: this process is an external trainer rank's own (trainer.source:
  /// external; the `rlsync` Python module): it hosts rank `external_rank`
  /// alone, on `external_source`, and no engine or router of its node.
  std::optional<std::uint32_t> external_rank;
  std::shared_ptr<transfer::weight_source> external_source;
  /// Called once with the ranks spawned here, before they register.
  std::function<void(const std::vector<hosted_rank>&)> on_ranks;
  /// Kept pointing at the coordinator this node registered with (a rejoin
  /// replaces it); nullptr: not kept.
  std::shared_ptr<coordinator_ref> coordinator;
  /// transfer.backend nccl: how this node's members start their links;
  /// empty: nccl_link on each member's device (tests give a fake world's).
  gpu::nccl_membership::link_factory nccl_links;
  /// The devices the start-up check reads; empty: gpu::query_devices().
  std::optional<gpu::device_info> devices;
};

/// How a member node ended.
struct member_node_end {
  int exit_code = 0;           ///< 0: stopped or the coordinator ended; 1: could not (re)join or register
  bool all_terminated = false; ///< every engine of this node terminated in time
};

/// Joins the cluster as `node`, spawns and registers its engines, and serves
/// until stop_requested() says so or the coordinator stops; rejoins (up to
/// connect_deadline_ms) when the link to the head is lost. Blocking: call it
/// from a thread that is not an actor.
member_node_end run_member_node(caf::actor_system& sys, const topology& t, const node_spec& node,
                                const node_spec& head, const std::string& secret, const member_node_options& opts);

} // namespace rlsync
