#include "actors/sender_guard.hpp"

#include "runtime/base/printable.hpp"

#include <caf/actor_addr.hpp>

#include <algorithm>
#include <iostream>

namespace rlsync {

sender_policy local_or_admitted(caf::node_id own, std::function<bool(const caf::node_id&)> admit) {
  return [own, admit = std::move(admit)](const caf::strong_actor_ptr& sender) {
    return sender->node() == own || (admit && admit(sender->node()));
  };
}

void trusted_actors::assign(const std::vector<caf::actor_addr>& actors) {
  std::set<std::pair<caf::node_id, caf::actor_id>> next;
  for (const auto& a : actors)
    if (a)
      next.emplace(a.node(), a.id());
  std::lock_guard<std::mutex> lock(mutex_);
  actors_ = std::move(next);
}

bool trusted_actors::contains(const caf::strong_actor_ptr& sender) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sender && actors_.count({sender->node(), sender->id()}) > 0;
}

bool trusted_actors::contains_node(const caf::node_id& node) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(actors_.begin(), actors_.end(), [&](const auto& a) { return a.first == node; });
}

sender_policy local_or_trusted(caf::node_id own, std::shared_ptr<const trusted_actors> trusted) {
  return [own, trusted = std::move(trusted)](const caf::strong_actor_ptr& sender) {
    return sender->node() == own || (trusted && trusted->contains(sender));
  };
}

sender_policy local_or_nodes_of(caf::node_id own, std::shared_ptr<const trusted_actors> trusted) {
  return [own, trusted = std::move(trusted)](const caf::strong_actor_ptr& sender) {
    return sender->node() == own || (trusted && trusted->contains_node(sender->node()));
  };
}

std::string engine_nodes::assign(const std::vector<engine_placement>& placements) {
  if (placements.size() > max_engines)
    return std::to_string(placements.size()) + " engine placements (at most " + std::to_string(max_engines) + ")";
  std::map<std::string, std::string> next;
  std::multiset<std::string> nodes;
  for (const auto& p : placements) {
    if (p.engine.empty() || p.engine.size() > max_engine_name_bytes)
      return "an engine name of " + std::to_string(p.engine.size()) + " bytes (1 to "
             + std::to_string(max_engine_name_bytes) + ")";
    if (p.node.empty() || p.node.size() > max_engine_name_bytes)
      return "engine '" + printable(p.engine) + "': a node id of " + std::to_string(p.node.size()) + " bytes";
    auto [at, added] = next.emplace(p.engine, p.node);
    if (!added && at->second != p.node)
      return "engine '" + printable(p.engine) + "' placed on two nodes";
    if (added)
      nodes.insert(p.node);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  node_of_ = std::move(next);
  nodes_ = std::move(nodes);
  return {};
}

bool engine_nodes::hosts(const caf::node_id& node, const std::string& engine) const {
  const auto id = to_string(node);
  std::lock_guard<std::mutex> lock(mutex_);
  auto i = node_of_.find(engine);
  return i != node_of_.end() && i->second == id;
}

bool engine_nodes::hosts_any(const caf::node_id& node) const {
  const auto id = to_string(node);
  std::lock_guard<std::mutex> lock(mutex_);
  return nodes_.count(id) > 0;
}

std::optional<engine_drivers::key> engine_drivers::key_of(const caf::actor_addr& a) {
  if (!a)
    return std::nullopt;
  return key{a.node(), a.id()};
}

void engine_drivers::granted(const caf::actor_addr& coordinator, const caf::actor_addr& router) {
  auto c = key_of(coordinator);
  auto r = key_of(router);
  std::lock_guard<std::mutex> lock(mutex_);
  coordinator_ = std::move(c);
  router_ = std::move(r);
}

bool engine_drivers::vouch(const caf::strong_actor_ptr& sender, const caf::actor_addr& router) {
  auto r = key_of(router);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sender || !coordinator_ || *coordinator_ != key{sender->node(), sender->id()})
    return false;
  router_ = std::move(r);
  return true;
}

bool engine_drivers::contains(const caf::strong_actor_ptr& sender) const {
  if (!sender)
    return false;
  const key k{sender->node(), sender->id()};
  std::lock_guard<std::mutex> lock(mutex_);
  return coordinator_ == k || router_ == k;
}

sender_policy local_or_driver(caf::node_id own, std::shared_ptr<const engine_drivers> drivers) {
  return [own, drivers = std::move(drivers)](const caf::strong_actor_ptr& sender) {
    return sender->node() == own || (drivers && drivers->contains(sender));
  };
}

sender_guard::sender_guard(std::string actor, sender_policy policy, std::function<void(const std::string&)> log)
    : actor_(std::move(actor)), policy_(std::move(policy)),
      log_(log ? std::move(log) : [](const std::string& line) { std::cerr << (line + '\n'); }) {}

bool sender_guard::admits(const caf::strong_actor_ptr& sender, const caf::actor_control_block* self,
                          const caf::node_id& own) const {
  if (!sender)
    return false; // anonymous: nobody vouches for it
  if (sender.get() == self)
    return true; // its own timers and steps
  return policy_ ? policy_(sender) : sender->node() == own;
}

caf::error sender_guard::refuse(const caf::strong_actor_ptr& sender, const std::string& message,
                                const std::string& why) {
  auto count = ++refused_;
  std::string from = sender ? "actor " + std::to_string(sender->id()) + " on node " + printable(to_string(sender->node()))
                            : std::string{"an anonymous sender"};
  log_(actor_ + ": refused '" + printable(message) + "' from " + from + ": " + why + " (" + std::to_string(count)
       + " refused so far)");
  if (why != not_admitted) // an admitted node asking for what is not its own
    return make_error(errc::unauthenticated, actor_ + ": '" + printable(message) + "' refused: " + why);
  return make_error(errc::unauthenticated, actor_ + ": '" + message + "' refused: the sender's node is not admitted "
                                             "(nodes prove the cluster secret to the gatekeeper first)");
}

} // namespace rlsync
