// The coordinator's membership and failure handling on the deterministic
// scheduler, against scripted engines (tests/support/coordinator_fixture.hpp):
// registration retries and stale incarnations, heartbeat timeouts, the restart
// cap, min_live_engines, and a restarted coordinator going on from its state
// file.
#include "runtime/control/coordinator_state_file.hpp"
#include "tests/support/coordinator_fixture.hpp"
#include "tests/support/scratch_dir.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

using namespace rlsync;
using namespace rlsync::test;
using namespace std::chrono_literals;

TEST_CASE_FIXTURE(coordinator_fixture, "membership: retries, stale incarnations, deregistration") {
  start();
  auto& a = add_engine("a", 3);
  auto handle = caf::actor_cast<rollout_engine_actor>(a.actor);
  auto retry = request<registration>(coord, register_atom::value,
                                     engine_info{"a", "node", 1, 0, false, 3}, handle);
  run();
  REQUIRE(retry->has_value());
  REQUIRE(**retry);
  CHECK((**retry)->routable); // the same actor again: nothing changes
  auto other = spawn(scripted_engine, std::string{"a"}, std::make_shared<engine_script>(), journal);
  auto stale = request<registration>(coord, register_atom::value,
                                     engine_info{"a", "node", 1, 0, false, 2},
                                     caf::actor_cast<rollout_engine_actor>(other));
  auto unnamed = request<registration>(coord, register_atom::value, engine_info{},
                                       caf::actor_cast<rollout_engine_actor>(other));
  run();
  REQUIRE(stale->has_value());
  REQUIRE(!**stale);
  CHECK(is((**stale).error(), errc::version_mismatch));
  REQUIRE(unnamed->has_value());
  REQUIRE(!**unnamed);
  CHECK(is((**unnamed).error(), errc::malformed));
  CHECK(routable("a"));
  routes->clear();
  tell(coord, deregister_atom::value, std::string{"a"});
  tell(coord, heartbeat_atom::value, heartbeat{"a", 1});
  run();
  CHECK(!member("a"));
  CHECK(*routes == std::vector<std::string>{"evict a"});
}

TEST_CASE_FIXTURE(coordinator_fixture, "the names the coordinator keeps records of are bounded, and known names rejoin") {
  auto c = config();
  c.max_engines = 2;
  start(c);
  add_engine("a");
  add_engine("b");
  auto& extra = spawn_engine("c");
  auto refused = request<registration>(coord, register_atom::value, engine_info{"c", "node", 1, 0, false, 0},
                                       caf::actor_cast<rollout_engine_actor>(extra.actor));
  run();
  REQUIRE(refused->has_value());
  REQUIRE(!**refused);
  CHECK(is((**refused).error(), errc::malformed));
  CHECK(sys.render((**refused).error()).find("keeps at most 2 engines") != std::string::npos);
  CHECK(!member("c"));
  // A name it knows comes back after leaving: its record is there already.
  tell(coord, deregister_atom::value, std::string{"b"});
  run();
  CHECK(!member("b"));
  auto& again = spawn_engine("b");
  CHECK(join(engine_info{"b", "node", 1, 0, false, 1}, again));
  CHECK(member("b"));
}

// -- failure handling: heartbeat timeouts ------------------------------------------------

TEST_CASE_FIXTURE(coordinator_fixture, "heartbeat timeout: a silent member is failed over, skipped, and rejoins once it answers") {
  auto c = heartbeat_config(); // every 100 ms; silent for more than 300 ms: unreachable
  c.sync.min_live_engines = 2;
  start(c);
  add_engine("a");
  add_engine("b");
  publish(1);
  REQUIRE(routable("a"));
  REQUIRE(routable("b"));
  ticks(2); // both answered the heartbeats of t = 100 and 200 ms
  forget_history();
  engines["b"].script->on_heartbeat = act::drop; // b is last heard from at 200 ms
  ticks(2); // t = 400 ms: silent for 200 ms, within the timeout
  CHECK(status().unreachable.empty());
  CHECK(status().live == 2);
  CHECK(routes->empty());
  ticks(2); // t = 600 ms: silent for 400 ms
  auto s = status();
  CHECK(s.unreachable == std::vector<std::string>{"b"});
  CHECK(s.live == 1);
  CHECK(s.routable == std::vector<std::string>{"a"});
  CHECK(s.below_min_live_events == 1);
  CHECK(member("b")); // unreachable, not gone
  CHECK(*routes == std::vector<std::string>{"failed b"}); // the router reroutes its requests
  CHECK(member_events == std::vector<std::string>{"b unreachable"});
  CHECK(logged("b silent for 400.000 ms"));
  CHECK(logged("ALERT: only 1 live engines"));
  // The next round leaves it out.
  publish(2);
  CHECK(seen_by("a") == all_phases);
  CHECK(seen_by("b").empty());
  CHECK(last_report().engines_synced == 1);
  ticks(3); // still silent: reported once
  CHECK(*routes == std::vector<std::string>{"failed b", "route a v2"});
  CHECK(std::count(member_events.begin(), member_events.end(), "b unreachable") == 1);
  forget_history();
  // It answers again: reachable, and a round of its own brings it to v2.
  engines["b"].script->on_heartbeat = act::answer;
  ticks(1);
  CHECK(member_events == std::vector<std::string>{"b reachable", "b routable"});
  CHECK(seen_by("b") == all_phases);
  CHECK(seen_by("a").empty()); // a serves v2 already
  CHECK(engines["b"].script->starts == std::vector<std::uint64_t>{2});
  CHECK(*routes == std::vector<std::string>{"route b v2"});
  s = status();
  CHECK(s.unreachable.empty());
  CHECK(s.live == 2);
  CHECK(s.routable == std::vector<std::string>{"a", "b"});
  CHECK(s.below_min_live_events == 1);
  CHECK(logged("2 live engines serving within sync.staleness again"));
}

TEST_CASE_FIXTURE(coordinator_fixture, "heartbeats go out one-way: two messages a member, a failing one is silence") {
  auto c = heartbeat_config();
  start(c);
  add_engine("a");
  add_engine("b");
  publish(1);
  forget_history();
  // A tick: the coordinator's timer, a heartbeat to each member, each answer
  // a plain message (CAF tracks no request for them).
  advance(std::chrono::milliseconds{100});
  auto beats_of = [&](const std::string& e) {
    return std::count_if(journal->beats.begin(), journal->beats.end(), [&](const heartbeat& hb) { return hb.from == e; });
  };
  CHECK(beats_of("a") == 1);
  CHECK(beats_of("b") == 1);
  CHECK(status().unreachable.empty());
  // b's handler fails: its error answers no request, yet it is not refused
  // as a stray error; b is silent, and the timeout judges it.
  engines["b"].script->on_heartbeat = act::fail;
  ticks(5);
  auto s = status();
  CHECK(s.unreachable == std::vector<std::string>{"b"});
  CHECK(s.refused == 0);
  CHECK_FALSE(logged("refused"));
  // An error from a sender the tick did not address is still a stray error.
  auto stray = sys.spawn([](caf::event_based_actor*) -> caf::behavior { return {}; });
  caf::send_as(stray, caf::actor_cast<caf::actor>(coord), caf::make_error(caf::sec::runtime_error, "stray"));
  run();
  CHECK(status().refused == 1);
  caf::anon_send_exit(stray, caf::exit_reason::user_shutdown);
  run();
}

TEST_CASE_FIXTURE(coordinator_fixture, "heartbeat timeout during a round: the silent member is evicted, the others complete it") {
  start(heartbeat_config());
  add_engine("a");
  add_engine("b");
  publish(1);
  forget_history();
  engines["b"].on(sync_phase::flush, act::drop); // b falls silent in the flush phase...
  engines["b"].script->on_heartbeat = act::drop; // ...and answers no heartbeat after registering at 0 ms
  publish(2);
  CHECK(count(sync_phase::flush) == 2);
  ticks(3); // t = 300 ms: silent for 300 ms, not past the timeout; flush's deadline is 1 s
  CHECK(count(sync_phase::start) == 0);
  CHECK(reports.empty());
  ticks(1); // t = 400 ms
  REQUIRE(reports.size() == 1);
  auto r = reports.back();
  CHECK(r.version == 2);
  CHECK(r.engines_synced == 1);
  CHECK(r.evicted == std::vector<std::string>{"b"});
  CHECK(seen_by("a") == all_phases);
  CHECK(seen_by("b") == std::vector<sync_phase>{sync_phase::pause, sync_phase::flush});
  check_barrier_order();
  CHECK(*routes == std::vector<std::string>{"failed b", "failed b", "route a v2"});
  CHECK(logged("evicted b (flush: unreachable)"));
  CHECK(status().unreachable == std::vector<std::string>{"b"});
  CHECK(!member_info("b").dirty); // evicted before start: its weights are whole
}

// -- failure handling: restarts and min_live_engines --------------------------------------

TEST_CASE_FIXTURE(coordinator_fixture, "restart cap: past sync.max_restarts a replica is retired and refused for good") {
  test::scratch_dir dir;
  auto c = config();
  c.sync.max_restarts = 2;
  c.state_file = dir / "coordinator.yaml";
  start(c);
  struct row {
    const char* what;
    bool kill_live_one; ///< the registered incarnation dies first
    std::uint64_t incarnation;
    std::optional<errc> refused;
    std::uint32_t restarts; ///< counted after the row
  };
  const std::vector<row> rows = {
    {"first registration", false, 1, {}, 0},
    {"the same incarnation from another actor while it lives", false, 1, errc::version_mismatch, 0},
    {"a reconnect after a death (same incarnation) is no restart", true, 1, {}, 0},
    {"restart 1 replaces the live incarnation", false, 2, {}, 1},
    {"an older incarnation after a death", true, 1, errc::version_mismatch, 1},
    {"restart 2 after a death", false, 3, {}, 2},
    {"restart 3 is past the cap: retired", false, 4, errc::evicted, 3},
    {"a later incarnation stays refused", false, 5, errc::evicted, 3},
  };
  std::optional<engine_handle> live;
  for (auto& r : rows) {
    CAPTURE(r.what);
    if (r.kill_live_one) {
      REQUIRE(live);
      kill(*live);
      live.reset();
      REQUIRE(!member("a"));
    }
    auto e = spawn_engine("a");
    auto reg = join(engine_info{"a", "node", 1, 0, false, r.incarnation}, e);
    if (r.refused) {
      REQUIRE(!reg);
      CHECK(is(reg.error(), *r.refused));
    } else {
      CHECK(reg);
      live = e;
    }
    auto persisted = read_coordinator_state(c.state_file);
    REQUIRE(persisted);
    REQUIRE(persisted->members.size() == 1);
    CHECK(persisted->members[0].restarts == r.restarts);
    CHECK(persisted->members[0].retired == (r.incarnation >= 4));
    CHECK(status().retired == (r.incarnation >= 4 ? std::vector<std::string>{"a"} : std::vector<std::string>{}));
  }
  // Retiring removed the replaced incarnation 3 too: nothing serves as "a".
  CHECK(!member("a"));
  CHECK(routes->back() == "evict a");
  CHECK(std::count(member_events.begin(), member_events.end(), "a retired") == 1);
  CHECK(logged("ALERT: a retired: restart 3 is past sync.max_restarts = 2"));
  // A restarted coordinator remembers it.
  caf::anon_send_exit(coord, caf::exit_reason::kill);
  run();
  c.restored = read_coordinator_state(c.state_file);
  start(c);
  auto again = join(engine_info{"a", "node", 1, 0, false, 9}, spawn_engine("a"));
  REQUIRE(!again);
  CHECK(is(again.error(), errc::evicted));
  CHECK(status().retired == std::vector<std::string>{"a"});
}

// -- sync.first_round_wait: the fleet's first sync is one round ----------------------------

namespace {
engine_info newcomer(const std::string& name) { return engine_info{name, "node", 1, 0, false, 0}; }

/// The fixture's configuration for a fleet of `engines` replicas whose
/// first round waits `wait` for them.
coordinator_config gathering(coordinator_fixture& f, std::size_t engines, std::chrono::milliseconds wait) {
  auto c = f.config();
  c.expected_engines = engines;
  c.sync.first_round_wait = wait;
  return c;
}
} // namespace

TEST_CASE_FIXTURE(coordinator_fixture, "first_round_wait: no round until the whole fleet registered, then one for all") {
  start(gathering(*this, 2, 10s));
  REQUIRE(join(newcomer("a"), spawn_engine("a")));
  CHECK(seen_by("a").empty()); // held: b has not registered
  CHECK(reports.empty());
  REQUIRE(join(newcomer("b"), spawn_engine("b")));
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].engines_synced == 2);
  CHECK(routable("a"));
  CHECK(routable("b"));
  CHECK(!logged("first_round_wait_ms passed"));
  // Once gathered, a later newcomer's cold sync goes at once.
  REQUIRE(join(newcomer("c"), spawn_engine("c")));
  CHECK(reports.size() == 2);
  CHECK(routable("c"));
}

TEST_CASE_FIXTURE(coordinator_fixture, "first_round_wait: when it passes, the first round goes without the missing") {
  start(gathering(*this, 3, 5s));
  REQUIRE(join(newcomer("a"), spawn_engine("a")));
  REQUIRE(join(newcomer("b"), spawn_engine("b")));
  advance(4900ms);
  CHECK(reports.empty());
  advance(100ms);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].engines_synced == 2);
  CHECK(logged("sync.first_round_wait_ms passed with 2 of 3 engines registered"));
  REQUIRE(join(newcomer("c"), spawn_engine("c")));
  CHECK(reports.size() == 2);
}

TEST_CASE_FIXTURE(coordinator_fixture, "first_round_wait: a round asked for is not held") {
  start(gathering(*this, 2, 10s));
  REQUIRE(join(newcomer("a"), spawn_engine("a")));
  CHECK(reports.empty());
  auto asked = request<sync_report>(coord, sync_atom::value);
  run();
  REQUIRE(asked->has_value());
  REQUIRE(**asked);
  CHECK((***asked).engines_synced == 1);
  CHECK(routable("a"));
}

TEST_CASE_FIXTURE(coordinator_fixture, "first_round_wait: its end is logged when it passes, with no round wanted then") {
  start(gathering(*this, 2, 5s));
  advance(5s);
  CHECK(logged("sync.first_round_wait_ms passed with 0 of 2 engines registered"));
  REQUIRE(join(newcomer("a"), spawn_engine("a"))); // the wait is over: its cold sync goes at once
  CHECK(reports.size() == 1);
}

TEST_CASE_FIXTURE(coordinator_fixture, "first_round_wait: a coordinator restored from its state file holds no round") {
  auto c = gathering(*this, 2, 10s);
  c.restored = persisted_coordinator{0, 0, 3, {}};
  start(c);
  REQUIRE(join(newcomer("a"), spawn_engine("a")));
  CHECK(reports.size() == 1);
  CHECK(routable("a"));
}

TEST_CASE_FIXTURE(coordinator_fixture, "first_round_wait 0 (the default): each newcomer's cold sync goes as it registers") {
  start(gathering(*this, 2, 0ms));
  REQUIRE(join(newcomer("a"), spawn_engine("a")));
  CHECK(reports.size() == 1);
  CHECK(routable("a"));
}

TEST_CASE_FIXTURE(coordinator_fixture, "min_live_engines: one alert per fall below, armed once that many served") {
  auto c = config();
  c.sync.min_live_engines = 2;
  start(c);
  auto events = [&] { return status().below_min_live_events; };
  // Before two ever joined: no alert, however few are left.
  kill(add_engine("a"));
  CHECK(events() == 0);
  add_engine("b");
  CHECK(events() == 0);
  add_engine("c"); // two live: armed
  CHECK(!logged("ALERT"));
  kill(engines["c"]);
  CHECK(events() == 1);
  CHECK(logged("ALERT: only 1 live engines serving within sync.staleness = 1, below sync.min_live_engines = 2"));
  log_lines.clear();
  kill(engines["b"]); // further down while below: the same fall
  CHECK(events() == 1);
  CHECK(!logged("ALERT"));
  add_engine("d");
  CHECK(events() == 1);
  add_engine("e"); // back to two
  CHECK(logged("2 live engines serving within sync.staleness again"));
  kill(engines["d"]);
  CHECK(events() == 2);
  CHECK(status().live == 1);
}

TEST_CASE_FIXTURE(coordinator_fixture, "min_live_engines counts engines serving, not engines reachable") {
  auto c = config();
  c.sync.min_live_engines = 2;
  start(c);
  add_engine("a");
  add_engine("b");
  publish(1); // both serve v1: armed
  CHECK(!logged("ALERT"));
  // b fails its transfer of v2: evicted and dirty, alive and reachable all along.
  engines["b"].on(sync_phase::transfer, act::fail);
  publish(2);
  auto s = status();
  CHECK(s.live == 2); // both answer
  CHECK(s.routable == std::vector<std::string>{"a"});
  CHECK(s.below_min_live_events == 1);
  CHECK(logged("ALERT: only 1 live engines serving within sync.staleness = 1, below sync.min_live_engines = 2"));
  // The next round brings b current again.
  engines["b"].on(sync_phase::transfer, act::answer);
  publish(3);
  CHECK(status().routable == std::vector<std::string>{"a", "b"});
  CHECK(logged("2 live engines serving within sync.staleness again"));
  CHECK(status().below_min_live_events == 1);
}

// -- failure handling: the state file -----------------------------------------------------

TEST_CASE_FIXTURE(coordinator_fixture, "state file: a restarted coordinator goes on from the persisted counter") {
  test::scratch_dir dir;
  auto c = config();
  c.state_file = dir / "coordinator.yaml";
  start(c);
  for (auto name : {"a", "b", "c", "d"})
    REQUIRE(join(engine_info{name, "node", 1, 0, false, 1}, spawn_engine(name)));
  publish(3);
  REQUIRE(status().routable.size() == 4);
  auto persisted = read_coordinator_state(c.state_file);
  REQUIRE(persisted);
  CHECK(persisted->synced_version == 3);
  CHECK(persisted->newest_version == 3);
  REQUIRE(persisted->members.size() == 4);
  for (auto& m : persisted->members) {
    CAPTURE(m.name);
    CHECK(m.version == 3);
    CHECK(m.routable);
    CHECK(m.incarnation == 1);
    CHECK(m.restarts == 0);
  }
  // The coordinator restarts; the engines live on and register again.
  caf::anon_send_exit(coord, caf::exit_reason::kill);
  run();
  forget_history();
  c.restored = persisted;
  start(c);
  CHECK(status().version == 3);
  for (auto& [name, e] : engines)
    e.on(sync_phase::pause, act::hold); // no round may make anyone current here
  struct row {
    const char* name;
    std::uint64_t version;
    bool dirty;
    std::uint64_t incarnation;
    bool routable;
  };
  const std::vector<row> rows = {
    {"a", 3, false, 1, true},  // current then and now: serves at once
    {"b", 2, false, 1, false}, // an older version
    {"c", 3, true, 1, false},  // holds part of an update
    {"d", 3, false, 2, false}, // restarted meanwhile: a restart knows nothing
    {"e", 3, false, 1, false}, // never known to this coordinator
  };
  for (auto& r : rows) {
    CAPTURE(r.name);
    if (!engines.count(r.name))
      spawn_engine(r.name, {{sync_phase::pause, act::hold}});
    auto reg = join(engine_info{r.name, "node", 1, r.version, r.dirty, r.incarnation}, engines[r.name]);
    REQUIRE(reg);
    CHECK(reg->routable == r.routable);
    CHECK(reg->current_version == 3);
    CHECK(routable(r.name) == r.routable);
  }
  // The router that outlived the last coordinator forgets that one's table:
  // only what registers current is routed again.
  CHECK(*routes == std::vector<std::string>{"evict a", "evict b", "evict c", "evict d", "route a v3"});
  CHECK(member_events.front() == "a registered");
  CHECK(member_events.at(1) == "a routable");
  CHECK(seen_by("a").empty()); // no round for it
  // A version older than the restored counter is ignored; the counter never goes back.
  publish(2);
  CHECK(logged("ignored version 2"));
  CHECK(status().version == 3);
  auto after = read_coordinator_state(c.state_file);
  REQUIRE(after);
  CHECK(after->synced_version == 3);
  CHECK(after->newest_version == 3);
}
