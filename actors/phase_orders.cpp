#include "actors/phase_orders.hpp"

#include <string>

namespace rlsync {

std::string check(const phase_order& x) {
  if (static_cast<int>(x.phase) >= static_cast<int>(sync_phase::done))
    return "phase_order.phase: out of range (" + std::to_string(static_cast<int>(x.phase)) + ")";
  if (x.deadline_ms < 1 || x.deadline_ms > max_phase_deadline_ms)
    return "phase_order.deadline_ms: " + std::to_string(x.deadline_ms) + " lies outside [1, "
           + std::to_string(max_phase_deadline_ms) + "]";
  if (auto why = check(x.pause); !why.empty())
    return "phase_order." + why;
  if (auto why = check(x.transfer); !why.empty())
    return "phase_order." + why;
  if (x.producers.size() != x.transfer.producers.size())
    return "phase_order.producers: " + std::to_string(x.producers.size()) + " handles for "
           + std::to_string(x.transfer.producers.size()) + " producers";
  return {};
}

} // namespace rlsync
