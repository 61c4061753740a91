// The coordinator's sync round on the deterministic scheduler, against
// scripted engines (tests/support/coordinator_fixture.hpp) that can be told,
// per phase, to answer, to hold their answer (forever, or until released: a
// late answer), to fail, to die, to answer for the wrong version, or to fall
// silent. The engines record the global order in which phases arrive across
// them, which is what the barrier promises. Here: one round's barrier,
// deadlines and evictions, versions and newcomers, the round's figures, the
// sync.pause keys, and the bookkeeping of a round over 1000 engines.
// Membership and failure handling, the trainer, and waves (of a round and of
// the control-plane probe) are in test_coordinator_*.cpp.
#include "tests/support/coordinator_fixture.hpp"
#include "tests/support/fleet_scale.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/stateful_actor.hpp>

#include <cstdint>
#include <string>
#include <vector>

using namespace rlsync;
using namespace rlsync::test;
using namespace std::chrono_literals;

TEST_CASE_FIXTURE(coordinator_fixture, "a round with zero members completes and sync replies") {
  start();
  auto rep = request<sync_report>(coord, sync_atom::value);
  run();
  REQUIRE(rep->has_value());
  REQUIRE(**rep);
  auto& r = ***rep;
  CHECK(r.version == 0);
  CHECK(r.engines_synced == 0);
  CHECK(r.evicted.empty());
  CHECK(r.bytes == 0);
  CHECK(r.stall_ns == 0); // simulated time did not move
  auto s = status();
  CHECK(s.rounds == 1);
  REQUIRE(s.history.size() == 1);
  CHECK(log_lines.size() == 1);
  CHECK(routes->empty());
}

TEST_CASE_FIXTURE(coordinator_fixture, "the fleet's digest with no member is answered at once, empty") {
  start();
  auto digests = request<std::vector<weight_digest>>(coord, digest_atom::value);
  run();
  REQUIRE(digests->has_value());
  REQUIRE(**digests);
  CHECK((**digests)->empty());
}

TEST_CASE_FIXTURE(coordinator_fixture, "sync replies with the report and every phase goes to every engine") {
  auto c = config();
  c.sync.every_versions = 10; // publishing alone starts no round here
  start(c);
  add_engine("a");
  add_engine("b");
  publish(3, 7);
  forget_history();
  auto rep = request<sync_report>(coord, sync_atom::value);
  run();
  REQUIRE(rep->has_value());
  REQUIRE(**rep);
  auto& r = ***rep;
  CHECK(r.version == 3);
  CHECK(r.engines_synced == 2);
  CHECK(r.evicted.empty());
  CHECK(r.bytes == 2000); // the engines' transfer reports, summed
  CHECK(seen_by("a") == all_phases);
  CHECK(seen_by("b") == all_phases);
  check_barrier_order();
  // What the engines were asked.
  auto& sa = *engines["a"].script;
  REQUIRE(!sa.pauses.empty());
  CHECK(sa.pauses.back().mode == pause_mode::keep);
  CHECK(!sa.pauses.back().clear_cache); // the flush phase resets the cache
  CHECK(sa.starts.back() == 3);
  REQUIRE(!sa.orders.empty());
  auto& o = sa.orders.back();
  CHECK(o.version == 3);
  CHECK(o.backend == "local");
  CHECK(o.mode == transfer_mode::sharded);
  CHECK(*routes == std::vector<std::string>{"route a v3", "route b v3"});
  REQUIRE(log_lines.size() == 1);
  CHECK(log_lines[0].find("v3: 2 engines synced") != std::string::npos);
  CHECK(r.slowest_pull_ns == 0); // the scripted engines said nothing of their pulls
}

TEST_CASE_FIXTURE(coordinator_fixture, "the report names where the slowest engine's pull went") {
  auto c = config();
  c.sync.every_versions = 10;
  start(c);
  add_engine("a");
  add_engine("b");
  add_engine("c");
  // b pulled longest, though a waited longer and c stored longer: the
  // figures are one engine's, the one that bounded the transfer phase.
  engines["a"].script->pull_ns = 5'000'000;
  engines["a"].script->wait_ns = 4'000'000;
  engines["a"].script->store_ns = 500'000;
  engines["b"].script->pull_ns = 9'000'000;
  engines["b"].script->wait_ns = 2'000'000;
  engines["b"].script->store_ns = 6'000'000;
  engines["b"].script->ran_ns = 5'000'000;
  engines["b"].script->queued_ns = 3'000'000;
  engines["c"].script->pull_ns = 8'000'000;
  engines["c"].script->store_ns = 7'500'000;
  publish(3, 7);
  auto rep = request<sync_report>(coord, sync_atom::value);
  run();
  REQUIRE(rep->has_value());
  REQUIRE(**rep);
  auto& r = ***rep;
  CHECK(r.engines_synced == 3);
  CHECK(r.slowest_pull_ns == 9'000'000);
  CHECK(r.slowest_wait_ns == 2'000'000);
  CHECK(r.slowest_store_ns == 6'000'000);
  CHECK(r.slowest_ran_ns == 5'000'000);
  CHECK(r.slowest_queued_ns == 3'000'000);
}

TEST_CASE_FIXTURE(coordinator_fixture, "the transfer order says since when the version's bytes are the same") {
  start();
  add_engine("a");
  version_info v3{3, 4, 4096};
  v3.same_bytes_since = 2;
  tell(coord, version_atom::value, v3);
  run();
  REQUIRE(!engines["a"].script->orders.empty());
  CHECK(engines["a"].script->orders.back().version == 3);
  CHECK(engines["a"].script->orders.back().same_bytes_since == 2);
  // A trainer claiming bytes from past its version is refused: no round on it.
  const auto rounds = status().rounds;
  version_info bad{4, 4, 4096};
  bad.same_bytes_since = 9;
  tell(coord, version_atom::value, bad);
  run();
  CHECK(status().rounds == rounds);
  CHECK(engines["a"].script->orders.back().version == 3);
  REQUIRE(!log_lines.empty());
  CHECK(log_lines.back().find("refused a version of the trainer: version_info.same_bytes_since: 9 is past the version (4)")
        != std::string::npos);
}

TEST_CASE_FIXTURE(coordinator_fixture, "pause goes to every engine at once, not one by one") {
  start();
  add_engine("a");
  add_engine("b");
  tell(coord, version_atom::value, version_info{1, 4, 4096});
  auto [atom, vi] = expect_msg<version_atom, version_info>(coord);
  CHECK(vi.version == 1);
  // Both pause orders are out before either engine answered, each with its own token.
  CHECK(next_msg_is<phase_atom, phase_order>(engines["a"].actor));
  CHECK(next_msg_is<phase_atom, phase_order>(engines["b"].actor));
  auto [atom_b, order_b] = expect_msg<phase_atom, phase_order>(engines["b"].actor);
  auto [atom_a, order_a] = expect_msg<phase_atom, phase_order>(engines["a"].actor);
  CHECK(order_a.phase == sync_phase::pause);
  CHECK(order_b.phase == sync_phase::pause);
  CHECK(order_a.token != order_b.token);
  run();
  CHECK(last_report().engines_synced == 2);
}

TEST_CASE_FIXTURE(coordinator_fixture, "no engine receives start before every live engine acknowledged flush") {
  start();
  add_engine("a");
  add_engine("b");
  add_engine("c");
  forget_history();
  engines["b"].on(sync_phase::flush, act::hold);
  publish(1);
  // a and c acknowledged flush; b has not: nobody may start.
  CHECK(count(sync_phase::flush) == 3);
  CHECK(count(sync_phase::start) == 0);
  CHECK(routes->empty()); // nor is anyone told it is current at v1
  release("b");
  CHECK(count(sync_phase::start) == 3);
  CHECK(count(sync_phase::resume) == 3);
  check_barrier_order();
  CHECK(last_report().engines_synced == 3);
}

TEST_CASE_FIXTURE(coordinator_fixture, "a phase answer counts only from the engine its order went to") {
  start();
  add_engine("a");
  add_engine("b");
  forget_history();
  engines["b"].on(sync_phase::flush, act::hold);
  publish(1);
  REQUIRE(count(sync_phase::flush) == 2);
  // Every token issued so far, answered by another (admitted) actor: the two
  // of the current phase are refused as not from their engines, the older
  // ones are late and ignored. Nobody starts.
  auto refused = status().refused;
  for (std::uint64_t token = 0; token < 100; ++token)
    tell(coord, phase_done_atom::value, token, phase_ack{"b", 1});
  run();
  CHECK(status().refused == refused + 2);
  CHECK(count(sync_phase::start) == 0);
  // b's own answer, now, is the one that counts.
  release("b");
  CHECK(count(sync_phase::start) == 2);
  CHECK(last_report().engines_synced == 2);
  CHECK(last_report().evicted.empty());
}

TEST_CASE_FIXTURE(coordinator_fixture, "an engine that never answers pause is evicted at the deadline") {
  start();
  add_engine("a");
  add_engine("b");
  add_engine("c");
  forget_history();
  engines["c"].on(sync_phase::pause, act::hold);
  publish(1);
  CHECK(count(sync_phase::pause) == 3);
  CHECK(count(sync_phase::flush) == 0);
  advance(4999ms); // the pause deadline is 5 s
  CHECK(count(sync_phase::flush) == 0);
  CHECK(status().rounds == 3); // the three cold syncs; this one still runs
  advance(1ms);
  CHECK(seen_by("a") == all_phases);
  CHECK(seen_by("c") == std::vector<sync_phase>{sync_phase::pause});
  check_barrier_order();
  auto r = last_report();
  CHECK(r.version == 1);
  CHECK(r.engines_synced == 2);
  CHECK(r.evicted == std::vector<std::string>{"c"});
  CHECK(r.stall_ns == 5'000'000'000u); // the deadline, as the engines saw it
  CHECK(r.transfer_ns == 0);
  CHECK(r.control_ns == r.stall_ns);
  CHECK(*routes == std::vector<std::string>{"failed c", "route a v1", "route b v1"});
  CHECK(routable("a"));
  CHECK(!routable("c"));
  CHECK(member("c")); // alive: still registered, unroutable
  REQUIRE(!log_lines.empty());
  CHECK(log_lines.back().find("evicted c (pause: no answer within 5000 ms)") != std::string::npos);
}

TEST_CASE_FIXTURE(coordinator_fixture, "an evicted engine that stays alive rejoins at the next round") {
  start();
  add_engine("a");
  add_engine("b");
  engines["b"].on(sync_phase::start, act::fail);
  publish(1);
  auto r1 = last_report();
  CHECK(r1.evicted == std::vector<std::string>{"b"});
  CHECK(!routable("b"));
  auto s = status();
  for (auto& m : s.members)
    if (m.name == "b")
      CHECK(m.dirty); // evicted after start: the update may be half applied
  CHECK(s.rounds == 3); // no round of its own: it waits for the next boundary
  forget_history();
  engines["b"].on(sync_phase::start, act::answer);
  publish(2);
  CHECK(seen_by("b") == all_phases); // a full round brings it current
  CHECK(last_report().engines_synced == 2);
  CHECK(routable("b"));
  CHECK(*routes == std::vector<std::string>{"route a v2", "route b v2"});
}

TEST_CASE_FIXTURE(coordinator_fixture, "a dead engine is evicted and removed") {
  start();
  add_engine("a");
  add_engine("b");
  forget_history();
  engines["b"].on(sync_phase::flush, act::die);
  publish(1);
  // No deadline had to pass: the down_msg evicts it.
  auto r = last_report();
  CHECK(r.engines_synced == 1);
  CHECK(r.evicted == std::vector<std::string>{"b"});
  CHECK(seen_by("b") == std::vector<sync_phase>{sync_phase::pause, sync_phase::flush});
  CHECK(seen_by("a") == all_phases);
  check_barrier_order();
  CHECK(!member("b"));
  CHECK(*routes == std::vector<std::string>{"failed b", "route a v1"});
  // A death between rounds: removed, and the router is told.
  routes->clear();
  caf::anon_send_exit(engines["a"].actor, caf::exit_reason::kill);
  run();
  CHECK(!member("a"));
  CHECK(*routes == std::vector<std::string>{"evict a"});
  CHECK(status().rounds == 3);
}

TEST_CASE_FIXTURE(coordinator_fixture, "a late acknowledgement from an evicted engine is ignored") {
  start();
  add_engine("a");
  add_engine("b");
  forget_history();
  engines["b"].on(sync_phase::pause, act::hold);
  publish(1);
  advance(5000ms); // b evicted at the pause deadline; round 1 ends without it
  CHECK(last_report().evicted == std::vector<std::string>{"b"});
  auto rounds = status().rounds;
  forget_history();
  // Round 2 includes b again, which holds its pause answer again.
  publish(2);
  CHECK(seen_by("b") == std::vector<sync_phase>{sync_phase::pause});
  // b's late answer to round 1's pause must not count for round 2.
  release("b");
  CHECK(count(sync_phase::flush) == 0);
  CHECK(status().rounds == rounds);
  // Its answer for round 2 does.
  release("b");
  CHECK(seen_by("b") == all_phases);
  check_barrier_order();
  auto r = last_report();
  CHECK(r.version == 2);
  CHECK(r.engines_synced == 2);
  CHECK(r.evicted.empty());
  CHECK(routable("b"));
}

TEST_CASE_FIXTURE(coordinator_fixture, "an answer from a replaced incarnation is ignored") {
  start();
  add_engine("a");
  add_engine("b", 1);
  forget_history();
  engines["b"].on(sync_phase::flush, act::hold);
  auto old_b = engines["b"];
  publish(1);
  CHECK(count(sync_phase::start) == 0);
  // b restarts: the new incarnation replaces the old one, which leaves the
  // round while the coordinator still awaits its flush answer. a goes on
  // alone; then the new b's cold sync starts, and it too holds its flush.
  add_engine("b", 2, {{sync_phase::flush, act::hold}});
  CHECK(status().rounds == 3);
  CHECK(engines["b"].script->pauses.size() == 1);
  // The old incarnation answers flush for round 3 while round 4 waits for
  // the new one's flush under the same name: it must not count.
  caf::anon_send(old_b.actor, release_atom::value);
  run();
  CHECK(status().rounds == 3);
  CHECK(engines["b"].script->starts.empty());
  release("b");
  auto s = status();
  CHECK(s.rounds == 4);
  REQUIRE(s.history.size() == 4);
  auto round3 = s.history[2];
  CHECK(round3.version == 1);
  CHECK(round3.engines_synced == 1);
  CHECK(round3.evicted == std::vector<std::string>{"b"});
  auto cold = s.history[3];
  CHECK(cold.version == 1);
  CHECK(cold.engines_synced == 1); // only b: a already serves v1 and keeps serving
  CHECK(cold.evicted.empty());
  CHECK(routable("b"));
  CHECK(old_b.script->starts.empty());
  CHECK(engines["b"].script->starts == std::vector<std::uint64_t>{1});
  CHECK(*routes == std::vector<std::string>{"failed b", "route a v1", "route b v1"});
  caf::anon_send_exit(old_b.actor, caf::exit_reason::kill);
  run();
  CHECK(member("b")); // the old incarnation's death does not remove the new one
  CHECK(routable("b"));
}

TEST_CASE_FIXTURE(coordinator_fixture, "errors and wrong versions evict, and with all evicted the round still ends") {
  start();
  add_engine("a");
  add_engine("b");
  add_engine("c");
  forget_history();
  engines["a"].on(sync_phase::pause, act::fail);
  engines["b"].on(sync_phase::transfer, act::wrong);
  engines["c"].on(sync_phase::finish, act::wrong);
  publish(1);
  auto r = last_report();
  CHECK(r.engines_synced == 0);
  CHECK(r.evicted == std::vector<std::string>{"a", "b", "c"});
  CHECK(r.bytes == 1000); // c's transfer arrived before its finish went wrong
  check_barrier_order();
  CHECK(seen_by("c") == std::vector<sync_phase>{sync_phase::pause, sync_phase::flush,
                                                sync_phase::start, sync_phase::transfer,
                                                sync_phase::finish});
  CHECK(status().routable.empty());
  CHECK(*routes == std::vector<std::string>{"failed a", "failed b", "failed c"});
  CHECK(status().rounds == 4); // and no round back to back with nobody to sync
  REQUIRE(log_lines.size() >= 2);
  CHECK(log_lines[log_lines.size() - 2].find("0 engines synced") != std::string::npos);
  // None serving any more (min_live_engines 1), though all three are alive.
  CHECK(log_lines.back().find("ALERT: only 0 live engines serving within sync.staleness") != std::string::npos);
  CHECK(status().below_min_live_events == 1);
}

TEST_CASE_FIXTURE(coordinator_fixture, "versions never go backwards") {
  start();
  add_engine("a");
  publish(5);
  CHECK(status().version == 5);
  forget_history();
  publish(3); // an older version: refused, no round
  publish(5); // the same again: nothing to do
  CHECK(arrivals->empty());
  CHECK(status().version == 5);
  REQUIRE(log_lines.size() == 1);
  CHECK(log_lines[0].find("ignored version 3") != std::string::npos);
  auto rep = request<sync_report>(coord, sync_atom::value);
  run();
  REQUIRE(rep->has_value());
  REQUIRE(**rep);
  CHECK((***rep).version == 5); // an explicit round goes to the newest, not to 3
  CHECK(arrivals->empty());       // and pauses nobody: every engine already serves it
  add_engine("n");
  CHECK(last_registration.current_version == 5); // a newcomer learns where the fleet is
}

TEST_CASE_FIXTURE(coordinator_fixture, "a newcomer stays unroutable until its first completed round") {
  start();
  add_engine("a");
  publish(1);
  CHECK(routable("a"));
  forget_history();
  // A newcomer during a round is not in it.
  engines["a"].on(sync_phase::transfer, act::hold);
  publish(2);
  auto& n = add_engine("n");
  CHECK(seen_by("n").empty());
  CHECK(!routable("n"));
  n.on(sync_phase::pause, act::hold);
  release("a"); // round to v2 ends; n's cold sync starts at once
  CHECK(*routes == std::vector<std::string>{"route a v2"});
  CHECK(seen_by("n") == std::vector<sync_phase>{sync_phase::pause});
  CHECK(!routable("n"));
  engines["a"].on(sync_phase::transfer, act::answer);
  release("n");
  CHECK(routable("n"));
  CHECK(*routes == std::vector<std::string>{"route a v2", "route n v2"}); // a kept serving
  CHECK(seen_by("a") == all_phases);  // the round to v2 only
  auto s = status();
  CHECK(s.history.back().engines_synced == 1);
  CHECK(s.history.back().version == 2);
}

TEST_CASE_FIXTURE(coordinator_fixture, "sync during a round gets the next round") {
  auto c = config();
  c.sync.every_versions = 10;
  start(c);
  add_engine("a");
  publish(1); // not due on its own: the first sync takes a to v1
  forget_history();
  engines["a"].on(sync_phase::pause, act::hold);
  auto first = request<sync_report>(coord, sync_atom::value);
  run();
  auto second = request<sync_report>(coord, sync_atom::value);
  run();
  CHECK(!first->has_value());
  CHECK(!second->has_value());
  engines["a"].on(sync_phase::pause, act::answer);
  release("a");
  REQUIRE(first->has_value());
  REQUIRE(second->has_value());
  CHECK(status().rounds == 3);
  // The second round came after the first and found a current: nothing to pause.
  CHECK(count(sync_phase::pause) == 1);
  CHECK((**second)->version == 1);
  CHECK((**second)->engines_synced == 0);
}

TEST_CASE_FIXTURE(coordinator_fixture, "stall, transfer and control figures") {
  start();
  add_engine("a");
  forget_history();
  engines["a"].on(sync_phase::pause, act::hold);
  engines["a"].on(sync_phase::transfer, act::hold);
  publish(1);
  advance(100ms); // pausing takes 100 ms
  release("a");
  advance(2s); // the transfer 2 s, well within its 60 s deadline
  release("a");
  auto r = last_report();
  CHECK(r.engines_synced == 1);
  CHECK(r.stall_ns == 2'100'000'000u);
  CHECK(r.transfer_ns == 2'000'000'000u);
  CHECK(r.control_ns == 100'000'000u);
}

// -- the topology's sync keys -----------------------------------------------------------

TEST_CASE("sync.pause: every engine is paused with the configured mode and clear_cache") {
  const std::vector<pause_request> rows = {
    {pause_mode::keep, false}, // the default: frozen requests continue over their old KV
    {pause_mode::keep, true},  // as NeMo-RL: KV recomputed with the new weights
    {pause_mode::wait, false},
    {pause_mode::abort, true},
  };
  for (auto& r : rows) {
    CAPTURE(to_string(r.mode));
    CAPTURE(r.clear_cache);
    coordinator_fixture f; // a fresh coordinator and engines per row
    auto c = f.config();
    c.sync.pause = r;
    f.start(c);
    f.add_engine("a");
    f.add_engine("b");
    f.publish(1);
    for (auto name : {"a", "b"}) {
      auto& pauses = f.engines[name].script->pauses;
      REQUIRE(!pauses.empty());
      for (auto& p : pauses) {
        CHECK(p.mode == r.mode);
        CHECK(p.clear_cache == r.clear_cache);
      }
    }
  }
}

TEST_CASE("coordinator_config_from carries the sync section (pause, wave_size, staleness, min_live_engines, "
          "first_round_wait) and the replica count") {
  auto t = parse_topology("name: t\n"
                          "model: {synthetic: {layers: 2, hidden_size: 64, heads: 4, intermediate_size: 96}}\n"
                          "nodes: [{name: a}]\n"
                          "trainer: {node: a}\n"
                          "engines: [{name: e, node: a, replicas: 3}]\n"
                          "sync: {staleness: 2, wave_size: 2, min_live_engines: 3, first_round_wait_ms: 1500,\n"
                          "       pause: {mode: wait, clear_cache: true}}\n",
                          "t.yaml", "/base");
  auto cc = coordinator_config_from(t);
  CHECK(cc.sync.pause.mode == pause_mode::wait);
  CHECK(cc.sync.pause.clear_cache);
  CHECK(cc.sync.wave_size == 2);
  CHECK(cc.sync.staleness == 2);
  CHECK(cc.sync.min_live_engines == 3);
  CHECK(cc.sync.first_round_wait == std::chrono::milliseconds(1500));
  CHECK(cc.expected_engines == 3);
}

// -- scale ------------------------------------------------------------------------------

TEST_CASE("a round's messages and bookkeeping grow linearly with the fleet: 100 and 1000 engines, one wave or "
          "waves of 100") {
  for (std::size_t wave_size : {0, 100}) {
    CAPTURE(wave_size);
    auto small = measure_fleet_round(100, wave_size);
    auto large = measure_fleet_round(1000, wave_size);
    CHECK(small.synced == 100);
    CHECK(large.synced == 1000);
    // Six phases, a request and a reply each, per engine: about 12 messages.
    const double small_msgs = static_cast<double>(small.messages) / 100, large_msgs = static_cast<double>(large.messages) / 1000;
    CAPTURE(small_msgs);
    CAPTURE(large_msgs);
    CHECK(small_msgs >= 12);
    CHECK(large_msgs <= small_msgs * 1.1); // linear: the same per engine, give or take the fixed part
    // The coordinator's book: about 25 steps per engine (see the sync_round
    // test); a linear search per reply would take hundreds per engine at 1000.
    const double small_ops = static_cast<double>(small.ops) / 100, large_ops = static_cast<double>(large.ops) / 1000;
    CAPTURE(small_ops);
    CAPTURE(large_ops);
    CHECK(large.ops > 1000);
    CHECK(large_ops < 30);
    CHECK(large_ops <= small_ops * 1.1);
  }
}

