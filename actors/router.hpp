#pragma once
// The router: routes generation requests to routable replicas at
// a current version, queues them (bounded, with a deadline) while none can
// serve, and relays each engine's final answer back to its requester.
//
// One request's life (counters in router_status in brackets):
//
//   generate ─ check fails ─────────────────────────────▶ error malformed     [rejected]
//      ├─ a replica can serve ─▶ running [outstanding]
//      │                           ├ engine's result ─────────▶ result        [completed]
//      │                           └ engine error, timeout, down ─▶ result, reason failed
//      │                                                                      [completed]
//      ├─ none, queue full ─────────────────────────────▶ error queue_full    [rejected]
//      └─ none ─▶ queued, FIFO [queued] ─ a replica can serve ─▶ running
//                   └ its deadline passes ───────────────▶ error not_routable [rejected]
//                     (a requeued reroute: a result with its tokens so far, reason rejected)
//
// A request's deadline is its own deadline_ms, or the router's queue_deadline
// when it has none; it counts from arrival, and from each requeue after its
// engine failed. While every engine is down the queue holds requests until
// one is current again: losing the fleet costs waiting time, not requests.
//
// Tokens do not pass through the router's mailbox, which must stay free for
// route updates and evictions. Each dispatch of a request gets its own relay
// actor, handed to the engine as the sink: it forwards every token once, in
// order, to the requester's sink, drops duplicates and strays (by request id
// and index), and remembers what it forwarded. That record is what a reroute
// continues from (prompt + tokens so far, the rest of the budget); the next
// engine gets a fresh relay, so late tokens of an abandoned attempt land
// nowhere. The router answers only after the relay has closed, so the
// requester's sink has every token before the requester has the result.
//
// Replicas come from the coordinator's route updates. The router monitors
// each one, and remembers the last incarnation of each name that went down:
// a route update naming that handle again (sent before the coordinator
// learnt of the death) is ignored, so the router never sends to an engine it
// knows is dead. A replica that fails — it dies (down message), the coordinator
// reports it silent, evicted in its wave or dirty (failed_atom), or it refuses
// a request it cannot serve (dirty, full, evicted) — loses its running
// requests to a reroute:
//
//   running ─ engine failed ─▶ rerouting: close the old relay, append what it
//      ▲                        forwarded to the request's `prior` tokens
//      │                          ├ budget used up or eos ─▶ result         [completed]
//      │                          ├ attempts > max_reroutes ─▶ result, failed [completed]
//      └──── dispatch ◀───────────┴ else: prompt + client's generated + prior,
//             (or queued)               the rest of the budget   [rerouted]
//
// The requester's sink saw exactly the old relay's tokens, and the next
// attempt starts at the index after them, so the stream has no gap and no
// duplicate; the final result is `prior` followed by the last engine's
// tokens, version spans shifted and joined. The old engine is told to abort
// the request (best effort: it may be dead or unreachable).
#include "actors/interfaces.hpp"
#include "actors/sender_guard.hpp"
#include "runtime/control/routing.hpp"

#include <caf/actor_system.hpp>
#include <caf/typed_response_promise.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace rlsync {

/// One request's token relay: the sink the router hands to the engine.
/// Private to the router; engines see only its token_sink_actor face.
using token_relay_actor = token_sink_actor::extend<
  // the request is over: reply with every token forwarded (and their spans), then quit
  caf::replies_to<finish_atom>::with<generate_result>>;

/// The router's own interface: router_actor plus the deadline it sends
/// itself. Handles given out are router_actor; a superset interface still
/// matches router_actor remotely.
using router_impl_actor = router_actor::extend<
  // the earliest queued deadline is due (accepted only from the router
  // itself); the two numbers are unused (0)
  caf::reacts_to<caf::timeout_atom, std::uint64_t, std::uint32_t>>;

/// A request the router has accepted and not yet answered.
struct request_record {
  std::uint64_t ticket = 0; ///< the router's own key: request ids are the clients'
  generate_request request;
  token_sink_actor sink; ///< the requester's
  caf::typed_response_promise<generate_result> promise;
  // Set while running:
  std::string engine_name;
  rollout_engine_actor engine;
  token_relay_actor relay;
  std::uint32_t attempts = 0; ///< dispatches so far; replies to an earlier one are stale
  /// Tokens earlier attempts delivered to the sink (spans from 0), which the
  /// next attempt continues after.
  generate_result prior;
  /// While queued: when it gives up waiting (its key in queue_deadlines).
  caf::actor_clock::time_point queued_until;
  /// The replicas earlier attempts left (at most max_reroutes + 1 names): a
  /// reroute does not go straight back to one that just refused it.
  std::vector<std::string> left;
  // Set while closing: the engine's result, or none when the request failed.
  std::optional<generate_result> result;
};

struct router_state {
  router_config config;
  routing_rules rules;
  /// The routing table: one entry per known replica, by name.
  std::vector<replica_load> replicas;
  std::map<std::string, rollout_engine_actor> engines;
  /// The incarnation of each name that last went down (one per name: names
  /// come from the topology, so this stays bounded).
  std::map<std::string, caf::actor_addr> dead;
  std::string round_robin_cursor;
  std::uint64_t next_ticket = 1;
  /// Waiting for a replica, FIFO: tickets grow with arrival. At most queue_limit.
  std::map<std::uint64_t, request_record> queued;
  /// The queued requests' deadlines, earliest first, and when the one timer
  /// for them is due: a timer per enqueue would outlive its request (a
  /// request dispatched at once left its full deadline pending).
  std::multimap<caf::actor_clock::time_point, std::uint64_t> queue_deadlines;
  std::optional<caf::actor_clock::time_point> queue_timer_at;
  std::map<std::uint64_t, request_record> running;
  /// Finished, waiting for the relay to flush its last tokens before the answer.
  std::map<std::uint64_t, request_record> closing;
  /// Their engine failed; waiting for the old relay's record before the next dispatch.
  std::map<std::uint64_t, request_record> rerouting;
  /// request_id → ticket while queued or running: one request id is in flight once.
  std::unordered_map<std::uint64_t, std::uint64_t> in_flight;
  std::uint64_t completed = 0;
  std::uint64_t rejected = 0;
  std::uint64_t rerouted = 0;
  /// Refuses (counts, logs) messages from senders the router's policy does not admit.
  std::shared_ptr<sender_guard> guard;

  static inline const char* name = "router";
};

/// The router's behaviour (spawn it with spawn_router). `authorize`: who
/// may send to it besides itself (local_or_admitted); empty: this process's
/// actors only. Every other sender is refused, on every message.
router_impl_actor::behavior_type router(router_impl_actor::stateful_pointer<router_state> self,
                                        router_config config, sender_policy authorize);

/// Spawns a router with `config`, admitting senders as `authorize` says.
router_actor spawn_router(caf::actor_system& sys, router_config config, sender_policy authorize = {});

} // namespace rlsync
