#pragma once
// Stands in for the coordinator in tests of how engines answer phase
// orders (actors/phase_orders.hpp): records every phase_done it gets.
#include "actors/interfaces.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rlsync::test {

/// What came back to the order's sender: token and what it carried.
struct answer {
  std::uint64_t token = 0;
  std::string what; ///< "pause", "ack", "transfer" or the error's rendering
};

/// Stands in for the coordinator: records every phase_done it gets.
inline caf::behavior answer_sink(caf::event_based_actor* self, std::shared_ptr<std::vector<answer>> out) {
  return {
    [=](phase_done_atom, std::uint64_t token, const pause_report&) { out->push_back({token, "pause"}); },
    [=](phase_done_atom, std::uint64_t token, const phase_ack&) { out->push_back({token, "ack"}); },
    [=](phase_done_atom, std::uint64_t token, const transfer_report&) { out->push_back({token, "transfer"}); },
    [=](phase_done_atom, std::uint64_t token, const caf::error& err) {
      out->push_back({token, self->system().render(err)});
    },
  };
}

/// A valid order for `phase` (version 3, a 1 s deadline) with `token`.
inline phase_order order_of(sync_phase phase, std::uint64_t token) {
  phase_order o;
  o.token = token;
  o.phase = phase;
  o.deadline_ms = 1000;
  o.version = 3;
  return o;
}

} // namespace rlsync::test
