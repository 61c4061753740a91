// The drill's final check, row by row: one healthy observation, then one
// change per row that must flip exactly the invariant it concerns.
#include "runtime/drill/drill_check.hpp"

#include <doctest/doctest.h>

#include <functional>

using namespace rlsync;

namespace {

drill_observation healthy() {
  drill_observation o;
  o.sent = 10;
  o.completed = 9;
  o.rejected = 1;
  o.tokens = o.streamed_tokens = 90;
  o.tokens_by_version = {{2, 40}, {3, 50}};
  o.completed_versions = {1, 2, 3};
  o.synced_version = 3;
  drill_engine_end a;
  a.name = "a";
  a.routable = true;
  a.version = 3;
  auto b = a;
  b.name = "b";
  b.faulted = true; // killed and restarted: rejoined
  auto c = a;
  c.name = "c";
  c.alive = false; // killed for good: not a live engine
  c.faulted = true;
  c.routable = false;
  c.version = 2;
  o.engines = {a, b, c};
  o.lost_by_design = {"c"};
  o.trainer_version = 3;
  o.throughput_before = 1000;
  o.throughput_after = 950;
  return o;
}

} // namespace

TEST_CASE("drill check: a healthy drill holds every invariant") {
  auto results = check_drill(healthy());
  REQUIRE(results.size() == 7);
  for (auto& r : results) {
    CAPTURE(r.name);
    CAPTURE(r.evidence);
    CHECK(r.held);
    CHECK(!r.evidence.empty());
  }
  CHECK(results[4].evidence.find("c dead") != std::string::npos);
}

TEST_CASE("drill check: each fault in the observation breaks its invariant") {
  struct row {
    const char* what;
    std::function<void(drill_observation&)> change;
    std::size_t broken; ///< index of the invariant that must be violated
    const char* evidence; ///< part of its evidence
  };
  const row rows[] = {
    {"a request failed", [](auto& o) { o.completed = 8; o.failed = 1; }, 0, "1 failed"},
    {"a request never answered", [](auto& o) { o.completed = 8; }, 0, "1 never answered"},
    {"a duplicated token", [](auto& o) { o.streamed_tokens = 91; }, 1, "91 tokens streamed"},
    {"a broken stream", [](auto& o) { o.stream_mismatches = 2; }, 1, "2 streams"},
    {"a live engine behind", [](auto& o) { o.engines[0].version = 2; o.engines[0].routable = false; }, 2, "a v2"},
    {"a live engine dirty", [](auto& o) { o.engines[0].dirty = true; }, 2, "DIRTY"},
    {"weights differ", [](auto& o) { o.engines[0].weights_problem = "3 of 8 shards differ"; }, 2, "3 of 8"},
    {"no live engine", [](auto& o) { for (auto& e : o.engines) e.alive = false; }, 2, "no live engine"},
    {"tokens while dirty", [](auto& o) { o.engines[1].dirty_tokens = 4; }, 3, "b 4"},
    {"a version no round completed", [](auto& o) { o.tokens_by_version[7] = 1; }, 3, "1 tokens at v7"},
    {"a rejoined replica stale", [](auto& o) { o.engines[1].routable = false; }, 4, "b v3 NOT routable"},
    {"an engine out that no fault took for good", [](auto& o) { o.lost_by_design.clear(); }, 4,
     "c dead, though no fault of the drill took it for good"},
    {"a restart refused: retired", [](auto& o) { o.engines[1].retired = true; }, 4, "b retired, though"},
    {"an engine never back from a partition", [](auto& o) { o.engines[1].reachable = false; }, 4,
     "b unreachable, though"},
    {"the final round failed", [](auto& o) { o.final_round_problem = "trainer did not freeze: request_timeout"; }, 2,
     "the final round: trainer did not freeze"},
    {"the trainer froze at a version no round reached", [](auto& o) { o.trainer_version = 4; }, 2,
     "the trainer froze at v4"},
    {"throughput not back", [](auto& o) { o.throughput_after = 899; }, 5, "89.9%"},
    {"nothing measured before", [](auto& o) { o.throughput_before = 0; }, 5, "nothing measured"},
    {"below the minimum", [](auto& o) { o.below_min_live_events = 1; }, 6, "1 times"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto o = healthy();
    r.change(o);
    auto results = check_drill(o);
    for (std::size_t i = 0; i < results.size(); ++i) {
      CAPTURE(results[i].name);
      CAPTURE(results[i].evidence);
      if (i == r.broken) {
        CHECK(!results[i].held);
        CHECK(results[i].evidence.find(r.evidence) != std::string::npos);
      } else if (!((r.broken == 2 && i == 4) || (r.broken == 4 && i == 2))) {
        CHECK(results[i].held); // a stale rejoined engine is a stale live engine too
      }
    }
  }
}

TEST_CASE("drill check: a final round that fails because the drill took the trainer for good is reported") {
  auto o = healthy();
  o.final_round_problem = "trainer did not freeze: request_receiver_down";
  o.trainer_version.reset(); // it never answered
  o.trainer_lost_by_design = true;
  auto results = check_drill(o);
  CAPTURE(results[2].evidence);
  CHECK(results[2].held);
  CHECK(results[2].evidence.find("took the trainer out for good") != std::string::npos);
  o.trainer_lost_by_design = false;
  CHECK_FALSE(check_drill(o)[2].held);
  // What no trainer's absence explains is judged all the same.
  o.trainer_lost_by_design = true;
  o.final_check_problem = "digests: request_timeout";
  o.final_round_problem += "; " + o.final_check_problem;
  CHECK_FALSE(check_drill(o)[2].held);
}

TEST_CASE("drill check: throughput reported, not judged") {
  struct row {
    double before, after;
    bool held;
  };
  const row rows[] = {{1000, 950, true}, {1000, 899, false}, {0, 500, false}};
  for (auto& r : rows) {
    CAPTURE(r.before);
    CAPTURE(r.after);
    auto o = healthy();
    o.throughput_before = r.before;
    o.throughput_after = r.after;
    o.judge_throughput = false;
    auto results = check_drill(o);
    REQUIRE(results.size() == 7);
    CHECK_FALSE(results[5].judged);
    CHECK(results[5].held == r.held); // the figure still says whether it came back
    CHECK(results[5].evidence.find("reported, not judged") != std::string::npos);
    for (std::size_t i = 0; i < results.size(); ++i)
      if (i != 5)
        CHECK(results[i].judged);
    drill_record rec;
    rec.invariants = results;
    CHECK(rec.passed()); // every judged invariant held
    o.judge_throughput = true;
    rec.invariants = check_drill(o);
    CHECK(rec.passed() == r.held);
  }
}

TEST_CASE("drill check: min_live is not judged when the drill itself kills too many at once") {
  struct row {
    const char* what;
    std::int64_t killed_at_once;
    std::int64_t min_live;
    bool judged;
  };
  // healthy() has three engines.
  const row rows[] = {
    {"no kill", 0, 1, true},
    {"one of three, min 1", 1, 1, true},
    {"two of three, min 1", 2, 1, true},
    {"all three, min 1", 3, 1, false},
    {"two of three, min 2", 2, 2, false},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto o = healthy();
    o.min_live_engines = r.min_live;
    o.engines_killed_at_once = r.killed_at_once;
    o.below_min_live_events = 1;
    auto results = check_drill(o);
    REQUIRE(results.size() == 7);
    CHECK(!results[6].held);
    CHECK(results[6].judged == r.judged);
    CHECK((results[6].evidence.find("reported, not judged") != std::string::npos) == !r.judged);
  }
}
