#include "runtime/control/membership_policy.hpp"

namespace rlsync {

bool past_restart_cap(std::uint32_t restarts, std::int64_t max_restarts) {
  return static_cast<std::int64_t>(restarts) > max_restarts;
}

registration_decision decide_registration(const registration_facts& f) {
  registration_decision d;
  if (f.known_replica && f.retired) {
    d.verdict = registration_verdict::retired;
    return d;
  }
  if (f.registered) {
    if (f.same_actor) {
      d.verdict = registration_verdict::retry;
      return d;
    }
    if (f.incarnation <= f.registered_incarnation) {
      d.verdict = registration_verdict::not_newer;
      return d;
    }
    d.replaces = true;
  } else if (f.known_replica && f.incarnation < f.last_incarnation) {
    d.verdict = registration_verdict::older_than_seen;
    return d;
  }
  if (f.known_replica && f.incarnation > f.last_incarnation) {
    d.restart = true;
    if (past_restart_cap(f.restarts + 1, f.max_restarts))
      d.verdict = registration_verdict::retire;
    return d;
  }
  // The same incarnation again: it reconnected, or the coordinator
  // restarted. Current then and now, and not left paused by a round the
  // coordinator never finished: it may serve at once.
  d.routable_at_once = f.known_replica && f.was_routable && !f.dirty && !f.paused && f.version != 0
                       && f.version == f.synced_version && f.recorded_version == f.version;
  return d;
}

bool serves(const member_view& m, std::uint64_t newest) {
  return m.routable && !m.dirty && m.version == newest;
}

bool joins_round(const member_view& m, std::uint64_t newest) {
  return !serves(m, newest) && !m.unreachable;
}

bool waits_for_cold_sync(const member_view& m) {
  return m.newcomer && !m.unreachable;
}

bool dirty_after_eviction(sync_phase phase) {
  return phase >= sync_phase::start && phase != sync_phase::done;
}

wave_outcome after_wave(bool wave_aborted, bool said_dirty) {
  if (!wave_aborted)
    return wave_outcome::current;
  return said_dirty ? wave_outcome::dirty : wave_outcome::old_version;
}

bool silent_too_long(std::uint64_t now_ns, std::uint64_t last_heard_ns, std::uint64_t timeout_ns) {
  return now_ns > last_heard_ns && now_ns - last_heard_ns > timeout_ns;
}

min_live_change count_live(min_live_alert& a, std::int64_t live, std::int64_t serving, std::int64_t min_live) {
  if (serving >= min_live)
    a.armed = true;
  if (live >= min_live) {
    bool was_below = a.below;
    a.below = false;
    return was_below ? min_live_change::recovered : min_live_change::none;
  }
  if (!a.armed || a.below)
    return min_live_change::none;
  a.below = true;
  ++a.events;
  return min_live_change::alert;
}

} // namespace rlsync
