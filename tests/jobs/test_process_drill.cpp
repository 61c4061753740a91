// The multi-process drill's pure parts: what each fault does to which node's
// process, which faults processes refuse (with their place), the head's phase
// lines, the drill's round numbers and the "no version goes backwards" watch.
// The runner itself (processes, signals) runs in `cli: process-drill`.
#include "actors/jobs/process_drill.hpp"
#include "actors/jobs/process_faults.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace rlsync;
using namespace rlsync::jobs;
using std::chrono::milliseconds;

namespace {

/// head (coordinator, router, trainer), engines-a (rollout-a), engines-b (rollout-b, rollout-c).
topology three_nodes() {
  topology t;
  t.name = "three";
  for (auto name : {"head", "engines-a", "engines-b"}) {
    node_spec n;
    n.name = name;
    t.nodes.push_back(n);
  }
  t.trainer.node = t.router.node = t.coordinator.node = "head";
  for (auto [name, node] : {std::pair{"rollout-a", "engines-a"}, {"rollout-b", "engines-b"}, {"rollout-c", "engines-b"}}) {
    engine_spec e;
    e.name = name;
    e.node = node;
    t.engines.push_back(e);
  }
  return t;
}

fault_spec fault(fault_action action, const std::string& target, fault_target kind,
                 std::optional<std::int64_t> duration_ms = std::nullopt) {
  fault_spec f;
  f.at_sync = 4;
  f.phase = sync_phase::transfer;
  f.action = action;
  f.target = target;
  f.target_kind = kind;
  if (duration_ms)
    f.duration = milliseconds(*duration_ms);
  return f;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

} // namespace

TEST_CASE("process drill: a topology with several nodes runs as processes") {
  auto t = three_nodes();
  CHECK(runs_as_processes(t));
  t.nodes.resize(1);
  CHECK_FALSE(runs_as_processes(t));
}

TEST_CASE("process drill: each fault maps to a node's process and a signal or a link") {
  struct row {
    const char* what;
    fault_spec f;
    bool netns;
    const char* node; ///< empty: refused
    process_action action;
    std::int64_t ends_after_ms; ///< -1: no end
    bool head;
    const char* refusal; ///< part of it, when refused
  };
  const row rows[] = {
    {"an engine's kill hits its node", fault(fault_action::kill, "rollout-b", fault_target::engine, 1500), false,
     "engines-b", process_action::kill, 1500, false, ""},
    {"a node killed for good", fault(fault_action::kill, "engines-a", fault_target::node), false, "engines-a",
     process_action::kill, -1, false, ""},
    {"restart: kill and start at once", fault(fault_action::restart, "engines-a", fault_target::node), false,
     "engines-a", process_action::kill_restart, -1, false, ""},
    {"the coordinator is the head", fault(fault_action::kill, "coordinator", fault_target::coordinator, 1000), false,
     "head", process_action::kill, 1000, true, ""},
    {"the trainer lives on the head", fault(fault_action::kill, "trainer", fault_target::trainer, 1000), false, "head",
     process_action::kill, 1000, true, ""},
    {"the router lives on the head", fault(fault_action::restart, "router", fault_target::router), false, "head",
     process_action::kill_restart, -1, true, ""},
    {"the head killed for good ends nothing", fault(fault_action::kill, "coordinator", fault_target::coordinator),
     false, "", process_action::kill, -1, false, "give it a duration_ms"},
    {"delay_acks: SIGSTOP, SIGCONT after", fault(fault_action::delay_acks, "rollout-c", fault_target::engine, 800),
     false, "engines-b", process_action::stop, 800, false, ""},
    {"delay_acks needs a duration", fault(fault_action::delay_acks, "rollout-c", fault_target::engine), false, "",
     process_action::stop, -1, false, "needs a duration_ms"},
    {"partition without namespaces", fault(fault_action::partition, "engines-b", fault_target::node, 2000), false, "",
     process_action::cut_link, -1, false, "only with --netns"},
    {"partition in namespaces", fault(fault_action::partition, "engines-b", fault_target::node, 2000), true,
     "engines-b", process_action::cut_link, 2000, false, ""},
    {"an engine's partition cuts its node", fault(fault_action::partition, "rollout-a", fault_target::engine), true,
     "engines-a", process_action::cut_link, -1, false, ""},
    {"heal in namespaces", fault(fault_action::heal, "engines-b", fault_target::node), true, "engines-b",
     process_action::restore_link, -1, false, ""},
    {"heal without namespaces", fault(fault_action::heal, "engines-b", fault_target::node), false, "",
     process_action::restore_link, -1, false, "only with --netns"},
    {"corrupt: a signal to the producer's process", fault(fault_action::corrupt, "rollout-a", fault_target::engine),
     false, "head", process_action::corrupt, -1, true, ""},
  };
  auto t = three_nodes();
  t.transfer.backend = transfer_backend::ucx;
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto p = plan_process_fault(t, r.f, r.netns, "T.yaml:9:7: drill.faults[0]");
    if (std::string(r.what) == "a node killed for good") {
      // Not a node that rlsync launch restarts on failure: the drill could not rehearse that.
      auto restarting = t;
      restarting.nodes[1].restart = node_restart::on_failure;
      const auto refused = plan_process_fault(restarting, r.f, r.netns, "T.yaml:9:7: drill.faults[0]");
      CHECK_FALSE(refused.fault);
      CHECK(contains(refused.refusal, "T.yaml:9:7: drill.faults[0]: kill of engines-a kills node engines-a for good, "
                                      "which has restart: on-failure"));
    }
    if (std::string(r.node).empty()) {
      CHECK_FALSE(p.fault);
      CHECK(contains(p.refusal, "T.yaml:9:7: drill.faults[0]: "));
      CHECK(contains(p.refusal, r.refusal));
      continue;
    }
    REQUIRE(p.fault);
    CHECK(p.refusal.empty());
    CHECK(p.fault->node == r.node);
    CHECK(p.fault->action == r.action);
    CHECK(p.fault->head == r.head);
    CHECK(p.fault->node_index == static_cast<std::size_t>(std::string(r.node) == "head" ? 0 : std::string(r.node) == "engines-a" ? 1 : 2));
    if (r.ends_after_ms < 0)
      CHECK_FALSE(p.fault->ends_after);
    else
      CHECK(p.fault->ends_after == milliseconds(r.ends_after_ms));
  }
}

TEST_CASE("process drill: corrupt signals every node hosting a trainer rank") {
  auto t = three_nodes();
  auto f = fault(fault_action::corrupt, "rollout-b", fault_target::engine);
  t.transfer.backend = transfer_backend::local;
  CHECK(contains(plan_process_fault(t, f, false, "T.yaml:3:3").refusal, "T.yaml:3:3: corrupt of rollout-b: "
                                                                        "with processes the UCX producer"));
  t.transfer.backend = transfer_backend::ucx;
  struct row {
    const char* what;
    const char* trainer_node;
    std::vector<trainer_rank> ranks;
    std::vector<std::string> rank_nodes; ///< empty: refused
    const char* node;
    bool head;
  };
  const row rows[] = {
    {"one trainer on the head", "head", {}, {"head"}, "head", true},
    {"one trainer on a member", "engines-a", {}, {"engines-a"}, "engines-a", false},
    {"every rank on the head", "head", {trainer_rank{"head", {0, 1, 2, 3}}}, {"head"}, "head", true},
    {"ranks on the head and a member", "head", {trainer_rank{"head", {0, 1}}, trainer_rank{"engines-b", {2, 3}}},
     {"head", "engines-b"}, "head", true},
    {"ranks on members only, in topology order", "engines-b",
     {trainer_rank{"engines-b", {0, 1}}, trainer_rank{"engines-a", {2, 3}}}, {"engines-a", "engines-b"}, "engines-a",
     false},
    {"no node hosts a rank", "nowhere", {trainer_rank{"nowhere", {0, 1, 2, 3}}}, {}, "", false},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    t.trainer.node = r.trainer_node;
    t.trainer.ranks = r.ranks;
    auto p = plan_process_fault(t, f, false, "T.yaml:3:3");
    if (r.rank_nodes.empty()) {
      CHECK_FALSE(p.fault);
      CHECK(contains(p.refusal, "T.yaml:3:3: corrupt of rollout-b: no node hosts a trainer rank"));
      continue;
    }
    REQUIRE(p.fault);
    CHECK(p.fault->action == process_action::corrupt);
    CHECK(p.fault->rank_nodes == r.rank_nodes);
    CHECK(p.fault->node == r.node); // not engines-b, where rollout-b runs: the producers are the ranks'
    CHECK(p.fault->head == r.head);
    CHECK_FALSE(p.fault->withhold_first);
  }
}

TEST_CASE("process drill: a rank's node killed or cut at transfer withholds a group first") {
  auto t = three_nodes();
  t.trainer.ranks = {trainer_rank{"head", {0, 1}}, trainer_rank{"engines-b", {2, 3}}};
  auto at = [](fault_spec f, std::optional<sync_phase> phase) {
    if (phase) {
      f.phase = *phase;
    } else {
      f.at_sync.reset();
      f.at = milliseconds(3000);
    }
    return f;
  };
  struct row {
    const char* what;
    fault_spec f;
    bool withhold_first;
  };
  const row rows[] = {
    {"kill at transfer", fault(fault_action::kill, "engines-b", fault_target::node, 2000), true},
    {"restart at transfer", fault(fault_action::restart, "engines-b", fault_target::node), true},
    {"partition at transfer", fault(fault_action::partition, "engines-b", fault_target::node, 2000), true},
    {"an engine of the rank's node", fault(fault_action::kill, "rollout-b", fault_target::engine, 2000), true},
    {"kill at finish", at(fault(fault_action::kill, "engines-b", fault_target::node, 2000), sync_phase::finish), false},
    {"kill at start", at(fault(fault_action::kill, "engines-b", fault_target::node, 2000), sync_phase::start), false},
    {"kill at a time", at(fault(fault_action::kill, "engines-b", fault_target::node, 2000), std::nullopt), false},
    {"a node without ranks", fault(fault_action::kill, "engines-a", fault_target::node, 2000), false},
    {"the head (it ends the round itself)", fault(fault_action::kill, "coordinator", fault_target::coordinator, 1000),
     false},
    {"delay_acks", fault(fault_action::delay_acks, "engines-b", fault_target::node, 800), false},
    {"heal", fault(fault_action::heal, "engines-b", fault_target::node), false},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto p = plan_process_fault(t, r.f, true, "T.yaml:9:7");
    REQUIRE(p.fault);
    CHECK(p.fault->withhold_first == r.withhold_first);
  }
}

TEST_CASE("process drill: a drill signal's order, encoded and decoded") {
  struct row {
    const char* what;
    drill_order o;
    bool fits;
  };
  const row rows[] = {
    {"any engine, any version", {std::nullopt, 0}, true},
    {"engine 0", {0u, 0}, true},
    {"engine 3, v12", {3u, 12}, true},
    {"a version only (withhold)", {std::nullopt, 77}, true},
    {"the largest of both", {max_drill_order_engine, max_drill_order_version}, true},
    {"an engine index too large", {max_drill_order_engine + 1, 5}, false},
    {"a version too large", {1u, max_drill_order_version + 1}, false},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto v = encode_drill_order(r.o);
    CHECK(v.has_value() == r.fits);
    if (!v)
      continue;
    CHECK(*v != ~std::uint64_t{0}); // the receiver's "no order"
    CHECK(decode_drill_order(*v) == r.o);
  }
  CHECK(decode_drill_order(0) == drill_order{std::nullopt, 0}); // a plain kill: any engine, any version
}

TEST_CASE("process drill: a node's order ring keeps every order up to its capacity, and counts the rest lost") {
  drill_order_ring ring;
  std::vector<std::uint64_t> taken;
  auto take = [&] { return ring.take([&](std::uint64_t v) { taken.push_back(v); }); };
  CHECK(take() == 0);
  CHECK(taken.empty());
  for (std::uint64_t i = 0; i < drill_order_ring::capacity + 3; ++i)
    ring.store(i);
  CHECK(take() == 3); // the three past the capacity, not the first three
  REQUIRE(taken.size() == drill_order_ring::capacity);
  for (std::uint64_t i = 0; i < drill_order_ring::capacity; ++i)
    CHECK(taken[i] == i);
  // Taken slots are free again, wherever the ring's cursor stands.
  taken.clear();
  ring.store(100);
  ring.store(101);
  CHECK(take() == 0);
  CHECK(taken == std::vector<std::uint64_t>{100, 101});
}

TEST_CASE("process drill: the first refused fault is named with its place and index") {
  auto t = three_nodes();
  std::vector<std::size_t> asked;
  auto place = [&](std::size_t i) {
    asked.push_back(i);
    return "T.yaml:" + std::to_string(30 + i) + ":7";
  };
  CHECK(contains(plan_process_drill(t, false, place).refusal, "no drill.faults"));
  t.drill.faults = {fault(fault_action::kill, "rollout-a", fault_target::engine, 500),
                    fault(fault_action::partition, "engines-b", fault_target::node, 500)};
  auto refused = plan_process_drill(t, false, place);
  CHECK(refused.faults.empty());
  CHECK(contains(refused.refusal, "T.yaml:31:7: drill.faults[1]: partition of engines-b"));
  auto planned = plan_process_drill(t, true, place);
  CHECK(planned.refusal.empty());
  REQUIRE(planned.faults.size() == 2);
  CHECK(planned.faults[0].node == "engines-a");
  CHECK(planned.faults[1].action == process_action::cut_link);
}

TEST_CASE("process drill: a fault's place in its YAML file") {
  auto dir = std::filesystem::temp_directory_path() / ("rlsync-fault-place-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto path = (dir / "t.yaml").string();
  std::ofstream(path) << "name: x\n"
                         "drill:\n"
                         "  faults:\n"
                         "    - {at_ms: 1, action: kill, target: a}\n"
                         "    - at_ms: 2\n"
                         "      action: kill\n";
  CHECK(fault_place(path, 0) == path + ":4:7");
  CHECK(fault_place(path, 1) == path + ":5:7");
  CHECK(fault_place(path, 2) == path); // no such fault: the file alone
  CHECK(fault_place((dir / "missing.yaml").string(), 0) == (dir / "missing.yaml").string());
  std::filesystem::remove_all(dir);
}

TEST_CASE("process drill: the head's phase lines, written and read back") {
  auto line = drill_phase_line(16, 17, sync_phase::transfer, {"rollout-a", "rollout-b"});
  CHECK(line == "rlsync-drill: phase round=16 version=17 phase=transfer engines=rollout-a,rollout-b");
  auto e = parse_drill_phase_line(line + "\n");
  REQUIRE(e);
  CHECK(e->round == 16);
  CHECK(e->version == 17);
  CHECK(e->phase == sync_phase::transfer);
  CHECK(e->engines == std::vector<std::string>{"rollout-a", "rollout-b"});
  // "continue" is how drills spell the resume phase; a round may have no engines.
  auto resume = parse_drill_phase_line(drill_phase_line(3, 2, sync_phase::resume, {}));
  REQUIRE(resume);
  CHECK(resume->phase == sync_phase::resume);
  CHECK(resume->engines.empty());
  CHECK(contains(drill_phase_line(3, 2, sync_phase::resume, {}), "phase=continue"));

  struct row {
    const char* line;
    bool parsed;
  };
  const row rows[] = {
    {"[head] rlsync-drill: phase round=1 version=1 phase=pause engines=a", true}, // a launcher's prefix
    {"rlsync-drill: phase round=1 version=1 phase=pause engines=a\r\n", true},
    {"rlsync-drill: phase round=18446744073709551615 version=0 phase=finish engines=a", true},
    {"rlsync-drill: phase round=18446744073709551616 version=0 phase=finish engines=a", false}, // overflow
    {"rlsync-drill: phase round=-1 version=0 phase=finish engines=a", false},
    {"rlsync-drill: phase round=1 version=x phase=finish engines=a", false},
    {"rlsync-drill: phase round=1 version=1 phase=later engines=a", false},
    {"rlsync-drill: phase round=1 version=1 phase=resume engines=a", false}, // drills say continue
    {"rlsync-drill: phase round=1 version=1 engines=a", false},
    {"rlsync-drill: phase round=1 version=1 phase=pause engines=a,", false},
    {"rlsync-drill: phase round=1 version=1 phase=pause engines=a,,b", false},
    {"rlsync-drill: phase round=1 version=1 phase=pause engines=a/b", false},
    {"rlsync-drill: phase round=1 version=1 phase=pause engines=a extra=1", false},
    {"rlsync-drill: phase round= version=1 phase=pause engines=a", false},
    {"sync 16 v17: 2 engines, stall 7.6 ms", false},
    {"[head no closing bracket", false},
    {"", false},
  };
  for (auto& r : rows) {
    CAPTURE(r.line);
    CHECK(parse_drill_phase_line(r.line).has_value() == r.parsed);
  }
}

TEST_CASE("process drill: round 1 is the first round that reaches every engine") {
  drill_rounds rounds({"rollout-a", "rollout-b"});
  struct row {
    std::uint64_t head_round;
    std::vector<std::string> engines;
    std::int64_t drill_round; ///< -1: not counted
  };
  const row rows[] = {
    {1, {}, -1},                             // the head is up, no engine joined yet
    {5, {"rollout-a"}, -1},                  // one node joined
    {7, {"rollout-b", "rollout-a"}, 1},      // the whole fleet: round 1
    {8, {"rollout-a"}, 2},                   // later rounds count on, whoever is in them
    {8, {"rollout-a"}, 2},                   // every phase of a round has its number
    {6, {"rollout-a", "rollout-b"}, -1},     // numbered below round 1
    {20, {}, 14},
  };
  for (auto& r : rows) {
    CAPTURE(r.head_round);
    drill_phase_event e;
    e.round = r.head_round;
    e.engines = r.engines;
    auto n = rounds.on_phase(e);
    if (r.drill_round < 0)
      CHECK_FALSE(n);
    else
      CHECK(n == static_cast<std::uint64_t>(r.drill_round));
  }
  CHECK(rounds.started());
}

TEST_CASE("process drill: with waves, round 1 is the first whose waves together reach every engine") {
  drill_rounds rounds({"a-0", "a-1", "b-0", "b-1"});
  struct row {
    std::uint64_t head_round;
    std::vector<std::string> engines;
    std::int64_t drill_round; ///< -1: not counted
  };
  const row rows[] = {
    {2, {"a-0", "a-1"}, -1},        // wave 1 of a round
    {3, {"b-0", "b-1"}, -1},        // another round: round 2's wave does not carry over
    {3, {"stranger", "a-0"}, -1},   // three of four: a name outside the topology counts for nothing
    {3, {"a-0", "b-1"}, -1},        // repeats count once
    {4, {"a-0", "a-1"}, -1},        // round 4, wave 1
    {4, {"b-0", "b-1"}, 1},         // its wave 2 completes the fleet: round 1
    {5, {"a-0", "a-1"}, 2},         // later rounds count on, one wave or several
  };
  for (auto& r : rows) {
    CAPTURE(r.head_round);
    drill_phase_event e;
    e.round = r.head_round;
    e.engines = r.engines;
    auto n = rounds.on_phase(e);
    if (r.drill_round < 0)
      CHECK_FALSE(n);
    else
      CHECK(n == static_cast<std::uint64_t>(r.drill_round));
  }
  CHECK(rounds.started());
}

TEST_CASE("process drill: no version goes backwards past a completed round") {
  // A phase event, or (synced) the round's end: engines reached it unless 0.
  struct event {
    std::uint64_t round, version;
    sync_phase phase;
    bool synced = false;
    std::uint64_t engines = 2;
    bool aborted = false;
  };
  const auto end_of = [](std::uint64_t round, std::uint64_t version, std::uint64_t engines = 2, bool aborted = false) {
    return event{round, version, sync_phase::resume, true, engines, aborted};
  };
  struct row {
    const char* what;
    std::vector<event> events;
    const char* regression; ///< empty: none
  };
  const row rows[] = {
    {"rounds in order",
     {{1, 1, sync_phase::resume}, end_of(1, 1), {2, 2, sync_phase::pause}, {2, 2, sync_phase::resume}, end_of(2, 2)},
     ""},
    {"a head killed mid-transfer syncs the last completed version again",
     {{15, 14, sync_phase::resume}, end_of(15, 14), {16, 15, sync_phase::transfer}, {16, 14, sync_phase::pause},
      {16, 14, sync_phase::resume}},
     ""},
    {"an aborted round continues but completes nothing",
     {{15, 14, sync_phase::resume}, end_of(15, 14), {16, 15, sync_phase::resume}, end_of(16, 15, 0, true),
      {17, 14, sync_phase::pause}},
     ""},
    {"a round aborted after a wave reached some engines completed its version",
     {{16, 15, sync_phase::resume}, end_of(16, 15, 1, true), {17, 14, sync_phase::pause}},
     "v14 (round 17) after v15 completed (round 16)"},
    {"a restarted head below a completed round",
     {{15, 14, sync_phase::resume}, end_of(15, 14), {16, 15, sync_phase::resume}, end_of(16, 15),
      {16, 14, sync_phase::pause}},
     "v14 (round 16) after v15 completed (round 16)"},
    {"only the first breach is named",
     {{3, 9, sync_phase::resume}, end_of(3, 9), {4, 2, sync_phase::pause}, {5, 1, sync_phase::pause}},
     "v2 (round 4) after v9 completed (round 3)"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    version_watch w;
    for (auto& e : r.events) {
      if (e.synced) {
        w.on_synced({e.version, e.engines, e.aborted});
        continue;
      }
      drill_phase_event p;
      p.round = e.round;
      p.version = e.version;
      p.phase = e.phase;
      w.on_phase(p);
    }
    CHECK(w.regression() == r.regression);
  }
}

TEST_CASE("process drill: the head's synced lines, written and read back") {
  sync_report r;
  r.version = 17;
  r.engines_synced = 2;
  CHECK(drill_synced_line(r) == "rlsync-drill: synced version=17 engines=2 aborted=0");
  r.aborted = true;
  auto e = parse_drill_synced_line("[head] " + drill_synced_line(r) + "\n");
  REQUIRE(e);
  CHECK(e->version == 17);
  CHECK(e->engines == 2);
  CHECK(e->aborted);
  for (const char* bad : {"rlsync-drill: synced version=1 engines=2", "rlsync-drill: synced version=1 engines=2 aborted=2",
                          "rlsync-drill: synced version=x engines=2 aborted=0",
                          "rlsync-drill: synced version=1 engines=2 aborted=0 more=1",
                          "rlsync-drill: phase round=1 version=1 phase=pause engines=a"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_drill_synced_line(bad));
  }
}

TEST_CASE("process drill: the job stops once a round after the last fault reached every engine") {
  fleet_recovery_watch watch({"a-0", "a-1", "b-0"});
  struct row {
    bool arm_before;  ///< every fault is over as this event comes
    std::uint64_t head_round;
    sync_phase phase;
    std::vector<std::string> engines;
    int ends;         ///< 0: a phase event; 1: the round ends; 2: it ends aborted
    bool recovered;
  };
  const row rows[] = {
    {false, 3, sync_phase::resume, {"a-0", "a-1", "b-0"}, 0, false}, // before the faults ended: does not count
    {false, 3, sync_phase::resume, {}, 1, false},
    {true, 4, sync_phase::transfer, {"a-0", "a-1", "b-0"}, 0, false}, // not yet continued
    {false, 4, sync_phase::resume, {"a-0", "a-1"}, 0, false},         // b-0 still out
    {false, 4, sync_phase::resume, {}, 1, false},
    {false, 5, sync_phase::resume, {"b-0", "stranger"}, 0, false},    // another round's wave
    {false, 5, sync_phase::resume, {"a-0", "b-0"}, 0, false},         // repeats count once
    {false, 5, sync_phase::resume, {"a-1"}, 0, false},                // every engine continued, the round not ended
    {false, 5, sync_phase::resume, {}, 2, false},                     // aborted: they serve their old version
    {false, 6, sync_phase::resume, {"a-0", "a-1", "b-0"}, 0, false},
    {false, 6, sync_phase::resume, {}, 1, true},                      // completed: the fleet is back
    {false, 7, sync_phase::resume, {"a-0"}, 0, true},                 // and stays so
  };
  for (auto& r : rows) {
    CAPTURE(r.head_round);
    CAPTURE(r.ends);
    if (r.arm_before)
      watch.arm();
    if (r.ends > 0) {
      watch.on_synced({r.head_round, 3, r.ends == 2});
    } else {
      drill_phase_event e;
      e.round = r.head_round;
      e.phase = r.phase;
      e.engines = r.engines;
      watch.on_phase(e);
    }
    CHECK(watch.recovered() == r.recovered);
  }
  CHECK(watch.armed());
}
