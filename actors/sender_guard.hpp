#pragma once
// Authorization on every message. CAF delivers a message to any actor id in
// its registry, whoever sent it (over the network too), so every handler of
// an actor a remote peer can reach runs behind `authorized`: the message is
// handled only when its sender may send to this actor (this process's own
// actors, the actor itself, and whoever the actor's sender_policy admits,
// e.g. the nodes the gatekeeper admitted). Anything else, an anonymous
// sender included, is refused: a request gets errc::unauthenticated, a
// one-way message is dropped; the refusal is counted and logged (rate
// limited, so a flood cannot fill the log).
//
//   behaviour { authorized(self, guard, [=](status_atom) -> status { ... }), ... }
//
// The wrapper has the handler's own parameters; a handler returning a plain
// value T returns caf::result<T> through it (the interface is unchanged).
#include "actors/type_ids.hpp"
#include "runtime/base/rate_limited_log.hpp"

#include <caf/actor_addr.hpp>
#include <caf/actor_control_block.hpp>
#include <caf/atom.hpp>
#include <caf/node_id.hpp>
#include <caf/response_promise.hpp>
#include <caf/result.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace rlsync {

/// Whether a message's sender may be served (never asked about an
/// anonymous sender, who is always refused, or about the actor itself).
using sender_policy = std::function<bool(const caf::strong_actor_ptr& sender)>;

/// This process's actors and those of the nodes `admit` says were admitted
/// (the gatekeeper's word); without `admit`, this process's actors only.
sender_policy local_or_admitted(caf::node_id own, std::function<bool(const caf::node_id&)> admit);

/// A set of actors (by node and id, so that every proxy of one remote actor
/// matches), thread-safe: an engine's coordinator and router, replaced when
/// its node rejoins a restarted head.
class trusted_actors {
public:
  /// Replaces the set by `actors` (null handles are skipped).
  void assign(const std::vector<caf::actor_addr>& actors);
  bool contains(const caf::strong_actor_ptr& sender) const;
  /// Whether `node` runs one of the actors.
  bool contains_node(const caf::node_id& node) const;

private:
  mutable std::mutex mutex_;
  std::set<std::pair<caf::node_id, caf::actor_id>> actors_;
};

/// This process's actors and the actors in `trusted`: who may drive an engine.
sender_policy local_or_trusted(caf::node_id own, std::shared_ptr<const trusted_actors> trusted);

/// This process's actors and every actor of the nodes of the actors in
/// `trusted` (e.g. the head's process, where the coordinator runs): who may
/// drive a trainer rank on a member node. Node-wide because the head's main
/// job, not only its coordinator, asks ranks to freeze.
sender_policy local_or_nodes_of(caf::node_id own, std::shared_ptr<const trusted_actors> trusted);

/// Where the registered engines run (engine name -> printed CAF node id), as
/// the coordinator last said; thread-safe: a trainer's handlers and its
/// guard read it. Bounded by what `assign` accepts.
class engine_nodes {
public:
  /// Most engines one placement list may name; names longer than
  /// max_engine_name_bytes are refused too.
  static constexpr std::size_t max_engines = 4096;
  static constexpr std::size_t max_engine_name_bytes = 4096;

  /// Replaces every placement by `placements`. Returns an empty string, or
  /// why the list is refused (too long, an empty or overlong name, a name
  /// twice with different nodes); a refused list changes nothing.
  std::string assign(const std::vector<engine_placement>& placements);
  /// Whether `engine` is registered from `node`.
  bool hosts(const caf::node_id& node, const std::string& engine) const;
  /// Whether some registered engine runs on `node`.
  bool hosts_any(const caf::node_id& node) const;

private:
  mutable std::mutex mutex_;
  std::map<std::string, std::string> node_of_;  ///< engine -> node
  std::multiset<std::string> nodes_;            ///< one entry per engine
};

/// Who drives a member node's engines: the coordinator of the grant they
/// registered under and one router, the grant's or the one that coordinator
/// vouched for since (a router on a member node registers with the
/// coordinator, which names it to every engine; a restarted router has a new
/// handle and is vouched for again). Only the coordinator may vouch: a
/// router, trusted or not, cannot name another. Thread-safe.
class engine_drivers {
public:
  /// A (re)join: the grant's coordinator and router (null: none named yet).
  void granted(const caf::actor_addr& coordinator, const caf::actor_addr& router);
  /// `sender` names `router` as the one to obey: replaces the router when
  /// `sender` is the coordinator (true), else changes nothing (false).
  bool vouch(const caf::strong_actor_ptr& sender, const caf::actor_addr& router);
  bool contains(const caf::strong_actor_ptr& sender) const;

private:
  using key = std::pair<caf::node_id, caf::actor_id>;
  static std::optional<key> key_of(const caf::actor_addr& a);
  mutable std::mutex mutex_;
  std::optional<key> coordinator_, router_;
};

/// This process's actors and the engine's drivers.
sender_policy local_or_driver(caf::node_id own, std::shared_ptr<const engine_drivers> drivers);

/// sender_guard::refuse's reason when none is given: the sender's node was
/// never admitted (any other reason is an admitted node's own, told to it).
inline const std::string not_admitted = "not admitted";

/// One actor's gate: its policy, its refusal count and its rate-limited log.
class sender_guard {
public:
  /// `actor` names the guarded actor in log lines and errors; an empty
  /// `policy`: this process's actors only; an empty `log`: stderr.
  sender_guard(std::string actor, sender_policy policy, std::function<void(const std::string&)> log = {});

  /// Whether `sender` may send to the actor `self` (on node `own`).
  bool admits(const caf::strong_actor_ptr& sender, const caf::actor_control_block* self,
              const caf::node_id& own) const;

  /// Counts and logs one refused message (`message`: its type, e.g. its
  /// leading atom) and returns the error a request gets.
  caf::error refuse(const caf::strong_actor_ptr& sender, const std::string& message,
                    const std::string& why = not_admitted);

  /// Messages refused so far.
  std::uint64_t refused() const { return refused_.load(); }

private:
  std::string actor_;
  sender_policy policy_;
  rate_limited_log log_;
  std::atomic<std::uint64_t> refused_{0}; ///< shared by an actor and its helpers (the router's relays)
};

namespace detail {

template <class T>
struct is_atom_constant : std::false_type {};
template <caf::atom_value V>
struct is_atom_constant<caf::atom_constant<V>> : std::true_type {};

/// A message's name for the log: its leading atom (every rlsync message has one).
template <class First, class... Rest>
std::string message_name() {
  using head = std::decay_t<First>;
  if constexpr (is_atom_constant<head>::value)
    return caf::to_string(head::value);
  else
    return "message";
}

/// What the wrapper returns for a handler returning `R`: a refusal must be
/// expressible, so a plain value becomes caf::result of it.
template <class R>
struct guarded_result {
  using type = caf::result<R>;
};
template <>
struct guarded_result<void> {
  using type = void;
};
template <class... Ts>
struct guarded_result<caf::result<Ts...>> {
  using type = caf::result<Ts...>;
};

template <class Self, class F, class R, class... Args>
auto authorize(Self self, std::shared_ptr<sender_guard> guard, F handler, R (F::*)(Args...) const) {
  using out = typename guarded_result<R>::type;
  return [self, guard, handler](Args... xs) -> out {
    const auto& sender = self->current_sender();
    if (!guard->admits(sender, self->ctrl(), self->node())) {
      auto err = guard->refuse(sender, message_name<Args...>());
      if constexpr (std::is_void_v<out>) {
        // One-way: dropped. Sent as a request, CAF would answer an empty
        // message, which a peer cannot tell from being served: it gets the error.
        auto rp = self->template make_response_promise<caf::response_promise>();
        if (rp.pending() && !rp.async())
          rp.deliver(std::move(err));
        return;
      } else
        return out{std::move(err)};
    }
    return handler(std::forward<Args>(xs)...);
  };
}

} // namespace detail

/// Counts and logs a stray error message (one that answers no request)
/// instead of ending the actor, CAF's default: any peer can send one, and it
/// bypasses the behaviour. Errors from a sender `expected` admits (the
/// answer to a one-way message the actor sent it) are dropped silently.
template <class Self>
void refuse_stray_errors(Self self, std::shared_ptr<sender_guard> guard,
                         std::function<bool(const caf::strong_actor_ptr&)> expected = {}) {
  self->set_error_handler([self, guard, expected](caf::error& err) {
    if (expected && self->current_sender() && expected(self->current_sender()))
      return;
    guard->refuse(self->current_sender(), "error " + to_string(err), "an error message that answers no request");
  });
}

/// `handler` behind `guard`: it runs only for a sender the guard admits.
/// The handler's signature is deduced from its call operator, so a generic
/// lambda cannot be wrapped.
template <class Self, class F>
auto authorized(Self self, std::shared_ptr<sender_guard> guard, F handler) {
  return detail::authorize(self, std::move(guard), std::move(handler), &F::operator());
}

} // namespace rlsync
