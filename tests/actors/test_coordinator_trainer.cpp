// The coordinator and the trainer on the deterministic scheduler, against
// scripted engines and a scripted trainer (tests/support/coordinator_fixture.hpp):
// it follows the trainer's versions and pins them, tells the router every
// version published, and when the trainer dies mid-round it resumes the
// engines at once and waits for a trainer before the next round.
#include "tests/support/coordinator_fixture.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

using namespace rlsync;
using namespace rlsync::test;
using namespace std::chrono_literals;

TEST_CASE_FIXTURE(coordinator_fixture, "the coordinator subscribes to the trainer and learns its version") {
  auto rec = std::make_shared<trainer_script>();
  auto trainer = spawn(scripted_trainer, rec);
  auto c = config();
  c.trainer = trainer;
  start(c);
  REQUIRE(rec->listeners.size() == 1);
  CHECK(status().version == 2); // the trainer's current version, synced with nobody
  add_engine("a");
  CHECK(engines["a"].script->starts.back() == 2);
  CHECK(engines["a"].script->orders.back().version == 2);
  publish_from(trainer, version_info{3, 4, 4096});
  run();
  CHECK(status().version == 3);
  CHECK(engines["a"].script->starts.back() == 3);
  // Each round asks the trainer to keep its version (slow remote pulls).
  CHECK(rec->pins == std::vector<std::uint64_t>{2, 3});
  publish_from(trainer, version_info{4, 4, 4096});
  run();
  CHECK(rec->pins.back() == 4);
}

TEST_CASE_FIXTURE(coordinator_trainer_fixture, "a restarted trainer vouches for no unchanged bytes from before it attached") {
  start_with_trainer(config());
  version_info v3{3, 4, 4096};
  v3.same_bytes_since = 2;
  publish_from(trainer, v3);
  run();
  CHECK(engines["a"].script->orders.back().same_bytes_since == 2); // the first trainer's own chain
  // Another trainer process: its chain starts anew, whatever numbers it reuses.
  auto rec2 = std::make_shared<trainer_script>();
  rec2->current = v3; // the same number, from another process: its bytes may differ
  rec2->current.same_bytes_since = 1;
  auto trainer2 = spawn(scripted_trainer, rec2);
  tell(coord, register_atom::value, caf::actor_cast<trainer_actor>(trainer2));
  run();
  version_info v5{5, 4, 4096};
  v5.same_bytes_since = 3; // unchanged since v3: its v3, not the one engines got
  publish_from(trainer2, v5);
  run();
  CHECK(engines["a"].script->orders.back().version == 5);
  CHECK(engines["a"].script->orders.back().same_bytes_since == 4); // one past what the coordinator knew
  version_info v6{6, 4, 4096};
  v6.same_bytes_since = 5;
  publish_from(trainer2, v6);
  run();
  CHECK(engines["a"].script->orders.back().same_bytes_since == 5); // its own, from then on
  version_info v7{7, 4, 4096};
  v7.same_bytes_since = 2; // before it attached, and nothing it may vouch for: 4 on
  publish_from(trainer2, v7);
  run();
  CHECK(engines["a"].script->orders.back().same_bytes_since == 4);
}

TEST_CASE_FIXTURE(coordinator_fixture, "the router hears every version the trainer publishes, and a new router the newest") {
  start();
  add_engine("a");
  publish(1);
  publish(2);
  CHECK(*published == std::vector<std::uint64_t>{1, 2});
  publish(2); // nothing new: not repeated
  CHECK(*published == std::vector<std::uint64_t>{1, 2});
  auto second_seen = std::make_shared<router_script>();
  auto second = spawn(scripted_router, second_seen);
  tell(coord, register_atom::value, caf::actor_cast<router_actor>(second));
  run();
  CHECK(second_seen->routes == std::vector<std::string>{"route a v2"});
  CHECK(second_seen->published == std::vector<std::uint64_t>{2});
}

TEST_CASE_FIXTURE(coordinator_trainer_fixture, "sync requests waiting for a round are bounded: the oldest is answered first") {
  start_with_trainer(config());
  kill_trainer(); // no trainer: no round starts, every sync waits
  std::vector<decltype(request<sync_report>(coord, sync_atom::value))> waiting;
  for (std::size_t i = 0; i < max_sync_waiters; ++i)
    waiting.push_back(request<sync_report>(coord, sync_atom::value));
  run();
  for (const auto& w : waiting)
    REQUIRE(!w->has_value());
  // Callers that gave up leave their promises: a new one still waits, and
  // the oldest hears that it will not be served.
  auto newest = request<sync_report>(coord, sync_atom::value);
  run();
  CHECK(!newest->has_value());
  REQUIRE(waiting.front()->has_value());
  REQUIRE(!**waiting.front());
  CHECK(is((**waiting.front()).error(), errc::queue_full));
  CHECK(!waiting[1]->has_value());
}

TEST_CASE_FIXTURE(coordinator_trainer_fixture, "a round aborted while an engine's wait-pause still waits evicts it clean, on its old version") {
  start_with_trainer(config());
  engines["a"].on(sync_phase::pause, act::hold);   // a wait-pause: its requests still run
  engines["a"].on(sync_phase::resume, act::fail);  // and the real engine refuses resume meanwhile
  engines["a"].script->fail_with = errc::pause_in_flight;
  publish_through_trainer(3);
  CHECK(count(sync_phase::pause) == 2);
  CHECK(count(sync_phase::start) == 0);
  kill_trainer();
  REQUIRE(reports.size() == 1);
  CHECK(reports.back().aborted);
  CHECK(member_info("a").version == 2);
  CHECK(!member_info("a").dirty); // it never began the update: the next round need not send it all
  CHECK(!member_info("b").dirty);
}

// -- failure handling: the trainer ---------------------------------------------------------

TEST_CASE_FIXTURE(coordinator_trainer_fixture, "the trainer dies mid-round: resume at once, the dirty engine leaves routing, no round until a trainer attaches") {
  start_with_trainer(config());
  for (auto name : {"a", "b"}) {
    engines[name].on(sync_phase::transfer, act::hold); // the transfer is under way
    engines[name].script->fail_held_on_resume = true;  // as the real engine does
  }
  engines["b"].script->dirty_on_resume = true; // b received part of v3, a nothing
  advance(1s); // the clock is not at 0: a transfer start of 0 would hide a bad figure
  publish_through_trainer(3);
  CHECK(count(sync_phase::transfer) == 2);
  CHECK(count(sync_phase::finish) == 0);
  advance(100ms);
  kill_trainer();
  CHECK(seen_by("a") == aborted_phases);
  CHECK(seen_by("b") == aborted_phases);
  REQUIRE(reports.size() == 1);
  auto r = reports.back();
  CHECK(r.aborted);
  CHECK(r.version == 3);
  CHECK(r.engines_synced == 0);
  CHECK(r.evicted.empty()); // the transfer errors the engines answered with at resume evict nobody
  CHECK(r.stall_ns == 100'000'000u);
  CHECK(r.transfer_ns == 0); // it never ended
  CHECK(r.control_ns == r.stall_ns);
  auto s = status();
  CHECK(s.version == 2); // nothing synced to v3
  REQUIRE(!s.history.empty());
  CHECK(s.history.back().aborted);
  CHECK(s.history.back().engines_synced == 0); // the history says what the waiters were told
  CHECK(s.routable == std::vector<std::string>{"a"});
  CHECK(*routes == std::vector<std::string>{"failed b"}); // its frozen requests move; a serves v2 as before
  CHECK(member_events == std::vector<std::string>{"b dirty"});
  CHECK(member_info("a").version == 2);
  CHECK(!member_info("a").dirty);
  CHECK(member_info("b").dirty);
  CHECK(logged("v3: ABORTED (the trainer is down): 1 engines resume on their old version, 1 dirty"));
  // No trainer: neither a new version nor an explicit sync starts a round.
  forget_history();
  for (auto name : {"a", "b"})
    engines[name].on(sync_phase::transfer, act::answer);
  publish(4);
  auto waiting = request<sync_report>(coord, sync_atom::value);
  run();
  CHECK(arrivals->empty());
  CHECK(!waiting->has_value());
  CHECK(status().rounds == s.rounds);
  // A trainer attaches: the next round runs, to the version it reports.
  std::uint64_t restarted_at = 0;
  SUBCASE("a newer version") {
    restarted_at = 5;
  }
  SUBCASE("the version published while it was down: the round is retried") {
    restarted_at = 4;
  }
  CAPTURE(restarted_at);
  auto rec2 = std::make_shared<trainer_script>();
  rec2->current = version_info{restarted_at, 4, 4096};
  trainer_actor trainer2 = spawn(scripted_trainer, rec2);
  tell(coord, register_atom::value, trainer2);
  run();
  CHECK(rec2->listeners.size() == 1);
  auto target = std::max<std::uint64_t>(restarted_at, 4); // v4 was published meanwhile
  CHECK(rec2->pins == std::vector<std::uint64_t>{target});
  CHECK(seen_by("a") == all_phases);
  CHECK(seen_by("b") == all_phases);
  CHECK(*routes == std::vector<std::string>{"route a v" + std::to_string(target), "route b v" + std::to_string(target)});
  s = status();
  CHECK(s.version == target);
  CHECK(s.routable == std::vector<std::string>{"a", "b"});
  CHECK(!member_info("b").dirty);
  REQUIRE(waiting->has_value());
  REQUIRE(**waiting);
  CHECK((**waiting)->version == target);
  CHECK((**waiting)->engines_synced == 2);
  CHECK(!(**waiting)->aborted);
  // And it is followed: its next version starts the next round.
  forget_history();
  publish_from(trainer2, version_info{target + 1, 4, 4096});
  run();
  CHECK(status().version == target + 1);
}

TEST_CASE_FIXTURE(coordinator_trainer_fixture, "a late answer or failure of a phase the abort skipped changes nothing") {
  auto c = config();
  c.sync.deadlines.transfer = 500ms;
  c.sync.deadlines.resume = 5000ms;
  start_with_trainer(c);
  engines["a"].on(sync_phase::transfer, act::hold); // b answers transfer, a holds it
  publish_through_trainer(3);
  REQUIRE(count(sync_phase::transfer) == 2);
  SUBCASE("the engine fails its transfer as it resumes") {
    engines["a"].script->fail_held_on_resume = true;
    kill_trainer();
  }
  SUBCASE("the transfer deadline passes while the round resumes") {
    engines["a"].on(sync_phase::resume, act::hold);
    kill_trainer();
    CHECK(reports.empty()); // a has not resumed yet
    advance(500ms);         // the skipped transfer request times out
    CHECK(routes->empty());
    CHECK(reports.empty());
    release("a"); // the transfer answer, long dropped
    CHECK(reports.empty());
    release("a"); // resume
  }
  SUBCASE("the transfer answer arrives while the round resumes") {
    engines["a"].on(sync_phase::resume, act::hold);
    kill_trainer();
    release("a"); // the transfer answer, within its deadline but for a skipped phase
    CHECK(reports.empty()); // it is no resume acknowledgement
    release("a"); // resume
  }
  REQUIRE(reports.size() == 1);
  auto r = reports.back();
  CHECK(r.aborted);
  CHECK(r.evicted.empty());
  CHECK(r.bytes == 1000); // b's transfer only
  CHECK(routes->empty());
  CHECK(status().routable == std::vector<std::string>{"a", "b"});
  CHECK(!member_info("a").dirty);
}

TEST_CASE_FIXTURE(coordinator_trainer_fixture, "a newcomer's cold sync cut short by the trainer's death is retried at the same version") {
  start_with_trainer(config()); // a and b serve v2, the trainer's newest
  add_engine("c", 0, {{sync_phase::transfer, act::hold}});
  engines["c"].script->fail_held_on_resume = true;
  CHECK(seen_by("c") == std::vector<sync_phase>{sync_phase::pause, sync_phase::flush, sync_phase::start,
                                                sync_phase::transfer});
  kill_trainer();
  REQUIRE(!reports.empty());
  CHECK(reports.back().aborted);
  CHECK(!routable("c"));
  // The next trainer still holds v2: no newer version calls for a round, the
  // newcomer that never served does.
  forget_history();
  engines["c"].on(sync_phase::transfer, act::answer);
  auto rec2 = std::make_shared<trainer_script>();
  trainer_actor trainer2 = spawn(scripted_trainer, rec2);
  tell(coord, register_atom::value, trainer2);
  run();
  CHECK(seen_by("c") == all_phases);
  CHECK(seen_by("a").empty()); // a and b serve v2 already
  CHECK(routable("c"));
  CHECK(member_info("c").version == 2);
}

TEST_CASE_FIXTURE(coordinator_trainer_fixture, "a trainer replaced mid-round, its down message not yet seen, aborts the round") {
  start_with_trainer(config());
  for (auto name : {"a", "b"}) {
    engines[name].on(sync_phase::transfer, act::hold); // pulling from the first trainer
    engines[name].script->fail_held_on_resume = true;
  }
  publish_through_trainer(3);
  CHECK(count(sync_phase::transfer) == 2);
  // Another trainer registers while the first still lives (its death, if it
  // comes, is news about an incarnation already replaced).
  auto rec2 = std::make_shared<trainer_script>();
  rec2->current = version_info{3, 4, 4096};
  trainer_actor trainer2 = spawn(scripted_trainer, rec2);
  for (auto name : {"a", "b"})
    engines[name].on(sync_phase::transfer, act::answer);
  tell(coord, register_atom::value, trainer2);
  run();
  REQUIRE(reports.size() >= 2);
  CHECK(reports[reports.size() - 2].aborted);
  CHECK(logged("v3: ABORTED (the trainer was replaced)"));
  // The retry pulls from the new trainer, to the version it holds.
  CHECK(!reports.back().aborted);
  CHECK(reports.back().engines_synced == 2);
  CHECK(rec2->pins == std::vector<std::uint64_t>{3});
  CHECK(status().version == 3);
  // The first trainer, still alive (a partition healed), publishes on: its
  // numbers are not the current trainer's.
  publish_from(trainer, version_info{9, 4, 4096});
  run();
  CHECK(logged("ignored version 9 from a sender that is not the current trainer"));
  CHECK(status().version == 3);
  CHECK(reports.back().version == 3);
  kill_trainer(); // the first one's death changes nothing now
  CHECK(status().routable == std::vector<std::string>{"a", "b"});
  CHECK(reports.back().version == 3);
  CHECK(!reports.back().aborted);
}

TEST_CASE_FIXTURE(coordinator_trainer_fixture, "a trainer replaced mid-round resumes the wave at once, before its version answer") {
  start_with_trainer(config()); // no heartbeats: nothing else would settle the round
  for (auto name : {"a", "b"}) {
    engines[name].on(sync_phase::transfer, act::hold);
    engines[name].script->fail_held_on_resume = true;
  }
  publish_through_trainer(3);
  REQUIRE(count(sync_phase::transfer) == 2);
  auto rec2 = std::make_shared<trainer_script>();
  rec2->current = version_info{3, 4, 4096};
  rec2->hold_version = true; // its answer, or the ask's failure, comes only later
  trainer_actor trainer2 = spawn(scripted_trainer, rec2);
  tell(coord, register_atom::value, trainer2);
  run(); // no time passes: the aborted round's resume goes out now, not at an answer or a deadline
  CHECK(logged("v3: ABORTED (the trainer was replaced)"));
  CHECK(count(sync_phase::resume) == 2);
  CHECK(rec2->held_versions.size() == 1); // still unanswered
}

TEST_CASE_FIXTURE(coordinator_trainer_fixture, "a new trainer whose version answer is refused is asked again at a heartbeat") {
  start_with_trainer(heartbeat_config());
  add_engine("c", 0, {{sync_phase::transfer, act::hold}});
  engines["c"].script->fail_held_on_resume = true;
  kill_trainer(); // c's cold sync is cut short
  REQUIRE(!routable("c"));
  engines["c"].on(sync_phase::transfer, act::answer);
  auto rec2 = std::make_shared<trainer_script>();
  rec2->current = version_info{2, 4, 4096};
  rec2->current.same_bytes_since = 3; // past its version: check() refuses the answer
  trainer_actor trainer2 = spawn(scripted_trainer, rec2);
  tell(coord, register_atom::value, trainer2);
  run();
  CHECK(logged("refused a version of the trainer"));
  CHECK(!routable("c")); // no round without the new trainer's version
  rec2->current.same_bytes_since = 0;
  ticks(2);
  CHECK(routable("c")); // asked again at a tick: the retried cold sync ran
  CHECK(member_info("c").version == 2);
}
