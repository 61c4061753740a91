// Waves on the deterministic scheduler, against scripted engines
// (tests/support/coordinator_fixture.hpp): a round in waves of sync.wave_size
// engines, one wave at a time while the others serve, and the control-plane
// probe's heartbeat waves.
#include "tests/support/coordinator_fixture.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace rlsync;
using namespace rlsync::test;
using namespace std::chrono_literals;

// -- control-plane probe -------------------------------------------------------------

TEST_CASE_FIXTURE(coordinator_fixture, "probe: one heartbeat wave at a time to every engine, replied after the last") {
  start();
  add_engine("a");
  add_engine("b");
  add_engine("c");
  forget_history();
  auto rounds = status().rounds;
  engines["b"].script->on_heartbeat = act::hold; // b answers each wave when the test says so
  auto elapsed = request<std::uint64_t>(coord, probe_atom::value, std::uint32_t{6});
  run();
  std::vector<std::uint64_t> sent;
  for (std::uint64_t wave = 0; wave < 6; ++wave) {
    CAPTURE(wave);
    sent.push_back(wave);
    // Every engine has wave k, none has wave k+1: b has not answered yet.
    CHECK(beats_of("a") == sent);
    CHECK(beats_of("b") == sent);
    CHECK(beats_of("c") == sent);
    CHECK(!elapsed->has_value());
    advance(10ms);
    release("b");
  }
  CHECK(probe(elapsed) == 60'000'000u); // six waves of 10 ms each
  // Across engines too: all of wave k arrived before any of wave k+1.
  REQUIRE(beats->size() == 18);
  for (std::size_t i = 0; i < beats->size(); ++i)
    CHECK((*beats)[i].seq == i / 3);
  // Only a measurement: no round, nobody evicted.
  CHECK(arrivals->empty());
  CHECK(routes->empty());
  CHECK(status().rounds == rounds);
}

TEST_CASE_FIXTURE(coordinator_fixture, "probe: no members or no waves, 0 at once") {
  start();
  auto none = request<std::uint64_t>(coord, probe_atom::value, std::uint32_t{6});
  run();
  CHECK(probe(none) == 0);
  add_engine("a");
  forget_history();
  auto zero = request<std::uint64_t>(coord, probe_atom::value, std::uint32_t{0});
  run();
  CHECK(probe(zero) == 0);
  CHECK(beats->empty());
}

TEST_CASE_FIXTURE(coordinator_fixture, "probe: an engine that never answers bounds each wave by the pause deadline") {
  start();
  add_engine("a");
  add_engine("b");
  add_engine("c");
  forget_history();
  engines["c"].script->on_heartbeat = act::hold; // never released
  auto elapsed = request<std::uint64_t>(coord, probe_atom::value, std::uint32_t{2});
  run();
  CHECK(beats_of("a") == std::vector<std::uint64_t>{0});
  advance(4999ms); // the pause deadline is 5 s
  CHECK(beats_of("a") == std::vector<std::uint64_t>{0});
  CHECK(!elapsed->has_value());
  advance(1ms);
  CHECK(beats_of("a") == std::vector<std::uint64_t>{0, 1});
  CHECK(beats_of("c") == std::vector<std::uint64_t>{0, 1});
  advance(5000ms);
  CHECK(probe(elapsed) == 10'000'000'000u);
  // A measurement evicts nobody.
  CHECK(member("c"));
  CHECK(routable("c"));
  CHECK(routes->empty());
}

TEST_CASE_FIXTURE(coordinator_fixture, "probe: runs beside a round without touching it") {
  start();
  add_engine("a");
  add_engine("b");
  forget_history();
  engines["a"].on(sync_phase::pause, act::hold);
  publish(1); // the round waits for a's pause
  auto elapsed = request<std::uint64_t>(coord, probe_atom::value, std::uint32_t{6});
  run();
  CHECK(probe(elapsed) == 0); // simulated time did not move
  CHECK(beats_of("a").size() == 6);
  CHECK(beats_of("b").size() == 6);
  CHECK(count(sync_phase::flush) == 0); // the round still waits for a's pause
  release("a");
  CHECK(seen_by("a") == all_phases);
  CHECK(seen_by("b") == all_phases);
  check_barrier_order();
  auto r = last_report();
  CHECK(r.version == 1);
  CHECK(r.engines_synced == 2);
  CHECK(r.evicted.empty());
}

// -- waves ------------------------------------------------------------------------------

namespace {

/// The engines each phase went to, per round, as the coordinator sent it.
struct phase_record {
  std::uint64_t round;
  sync_phase phase;
  std::vector<std::string> engines;
};

/// Where (engine, phase) first arrived; arrivals->size() if never.
std::size_t arrival_index(const std::vector<arrival>& xs, const std::string& engine, sync_phase phase) {
  for (std::size_t i = 0; i < xs.size(); ++i)
    if (xs[i].engine == engine && xs[i].phase == phase)
      return i;
  return xs.size();
}

} // namespace

TEST_CASE_FIXTURE(coordinator_fixture, "waves: five engines in waves of two, one wave at a time, the others serving") {
  auto c = config();
  c.sync.wave_size = 2;
  auto sent = std::make_shared<std::vector<phase_record>>();
  c.on_phase = [sent](std::uint64_t round, std::uint64_t, sync_phase phase, const std::vector<std::string>& engines) {
    sent->push_back({round, phase, engines});
  };
  start(c);
  const std::vector<std::string> names = {"a", "b", "c", "d", "e"};
  for (auto& name : names)
    add_engine(name);
  REQUIRE(status().routable == names); // the cold syncs ran in waves too
  forget_history();
  sent->clear();
  engines["c"].on(sync_phase::transfer, act::hold);
  // Each engine's pull took as long as its place in the alphabet, but d's
  // longest: the round names d's pull, from the second of three waves.
  for (std::size_t i = 0; i < names.size(); ++i) {
    auto& s = *engines[names[i]].script;
    s.pull_ns = (names[i] == "d" ? 50 : i + 1) * 1'000'000;
    s.wait_ns = s.pull_ns / 4;
    s.store_ns = s.pull_ns / 2;
  }
  publish(1);
  // Wave 1 (a, b) is done and serves v1; wave 2 (c, d) waits on c's
  // transfer; e has not been asked anything and serves v0 meanwhile.
  for (auto name : {"a", "b"}) {
    CAPTURE(name);
    CHECK(seen_by(name) == all_phases);
    CHECK(member_info(name).version == 1);
    CHECK(routable(name));
  }
  CHECK(*routes == std::vector<std::string>{"route a v1", "route b v1"});
  CHECK(seen_by("c") == std::vector<sync_phase>{sync_phase::pause, sync_phase::flush, sync_phase::start,
                                                sync_phase::transfer});
  CHECK(seen_by("e").empty());
  CHECK(routable("e"));
  CHECK(member_info("e").version == 0);
  CHECK(status().version == 0); // the round has not ended
  CHECK(reports.empty());
  release("c");
  // Three waves, each pause to at most two engines, in snapshot order, and
  // no wave paused before the previous one resumed.
  std::vector<std::vector<std::string>> pauses;
  for (auto& p : *sent) {
    CHECK(p.engines.size() <= 2);
    if (p.phase == sync_phase::pause)
      pauses.push_back(p.engines);
  }
  CHECK(pauses == std::vector<std::vector<std::string>>{{"a", "b"}, {"c", "d"}, {"e"}});
  for (auto [done, next] : {std::pair{"b", "c"}, std::pair{"d", "e"}}) {
    CAPTURE(next);
    CHECK(arrival_index(*arrivals, done, sync_phase::resume) < arrival_index(*arrivals, next, sync_phase::pause));
  }
  // Everybody ends on the version.
  for (auto& name : names) {
    CAPTURE(name);
    CHECK(seen_by(name) == all_phases);
    CHECK(member_info(name).version == 1);
  }
  auto s = status();
  CHECK(s.routable == names);
  CHECK(s.version == 1);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].engines_synced == 5);
  CHECK(reports[0].evicted.empty());
  CHECK(reports[0].bytes == 5000);
  CHECK(reports[0].slowest_pull_ns == 50'000'000);
  CHECK(reports[0].slowest_wait_ns == 12'500'000);
  CHECK(reports[0].slowest_store_ns == 25'000'000);
  CHECK(*routes
        == std::vector<std::string>{"route a v1", "route b v1", "route c v1", "route d v1", "route e v1"});
  CHECK(logged("v1: 5 engines synced in 3 waves"));
}

TEST_CASE_FIXTURE(coordinator_fixture, "waves: an eviction in wave 2 does not stop wave 3") {
  auto c = config();
  c.sync.wave_size = 2;
  start(c);
  for (auto name : {"a", "b", "c", "d", "e"})
    add_engine(name);
  forget_history();
  engines["d"].on(sync_phase::transfer, act::fail);
  publish(1);
  CHECK(seen_by("d") == std::vector<sync_phase>{sync_phase::pause, sync_phase::flush, sync_phase::start,
                                                sync_phase::transfer});
  CHECK(seen_by("e") == all_phases); // wave 3 ran
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].engines_synced == 4);
  CHECK(reports[0].evicted == std::vector<std::string>{"d"});
  CHECK(!reports[0].aborted);
  auto s = status();
  CHECK(s.version == 1);
  CHECK(s.routable == std::vector<std::string>{"a", "b", "c", "e"});
  CHECK(member_info("d").dirty); // evicted in transfer: the session may be half applied
  CHECK(*routes == std::vector<std::string>{"route a v1", "route b v1", "failed d", "route c v1", "route e v1"});
  CHECK(logged("evicted d (transfer: "));
  // The next round brings d current, alone.
  forget_history();
  engines["d"].on(sync_phase::transfer, act::answer);
  publish(2);
  CHECK(seen_by("d") == all_phases);
  CHECK(status().routable.size() == 5);
}

TEST_CASE_FIXTURE(coordinator_fixture, "waves: an engine of a later wave that dies leaves the round before its wave") {
  auto c = config();
  c.sync.wave_size = 1;
  start(c);
  for (auto name : {"a", "b", "c"})
    add_engine(name);
  forget_history();
  engines["a"].on(sync_phase::pause, act::hold);
  publish(1);
  kill(engines["c"]); // waits for wave 3
  CHECK(!member_info("b").dirty);
  release("a");
  CHECK(seen_by("b") == all_phases);
  CHECK(seen_by("c").empty());
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].engines_synced == 2);
  CHECK(reports[0].evicted == std::vector<std::string>{"c"});
  CHECK(logged("evicted c (before its wave: down"));
  CHECK(status().routable == std::vector<std::string>{"a", "b"});
}

TEST_CASE_FIXTURE(coordinator_trainer_fixture, "waves: the trainer dies in wave 2: it resumes, wave 3 never starts") {
  auto c = config();
  c.sync.wave_size = 1;
  start_with_trainer(c);
  add_engine("c");
  REQUIRE(routable("c"));
  forget_history();
  engines["b"].on(sync_phase::transfer, act::hold);
  engines["b"].script->fail_held_on_resume = true;
  publish_through_trainer(3);
  CHECK(seen_by("a") == all_phases);
  CHECK(count(sync_phase::transfer) == 2);
  kill_trainer();
  CHECK(seen_by("b") == aborted_phases);
  CHECK(seen_by("c").empty()); // still on v2, never paused
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].aborted);
  CHECK(reports[0].engines_synced == 1);
  auto s = status();
  CHECK(s.version == 2); // the round did not complete
  CHECK(s.routable == std::vector<std::string>{"a", "b", "c"});
  CHECK(member_info("a").version == 3);
  CHECK(member_info("b").version == 2);
  CHECK(member_info("c").version == 2);
  CHECK(logged("v3: ABORTED (the trainer is down): 2 engines resume on their old version, 0 dirty, 1 synced in earlier waves"));
}
