#pragma once
// The coordinator under test on the deterministic scheduler (actor_fixture.hpp),
// with scripted engines (scripted_engine.hpp) that the test tells, per phase,
// to answer, hold, fail, die, answer for the wrong version or fall silent, a
// scripted router that writes down what the coordinator tells it, and helpers
// that read what the engines saw: which phases, in which global order (the
// barrier), which heartbeats.
#include "actors/coordinator.hpp"
#include "tests/support/actor_fixture.hpp"
#include "tests/support/scripted_engine.hpp"
#include "tests/support/scripted_router.hpp"
#include "tests/support/scripted_trainer.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rlsync::test {

/// A scripted engine the fixture spawned, and its script.
struct engine_handle {
  scripted_engine_actor actor;
  std::shared_ptr<engine_script> script;

  void on(sync_phase p, act a) { script->on[p] = a; }
};

struct coordinator_fixture : actor_fixture {
  std::shared_ptr<engine_journal> journal = std::make_shared<engine_journal>();
  std::shared_ptr<router_script> router_seen = std::make_shared<router_script>();
  // Views into the journal and the router's record (sharing their ownership).
  std::shared_ptr<std::vector<arrival>> arrivals{journal, &journal->phases};
  std::shared_ptr<std::vector<std::string>> routes{router_seen, &router_seen->routes};
  std::shared_ptr<std::vector<std::uint64_t>> published{router_seen, &router_seen->published};
  std::shared_ptr<std::vector<heartbeat>> beats{journal, &journal->beats};
  std::vector<std::string> log_lines;
  /// "<engine> <what>" per on_member call, and every report, in order.
  std::vector<std::string> member_events;
  std::vector<sync_report> reports;
  router_actor router;
  coordinator_actor coord;
  std::map<std::string, engine_handle> engines;
  registration last_registration;

  coordinator_config config() {
    coordinator_config c; // the topology's default deadlines: pause 5 s, flush 1 s, ...
    c.router = router;
    c.log = [this](const std::string& line) { log_lines.push_back(line); };
    c.on_member = [this](const std::string& engine, const std::string& what) {
      member_events.push_back(engine + " " + what);
    };
    c.on_report = [this](const sync_report& r) { reports.push_back(r); };
    return c;
  }

  /// Heartbeats every 100 ms; silent for more than 300 ms: unreachable.
  coordinator_config heartbeat_config() {
    auto c = config();
    c.heartbeat_interval = std::chrono::milliseconds{100};
    c.heartbeat_timeout = std::chrono::milliseconds{300};
    return c;
  }

  /// `n` heartbeat intervals of 100 ms, one at a time: every tick fires.
  void ticks(int n) {
    for (int i = 0; i < n; ++i)
      advance(std::chrono::milliseconds{100});
  }

  void start() {
    start(config());
  }

  void start(coordinator_config c) {
    coord = spawn(coordinator, std::move(c));
    run();
  }

  coordinator_fixture() {
    router = spawn(scripted_router, router_seen);
  }

  // The coordinator's callbacks write into this fixture's members.
  ~coordinator_fixture() {
    shutdown();
  }

  coordinator_fixture(const coordinator_fixture&) = delete;
  coordinator_fixture& operator=(const coordinator_fixture&) = delete;

  /// Spawns a scripted engine and registers it; its cold-sync round runs to the
  /// end unless the test has told some engine to hold.
  engine_handle& add_engine(const std::string& name, std::uint64_t incarnation = 0,
                            std::map<sync_phase, act> on = {}) {
    auto& e = spawn_engine(name, std::move(on));
    auto reg = join(engine_info{name, "node", 1, 0, false, incarnation}, e);
    REQUIRE(reg);
    last_registration = *reg;
    CHECK(!last_registration.routable); // never routable before a completed round
    return engines[name];
  }

  /// Scripted trainer `t` publishes `vi` to its listeners: the coordinator
  /// takes versions from its current trainer only.
  void publish_from(const trainer_actor& t, const version_info& vi) {
    tell(caf::actor_cast<scripted_trainer_actor>(t), caf::publish_atom::value, vi);
  }

  /// Spawns a scripted engine (replacing the fixture's record of that name)
  /// without registering it.
  engine_handle& spawn_engine(const std::string& name, std::map<sync_phase, act> on = {}) {
    auto script = std::make_shared<engine_script>();
    script->on = std::move(on);
    auto actor = spawn(scripted_engine, name, script, journal);
    return engines[name] = engine_handle{actor, script};
  }

  /// Registers `e` as `info` and runs what follows (its cold sync, unless held).
  caf::expected<registration> join(const engine_info& info, const engine_handle& e) {
    auto reg = request<registration>(coord, register_atom::value, info,
                                     caf::actor_cast<rollout_engine_actor>(e.actor));
    run();
    REQUIRE(reg->has_value());
    return **reg;
  }

  void kill(const engine_handle& e) {
    caf::anon_send_exit(e.actor, caf::exit_reason::kill);
    run();
  }

  /// Whether some log line contains `text`.
  bool logged(const std::string& text) const {
    return std::any_of(log_lines.begin(), log_lines.end(),
                       [&](const std::string& l) { return l.find(text) != std::string::npos; });
  }

  engine_info member_info(const std::string& name) {
    for (auto& m : status().members)
      if (m.name == name)
        return m;
    FAIL("not a member: " << name);
    return {};
  }

  void publish(std::uint64_t v, std::uint32_t groups = 4) {
    tell(coord, version_atom::value, version_info{v, groups, 4096});
    run();
  }

  void release(const std::string& name) {
    caf::anon_send(engines.at(name).actor, release_atom::value);
    run();
  }

  /// Forgets what the setup rounds left in the records.
  void forget_history() {
    arrivals->clear();
    routes->clear();
    beats->clear();
    log_lines.clear();
    member_events.clear();
    reports.clear();
    for (auto& [name, e] : engines) {
      e.script->pauses.clear();
      e.script->starts.clear();
      e.script->orders.clear();
    }
  }

  coordinator_status status() {
    auto s = request<coordinator_status>(coord, status_atom::value);
    run();
    REQUIRE(s->has_value());
    REQUIRE_MESSAGE(**s, (**s ? std::string{} : caf::to_string((*s)->error())));
    return ***s;
  }

  sync_report last_report() {
    auto s = status();
    REQUIRE(!s.history.empty());
    return s.history.back();
  }

  bool routable(const std::string& name) {
    auto r = status().routable;
    return std::find(r.begin(), r.end(), name) != r.end();
  }

  bool member(const std::string& name) {
    auto s = status();
    return std::any_of(s.members.begin(), s.members.end(),
                       [&](const engine_info& i) { return i.name == name; });
  }

  /// Phases `engine` received, in order.
  std::vector<sync_phase> seen_by(const std::string& engine) const {
    std::vector<sync_phase> out;
    for (auto& a : *arrivals)
      if (a.engine == engine)
        out.push_back(a.phase);
    return out;
  }

  /// The sequence numbers of the heartbeats `engine` received, in order.
  std::vector<std::uint64_t> beats_of(const std::string& engine) const {
    std::vector<std::uint64_t> out;
    for (auto& hb : *beats)
      if (hb.from == engine)
        out.push_back(hb.seq);
    return out;
  }

  std::uint64_t probe(const slot<std::uint64_t>& s) {
    REQUIRE(s->has_value());
    REQUIRE(**s);
    return ***s;
  }

  std::size_t count(sync_phase p) const {
    return std::count_if(arrivals->begin(), arrivals->end(),
                         [&](const arrival& a) { return a.phase == p; });
  }

  /// The barrier, seen from the engines: within one round, the phases
  /// arrive in non-decreasing order across all engines.
  void check_barrier_order() const {
    for (std::size_t i = 1; i < arrivals->size(); ++i) {
      CAPTURE(i);
      CAPTURE((*arrivals)[i].engine);
      CHECK((*arrivals)[i - 1].phase <= (*arrivals)[i].phase);
    }
  }
};

/// What an engine sees of a completed round.
inline const std::vector<sync_phase> all_phases = {sync_phase::pause,    sync_phase::flush,
                                                   sync_phase::start,    sync_phase::transfer,
                                                   sync_phase::finish,   sync_phase::resume};

/// A coordinator following a scripted trainer (at v2), with engines a and b
/// synced to v2 and routable.
struct coordinator_trainer_fixture : coordinator_fixture {
  std::shared_ptr<trainer_script> rec = std::make_shared<trainer_script>();
  trainer_actor trainer;

  void start_with_trainer(coordinator_config c) {
    trainer = spawn(scripted_trainer, rec);
    c.trainer = trainer;
    start(c);
    add_engine("a");
    add_engine("b");
    REQUIRE(routable("a"));
    REQUIRE(routable("b"));
    REQUIRE(status().version == 2);
    forget_history();
  }

  /// The trainer publishes v3; the round runs until the engines hold (or answer) transfer.
  void publish_through_trainer(std::uint64_t v) {
    REQUIRE(!rec->listeners.empty());
    publish_from(trainer, version_info{v, 4, 4096});
    run();
  }

  void kill_trainer() {
    caf::anon_send_exit(trainer, caf::exit_reason::kill);
    run();
  }
};

/// What an engine sees of a round aborted during its transfer.
inline const std::vector<sync_phase> aborted_phases = {sync_phase::pause, sync_phase::flush, sync_phase::start,
                                                       sync_phase::transfer, sync_phase::resume};

} // namespace rlsync::test
