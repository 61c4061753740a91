// Authorization on every message: for each guarded actor (coordinator,
// router, trainer, engine) and each message a peer can send, a sender that
// is not admitted is refused (a request gets errc::unauthenticated, a
// one-way message is dropped), the refusal is counted and nothing changes;
// an admitted sender is served. In one actor system every sender has the
// same node id, so the tests inject the policy: it names the "outsider"
// actors as not admitted. The last case is two actor systems over loopback,
// where the outsider is a real second node nobody admitted.
#include "actors/coordinator.hpp"
#include "actors/assembly/local_deployment.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/rollout_engine.hpp"
#include "actors/router.hpp"
#include "actors/sender_guard.hpp"
#include "actors/system_config.hpp"
#include "actors/trainer.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "tests/support/coordinator_fixture.hpp"
#include "tests/support/engine_fixtures.hpp"
#include "tests/support/recording_sink.hpp"
#include "tests/support/scripted_engine.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <doctest/doctest.h>

#include <deque>
#include <functional>
#include <set>

using namespace rlsync;
using namespace rlsync::test;
using namespace std::chrono_literals;

namespace {

/// The outsiders of one test: actors the injected policy does not admit.
template <class Base>
struct with_outsiders : Base {
  std::shared_ptr<std::set<caf::actor_id>> outsiders = std::make_shared<std::set<caf::actor_id>>();
  caf::actor outsider;
  std::vector<std::string> refusals; ///< the guards' log lines

  /// Admits every sender but the outsiders.
  sender_policy policy() const {
    auto ids = outsiders;
    return [ids](const caf::strong_actor_ptr& sender) { return ids->count(sender->id()) == 0; };
  }

  std::function<void(const std::string&)> refusal_log() {
    return [this](const std::string& line) { refusals.push_back(line); };
  }

  /// A one-way message from an outsider.
  template <class Handle, class... Ts>
  void tell_as_outsider(const Handle& dst, Ts&&... xs) {
    if (!outsider) {
      outsider = this->spawn([](caf::event_based_actor* self) -> caf::behavior {
        self->set_default_handler(caf::skip); // keeps answers to its messages, replies nothing
        return {[](caf::exit_msg&) {}};
      });
      outsiders->insert(outsider.id());
    }
    caf::send_as(outsider, dst, std::forward<Ts>(xs)...);
  }

  /// A request from a fresh outsider; the answer lands in the slot.
  template <class T, class Handle, class... Ts>
  typename Base::template slot<T> ask_as_outsider(const Handle& dst, Ts... xs) {
    auto out = std::make_shared<std::optional<caf::expected<T>>>();
    auto client = this->sys.spawn([=](caf::event_based_actor* self) {
      self->request(dst, std::chrono::seconds(3600), xs...)
        .then([=](T& x) { *out = std::move(x); }, [=](caf::error& err) { *out = std::move(err); });
    });
    outsiders->insert(client.id()); // before it runs: spawning only schedules it
    return out;
  }

  /// The refused request's error, after running what is queued.
  template <class T>
  caf::error refusal_of(const typename Base::template slot<T>& s) {
    this->run();
    REQUIRE(s->has_value());
    REQUIRE_FALSE(**s);
    return (*s)->error();
  }
};

/// One message a peer can send; `request`: its refusal is an error reply.
template <class Fixture>
struct message_row {
  const char* message;
  std::function<std::optional<caf::error>(Fixture&)> send_as_outsider;
};

// -- the coordinator -------------------------------------------------------------------

struct coordinator_authz : with_outsiders<coordinator_fixture> {
  void start_guarded() {
    auto c = config();
    c.authorize = policy();
    start(c);
    add_engine("a");
    add_engine("b");
    publish(1);
    REQUIRE(status().routable.size() == 2);
    forget_history();
  }

  /// What no refused message may change: members, who serves, version, rounds.
  std::string membership() {
    auto s = status();
    std::string out = "v" + std::to_string(s.version) + " rounds " + std::to_string(s.rounds) + ":";
    for (auto& m : s.members)
      out += " " + m.name + "@" + std::to_string(m.version);
    out += " routable:";
    for (auto& r : s.routable)
      out += " " + r;
    return out;
  }

  template <class T, class... Ts>
  std::optional<caf::error> ask(Ts... xs) {
    return refusal_of<T>(ask_as_outsider<T>(coord, xs...));
  }
  template <class... Ts>
  std::optional<caf::error> one_way(Ts&&... xs) {
    tell_as_outsider(coord, std::forward<Ts>(xs)...);
    run();
    return std::nullopt;
  }
};

TEST_CASE_FIXTURE(coordinator_authz, "the coordinator refuses every message of a sender not admitted") {
  using F = coordinator_authz;
  auto outsider_router = spawn(scripted_router, std::make_shared<router_script>());
  auto outsider_engine = caf::actor_cast<rollout_engine_actor>(spawn_engine("c").actor);
  auto outsider_rank = caf::actor_cast<trainer_actor>(spawn(scripted_trainer, std::make_shared<trainer_script>()));
  const message_row<F> rows[] = {
    {"register an engine",
     [&](F& f) { return f.ask<registration>(register_atom::value, engine_info{"c", "n", 1, 0, false, 1}, outsider_engine); }},
    {"register a trainer rank",
     [&](F& f) { return f.ask<registration>(register_atom::value, rank_info{0, "n", 1, {"a"}}, outsider_rank); }},
    {"deregister", [](F& f) { return f.one_way(deregister_atom::value, std::string{"a"}); }},
    {"attach a router",
     [&](F& f) { return f.one_way(register_atom::value, caf::actor_cast<router_actor>(outsider_router)); }},
    {"a version", [](F& f) { return f.one_way(version_atom::value, version_info{9, 4, 4096}); }},
    {"sync", [](F& f) { return f.ask<sync_report>(sync_atom::value); }},
    {"status", [](F& f) { return f.ask<coordinator_status>(status_atom::value); }},
    {"digest", [](F& f) { return f.ask<std::vector<weight_digest>>(digest_atom::value); }},
    {"heartbeat", [](F& f) { return f.one_way(heartbeat_atom::value, heartbeat{"a", 7}); }},
    {"probe", [](F& f) { return f.ask<std::uint64_t>(probe_atom::value, std::uint32_t{3}); }},
    {"tick", [](F& f) {
       f.tell_as_outsider(caf::actor_cast<coordinator_impl_actor>(f.coord), caf::tick_atom::value);
       f.run();
       return std::optional<caf::error>{};
     }},
    {"a phase answer", [](F& f) { return f.one_way(phase_done_atom::value, std::uint64_t{1}, phase_ack{"a", 9}); }},
    {"a phase failure", [](F& f) {
       return f.one_way(phase_done_atom::value, std::uint64_t{1}, caf::make_error(caf::sec::runtime_error));
     }},
    {"a phase deadline", [](F& f) {
       f.tell_as_outsider(caf::actor_cast<coordinator_impl_actor>(f.coord), caf::timeout_atom::value, std::uint64_t{1});
       f.run();
       return std::optional<caf::error>{};
     }},
  };
  start_guarded();
  auto before = membership();
  std::uint64_t refused = 0;
  for (auto& row : rows) {
    CAPTURE(row.message);
    auto err = row.send_as_outsider(*this);
    if (err)
      CHECK(is(*err, errc::unauthenticated));
    CHECK(status().refused == ++refused);
    CHECK(membership() == before);
    CHECK(arrivals->empty()); // no round, no phase sent to any engine
    CHECK(routes->empty());
  }
  CHECK(refusals.empty()); // the guard logs through cfg.log, where the fixture keeps lines
  CHECK(logged("coordinator: refused 'deregister' from actor"));
  // An anonymous sender is refused too.
  caf::anon_send(coord, deregister_atom::value, std::string{"a"});
  run();
  CHECK(status().refused == refused + 1);
  CHECK(membership() == before);
  // A stray error message (any peer can send one) no longer ends it.
  caf::anon_send(caf::actor_cast<caf::actor>(coord), caf::make_error(caf::sec::runtime_error));
  run();
  CHECK(status().refused == refused + 2);
  // (its log line is past the rate limit's burst by now: counted, not logged)
  // An admitted sender is served: the same deregistration now takes effect.
  tell(coord, deregister_atom::value, std::string{"a"});
  run();
  CHECK(status().members.size() == 1);
}

// -- the router ------------------------------------------------------------------------

struct router_authz : with_outsiders<actor_fixture> {
  std::shared_ptr<sink_record> tokens = std::make_shared<sink_record>();
  token_sink_actor sink = spawn(recording_sink, tokens);
  std::shared_ptr<engine_journal> journal = std::make_shared<engine_journal>();
  std::shared_ptr<engine_script> script = std::make_shared<engine_script>();
  rollout_engine_actor engine;
  router_actor router;

  router_authz() {
    engine = caf::actor_cast<rollout_engine_actor>(spawn(scripted_engine, std::string{"e"}, script, journal));
    router_config c;
    c.log = refusal_log();
    router = spawn_router(sys, c, policy());
    stop_first(router);
    tell(router, route_atom_v, route_update{"e", 1, true}, engine);
    run();
  }

  router_status status() {
    auto s = request<router_status>(router, status_atom_v);
    run();
    REQUIRE(*s);
    REQUIRE(**s);
    return ***s;
  }

  static generate_request request_of(std::uint64_t id) {
    generate_request r;
    r.request_id = id;
    r.prompt = {1, 2, 3};
    r.sampling.max_tokens = 2;
    return r;
  }
};

TEST_CASE_FIXTURE(router_authz, "the router refuses every message of a sender not admitted") {
  using F = router_authz;
  auto other = caf::actor_cast<rollout_engine_actor>(spawn(scripted_engine, std::string{"x"}, script, journal));
  auto ask_generate = [](F& f) -> std::optional<caf::error> {
    return f.refusal_of<generate_result>(f.ask_as_outsider<generate_result>(f.router, generate_atom_v, request_of(1), f.sink));
  };
  auto one_way = [](auto... xs) {
    return [=](F& f) -> std::optional<caf::error> {
      f.tell_as_outsider(f.router, xs...);
      f.run();
      return std::nullopt;
    };
  };
  const message_row<F> rows[] = {
    {"generate", ask_generate},
    {"route another engine", [&](F& f) {
       f.tell_as_outsider(f.router, route_atom_v, route_update{"x", 1, true}, other);
       f.run();
       return std::optional<caf::error>{};
     }},
    {"route: the engine unroutable", [](F& f) {
       f.tell_as_outsider(f.router, route_atom_v, route_update{"e", 1, false}, f.engine);
       f.run();
       return std::optional<caf::error>{};
     }},
    {"evict", one_way(evict_atom_v, std::string{"e"})},
    {"failed", one_way(failed_atom_v, std::string{"e"})},
    {"a newer version", one_way(version_atom_v, version_info{9, 4, 4096})}, // would make e stale
    {"status", [](F& f) -> std::optional<caf::error> {
       return f.refusal_of<router_status>(f.ask_as_outsider<router_status>(f.router, status_atom_v));
     }},
    {"heartbeat", [](F& f) -> std::optional<caf::error> {
       return f.refusal_of<heartbeat>(f.ask_as_outsider<heartbeat>(f.router, heartbeat_atom_v, heartbeat{"x", 1}));
     }},
  };
  std::uint64_t refused = 0;
  for (auto& row : rows) {
    CAPTURE(row.message);
    auto err = row.send_as_outsider(*this);
    if (err)
      CHECK(is(*err, errc::unauthenticated));
    auto s = status();
    CHECK(s.refused == ++refused);
    CHECK(s.routable == 1); // e still serves, x was never added
    CHECK(s.completed + s.rejected + s.outstanding + s.queued == 0);
  }
  CHECK(journal->dispatched.empty()); // no engine saw a request
  REQUIRE(!refusals.empty());
  CHECK(refusals.front().find("router: refused 'generate' from actor") != std::string::npos);
  // Admitted: the same request is served.
  auto ok = request<generate_result>(router, generate_atom_v, request_of(2), sink);
  run();
  REQUIRE(*ok);
  CHECK(**ok);
}

// -- the trainer -----------------------------------------------------------------------

/// Jobs wait until the test runs them.
struct held_runner final : job_runner {
  std::deque<std::function<void()>> jobs;
  bool post(std::function<void()> job) override {
    jobs.push_back(std::move(job));
    return true;
  }
};

struct trainer_authz : with_outsiders<actor_fixture> {
  std::shared_ptr<held_runner> runner = std::make_shared<held_runner>();
  trainer_impl_actor impl;
  trainer_actor trainer;
  std::shared_ptr<std::vector<version_info>> heard = std::make_shared<std::vector<version_info>>();

  trainer_authz() {
    trainer_config c;
    c.source = small_source(small_model(2));
    c.step_time = 100ms;
    c.runner = runner;
    c.log = refusal_log();
    c.authorize = policy();
    c.placements_from = policy();
    impl = spawn(rlsync::trainer, c);
    trainer = caf::actor_cast<trainer_actor>(impl);
    step(); // v1
  }

  void step() {
    run();
    REQUIRE(!runner->jobs.empty());
    auto job = std::move(runner->jobs.front());
    runner->jobs.pop_front();
    job();
    run();
  }

  std::uint64_t version() {
    auto v = request<version_info>(trainer, version_atom::value);
    run();
    REQUIRE(*v);
    REQUIRE(**v);
    return (***v).version;
  }

  std::uint64_t refused() {
    auto* ptr = caf::actor_cast<caf::abstract_actor*>(impl);
    auto& st = dynamic_cast<trainer_impl_actor::stateful_pointer<trainer_state>>(ptr)->state;
    return st.guard->refused() + st.data_guard->refused() + st.placements_guard->refused();
  }

  version_listener_actor listener() {
    auto seen = heard;
    return spawn([seen](version_listener_actor::pointer) -> version_listener_actor::behavior_type {
      return {[seen](version_atom, const version_info& v) { seen->push_back(v); }};
    });
  }
};

TEST_CASE_FIXTURE(trainer_authz, "the trainer refuses every message of a sender not admitted") {
  using F = trainer_authz;
  REQUIRE(version() == 1);
  auto ask = [](auto tag, auto... xs) {
    using T = typename decltype(tag)::type;
    return [=](F& f) -> std::optional<caf::error> {
      return f.refusal_of<T>(f.ask_as_outsider<T>(f.trainer, xs...));
    };
  };
  auto one_way = [](auto... xs) {
    return [=](F& f) -> std::optional<caf::error> {
      f.tell_as_outsider(f.impl, xs...);
      f.run();
      return std::nullopt;
    };
  };
  struct tag_meta { using type = std::vector<tensor_meta>; };
  struct tag_version { using type = version_info; };
  struct tag_bucket { using type = weight_bucket; };
  struct tag_beat { using type = heartbeat; };
  const message_row<F> rows[] = {
    {"meta", ask(tag_meta{}, meta_atom::value)},
    {"version", ask(tag_version{}, version_atom::value)},
    {"pull weights", ask(tag_bucket{}, pull_atom::value, std::uint64_t{1}, std::uint32_t{0})},
    {"subscribe", [](F& f) -> std::optional<caf::error> {
       f.tell_as_outsider(f.trainer, subscribe_atom::value, f.listener());
       f.run();
       return std::nullopt;
     }},
    {"freeze", ask(tag_version{}, freeze_atom::value)},
    {"pin", one_way(pin_atom::value, std::uint64_t{1})},
    {"step", ask(tag_version{}, step_atom::value)},
    {"heartbeat", ask(tag_beat{}, heartbeat_atom::value, heartbeat{"x", 1})},
    {"a forged step result", one_way(produced_atom::value, version_info{7, 4, 4096, {}})},
    {"a forged step failure", one_way(produced_atom::value, std::string{"forged"})},
    {"a forged catch-up", one_way(catch_up_atom::value, std::uint64_t{9})},
    {"a forged packed reply", one_way(packed_atom::value, std::uint64_t{1}, weight_bucket{})},
    {"a forged packing failure", one_way(packed_atom::value, std::uint64_t{1}, std::string{"forged"})},
    {"tick", one_way(caf::tick_atom::value)},
    {"engine placements", one_way(register_atom::value, std::vector<engine_placement>{{"e", "N"}})},
  };
  std::uint64_t refused_so_far = 0;
  for (auto& row : rows) {
    CAPTURE(row.message);
    auto err = row.send_as_outsider(*this);
    if (err)
      CHECK(is(*err, errc::unauthenticated));
    CHECK(refused() == ++refused_so_far);
    CHECK(version() == 1);
    CHECK(runner->jobs.empty()); // no step started
  }
  CHECK(heard->empty()); // the outsider's listener was never subscribed
  // Not frozen by the outsider: the next step (its timer) publishes v2.
  advance(100ms);
  step();
  CHECK(version() == 2);
  CHECK(heard->empty());
  // Admitted: a subscription is served at once with the current version.
  tell(trainer, subscribe_atom::value, listener());
  run();
  REQUIRE(heard->size() == 1);
  CHECK(heard->front().version == 2);
}

// -- the engine ------------------------------------------------------------------------

struct engine_authz : with_outsiders<actor_fixture> {
  rollout_engine_impl impl;
  rollout_engine_actor engine;
  std::shared_ptr<sink_record> tokens = std::make_shared<sink_record>();
  token_sink_actor sink = spawn(recording_sink, tokens);

  engine_authz() {
    rollout_engine_config cfg;
    cfg.model = tiny_config();
    cfg.options.name = "rollout-0";
    cfg.self_stepping = false;
    cfg.authorize = policy();
    cfg.log = refusal_log();
    impl = spawn(rollout_engine, cfg);
    engine = caf::actor_cast<rollout_engine_actor>(impl);
  }

  engine_status status() {
    auto s = request<engine_status>(engine, status_atom::value);
    run();
    REQUIRE(*s);
    REQUIRE(**s);
    return ***s;
  }
};

TEST_CASE_FIXTURE(engine_authz, "an engine refuses the orders of anyone but its drivers") {
  using F = engine_authz;
  auto ask = [](auto tag, auto... xs) {
    using T = typename decltype(tag)::type;
    return [=](F& f) -> std::optional<caf::error> {
      return f.refusal_of<T>(f.ask_as_outsider<T>(f.engine, xs...));
    };
  };
  struct tag_report { using type = pause_report; };
  struct tag_ack { using type = phase_ack; };
  struct tag_bytes { using type = std::uint64_t; };
  struct tag_transfer { using type = transfer_report; };
  struct tag_result { using type = generate_result; };
  struct tag_found { using type = bool; };
  struct tag_status { using type = engine_status; };
  struct tag_beat { using type = heartbeat; };
  struct tag_digest { using type = weight_digest; };
  generate_request req;
  req.request_id = 1;
  req.prompt = engine::encode("hello");
  req.sampling.max_tokens = 4;
  const message_row<F> rows[] = {
    {"pause", ask(tag_report{}, pause_atom::value, pause_request{pause_mode::abort, true})},
    {"flush", ask(tag_ack{}, flush_atom::value)},
    {"start", ask(tag_ack{}, start_atom::value, std::uint64_t{5})},
    {"update", ask(tag_bytes{}, update_atom::value, weight_bucket{})},
    {"transfer", ask(tag_transfer{}, transfer_atom::value, transfer_order{5, transfer_mode::sharded, "local", {}}, std::vector<trainer_actor>{})},
    {"finish", ask(tag_ack{}, finish_atom::value, std::uint64_t{5})},
    {"resume", ask(tag_ack{}, resume_atom::value)},
    {"generate", [&](F& f) -> std::optional<caf::error> {
       return f.refusal_of<generate_result>(f.ask_as_outsider<generate_result>(f.engine, generate_atom::value, req, f.sink));
     }},
    {"abort", ask(tag_found{}, abort_atom::value, std::uint64_t{1})},
    {"status", ask(tag_status{}, status_atom::value)},
    {"heartbeat", ask(tag_beat{}, heartbeat_atom::value, heartbeat{"x", 1})},
    {"digest", ask(tag_digest{}, digest_atom::value)},
    {"nccl join", ask(tag_bytes{}, nccl_join_atom::value, nccl_rendezvous_msg{})},
    {"phase order", [](F& f) -> std::optional<caf::error> { // one way: refused before it reaches pause
       phase_order order;
       order.phase = sync_phase::pause;
       order.deadline_ms = 1000;
       order.pause = pause_request{pause_mode::abort, true};
       f.tell_as_outsider(f.engine, phase_atom::value, order);
       f.run();
       return std::nullopt;
     }},
    {"route", [](F& f) -> std::optional<caf::error> { // one way: naming a router is the coordinator's word
       f.tell_as_outsider(f.engine, route_atom::value, heartbeat_actor{});
       f.run();
       return std::nullopt;
     }},
    {"step", [](F& f) -> std::optional<caf::error> {
       f.tell_as_outsider(f.impl, step_atom::value);
       f.run();
       return std::nullopt;
     }},
  };
  auto before = status();
  std::uint64_t refused = 0;
  for (auto& row : rows) {
    CAPTURE(row.message);
    auto err = row.send_as_outsider(*this);
    if (err)
      CHECK(is(*err, errc::unauthenticated));
    auto s = status();
    CHECK(s.refused == ++refused);
    CHECK(s.version == before.version);
    CHECK(s.state == scheduler_state::unpaused); // the outsider's pause never landed
    CHECK(s.running + s.waiting == 0);
  }
  CHECK(tokens->tokens.empty());
  REQUIRE(!refusals.empty());
  CHECK(refusals.front().find("engine rollout-0: refused 'pause'") != std::string::npos);
  // Its driver is obeyed.
  auto paused = request<pause_report>(engine, pause_atom::value, pause_request{pause_mode::abort, false});
  run();
  REQUIRE(*paused);
  CHECK(**paused);
  CHECK(status().state != scheduler_state::unpaused);
}

TEST_CASE("a member engine's drivers: this process and the actors of its grant") {
  auto trusted = std::make_shared<trusted_actors>();
  actor_fixture fx;
  auto a = fx.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
  auto b = fx.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
  auto sa = caf::actor_cast<caf::strong_actor_ptr>(a);
  auto sb = caf::actor_cast<caf::strong_actor_ptr>(b);
  CHECK_FALSE(trusted->contains(sa));
  trusted->assign({a.address()});
  CHECK(trusted->contains(sa));
  CHECK_FALSE(trusted->contains(sb));
  trusted->assign({b.address(), caf::actor_addr{}}); // a rejoin: the new grant replaces the old
  CHECK_FALSE(trusted->contains(sa));
  CHECK(trusted->contains(sb));
  // Both policies admit this process's actors whatever the sets say.
  CHECK(local_or_trusted(fx.sys.node(), trusted)(sa));
  CHECK(local_or_admitted(fx.sys.node(), {})(sa));
  // A policy over another node admits only what its set says.
  auto elsewhere = caf::make_node_id(7, "0102030405060708090a0b0c0d0e0f1011121314");
  REQUIRE(elsewhere);
  REQUIRE(*elsewhere != fx.sys.node());
  CHECK(local_or_trusted(*elsewhere, trusted)(sb));
  CHECK_FALSE(local_or_trusted(*elsewhere, trusted)(sa));
  CHECK_FALSE(local_or_admitted(*elsewhere, {})(sa));
  CHECK(local_or_admitted(*elsewhere, [&](const caf::node_id& n) { return n == fx.sys.node(); })(sa));
}

TEST_CASE("engine placements: a list is taken whole or refused naming why") {
  auto long_name = std::string(engine_nodes::max_engine_name_bytes + 1, 'x');
  struct row {
    const char* what;
    std::vector<engine_placement> placements;
    const char* refused; ///< nullptr: taken
  };
  std::vector<row> rows = {
    {"empty", {}, nullptr},
    {"two engines on one node", {{"a", "N1"}, {"b", "N1"}}, nullptr},
    {"the same placement twice", {{"a", "N1"}, {"a", "N1"}}, nullptr},
    {"one engine on two nodes", {{"a", "N1"}, {"a", "N2"}}, "placed on two nodes"},
    {"an empty engine name", {{"", "N1"}}, "an engine name of 0 bytes"},
    {"an overlong engine name", {{long_name, "N1"}}, "an engine name of 4097 bytes"},
    {"an empty node id", {{"a", ""}}, "a node id of 0 bytes"},
    {"too many", std::vector<engine_placement>(engine_nodes::max_engines + 1, {"a", "N1"}), "4097 engine placements"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    engine_nodes nodes;
    REQUIRE(nodes.assign({{"before", "N0"}}).empty());
    auto why = nodes.assign(r.placements);
    if (r.refused) {
      CHECK(why.find(r.refused) != std::string::npos);
      CHECK(why.size() < 200); // a bounded line, not the list echoed
    } else {
      CHECK(why.empty());
    }
  }
  // Placements by printed node id; a new list replaces the old one.
  actor_fixture fx;
  auto here = fx.sys.node();
  auto elsewhere = caf::make_node_id(7, "0102030405060708090a0b0c0d0e0f1011121314");
  REQUIRE(elsewhere);
  engine_nodes nodes;
  REQUIRE(nodes.assign({{"a", to_string(here)}, {"b", to_string(*elsewhere)}}).empty());
  CHECK(nodes.hosts(here, "a"));
  CHECK_FALSE(nodes.hosts(here, "b"));
  CHECK_FALSE(nodes.hosts(here, "c"));
  CHECK(nodes.hosts(*elsewhere, "b"));
  CHECK(nodes.hosts_any(*elsewhere));
  REQUIRE(nodes.assign({{"a", to_string(here)}}).empty());
  CHECK_FALSE(nodes.hosts(*elsewhere, "b"));
  CHECK_FALSE(nodes.hosts_any(*elsewhere));
  CHECK(nodes.hosts_any(here));
}

TEST_CASE("a trainer rank's drivers: this process and every actor of the head's node") {
  auto drivers = std::make_shared<trusted_actors>();
  actor_fixture fx;
  auto a = fx.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
  auto b = fx.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
  auto sa = caf::actor_cast<caf::strong_actor_ptr>(a);
  auto sb = caf::actor_cast<caf::strong_actor_ptr>(b);
  auto elsewhere = caf::make_node_id(7, "0102030405060708090a0b0c0d0e0f1011121314");
  REQUIRE(elsewhere);
  CHECK(local_or_nodes_of(fx.sys.node(), drivers)(sa)); // this process, whatever the set says
  CHECK_FALSE(local_or_nodes_of(*elsewhere, drivers)(sa));
  drivers->assign({a.address()}); // the coordinator of the grant
  CHECK(drivers->contains_node(fx.sys.node()));
  CHECK_FALSE(drivers->contains_node(*elsewhere));
  // Any actor of the coordinator's node (its main job freezes ranks), not only the coordinator.
  CHECK(local_or_nodes_of(*elsewhere, drivers)(sb));
  drivers->assign({}); // a rejoin before the new grant is known: nobody but this process
  CHECK_FALSE(local_or_nodes_of(*elsewhere, drivers)(sb));
}

// -- a router on a member node ---------------------------------------------------------

/// An engine of another node than the fixture's (its policy's own node is
/// another), driven by the coordinator of its grant and the router that
/// coordinator vouches for; routers forward generate requests as themselves.
struct vouched_router_fixture : actor_fixture {
  std::shared_ptr<engine_drivers> drivers = std::make_shared<engine_drivers>();
  std::vector<std::string> refusals;
  rollout_engine_actor engine;
  caf::actor coordinator = spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
  std::shared_ptr<sink_record> tokens = std::make_shared<sink_record>();
  token_sink_actor sink = spawn(recording_sink, tokens);
  using outcome = std::shared_ptr<std::optional<caf::expected<generate_result>>>;
  std::uint64_t next_request = 1;

  vouched_router_fixture() {
    auto elsewhere = caf::make_node_id(7, "0102030405060708090a0b0c0d0e0f1011121314");
    REQUIRE(elsewhere);
    rollout_engine_config cfg;
    cfg.model = tiny_config();
    cfg.options.name = "rollout-b";
    cfg.authorize = local_or_driver(*elsewhere, drivers);
    cfg.vouched_router = [d = drivers](const caf::strong_actor_ptr& sender, const caf::actor_addr& r) {
      return d->vouch(sender, r);
    };
    cfg.log = [this](const std::string& line) { refusals.push_back(line); };
    engine = caf::actor_cast<rollout_engine_actor>(spawn(rollout_engine, cfg));
    drivers->granted(coordinator.address(), caf::actor_addr{}); // the grant names no router: it runs elsewhere
  }

  /// A router stand-in: forwards each generate request to the engine as itself.
  std::pair<caf::actor, outcome> make_router() {
    auto out = std::make_shared<std::optional<caf::expected<generate_result>>>();
    auto target = engine;
    auto r = spawn([=](caf::event_based_actor* self) -> caf::behavior {
      return {[=](generate_atom, const generate_request& req, const token_sink_actor& s) {
        self->request(target, std::chrono::seconds(3600), generate_atom::value, req, s)
          .then([=](generate_result& g) { *out = std::move(g); }, [=](caf::error& e) { *out = std::move(e); });
      }};
    });
    return {r, out};
  }

  /// `router` asks the engine to generate; the outcome once everything queued ran.
  caf::expected<generate_result> generate_through(const std::pair<caf::actor, outcome>& router) {
    router.second->reset();
    generate_request req;
    req.request_id = next_request++;
    req.prompt = engine::encode("hello");
    req.sampling.max_tokens = 4;
    caf::anon_send(router.first, generate_atom::value, req, sink);
    run();
    REQUIRE(router.second->has_value());
    return **router.second;
  }

  /// `from` names `router` to the engine as the one to obey.
  void vouch(const caf::actor& from, const caf::actor& router) {
    caf::send_as(from, engine, route_atom::value, caf::actor_cast<heartbeat_actor>(router));
    run();
  }
};

TEST_CASE_FIXTURE(vouched_router_fixture, "a member engine obeys the router its coordinator vouches for, and no other") {
  auto first = make_router();
  auto other = make_router(); // a router on yet another member node, never vouched for
  auto refused = [](const caf::expected<generate_result>& r) {
    return !r && is(r.error(), errc::unauthenticated);
  };
  // Before any vouching: no router is obeyed.
  CHECK(refused(generate_through(first)));
  // A router cannot vouch for itself or another: only the coordinator may.
  vouch(first.first, first.first);
  CHECK(refused(generate_through(first)));
  // The coordinator vouches for the first: it is obeyed, the other is not.
  // Obeyed: the request reaches the engine, which answers it as it answers
  // its drivers (it holds no weights yet, so it says that).
  vouch(coordinator, first.first);
  auto obeyed = [](const caf::expected<generate_result>& r) {
    return !r && is(r.error(), errc::engine_dirty);
  };
  CHECK(obeyed(generate_through(first)));
  CHECK(refused(generate_through(other)));
  // A trusted router cannot name another either.
  const auto before = refusals.size();
  vouch(first.first, other.first);
  CHECK(refusals.size() == before + 1);
  CHECK(refusals.back().find("only the coordinator vouches for a router") != std::string::npos);
  CHECK(refused(generate_through(other)));
  // Restarted (a new handle), vouched for again: the new one is obeyed, the old one no more.
  vouch(coordinator, other.first);
  CHECK(obeyed(generate_through(other)));
  CHECK(refused(generate_through(first)));
  // A rejoin starts from the new grant: its coordinator, no router until vouched for again.
  drivers->granted(coordinator.address(), caf::actor_addr{});
  CHECK(refused(generate_through(other)));
}

TEST_CASE_FIXTURE(coordinator_fixture, "the coordinator vouches for each router that registers to every member engine") {
  std::vector<router_actor> announced;
  auto c = config();
  c.on_router = [&](const router_actor& r) { announced.push_back(r); };
  start(c);
  add_engine("e1");
  add_engine("e2");
  // The router it was spawned with is named to each engine as it registers.
  CHECK(journal->vouched
        == std::vector<std::string>{"e1:" + std::to_string(router.id()), "e2:" + std::to_string(router.id())});
  // A router that registers (on a member node; restarted: a new handle) is
  // named to every member, and to an engine that registers later.
  auto restarted = caf::actor_cast<router_actor>(spawn(scripted_router, std::make_shared<router_script>()));
  caf::send_as(caf::actor_cast<caf::actor>(router), coord, register_atom::value, restarted);
  run();
  REQUIRE(announced.size() == 1);
  CHECK(announced.front().address() == restarted.address());
  add_engine("e3");
  const auto id = std::to_string(restarted.id());
  CHECK(std::vector<std::string>(journal->vouched.begin() + 2, journal->vouched.end())
        == std::vector<std::string>{"e1:" + id, "e2:" + id, "e3:" + id});
}

// -- two nodes over loopback ------------------------------------------------------------

struct network_config : caf::actor_system_config {
  network_config() {
    load<caf::io::middleman>();
    register_rlsync_types(*this);
    set("logger.file-verbosity", caf::atom("quiet"));
  }
};

TEST_CASE("a second node nobody admitted is refused by a coordinator it reaches by id over the network") {
  network_config head_cfg;
  caf::actor_system head{head_cfg};
  auto admitted = std::make_shared<admitted_nodes>();
  std::vector<std::string> lines;
  std::mutex lines_mutex;
  coordinator_config cc;
  cc.authorize = local_or_admitted(head.node(), [admitted](const caf::node_id& n) { return admitted->contains(n); });
  // The head is node a; engine "intruder" runs on a, "mine" on b.
  const auto name_of = [admitted](const caf::node_id& n) { return admitted->name_of(n); };
  cc.trainer_ranks = 2;
  cc.origin = origin_check({{"engine intruder", "a"}, {"engine mine", "b"}, {"trainer rank 0", "a"},
                            {"trainer rank 1", "b"}, {"router", "a"}},
                           head.node(), "a", name_of);
  cc.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(lines_mutex);
    lines.push_back(line);
  };
  auto coord = head.spawn(coordinator, cc);
  // Published only to hand the peer its id; a real head publishes the
  // gatekeeper alone, and a peer reaches the rest by guessing ids.
  auto port = head.middleman().publish(coord, 0, "127.0.0.1", true);
  REQUIRE(port);
  {
    network_config peer_cfg;
    caf::actor_system peer{peer_cfg};
    auto remote = peer.middleman().remote_actor<coordinator_actor>("127.0.0.1", *port);
    REQUIRE(remote);
    caf::scoped_actor self{peer};
    auto status = [&]() -> caf::expected<coordinator_status> {
      caf::expected<coordinator_status> out{caf::error{}};
      self->request(*remote, 5s, status_atom::value)
        .receive([&](coordinator_status& s) { out = std::move(s); }, [&](caf::error& e) { out = std::move(e); });
      return out;
    };
    auto refused = status();
    REQUIRE_FALSE(refused);
    CHECK(is(refused.error(), errc::unauthenticated));
    caf::expected<registration> reg{caf::error{}};
    auto fake_engine = [](rollout_engine_actor::pointer) -> rollout_engine_actor::behavior_type {
      return {
        [](pause_atom, const pause_request&) -> pause_report { return {}; },
        [](flush_atom) -> phase_ack { return {}; },
        [](start_atom, std::uint64_t) -> phase_ack { return {}; },
        [](update_atom, const weight_bucket&) -> std::uint64_t { return 0; },
        [](transfer_atom, const transfer_order&, const std::vector<trainer_actor>&) -> transfer_report { return {}; },
        [](finish_atom, std::uint64_t) -> phase_ack { return {}; },
        [](resume_atom) -> phase_ack { return {}; },
        [](generate_atom, const generate_request&, const token_sink_actor&) -> generate_result { return {}; },
        [](abort_atom, std::uint64_t) -> bool { return false; },
        [](status_atom) -> engine_status { return {}; },
        [](route_atom, const heartbeat_actor&) {},
        [](digest_atom) -> weight_digest { return {}; },
        [](nccl_join_atom, const nccl_rendezvous_msg& m) -> std::uint64_t { return m.epoch; },
        [](nccl_dead_atom, std::uint64_t, const std::string&) {},
        [](heartbeat_atom, const heartbeat& hb) -> heartbeat { return hb; },
        [](phase_atom, const phase_order&) {},
      };
    };
    auto fake = peer.spawn(fake_engine);
    self->request(*remote, 5s, register_atom::value, engine_info{"intruder", "x", 1, 0, false, 1}, fake)
      .receive([&](registration& r) { reg = r; }, [&](caf::error& e) { reg = std::move(e); });
    REQUIRE_FALSE(reg);
    CHECK(is(reg.error(), errc::unauthenticated));
    // Once the gatekeeper admitted the peer's node, the same request is served.
    admitted->add(peer.node(), "b");
    auto served = status();
    REQUIRE(served);
    CHECK(served->members.empty());
    CHECK(served->refused == 2);

    // An admitted node registers its own engines only: not another node's
    // engine, nor its own engine's name with an actor that lives elsewhere.
    auto register_as = [&](const std::string& name, const rollout_engine_actor& engine) {
      caf::expected<registration> out{caf::error{}};
      self->request(*remote, 5s, register_atom::value, engine_info{name, "x", 1, 0, false, 1}, engine)
        .receive([&](registration& r) { out = r; }, [&](caf::error& e) { out = std::move(e); });
      return out;
    };
    auto taken = register_as("intruder", fake);
    REQUIRE_FALSE(taken);
    CHECK(is(taken.error(), errc::unauthenticated));
    CHECK(head.render(taken.error()).find("it runs on node 'a', not on the sender's node 'b'") != std::string::npos);
    // A handle of the head's own (the coordinator's, passed off as an engine).
    auto borrowed = register_as("mine", caf::actor_cast<rollout_engine_actor>(*remote));
    REQUIRE_FALSE(borrowed);
    CHECK_MESSAGE(head.render(borrowed.error()).find("its actor is not on the sender's node") != std::string::npos, head.render(borrowed.error()));
    // Nor another node's trainer rank (it would feed the fleet its weights).
    caf::expected<registration> rank{caf::error{}};
    self->request(*remote, 5s, register_atom::value, rank_info{0, "b", 1, {}}, caf::actor_cast<trainer_actor>(fake))
      .receive([&](registration& r) { rank = r; }, [&](caf::error& e) { rank = std::move(e); });
    REQUIRE_FALSE(rank);
    CHECK(head.render(rank.error()).find("trainer rank 0: it runs on node 'a', not on the sender's node 'b'")
          != std::string::npos);
    // Nor the router, which runs on a (one-way: refused and counted).
    self->send(*remote, register_atom::value, caf::actor_cast<router_actor>(fake));
    auto own = register_as("mine", fake);
    REQUIRE(own);
    REQUIRE(status());
    CHECK(status()->members.size() == 1);
    // The head's node cannot deregister b's engine either (it is no member's to drop but b's).
    {
      caf::scoped_actor local{head};
      local->send(coord, deregister_atom::value, std::string("mine"));
    }
    auto after = status();
    REQUIRE(after);
    CHECK(after->members.size() == 1);
    CHECK(after->refused == 7);
    caf::anon_send_exit(fake, caf::exit_reason::user_shutdown);
  }
  {
    std::lock_guard<std::mutex> lock(lines_mutex);
    CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
            return l.find("coordinator: refused 'status' from actor") != std::string::npos;
          }) == 1);
  }
  head.middleman().close(*port);
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
}

/// A request's outcome: no error when answered with an R.
template <class R, class... Ts>
caf::error ask(caf::scoped_actor& self, const trainer_actor& t, Ts... xs) {
  caf::error out = make_error(errc::malformed, "no answer");
  self->request(t, 5s, xs...).receive([&](R&) { out = caf::error{}; }, [&](caf::error& e) { out = e; });
  return out;
}

TEST_CASE("a trainer rank on a member node: tickets only to an engine's own node, orders only from the head") {
  // Three processes' worth of nodes: the rank's, the head's (the coordinator
  // that says where engines run and drives the rank) and a peer that
  // reaches the rank over the network (an engine node, or not).
  network_config rank_cfg, head_cfg, peer_cfg;
  caf::actor_system rank_sys{rank_cfg};
  caf::actor_system head_sys{head_cfg};
  caf::actor_system peer_sys{peer_cfg};
  caf::scoped_actor head{head_sys};
  caf::scoped_actor peer{peer_sys};
  auto drivers = std::make_shared<trusted_actors>();
  drivers->assign({head->address()});
  auto policy = local_or_nodes_of(rank_sys.node(), drivers);
  std::vector<std::string> lines;
  std::mutex lines_mutex;
  trainer_config c;
  c.source = small_source(small_model(2));
  c.step_time = 60s; // one step at start; none during the test
  c.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(lines_mutex);
    lines.push_back(line);
  };
  c.authorize = policy;
  c.placements_from = policy;
  c.engines = std::make_shared<engine_nodes>();
  c.ucx_tickets = std::make_shared<ucx_ticket_office>();
  c.ucx_tickets->open([](const std::string& engine, int) {
    return ucx_ticket{{1, 2, 3}, std::vector<std::uint8_t>(engine.begin(), engine.end())};
  });
  auto trainer = spawn_trainer(rank_sys, c);
  // Published only to hand the others its handle; a member publishes nothing
  // and others reach its actors through the head.
  auto port = rank_sys.middleman().publish(trainer, 0, "127.0.0.1", true);
  REQUIRE(port);
  auto at_head = head_sys.middleman().remote_actor<trainer_actor>("127.0.0.1", *port);
  auto at_peer = peer_sys.middleman().remote_actor<trainer_actor>("127.0.0.1", *port);
  REQUIRE(at_head);
  REQUIRE(at_peer);
  auto ticket = [&](const std::string& engine) {
    return ask<ucx_ticket>(peer, *at_peer, ucx_ticket_atom::value, engine, std::int32_t{0});
  };
  // The head's answer to a request comes after its earlier one-way messages are handled.
  auto place = [&](std::vector<engine_placement> p) {
    head->send(*at_head, register_atom::value, std::move(p));
    REQUIRE_FALSE(ask<version_info>(head, *at_head, version_atom::value));
  };
  const auto peer_node = to_string(peer_sys.node());
  // No engine runs on the peer's node: it gets nothing at all.
  CHECK(is(ask<std::vector<tensor_meta>>(peer, *at_peer, meta_atom::value), errc::unauthenticated));
  CHECK(is(ticket("rollout-a"), errc::unauthenticated));
  CHECK(is(ask<version_info>(peer, *at_peer, freeze_atom::value), errc::unauthenticated));
  // Nor can it say where engines run: only the head can.
  peer->send(*at_peer, register_atom::value, std::vector<engine_placement>{{"rollout-a", peer_node}});
  CHECK(is(ask<std::vector<tensor_meta>>(peer, *at_peer, meta_atom::value), errc::unauthenticated));
  CHECK(is(ticket("rollout-a"), errc::unauthenticated));
  // The head places rollout-a on the peer's node, rollout-b elsewhere.
  place({{"rollout-a", peer_node}, {"rollout-b", to_string(head_sys.node())}});
  CHECK_FALSE(ask<std::vector<tensor_meta>>(peer, *at_peer, meta_atom::value));
  CHECK_FALSE(ticket("rollout-a"));
  CHECK(is(ticket("rollout-b"), errc::unauthenticated)); // another engine's worker: not this node's to pull as
  CHECK(is(ticket("rollout-c"), errc::unauthenticated)); // not registered at all
  CHECK(is(ask<version_info>(peer, *at_peer, freeze_atom::value), errc::unauthenticated)); // an engine node does not drive ranks
  CHECK_FALSE(ask<version_info>(head, *at_head, freeze_atom::value));                        // the head does
  // rollout-a left: its node gets no more tickets.
  place({{"rollout-b", to_string(head_sys.node())}});
  CHECK(is(ticket("rollout-a"), errc::unauthenticated));
  {
    std::lock_guard<std::mutex> lock(lines_mutex);
    CHECK(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
      return l.find("refused 'ucxticket'") != std::string::npos
             && l.find("engine 'rollout-b' is not registered from that node") != std::string::npos;
    }));
  }
  rank_sys.middleman().close(*port);
  caf::anon_send_exit(trainer, caf::exit_reason::user_shutdown);
}

} // namespace
