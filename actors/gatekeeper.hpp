#pragma once
// Cluster membership is authenticated: a joining node must prove it holds
// the cluster secret before any of its actors is accepted.
//
//   node                     gatekeeper (head node, the only published actor)
//    │ hello(name) ───────────►  fresh 32-byte challenge, one use, bounded table
//    │ ◄──────────── challenge
//    │ admit(name, HMAC-SHA256(secret, challenge | name)) ──►  constant-time compare
//    │ ◄──────────── join_grant{coordinator, trainer, router}   and the sender's
//    │                                                        node id joins the
//    │                                                        admitted set, which the
//    │                                                        coordinator checks on
//    │                                                        every registration
//
// A wrong answer, an unknown or reused challenge, or a malformed message is
// refused with errc::unauthenticated and logged; nothing else changes.
#include "actors/interfaces.hpp"

#include <caf/node_id.hpp>

#include <algorithm>
#include <deque>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

namespace rlsync {

/// The node ids the gatekeeper admitted; shared with the coordinator.
class admitted_nodes {
public:
  void add(const caf::node_id& n);
  bool contains(const caf::node_id& n) const;

private:
  mutable std::mutex mutex_;
  std::set<caf::node_id> nodes_;
};

struct gatekeeper_config {
  std::string secret; ///< never empty: a cluster without a secret publishes no gatekeeper
  join_grant grant;
  std::shared_ptr<admitted_nodes> admitted;
  std::function<void(const std::string&)> log;
  std::size_t max_pending = 1024; ///< outstanding challenges (oldest dropped first)
};

struct gatekeeper_state {
  gatekeeper_config cfg;
  std::map<std::string, std::string> pending; ///< challenge (hex) -> node name
  std::deque<std::string> order;              ///< challenges, oldest first
  static inline const char* name = "gatekeeper";
};

gatekeeper_actor::behavior_type gatekeeper(gatekeeper_actor::stateful_pointer<gatekeeper_state> self,
                                           gatekeeper_config cfg);

/// HMAC-SHA256(secret, challenge | node) as lower-case hex: what a node answers.
std::string join_proof(const std::string& secret, const std::string& challenge, const std::string& node);

/// Reads the cluster secret from a file (trailing newlines dropped) or an
/// environment variable. Throws std::runtime_error naming the file or the
/// variable when it is missing, unreadable or empty.
std::string read_cluster_secret(const std::string& secret_file, const std::string& secret_env);

} // namespace rlsync
