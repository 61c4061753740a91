#pragma once
// How an engine serves the coordinator's sync phases at fleet scale.
//
// The coordinator sends each phase as a one-way order carrying a token and
// takes the answer back as a plain `phase_done` message with that token. It
// holds no CAF request per engine: CAF 0.17 keeps an actor's pending
// requests in a vector-backed map, so with n requests in flight every answer
// costs a linear search and erase, and a round of n engines O(n²). At
// 10,000 engines that was most of the coordinator's CPU.
//
// The engine runs the order through its own request handler for the phase,
// by asking itself: every engine kind (with its deferred answers, drills and
// guards) then answers an order exactly as it answers the request, and the
// engine holds at most a few requests of its own. The request to itself is
// bounded by twice the phase's deadline: the coordinator's own deadline has
// passed by then, so the engine never waits longer than it would be waited on.
#include "actors/interfaces.hpp"

#include <caf/actor_cast.hpp>
#include <caf/error.hpp>

#include <chrono>
#include <cstdint>
#include <utility>

namespace rlsync {

namespace phase_order_detail {

template <class Reply, class Self, class... Ts>
void ask_self(Self* self, const coordinator_actor& coordinator, std::uint64_t token, std::chrono::milliseconds bound,
              Ts&&... xs) {
  self->request(caf::actor_cast<rollout_engine_actor>(self), bound, std::forward<Ts>(xs)...)
    .then([self, coordinator, token](Reply& reply) { self->send(coordinator, phase_done_atom::value, token, std::move(reply)); },
          [self, coordinator, token](caf::error& err) { self->send(coordinator, phase_done_atom::value, token, std::move(err)); });
}

} // namespace phase_order_detail

/// Serves one phase order; the answer goes to the order's sender (the
/// coordinator). An order that fails its check is answered with errc::malformed.
template <class Self>
void serve_phase_order(Self* self, const phase_order& order) {
  using phase_order_detail::ask_self;
  auto coordinator = caf::actor_cast<coordinator_actor>(self->current_sender());
  if (!coordinator)
    return; // anonymous: nobody to answer
  if (auto why = check(order); !why.empty()) {
    self->send(coordinator, phase_done_atom::value, order.token, make_error(errc::malformed, why));
    return;
  }
  auto bound = std::chrono::milliseconds{order.deadline_ms} * 2;
  switch (order.phase) {
    case sync_phase::pause:
      ask_self<pause_report>(self, coordinator, order.token, bound, pause_atom::value, order.pause);
      break;
    case sync_phase::flush:
      ask_self<phase_ack>(self, coordinator, order.token, bound, flush_atom::value);
      break;
    case sync_phase::start:
      ask_self<phase_ack>(self, coordinator, order.token, bound, start_atom::value, order.version);
      break;
    case sync_phase::transfer:
      ask_self<transfer_report>(self, coordinator, order.token, bound, transfer_atom::value, order.transfer,
                                order.producers);
      break;
    case sync_phase::finish:
      ask_self<phase_ack>(self, coordinator, order.token, bound, finish_atom::value, order.version);
      break;
    case sync_phase::resume:
      ask_self<phase_ack>(self, coordinator, order.token, bound, resume_atom::value);
      break;
    case sync_phase::done: // refused by check
      break;
  }
}

} // namespace rlsync
