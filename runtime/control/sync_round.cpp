#include "runtime/control/sync_round.hpp"

#include <algorithm>

namespace rlsync {

bool round_due(std::uint64_t newest_version, std::uint64_t synced_version,
               std::int64_t every_versions, bool newcomer_waiting) {
  if (newcomer_waiting)
    return true;
  // A cadence below 1 would sync on no change at all; treat it as "every version".
  auto every = static_cast<std::uint64_t>(std::max<std::int64_t>(every_versions, 1));
  return newest_version > synced_version && newest_version - synced_version >= every;
}

namespace {

bool contains(const std::vector<std::string>& xs, std::string_view x) {
  return std::find(xs.begin(), xs.end(), x) != xs.end();
}

bool erase(std::vector<std::string>& xs, std::string_view x) {
  auto i = std::find(xs.begin(), xs.end(), x);
  if (i == xs.end())
    return false;
  xs.erase(i);
  return true;
}

} // namespace

sync_round::sync_round(std::uint64_t id, std::uint64_t version, std::vector<std::string> engines)
  : id_(id), version_(version), live_(std::move(engines)), pending_(live_) {
  if (live_.empty())
    phase_ = sync_phase::done;
}

bool sync_round::waiting_on(std::string_view name) const {
  return contains(pending_, name);
}

bool sync_round::in_round(std::string_view name) const {
  return contains(live_, name);
}

bool sync_round::ack(std::string_view name, sync_phase phase) {
  return phase == phase_ && erase(pending_, name);
}

bool sync_round::evict(std::string_view name) {
  if (!erase(live_, name))
    return false;
  erase(pending_, name);
  evicted_.emplace_back(name);
  return true;
}

sync_phase sync_round::advance() {
  if (!barrier_reached() || done())
    return phase_;
  phase_ = live_.empty() ? sync_phase::done : next(phase_);
  if (done())
    pending_.clear();
  else
    pending_ = live_;
  return phase_;
}

bool sync_round::abort() {
  // From finish on, every live engine holds the whole version: the round
  // completes without the trainer.
  if (phase_ >= sync_phase::finish)
    return false;
  aborted_ = true;
  phase_ = live_.empty() ? sync_phase::done : sync_phase::resume;
  pending_ = live_;
  return true;
}

} // namespace rlsync
