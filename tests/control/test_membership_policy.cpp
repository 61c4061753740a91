// The coordinator's membership decisions, row by row: registrations,
// who joins a round, liveness, what a wave's end or an eviction does, and
// the min_live_engines alert.
#include "runtime/control/membership_policy.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace rlsync;
using V = registration_verdict;

namespace {

/// A replica record the coordinator holds: incarnation 2, one restart,
/// current at v5 when it left; synced version 5, sync.max_restarts 3.
registration_facts known(std::uint64_t incarnation) {
  registration_facts f;
  f.known_replica = true;
  f.last_incarnation = 2;
  f.restarts = 1;
  f.recorded_version = 5;
  f.was_routable = true;
  f.incarnation = incarnation;
  f.version = 5;
  f.synced_version = 5;
  f.max_restarts = 3;
  return f;
}

} // namespace

TEST_CASE("decide_registration: who joins, who is refused, what counts as a restart") {
  struct row {
    const char* what;
    registration_facts facts;
    V verdict;
    bool replaces, restart, routable_at_once;
  };
  auto first = registration_facts{};
  first.incarnation = 0;
  auto retired = known(3);
  retired.retired = true;
  auto retry = known(2);
  retry.registered = true;
  retry.registered_incarnation = 2;
  retry.same_actor = true;
  auto same_incarnation_other_actor = retry;
  same_incarnation_other_actor.same_actor = false;
  auto replacement = retry;
  replacement.same_actor = false;
  replacement.incarnation = 3;
  auto older = known(1);
  auto restart = known(3);
  auto last_restart = known(3);
  last_restart.restarts = 2; // the third restart: at the cap, not past it
  auto past_cap = known(3);
  past_cap.restarts = 3; // the fourth
  auto replaced_past_cap = replacement;
  replaced_past_cap.restarts = 3;
  auto reconnect = known(2);
  auto reconnect_dirty = known(2);
  reconnect_dirty.dirty = true;
  auto reconnect_paused = known(2);
  reconnect_paused.paused = true;
  auto reconnect_behind = known(2);
  reconnect_behind.synced_version = 6;
  auto reconnect_other_version = known(2);
  reconnect_other_version.recorded_version = 4;
  auto reconnect_not_current = known(2);
  reconnect_not_current.was_routable = false;
  auto reconnect_empty = known(2);
  reconnect_empty.version = 0;
  reconnect_empty.recorded_version = 0;
  reconnect_empty.synced_version = 0;
  auto no_restarts_allowed = known(3);
  no_restarts_allowed.restarts = 0;
  no_restarts_allowed.max_restarts = 0;
  const std::vector<row> rows = {
    {"a first registration joins", first, V::join, false, false, false},
    {"a retired replica is refused", retired, V::retired, false, false, false},
    {"the registered actor again is a retry", retry, V::retry, false, false, false},
    {"another actor, same incarnation: not newer", same_incarnation_other_actor, V::not_newer, false, false, false},
    {"a newer incarnation replaces the member", replacement, V::join, true, true, false},
    {"an incarnation older than the last seen", older, V::older_than_seen, false, false, false},
    {"a new incarnation counts a restart", restart, V::join, false, true, false},
    {"the restart at the cap still joins", last_restart, V::join, false, true, false},
    {"the restart past the cap retires", past_cap, V::retire, false, true, false},
    {"a replacement past the cap retires and still drops the old", replaced_past_cap, V::retire, true, true, false},
    {"max_restarts 0: the first restart retires", no_restarts_allowed, V::retire, false, true, false},
    {"a reconnect current then and now is routable at once", reconnect, V::join, false, false, true},
    {"a dirty reconnect needs a sync", reconnect_dirty, V::join, false, false, false},
    {"a reconnect left paused by an unfinished round needs a sync (which continues it)", reconnect_paused, V::join,
     false, false, false},
    {"a reconnect behind the synced version needs a sync", reconnect_behind, V::join, false, false, false},
    {"a reconnect with another version than recorded", reconnect_other_version, V::join, false, false, false},
    {"a reconnect that was not current", reconnect_not_current, V::join, false, false, false},
    {"version 0 is never current", reconnect_empty, V::join, false, false, false},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto d = decide_registration(r.facts);
    CHECK(d.verdict == r.verdict);
    CHECK(d.replaces == r.replaces);
    CHECK(d.restart == r.restart);
    CHECK(d.routable_at_once == r.routable_at_once);
  }
}

TEST_CASE("past_restart_cap") {
  struct row {
    std::uint32_t restarts;
    std::int64_t max;
    bool past;
  };
  const row rows[] = {{0, 0, false}, {1, 0, true}, {3, 3, false}, {4, 3, true}, {0, -1, true}, {5, 100, false}};
  for (auto& r : rows) {
    CAPTURE(r.restarts);
    CAPTURE(r.max);
    CHECK(past_restart_cap(r.restarts, r.max) == r.past);
  }
}

TEST_CASE("serves, joins_round, waits_for_cold_sync") {
  struct row {
    const char* what;
    member_view m;
    bool serves, joins, cold_sync;
  };
  // member_view: routable, dirty, version, unreachable, newcomer; newest is 4.
  const row rows[] = {
    {"current: keeps serving", {true, false, 4, false, false}, true, false, false},
    {"behind", {true, false, 3, false, false}, false, true, false},
    {"dirty at the version", {true, true, 4, false, false}, false, true, false},
    {"evicted (unroutable) at the version", {false, false, 4, false, false}, false, true, false},
    {"a newcomer", {false, false, 0, false, true}, false, true, true},
    {"an unreachable newcomer waits", {false, false, 0, true, true}, false, false, false},
    {"unreachable and behind", {false, false, 3, true, false}, false, false, false},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    CHECK(serves(r.m, 4) == r.serves);
    CHECK(joins_round(r.m, 4) == r.joins);
    CHECK(waits_for_cold_sync(r.m) == r.cold_sync);
  }
}

TEST_CASE("dirty_after_eviction: from start on, the session may be half applied") {
  struct row {
    sync_phase phase;
    bool dirty;
  };
  const row rows[] = {{sync_phase::pause, false},   {sync_phase::flush, false}, {sync_phase::start, true},
                      {sync_phase::transfer, true}, {sync_phase::finish, true}, {sync_phase::resume, true},
                      {sync_phase::done, false}};
  for (auto& r : rows) {
    CAPTURE(to_string(r.phase));
    CHECK(dirty_after_eviction(r.phase) == r.dirty);
  }
}

TEST_CASE("after_wave: current, dirty or on the old version") {
  CHECK(after_wave(false, false) == wave_outcome::current);
  CHECK(after_wave(false, true) == wave_outcome::current); // a completed wave holds the version
  CHECK(after_wave(true, true) == wave_outcome::dirty);
  CHECK(after_wave(true, false) == wave_outcome::old_version);
}

TEST_CASE("silent_too_long") {
  struct row {
    std::uint64_t now, last, timeout;
    bool silent;
  };
  const row rows[] = {
    {1000, 0, 1000, false}, // exactly the timeout: not yet
    {1001, 0, 1000, true},
    {500, 400, 50, true},
    {400, 500, 50, false}, // heard after "now" (a clock read earlier): not silence
    {0, 0, 0, false},
    {~std::uint64_t{0}, 0, ~std::uint64_t{0} - 1, true},
  };
  for (auto& r : rows) {
    CAPTURE(r.now);
    CAPTURE(r.last);
    CAPTURE(r.timeout);
    CHECK(silent_too_long(r.now, r.last, r.timeout) == r.silent);
  }
}

TEST_CASE("count_live: armed once that many served, one alert per fall") {
  struct row {
    std::int64_t live;    // serving, or being brought current by the round in progress
    std::int64_t serving; // serving now
    min_live_change change;
    bool armed, below;
    std::uint64_t events;
  };
  // min_live_engines = 2.
  const row script[] = {
    {0, 0, min_live_change::none, false, false, 0},      // not armed yet: no alert while the fleet forms
    {2, 0, min_live_change::none, false, false, 0},      // two in their cold sync: live, not serving yet
    {1, 1, min_live_change::none, false, false, 0},
    {2, 2, min_live_change::none, true, false, 0},       // armed
    {2, 1, min_live_change::none, true, false, 0},       // one being synced still counts as live
    {1, 1, min_live_change::alert, true, true, 1},       // a fall
    {0, 0, min_live_change::none, true, true, 1},        // still below: no second alert
    {2, 2, min_live_change::recovered, true, false, 1},
    {3, 3, min_live_change::none, true, false, 1},
    {1, 1, min_live_change::alert, true, true, 2},       // the next fall
  };
  min_live_alert a;
  int line = 0;
  for (auto& r : script) {
    CAPTURE(++line);
    CHECK(count_live(a, r.live, r.serving, 2) == r.change);
    CHECK(a.armed == r.armed);
    CHECK(a.below == r.below);
    CHECK(a.events == r.events);
  }
}
