// The drill runner's pure parts: fault labels and refusals, when each fault
// is due and in which order, the timeline's lanes and failover times from the
// hooks' events, the throughput windows and their judgement, the figures and
// the summary. The runner itself (actors, real time) runs in `cli: drill`.
#include "actors/jobs/drill_faults.hpp"
#include "actors/jobs/drill_figures.hpp"
#include "actors/jobs/drill_runner.hpp"
#include "actors/jobs/drill_timeline.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

using namespace rlsync;
using namespace rlsync::jobs;
using std::chrono::milliseconds;

namespace {

fault_spec at_sync(std::int64_t round, sync_phase phase, fault_action action, const std::string& target,
                   fault_target kind = fault_target::engine) {
  fault_spec f;
  f.at_sync = round;
  f.phase = phase;
  f.action = action;
  f.target = target;
  f.target_kind = kind;
  return f;
}

fault_spec at_ms(std::int64_t ms, fault_action action, const std::string& target,
                 fault_target kind = fault_target::engine) {
  fault_spec f;
  f.at = milliseconds(ms);
  f.action = action;
  f.target = target;
  f.target_kind = kind;
  return f;
}

fault_spec lasting(fault_spec f, std::int64_t ms) {
  f.duration = milliseconds(ms);
  return f;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

} // namespace

// -- faults -------------------------------------------------------------------------

TEST_CASE("drill faults: labels name the action, target, when and how long") {
  struct row {
    fault_spec f;
    const char* label;
  };
  const row rows[] = {
    {lasting(at_sync(16, sync_phase::transfer, fault_action::kill, "rollout-0"), 1500),
     "kill rollout-0 (sync 16 transfer) for 1500 ms"},
    {at_sync(3, sync_phase::resume, fault_action::corrupt, "rollout-2"), "corrupt rollout-2 (sync 3 continue)"},
    {lasting(at_ms(4500, fault_action::partition, "rollout-1"), 2500), "partition rollout-1 (at 4500 ms) for 2500 ms"},
    {at_sync(5, sync_phase::pause, fault_action::restart, "coordinator", fault_target::coordinator),
     "restart coordinator (sync 5 pause)"},
  };
  for (auto& r : rows)
    CHECK(fault_label(r.f) == r.label);
}

TEST_CASE("drill faults: one process refuses whole-node kills and restarts, with their place") {
  struct row {
    const char* what;
    std::vector<fault_spec> faults;
    const char* refusal; ///< part of it; empty: accepted
  };
  const row rows[] = {
    {"no faults", {}, "no drill.faults"},
    {"engine kill", {at_ms(10, fault_action::kill, "rollout-0")}, ""},
    {"node partition", {at_ms(10, fault_action::partition, "local", fault_target::node)}, ""},
    {"node kill second",
     {at_ms(10, fault_action::kill, "rollout-0"), at_ms(20, fault_action::kill, "local", fault_target::node)},
     "drill.faults[1]: kill of a whole node"},
    {"node restart", {at_ms(10, fault_action::restart, "local", fault_target::node)},
     "drill.faults[0]: restart of a whole node"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    topology t;
    t.drill.faults = r.faults;
    auto why = refuse_drill(t);
    if (std::string(r.refusal).empty())
      CHECK(why.empty());
    else
      CHECK(contains(why, r.refusal));
  }
  topology t;
  t.drill.faults = {at_ms(10, fault_action::kill, "local", fault_target::node)};
  CHECK(refuse_drill(t, [](std::size_t i) { return "d.yaml:" + std::to_string(7 + i) + ":7"; })
        == "d.yaml:7:7: drill.faults[0]: kill of a whole node needs the multi-process drill; target its engines");
}

TEST_CASE("drill faults: which engines, and whether the trainer, the drill takes out for good") {
  struct row {
    const char* what;
    std::vector<fault_spec> faults;
    std::set<std::string> lost;
    bool trainer_lost;
  };
  const row rows[] = {
    {"a kill with a restart", {lasting(at_ms(10, fault_action::kill, "e-0"), 1000)}, {}, false},
    {"a kill for good", {at_ms(10, fault_action::kill, "e-0")}, {"e-0"}, false},
    {"a worker thread killed for good", {at_ms(10, fault_action::kill_worker, "e-1")}, {"e-1"}, false},
    {"a node killed for good: its engines and the trainer on it",
     {at_ms(10, fault_action::kill, "n1", fault_target::node)}, {"e-0", "e-1"}, true},
    {"a node cut off for good", {at_ms(10, fault_action::partition, "n2", fault_target::node)}, {"e-2"}, false},
    {"a partition healed later", {at_ms(10, fault_action::partition, "e-2"), at_ms(20, fault_action::heal, "e-2")},
     {}, false},
    {"a partition that lasts", {lasting(at_ms(10, fault_action::partition, "e-2"), 500)}, {}, false},
    {"a heal listed first but due later", {at_ms(20, fault_action::heal, "e-2"), at_ms(10, fault_action::partition, "e-2")},
     {}, false},
    {"a heal listed later but due earlier", {at_ms(10, fault_action::partition, "e-2"), at_ms(5, fault_action::heal, "e-2")},
     {"e-2"}, false},
    {"a heal at a later round", {at_sync(5, sync_phase::pause, fault_action::heal, "e-2"),
                                 at_sync(3, sync_phase::transfer, fault_action::partition, "e-2")},
     {}, false},
    {"a timed heal of a round's partition: order unknown, excused",
     {at_sync(50, sync_phase::pause, fault_action::partition, "e-2"), at_ms(1000, fault_action::heal, "e-2")},
     {"e-2"}, false},
    {"the trainer killed for good", {at_ms(10, fault_action::kill, "trainer", fault_target::trainer)}, {}, true},
    {"the trainer restarted", {lasting(at_ms(10, fault_action::kill, "trainer", fault_target::trainer), 500)}, {},
     false},
    {"an engine restarted at once", {at_ms(10, fault_action::restart, "e-0")}, {}, false},
    {"a corruption", {at_sync(3, sync_phase::transfer, fault_action::corrupt, "e-0")}, {}, false},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    topology t;
    t.trainer.node = "n1";
    for (auto [name, node] : {std::pair{"e-0", "n1"}, {"e-1", "n1"}, {"e-2", "n2"}}) {
      engine_spec e;
      e.name = name;
      e.node = node;
      t.engines.push_back(e);
    }
    t.drill.faults = r.faults;
    CHECK(engines_lost_by_design(t) == r.lost);
    CHECK(trainer_lost_by_design(t) == r.trainer_lost);
  }
}

TEST_CASE("drill faults: with processes a fault for good takes its target's whole node") {
  topology t;
  t.trainer.node = "n1";
  for (auto [name, node] : {std::pair{"e-0", "n1"}, {"e-1", "n1"}, {"e-2", "n2"}, {"e-3", "n3"}}) {
    engine_spec e;
    e.name = name;
    e.node = node;
    t.engines.push_back(e);
  }
  auto node_hit = [&](const fault_spec& f) {
    if (f.target_kind == fault_target::engine)
      return t.find_engine(f.target)->node;
    return f.target_kind == fault_target::trainer ? t.trainer.node : f.target;
  };
  t.drill.faults = {at_ms(10, fault_action::kill, "e-0")};
  CHECK(engines_lost_by_design(t) == std::set<std::string>{"e-0"});
  CHECK(engines_lost_by_design(t, node_hit) == std::set<std::string>{"e-0", "e-1"}); // its node's other engine
  CHECK_FALSE(trainer_lost_by_design(t));
  CHECK(trainer_lost_by_design(t, node_hit)); // the trainer ran there too
  t.drill.faults = {at_ms(10, fault_action::kill, "trainer", fault_target::trainer)};
  CHECK(engines_lost_by_design(t, node_hit) == std::set<std::string>{"e-0", "e-1"});
  // Ranks: every rank must be live for a round, so a redundant one lost for good stops them too.
  trainer_rank a, b;
  a.node = "n1";
  b.node = "n2";
  t.trainer.ranks = {a, b};
  t.drill.faults = {at_ms(10, fault_action::partition, "n2", fault_target::node)};
  CHECK(trainer_lost_by_design(t));
  CHECK(engines_lost_by_design(t) == std::set<std::string>{"e-2"});
  t.drill.faults = {at_ms(10, fault_action::kill, "e-3")};
  CHECK_FALSE(trainer_lost_by_design(t, node_hit)); // n3 hosts no rank
}

TEST_CASE("drill faults: which faults end after their duration") {
  struct row {
    fault_spec f;
    bool ends;
  };
  using ft = fault_target;
  const row rows[] = {
    {lasting(at_ms(0, fault_action::kill, "a"), 100), true},       // restarted
    {lasting(at_ms(0, fault_action::partition, "a"), 100), true},  // healed
    {lasting(at_ms(0, fault_action::partition, "n", ft::node), 100), true},
    {lasting(at_ms(0, fault_action::delay_acks, "a"), 100), true},
    {at_ms(0, fault_action::kill, "a"), false}, // killed for good
    {at_ms(0, fault_action::partition, "a"), false},
    {lasting(at_ms(0, fault_action::kill, "trainer", ft::trainer), 100), true},
    {lasting(at_ms(0, fault_action::kill, "router", ft::router), 100), true},
    {lasting(at_ms(0, fault_action::kill, "coordinator", ft::coordinator), 100), true},
    {lasting(at_ms(0, fault_action::restart, "coordinator", ft::coordinator), 100), false},
    {at_ms(0, fault_action::kill, "trainer", ft::trainer), false},
  };
  for (auto& r : rows) {
    CAPTURE(fault_label(r.f));
    CHECK(fault_has_end(r.f) == r.ends);
  }
}

TEST_CASE("drill faults: a round's phase hands over its faults once, in drill order") {
  fault_schedule s({at_sync(2, sync_phase::transfer, fault_action::kill, "b"),
                    at_sync(2, sync_phase::pause, fault_action::kill, "a"),
                    at_sync(2, sync_phase::transfer, fault_action::partition, "c"),
                    at_sync(3, sync_phase::transfer, fault_action::kill, "d"),
                    at_ms(100, fault_action::kill, "e")});
  struct row {
    std::uint64_t round;
    sync_phase phase;
    std::vector<std::size_t> due;
  };
  const row rows[] = {
    {1, sync_phase::transfer, {}},        {2, sync_phase::flush, {}},
    {2, sync_phase::transfer, {0, 2}},    {2, sync_phase::transfer, {}}, // once only
    {2, sync_phase::pause, {1}},          {3, sync_phase::transfer, {3}},
    {100, sync_phase::pause, {}}, // a fault at a time is no round's
  };
  for (auto& r : rows) {
    CAPTURE(r.round);
    CAPTURE(to_string(r.phase));
    CHECK(s.take_at_phase(r.round, r.phase) == r.due);
  }
}

TEST_CASE("drill faults: timed faults fall due by the workload's clock, once") {
  fault_schedule s({at_ms(300, fault_action::kill, "a"), at_sync(1, sync_phase::pause, fault_action::kill, "b"),
                    at_ms(100, fault_action::partition, "c"), at_ms(300, fault_action::heal, "c")});
  struct row {
    std::int64_t elapsed_ms;
    std::vector<std::size_t> due;
  };
  const row rows[] = {{0, {}}, {99, {}}, {100, {2}}, {250, {}}, {300, {0, 3}}, {10000, {}}};
  for (auto& r : rows) {
    CAPTURE(r.elapsed_ms);
    CHECK(s.take_due_by(milliseconds(r.elapsed_ms)) == r.due);
  }
  // Due in the same poll: by their time, then in drill order (a heal listed
  // first but due later fires after its partition).
  fault_schedule late_poll({at_ms(20, fault_action::heal, "c"), at_ms(10, fault_action::partition, "c"),
                            at_ms(10, fault_action::kill, "a")});
  CHECK(late_poll.take_due_by(milliseconds(50)) == std::vector<std::size_t>{1, 2, 0});
}

TEST_CASE("drill faults: the coordinator's hook waits for kills, not for restarts") {
  fault_schedule s({at_sync(1, sync_phase::pause, fault_action::kill, "a"),
                    at_sync(1, sync_phase::pause, fault_action::restart, "b")});
  auto due = s.take_at_phase(1, sync_phase::pause);
  REQUIRE(due == std::vector<std::size_t>{0, 1});
  CHECK_FALSE(s.landed(due));
  CHECK(s.landed({1})); // a restart needs this coordinator to register: no wait
  s.settle(0, true);
  CHECK(s.landed(due));
  CHECK_FALSE(s.all_settled());
  s.settle(1, true);
  CHECK(s.all_settled());
}

TEST_CASE("drill faults: every scheduled fault fired, or which did not") {
  struct row {
    const char* what;
    std::vector<int> fate; ///< per fault: 1 fired, 0 skipped, -1 never
    bool held;
    const char* evidence;
  };
  const row rows[] = {
    {"all fired", {1, 1}, true, "kill a (at 10 ms): fired; kill b (at 20 ms): fired"},
    {"one skipped", {1, 0}, false, "kill b (at 20 ms): skipped (not in one process)"},
    {"one never", {-1, 1}, false, "kill a (at 10 ms): NEVER FIRED"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    fault_schedule s({at_ms(10, fault_action::kill, "a"), at_ms(20, fault_action::kill, "b")});
    std::vector<std::size_t> never;
    for (std::size_t i = 0; i < r.fate.size(); ++i)
      if (r.fate[i] >= 0)
        s.settle(i, r.fate[i] == 1);
      else
        never.push_back(i);
    auto inv = s.fired_invariant();
    CHECK(inv.name == "every scheduled fault fired");
    CHECK(inv.held == r.held);
    CHECK(contains(inv.evidence, r.evidence));
    CHECK(s.never_fired() == never);
  }
}

TEST_CASE("drill faults: ends come due earliest first, each once") {
  fault_schedule s({at_ms(0, fault_action::kill, "a"), at_ms(0, fault_action::partition, "b"),
                    at_ms(0, fault_action::delay_acks, "c")});
  s.end_at(0, milliseconds(500));
  s.end_at(1, milliseconds(200));
  s.end_at(2, milliseconds(200));
  s.end_at(1, milliseconds(50)); // a fault ends once: the first end stands
  CHECK(s.ends_pending());
  CHECK(s.take_ends_due(milliseconds(100)).empty());
  CHECK(s.take_ends_due(milliseconds(600)) == std::vector<std::size_t>{1, 2, 0});
  CHECK_FALSE(s.ends_pending());
  CHECK(s.take_ends_due(milliseconds(10000)).empty());
  CHECK_THROWS_AS(s.end_at(3, milliseconds(1)), std::out_of_range);
}

// -- timeline -----------------------------------------------------------------------

TEST_CASE("drill timeline: the router's reroute lines") {
  struct row {
    const char* line;
    bool parsed;
    std::uint64_t id;
    const char* engine;
    std::uint32_t tokens;
  };
  const row rows[] = {
    {"router: request 17 rerouted from rollout-0 (down) after 5 tokens", true, 17, "rollout-0", 5},
    {"router: request 3 rerouted from rollout-1 (failed: x after y) after 0 tokens", true, 3, "rollout-1", 0},
    {"router: request 18446744073709551615 rerouted from e (down) after 4294967295 tokens", true,
     18446744073709551615ull, "e", 4294967295u},
    {"router: request 1 rerouted from e (down) after 4294967296 tokens", false, 0, "", 0},
    {"router: request x rerouted from e (down) after 5 tokens", false, 0, "", 0},
    {"router: request 1 rerouted from  (down) after 5 tokens", false, 0, "", 0},
    {"router: request 1 rerouted from e", false, 0, "", 0},
    {"router: engine rollout-0 down", false, 0, "", 0},
    {"", false, 0, "", 0},
  };
  for (auto& r : rows) {
    CAPTURE(r.line);
    auto p = parse_reroute_line(r.line);
    REQUIRE(p.has_value() == r.parsed);
    if (p) {
      CHECK(p->request_id == r.id);
      CHECK(p->engine == r.engine);
      CHECK(p->tokens == r.tokens);
    }
  }
}

TEST_CASE("drill timeline: lanes from the coordinator's events") {
  struct event {
    double at;
    const char* engine;
    const char* what;
    bool workload_started;
  };
  struct row {
    const char* what;
    std::vector<event> events;
    std::vector<lane_state> lanes; ///< of engine "a", in order
    bool faulted;
  };
  using ls = lane_state;
  const row rows[] = {
    {"cold start", {{1, "a", "registered", false}, {2, "a", "routable", false}}, {ls::generating}, false},
    {"restart", {{1, "a", "registered", true}, {2, "a", "routable", true}}, {ls::rejoining, ls::generating}, true},
    {"evicted", {{1, "a", "evicted", true}}, {ls::rejoining}, true},
    {"dirty", {{1, "a", "dirty", true}}, {ls::dirty}, true},
    {"cut off, evicted, back",
     {{1, "a", "unreachable", true}, {2, "a", "evicted", true}, {3, "a", "reachable", true}, {4, "a", "routable", true}},
     {ls::dead, ls::rejoining, ls::generating}, true},
    {"left", {{1, "a", "left", true}}, {ls::dead}, true},
    {"retired", {{1, "a", "retired", true}}, {ls::dead}, true},
    {"another engine", {{1, "b", "dirty", true}}, {}, false},
    {"unknown word", {{1, "a", "sneezed", true}}, {}, false},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    drill_timeline tl;
    for (auto& e : r.events)
      tl.on_member(e.at, e.engine, e.what, e.workload_started);
    std::vector<lane_state> lanes;
    for (auto& l : tl.lanes())
      if (l.engine == "a")
        lanes.push_back(l.state);
    CHECK(lanes == r.lanes);
    CHECK(tl.faulted("a") == r.faulted);
  }
}

TEST_CASE("drill timeline: an eviction counts as a caught corruption only after a corruption") {
  drill_timeline tl;
  tl.on_member(1, "a", "evicted", true); // no fault yet
  CHECK_FALSE(tl.evicted_after_corruption("a"));
  tl.on_fault(2, "a", fault_action::corrupt);
  tl.on_fault(2, "b", fault_action::corrupt);
  tl.on_member(3, "a", "routable", true);
  CHECK_FALSE(tl.evicted_after_corruption("a"));
  tl.on_member(4, "a", "evicted", true);
  CHECK(tl.evicted_after_corruption("a"));
  tl.on_fault(5, "b", fault_action::kill); // its last fault is not the corruption
  tl.on_member(6, "b", "evicted", true);
  CHECK_FALSE(tl.evicted_after_corruption("b"));
  tl.on_fault(7, "c", fault_action::corrupt);
  tl.on_member(8, "c", "dirty", true);
  CHECK(tl.evicted_after_corruption("c"));
}

TEST_CASE("drill timeline: phases and an aborted round on the lanes, completed versions") {
  drill_timeline tl;
  tl.on_phase(10, sync_phase::pause, {"a", "b"});
  tl.on_phase(20, sync_phase::flush, {"a", "b"});
  tl.on_phase(30, sync_phase::transfer, {"a", "b"});
  sync_report aborted;
  aborted.version = 2;
  aborted.aborted = true;
  aborted.evicted = {"b"};
  tl.on_sync(40, aborted);
  sync_report done;
  done.version = 3;
  done.engines_synced = 2;
  tl.on_sync(50, done);
  sync_report empty; // moved nothing: no version completed
  empty.version = 4;
  tl.on_sync(60, empty);

  std::vector<std::pair<std::string, lane_state>> lanes;
  for (auto& l : tl.lanes())
    lanes.emplace_back(l.engine, l.state);
  const std::vector<std::pair<std::string, lane_state>> expected = {
    {"a", lane_state::paused},       {"b", lane_state::paused}, {"a", lane_state::transferring},
    {"b", lane_state::transferring}, {"a", lane_state::generating}, // b was evicted: not back
  };
  CHECK(lanes == expected);
  CHECK(tl.completed_versions() == std::set<std::uint64_t>{3});
  REQUIRE(tl.marks().size() == 3);
  CHECK(tl.marks()[0].label == "v2 aborted");
  CHECK(tl.marks()[1].label == "v3");
  CHECK(tl.marks()[1].at_ms == 50);
  sync_report first_wave; // aborted after its first wave: that wave's engines serve v4
  first_wave.version = 4;
  first_wave.engines_synced = 1;
  first_wave.aborted = true;
  tl.on_sync(60, first_wave);
  CHECK(tl.completed_versions() == std::set<std::uint64_t>{3, 4});
}

TEST_CASE("drill timeline: detection and failover times from the fault") {
  drill_timeline tl;
  tl.on_fault(1000, "a", fault_action::kill);
  tl.on_fault(2000, "b", fault_action::partition);
  tl.on_member(1005, "a", "left", true);
  tl.on_member(2501, "b", "unreachable", true);
  tl.on_member(2600, "c", "unreachable", true); // no fault of the drill's: no figure
  CHECK(tl.detect_ms() == std::vector<double>{501});
  std::vector<std::string> detects;
  for (auto& m : tl.marks())
    if (m.kind == "detect")
      detects.push_back(m.label);
  CHECK(detects == std::vector<std::string>{"a left (5 ms after its fault)", "b unreachable (501 ms after its fault)"});

  tl.on_reroute({7, "a", 4});
  tl.on_reroute({8, "b", 0});
  tl.on_reroute({9, "z", 2}); // never faulted
  tl.on_token(1030, 7, 3);    // not the continuation's first token
  tl.on_token(1040, 7, 4);
  tl.on_token(1050, 7, 4); // counted once
  tl.on_token(2580, 8, 0);
  tl.on_token(2590, 9, 2);
  tl.on_token(2595, 99, 0);
  CHECK(tl.failover_after_kill_ms() == std::vector<double>{40});
  CHECK(tl.failover_after_other_ms() == std::vector<double>{580});
}

TEST_CASE("drill timeline: events past the bound are counted, not kept") {
  drill_timeline tl;
  for (std::size_t i = 0; i < drill_timeline::max_events + 3; ++i)
    tl.lane(static_cast<double>(i), "a", lane_state::generating);
  CHECK(tl.lanes().size() == drill_timeline::max_events);
  CHECK(tl.dropped() == 3);
}

// -- throughput and figures ---------------------------------------------------------

TEST_CASE("drill figures: tokens per second between two instants") {
  const std::vector<token_sample> samples = {{0, 0}, {100, 50}, {200, 100}, {300, 300}, {400, 400}};
  struct row {
    double from, to, expected;
  };
  const row rows[] = {
    {0, 200, 500},     // 100 tokens in 200 ms
    {100, 300, 1250},  // 250 in 200 ms
    {150, 250, 500},   // counts at the samples before: 50 → 100
    {0, 1000, 400},    // past the last sample: its count
    {-100, 0, 0},      // nothing before the first
    {200, 200, 0},     // empty span
    {300, 100, 0},     // reversed
  };
  for (auto& r : rows) {
    CAPTURE(r.from);
    CAPTURE(r.to);
    CHECK(tokens_per_second(samples, r.from, r.to) == doctest::Approx(r.expected));
  }
  CHECK(tokens_per_second({}, 0, 100) == 0);
  CHECK(tokens_per_second({{0, 100}, {100, 50}}, 0, 100) == 0); // a count going down is no throughput
}

TEST_CASE("drill figures: the plot smooths over the window before each sample") {
  const std::vector<token_sample> samples = {{0, 0}, {250, 100}, {500, 200}, {750, 600}, {1000, 600}};
  auto plot = throughput_plot(samples, 500);
  REQUIRE(plot.size() == 4); // the first sample has nothing before it
  CHECK(plot[0].at_ms == 250);
  CHECK(plot[0].tokens_per_s == doctest::Approx(400));  // 100 in 250 ms
  CHECK(plot[1].tokens_per_s == doctest::Approx(400));  // 200 in 500 ms
  CHECK(plot[2].tokens_per_s == doctest::Approx(1000)); // 500 in 500 ms (from 250)
  CHECK(plot[3].tokens_per_s == doctest::Approx(800));  // 400 in 500 ms (from 500)
  CHECK(throughput_plot({}, 500).empty());
}

TEST_CASE("drill figures: the baseline is the window before the first fault, after the ramp-up") {
  struct row {
    const char* what;
    double first_fault, faults_end, workload_start;
    double from, to;
  };
  const row rows[] = {
    {"a full window", 10000, 20000, 1000, 7000, 10000},
    {"cut by the ramp-up", 3000, 20000, 1000, 2000, 3000},
    {"no fault fired: before the end", -1, 20000, 1000, 17000, 20000},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto w = baseline_window(r.first_fault, r.faults_end, r.workload_start, 1000, 3000);
    CHECK(w.from_ms == r.from);
    CHECK(w.to_ms == r.to);
  }
}

TEST_CASE("drill figures: windows after recovery until one is within 10%") {
  // Each row: the baseline and the tokens/s each window would measure; the
  // windows measured before the judgement stops, and the figure it keeps.
  struct row {
    const char* what;
    double before;
    std::vector<double> windows;
    int measured;
    double kept;
  };
  const row rows[] = {
    {"back at once", 1000, {950, 1000, 1000, 1000}, 1, 950},
    {"exactly 90%", 1000, {900, 1000}, 1, 900},
    {"back in the third", 1000, {500, 850, 910, 1000}, 3, 910},
    {"never back: four windows, the last kept", 1000, {500, 600, 700, 800, 990}, 4, 800},
    {"nothing before: one window", 0, {100, 200}, 1, 100},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    int measured = 0;
    double after = 0;
    while (measure_another_window(r.before, after, measured, 4)) {
      REQUIRE(static_cast<std::size_t>(measured) < r.windows.size());
      after = r.windows[static_cast<std::size_t>(measured)];
      ++measured;
    }
    CHECK(measured == r.measured);
    CHECK(after == r.kept);
  }
}

TEST_CASE("drill figures: failover, detection and throughput rows") {
  drill_measurements m;
  m.failover_after_kill_ms = {40, 30, 46};
  m.failover_after_other_ms = {580};
  m.detect_ms = {501, 480};
  m.heartbeat_timeout_ms = 500;
  m.throughput_before = 1000;
  m.throughput_after = 990;
  m.completed = 120;
  m.rerouted = 8;
  struct row {
    const char* name;
    double value;
    const char* target;
  };
  const row rows[] = {
    {"failover after a kill, median of 3 rerouted requests", 40, "< 100 ms"},
    {"failover after a kill, worst", 46, "< 100 ms"},
    {"failover after a partition or other fault, median of 1", 580, "heartbeat timeout + reroute"},
    {"partition detected after, worst", 501, "<= heartbeat timeout 500 ms + one interval"},
    {"throughput before the first fault", 1000, ""},
    {"throughput after healing", 990, ""},
    {"after / before", 99, ">= 90%"},
    {"requests completed", 120, ""},
    {"requests rerouted (router)", 8, ""},
  };
  auto figures = drill_figures(m);
  REQUIRE(figures.size() == std::size(rows));
  for (std::size_t i = 0; i < figures.size(); ++i) {
    CAPTURE(rows[i].name);
    CHECK(figures[i].name == rows[i].name);
    CHECK(figures[i].value == doctest::Approx(rows[i].value));
    CHECK(figures[i].target == rows[i].target);
  }

  drill_measurements quiet; // nothing rerouted or detected, nothing before
  quiet.throughput_judged = false;
  figures = drill_figures(quiet);
  REQUIRE(figures.size() == 5);
  CHECK(figures[0].name == "throughput before the first fault");
  CHECK(figures[2].value == 0);
  CHECK(figures[2].target == ">= 90%, reported, not judged");
}

TEST_CASE("drill figures: the summary names the verdict, every figure and invariant, then the folder") {
  drill_record r;
  r.figures = {{"after / before", 85.04, "%", ">= 90%, reported, not judged"}, {"requests completed", 12, "", ""}};
  r.invariants = {{"every request finished", true, "12 sent"},
                  {"throughput back to its pre-fault level", false, "85.0%; reported, not judged", false}};
  auto text = drill_summary(r, "d.yaml", "out/dir");
  CHECK(text == "\n== rlsync drill d.yaml: PASSED\n"
                "  after / before: 85.0 % (target >= 90%, reported, not judged)\n"
                "  requests completed: 12.0\n"
                "  held      every request finished: 12 sent\n"
                "  reported  throughput back to its pre-fault level: 85.0%; reported, not judged\n"
                "report: out/dir/report.html\n"
                "out/dir\n");
  r.invariants[0].held = false;
  CHECK(contains(drill_summary(r, "d.yaml", "x"), "FAILED\n"));
  CHECK(contains(drill_summary(r, "d.yaml", "x"), "  VIOLATED  every request finished: 12 sent\n"));
}

TEST_CASE("drill runner: the --throughput values") {
  CHECK(parse_throughput_verdict("judge") == throughput_verdict::judge);
  CHECK(parse_throughput_verdict("report") == throughput_verdict::report);
  CHECK_FALSE(parse_throughput_verdict("Judge").has_value());
  CHECK_FALSE(parse_throughput_verdict("").has_value());
}

TEST_CASE("drill faults: the most engines killed at the same moment") {
  topology t;
  for (int i = 0; i < 3; ++i) {
    engine_spec e;
    e.name = "rollout-" + std::to_string(i);
    e.node = i < 2 ? "a" : "b";
    t.engines.push_back(e);
  }
  struct row {
    const char* what;
    std::vector<fault_spec> faults;
    std::int64_t expected;
  };
  const row rows[] = {
    {"none", {}, 0},
    {"one kill", {at_ms(100, fault_action::kill, "rollout-0")}, 1},
    {"two at different times", {at_ms(100, fault_action::kill, "rollout-0"), at_ms(200, fault_action::kill, "rollout-1")}, 1},
    {"three at once",
     {at_ms(100, fault_action::kill, "rollout-0"), at_ms(100, fault_action::kill, "rollout-1"),
      at_ms(100, fault_action::kill, "rollout-2")},
     3},
    {"a partition is no kill", {at_ms(100, fault_action::partition, "rollout-0")}, 0},
    {"the same round and phase",
     {at_sync(4, sync_phase::pause, fault_action::kill, "rollout-0"),
      at_sync(4, sync_phase::pause, fault_action::kill, "rollout-2"),
      at_sync(4, sync_phase::transfer, fault_action::kill, "rollout-1")},
     2},
    {"a node's kill counts its engines", {at_ms(100, fault_action::kill, "a", fault_target::node)}, 2},
    {"corruptions at one phase evict their engines together",
     {at_sync(4, sync_phase::start, fault_action::corrupt, "rollout-0"),
      at_sync(4, sync_phase::start, fault_action::corrupt, "rollout-1")},
     2},
    {"a corruption evicts at its round's transfer, beside a kill there",
     {at_sync(4, sync_phase::start, fault_action::corrupt, "rollout-0"),
      at_sync(4, sync_phase::transfer, fault_action::kill, "rollout-1")},
     2},
    {"a corruption after the transfer evicts at the next round's",
     {at_sync(4, sync_phase::finish, fault_action::corrupt, "rollout-0"),
      at_sync(5, sync_phase::transfer, fault_action::kill, "rollout-1")},
     2},
    {"a timed corruption has no moment to group", {at_ms(100, fault_action::corrupt, "rollout-0"),
                                                   at_ms(100, fault_action::kill, "rollout-1")},
     1},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    t.drill.faults = r.faults;
    CHECK(engines_killed_at_once(t) == r.expected);
  }
}

TEST_CASE("drill faults: a trainer or a layer's only holder killed mid-transfer dirties every engine") {
  topology t;
  t.trainer.node = "head";
  for (int i = 0; i < 3; ++i) {
    engine_spec e;
    e.name = "rollout-" + std::to_string(i);
    e.node = "engines";
    t.engines.push_back(e);
  }
  // rank-0 holds layers 0-1 alone; layers 2-3 have a holder on rank-1 and one on rank-1b.
  t.trainer.ranks = {{"rank-0", {0, 1}}, {"rank-1", {2, 3}}, {"rank-1b", {2, 3}}};
  struct row {
    const char* what;
    fault_spec fault;
    std::int64_t expected;
  };
  const row rows[] = {
    {"the only holder of layers 0-1, at transfer", at_sync(8, sync_phase::transfer, fault_action::kill, "rank-0", fault_target::node), 3},
    {"the only holder, at pause: the round aborts clean", at_sync(8, sync_phase::pause, fault_action::kill, "rank-0", fault_target::node), 0},
    {"the only holder, at a time", at_ms(100, fault_action::kill, "rank-0", fault_target::node), 0},
    {"one of two holders, at transfer", at_sync(8, sync_phase::transfer, fault_action::kill, "rank-1", fault_target::node), 0},
    {"the only holder partitioned at transfer", at_sync(8, sync_phase::transfer, fault_action::partition, "rank-0", fault_target::node), 3},
    {"an engine node partitioned", at_sync(8, sync_phase::transfer, fault_action::partition, "engines", fault_target::node), 0},
    {"an engine node at transfer counts its own", at_sync(8, sync_phase::transfer, fault_action::kill, "engines", fault_target::node), 3},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    t.drill.faults = {r.fault};
    CHECK(engines_killed_at_once(t) == r.expected);
  }
  CHECK(holds_layers_alone(t, "rank-0"));
  CHECK_FALSE(holds_layers_alone(t, "rank-1"));
  CHECK_FALSE(holds_layers_alone(t, "engines"));
  t.trainer.ranks = {{"head", {0, 1, 2, 3}}}; // one trainer: a kill at transfer takes every engine
  t.drill.faults = {at_sync(8, sync_phase::transfer, fault_action::kill, "trainer", fault_target::trainer)};
  CHECK(engines_killed_at_once(t) == 3);
  CHECK(holds_layers_alone(t, "head"));
}
