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
// engine holds at most a few requests of its own.
//
// The request to itself carries no timeout. The coordinator's phase deadline
// is what bounds the round; a CAF timeout per order would wake the clock
// thread of every engine process at every phase, and on a loaded host that
// cost the control round about 15 % (`rlsync bench control`). An order that
// passed the engine's partition gate is answered (the gate lets the engine's
// own requests through); what a handler that still never answers leaves
// behind (the test engines' silent modes, a simulated partition losing an
// answer) is a few hundred bytes of continuation in CAF, and it is bounded:
// an engine holds at most max_unanswered_phase_orders unanswered orders and
// refuses more with queue_full, which evicts it.
#include "actors/interfaces.hpp"

#include <caf/actor_cast.hpp>
#include <caf/error.hpp>

#include <cstdint>
#include <string>
#include <utility>

namespace rlsync {

/// Phase orders an engine holds unanswered: normally none or one (phases
/// reach an engine one at a time); more only where answers are lost.
constexpr std::uint32_t max_unanswered_phase_orders = 1024;

/// Kept in the engine's state: its unanswered phase orders.
struct phase_order_count {
  std::uint32_t unanswered = 0;
};

namespace phase_order_detail {

template <class Reply, class Self, class... Ts>
void ask_self(Self* self, phase_order_count& count, const coordinator_actor& coordinator, std::uint64_t token,
              Ts&&... xs) {
  ++count.unanswered;
  auto* n = &count; // in the actor's state: it outlives every continuation the actor runs
  self->request(caf::actor_cast<rollout_engine_actor>(self), caf::infinite, std::forward<Ts>(xs)...)
    .then(
      [self, n, coordinator, token](Reply& reply) {
        --n->unanswered;
        self->send(coordinator, phase_done_atom::value, token, std::move(reply));
      },
      [self, n, coordinator, token](caf::error& err) {
        --n->unanswered;
        self->send(coordinator, phase_done_atom::value, token, std::move(err));
      });
}

} // namespace phase_order_detail

/// Serves one phase order; the answer goes to the order's sender (the
/// coordinator). An order that fails its check is answered with
/// errc::malformed; one past max_unanswered_phase_orders with errc::queue_full.
template <class Self>
void serve_phase_order(Self* self, phase_order_count& count, const phase_order& order) {
  using phase_order_detail::ask_self;
  auto coordinator = caf::actor_cast<coordinator_actor>(self->current_sender());
  if (!coordinator)
    return; // anonymous: nobody to answer
  if (auto why = check(order); !why.empty()) {
    self->send(coordinator, phase_done_atom::value, order.token, make_error(errc::malformed, why));
    return;
  }
  if (count.unanswered >= max_unanswered_phase_orders) {
    self->send(coordinator, phase_done_atom::value, order.token,
               make_error(errc::queue_full, std::to_string(count.unanswered) + " phase orders still unanswered"));
    return;
  }
  switch (order.phase) {
    case sync_phase::pause:
      ask_self<pause_report>(self, count, coordinator, order.token, pause_atom::value, order.pause);
      break;
    case sync_phase::flush:
      ask_self<phase_ack>(self, count, coordinator, order.token, flush_atom::value);
      break;
    case sync_phase::start:
      ask_self<phase_ack>(self, count, coordinator, order.token, start_atom::value, order.version);
      break;
    case sync_phase::transfer:
      ask_self<transfer_report>(self, count, coordinator, order.token, transfer_atom::value, order.transfer,
                                order.producers);
      break;
    case sync_phase::finish:
      ask_self<phase_ack>(self, count, coordinator, order.token, finish_atom::value, order.version);
      break;
    case sync_phase::resume:
      ask_self<phase_ack>(self, count, coordinator, order.token, resume_atom::value);
      break;
    case sync_phase::done: // refused by check
      break;
  }
}

} // namespace rlsync
