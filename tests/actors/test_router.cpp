// The router on CAF's deterministic scheduler: scripted engines
// (tests/support/scripted_engine.hpp) that answer, hold their answer or
// refuse; a recording sink; clients that record the reply.
// Nothing runs until the test runs the scheduler, and time moves only when
// the test moves it.
#include "actors/router.hpp"
#include "tests/support/actor_fixture.hpp"
#include "tests/support/recording_sink.hpp"
#include "tests/support/scripted_engine.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <set>

using namespace rlsync;
using namespace std::chrono_literals;
using test::act;

namespace {

/// What the engines and the sink saw, in order; the clients add "result <id>"
/// to the sink's events as their answer arrives.
struct journal : test::engine_journal, test::sink_record {};

/// A client's view of one request: the result or the error.
struct outcome {
  std::optional<generate_result> result;
  std::optional<caf::error> error;
  bool answered() const { return result || error; }
};

struct router_fixture : test::actor_fixture {
  std::shared_ptr<journal> log = std::make_shared<journal>();
  token_sink_actor sink;

  router_fixture() {
    sink = spawn(test::recording_sink, log);
  }

  router_actor make_router(router_config c = {}) {
    auto r = spawn_router(sys, std::move(c));
    stop_first(r); // it answers every client as it stops; they then quit
    sched.run();
    return r;
  }

  /// A scripted engine whose tokens of request r are r*100+i, two per request
  /// (capped by max_tokens), all at `version`. on_generate: answer at once,
  /// hold the answer until resume (stands for a long generation), or fail
  /// (refuse with engine_dirty). duplicate: every token twice, and once more
  /// for request id + 1000.
  rollout_engine_actor make_engine(std::string name, std::uint64_t version = 1,
                                   act on_generate = act::answer, bool duplicate = false) {
    auto script = std::make_shared<test::engine_script>();
    script->version = version;
    script->on_generate = on_generate;
    script->duplicate_tokens = duplicate;
    rollout_engine_actor e = spawn(test::scripted_engine, std::move(name), script, log);
    sched.run();
    return e;
  }

  void route(const router_actor& r, const rollout_engine_actor& e, const std::string& name,
             std::uint64_t version, bool routable = true) {
    tell(r, route_atom_v, route_update{name, version, routable}, e);
    sched.run();
  }

  static generate_request request(std::uint64_t id, std::vector<std::int32_t> prompt = {1, 2, 3},
                                  std::uint32_t max_tokens = 4) {
    generate_request req;
    req.request_id = id;
    req.prompt = std::move(prompt);
    req.sampling.max_tokens = max_tokens;
    return req;
  }

  /// Sends one generate from a fresh client; runs the scheduler unless told
  /// not to. The client quits once answered (the router answers everything,
  /// at the latest when it stops).
  std::shared_ptr<outcome> submit(const router_actor& r, generate_request req, bool run = true) {
    auto out = std::make_shared<outcome>();
    auto log = this->log;
    auto sink = this->sink;
    sys.spawn([=](caf::event_based_actor* self) {
      auto id = req.request_id;
      self->request(r, caf::infinite, generate_atom_v, req, sink)
        .then(
          [=](generate_result& res) {
            log->events.push_back("result " + std::to_string(id));
            out->result = std::move(res);
          },
          [=](caf::error& err) { out->error = std::move(err); });
    });
    if (run)
      sched.run();
    return out;
  }

  /// One request-response exchange with any actor, from a fresh client.
  template <class T, class Handle, class... Ts>
  T ask(const Handle& h, Ts... xs) {
    auto out = std::make_shared<std::optional<T>>();
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(h, caf::infinite, xs...).then([=](T& x) { *out = std::move(x); });
    });
    sched.run();
    REQUIRE(out->has_value());
    return std::move(**out);
  }

  router_status status(const router_actor& r) {
    return ask<router_status>(r, status_atom_v);
  }

  void release(const rollout_engine_actor& e) {
    ask<phase_ack>(e, resume_atom_v);
  }

  void kill(const rollout_engine_actor& e) {
    caf::anon_send_exit(e, caf::exit_reason::kill);
    sched.run();
  }
};

std::vector<std::string> engines_of(const journal& log) {
  std::vector<std::string> out;
  for (auto& d : log.dispatched)
    out.push_back(d.substr(0, d.find(':')));
  return out;
}

using strings = std::vector<std::string>;

} // namespace

TEST_CASE_FIXTURE(router_fixture, "least outstanding spreads requests, ties by name") {
  auto r = make_router();
  auto a = make_engine("a", 1, act::hold);
  auto b = make_engine("b", 1, act::hold);
  auto c = make_engine("c", 1, act::hold);
  route(r, c, "c", 1);
  route(r, a, "a", 1);
  route(r, b, "b", 1);
  std::vector<std::shared_ptr<outcome>> outs;
  for (std::uint64_t id = 1; id <= 6; ++id)
    outs.push_back(submit(r, request(id)));
  CHECK(engines_of(*log) == strings{"a", "b", "c", "a", "b", "c"});
  CHECK(status(r).outstanding == 6);
  // b finishes its two; the next two go to b (0, then 1 outstanding, against 2 and 2).
  release(b);
  CHECK(outs[1]->result);
  CHECK(outs[4]->result);
  CHECK(!outs[0]->answered());
  outs.push_back(submit(r, request(7)));
  outs.push_back(submit(r, request(8)));
  CHECK(engines_of(*log) == strings{"a", "b", "c", "a", "b", "c", "b", "b"});
  release(a);
  release(b);
  release(c);
  for (auto& o : outs) {
    REQUIRE(o->result);
    CHECK(o->result->reason == finish_reason::length);
    CHECK(o->result->tokens.size() == 2);
  }
  auto s = status(r);
  CHECK(s.outstanding == 0);
  CHECK(s.completed == 8);
  CHECK(s.routable == 3);
}

TEST_CASE_FIXTURE(router_fixture, "round robin cycles through the replicas") {
  router_config cfg;
  cfg.policy = router_policy::round_robin;
  auto r = make_router(cfg);
  auto a = make_engine("a");
  auto b = make_engine("b");
  auto c = make_engine("c");
  route(r, a, "a", 1);
  route(r, b, "b", 1);
  route(r, c, "c", 1);
  // Each request finishes before the next: least-outstanding would pick a every time.
  for (std::uint64_t id = 1; id <= 7; ++id)
    CHECK(submit(r, request(id))->result);
  CHECK(engines_of(*log) == strings{"a", "b", "c", "a", "b", "c", "a"});
}

TEST_CASE_FIXTURE(router_fixture, "prefix affinity is stable for a prefix and falls back") {
  router_config cfg;
  cfg.policy = router_policy::prefix_affinity;
  cfg.affinity_prefix_tokens = 4;
  auto r = make_router(cfg);
  auto a = make_engine("a", 2);
  auto b = make_engine("b", 2);
  auto c = make_engine("c", 2);
  route(r, a, "a", 2);
  route(r, b, "b", 2);
  route(r, c, "c", 2);
  // The same 4-token prefix (the tails differ) lands on one replica every time.
  std::uint64_t id = 1;
  for (int i = 0; i < 5; ++i)
    CHECK(submit(r, request(id++, {9, 8, 7, 6, i}))->result);
  auto homes = engines_of(*log);
  CHECK(std::count(homes.begin(), homes.end(), homes[0]) == 5);
  auto home = homes[0];
  // Different prefixes spread over more than one replica.
  log->dispatched.clear();
  for (std::int32_t t = 0; t < 12; ++t)
    CHECK(submit(r, request(id++, {t, t, t, t}))->result);
  auto spread = engines_of(*log);
  CHECK(std::set<std::string>(spread.begin(), spread.end()).size() > 1);

  // The preferred replica falls behind (staleness 0): least outstanding among the others.
  auto engine_of = [&](const std::string& n) { return n == "a" ? a : n == "b" ? b : c; };
  auto others = strings{"a", "b", "c"};
  others.erase(std::find(others.begin(), others.end(), home));
  route(r, engine_of(others[0]), others[0], 3);
  route(r, engine_of(others[1]), others[1], 3);
  log->dispatched.clear();
  CHECK(submit(r, request(id++, {9, 8, 7, 6}))->result);
  CHECK(engines_of(*log) == strings{others[0]}); // ties by name
  // Back at the newest version: the prefix goes home again.
  route(r, engine_of(home), home, 3);
  log->dispatched.clear();
  CHECK(submit(r, request(id++, {9, 8, 7, 6}))->result);
  CHECK(engines_of(*log) == strings{home});
  // Evicted: never chosen.
  tell(r, evict_atom_v, home);
  sched.run();
  log->dispatched.clear();
  CHECK(submit(r, request(id++, {9, 8, 7, 6}))->result);
  CHECK(engines_of(*log) != strings{home});
}

TEST_CASE_FIXTURE(router_fixture, "requests wait while nothing is routable, then go in FIFO order") {
  auto r = make_router();
  auto a = make_engine("a");
  route(r, a, "a", 1, false); // known, not yet synced
  std::vector<std::shared_ptr<outcome>> outs;
  for (std::uint64_t id = 1; id <= 3; ++id)
    outs.push_back(submit(r, request(id)));
  auto s = status(r);
  CHECK(s.queued == 3);
  CHECK(s.routable == 0);
  CHECK(log->dispatched.empty());
  for (auto& o : outs)
    CHECK(!o->answered());
  route(r, a, "a", 1, true);
  CHECK(log->dispatched == strings{"a:1", "a:2", "a:3"});
  for (auto& o : outs)
    CHECK(o->result);
  s = status(r);
  CHECK(s.queued == 0);
  CHECK(s.completed == 3);
  // Their deadlines pass later: nothing happens to requests already served.
  sched.advance_time(60s);
  sched.run();
  CHECK(status(r).rejected == 0);
}

TEST_CASE_FIXTURE(router_fixture, "a full queue refuses at once with queue_full") {
  router_config cfg;
  cfg.queue_limit = 2;
  auto r = make_router(cfg);
  auto first = submit(r, request(1));
  auto second = submit(r, request(2));
  auto third = submit(r, request(3));
  CHECK(!first->answered());
  CHECK(!second->answered());
  REQUIRE(third->error);
  CHECK(is(*third->error, errc::queue_full));
  auto s = status(r);
  CHECK(s.queued == 2);
  CHECK(s.rejected == 1);
  // The refused request's id is free again; the queued ones are served later.
  auto a = make_engine("a");
  route(r, a, "a", 1);
  CHECK(first->result);
  CHECK(second->result);
  CHECK(submit(r, request(3))->result);
}

TEST_CASE_FIXTURE(router_fixture, "a queued request times out with not_routable at its deadline") {
  router_config cfg;
  cfg.queue_deadline = 30s;
  auto r = make_router(cfg);
  auto out = submit(r, request(1));
  sched.advance_time(29s);
  sched.run();
  CHECK(!out->answered());
  auto later = submit(r, request(2)); // queued 29 s after the first
  sched.advance_time(1s);
  sched.run();
  REQUIRE(out->error);
  CHECK(is(*out->error, errc::not_routable));
  CHECK(!later->answered());
  auto s = status(r);
  CHECK(s.queued == 1);
  CHECK(s.rejected == 1);
  // A replica arrives: only the request still waiting is served.
  auto a = make_engine("a");
  route(r, a, "a", 1);
  CHECK(log->dispatched == strings{"a:2"});
  CHECK(later->result);
}

TEST_CASE_FIXTURE(router_fixture, "a deadline message from anyone but the router is ignored") {
  auto r = make_router();
  auto out = submit(r, request(1));
  // The first ticket is 1: forge its deadline.
  tell(caf::actor_cast<router_impl_actor>(r), caf::timeout_atom_v, std::uint64_t{1}, std::uint32_t{0});
  sched.run();
  CHECK(!out->answered());
  CHECK(status(r).queued == 1);
}

TEST_CASE_FIXTURE(router_fixture, "evicted and dead replicas are never chosen") {
  auto r = make_router();
  auto a = make_engine("a");
  auto b = make_engine("b", 1, act::hold);
  route(r, a, "a", 1);
  route(r, b, "b", 1);
  tell(r, evict_atom_v, std::string{"a"});
  sched.run();
  auto on_b = submit(r, request(1));
  auto on_b2 = submit(r, request(2));
  CHECK(log->dispatched == strings{"b:1", "b:2"});
  CHECK(status(r).routable == 1);
  // b dies with two requests running: nothing else is routable, so they
  // wait, with the tokens their sink already has.
  kill(b);
  CHECK(!on_b->answered());
  CHECK(!on_b2->answered());
  auto s = status(r);
  CHECK(s.routable == 0);
  CHECK(s.outstanding == 0);
  CHECK(s.queued == 2);
  CHECK(s.rerouted == 2);
  // Nothing is routable now: a new request waits instead of going to a or b.
  log->dispatched.clear();
  auto waiting = submit(r, request(3));
  CHECK(log->dispatched.empty());
  CHECK(status(r).queued == 3);
  // a comes back through the coordinator: the rerouted requests continue
  // there after the two tokens b delivered, oldest first.
  route(r, a, "a", 1);
  CHECK(log->dispatched == strings{"a:1", "a:2", "a:3"});
  REQUIRE(on_b->result);
  CHECK(on_b->result->reason == finish_reason::length);
  CHECK(on_b->result->engine == "a");
  CHECK(on_b->result->tokens == std::vector<std::int32_t>{100, 101, 102, 103});
  CHECK(check(*on_b->result).empty());
  REQUIRE(on_b2->result);
  CHECK(on_b2->result->tokens == std::vector<std::int32_t>{200, 201, 202, 203});
  CHECK(waiting->result);
}

TEST_CASE_FIXTURE(router_fixture, "a stale replica is skipped, within the staleness bound it serves") {
  SUBCASE("staleness 0: only the newest version") {
    auto r = make_router();
    auto a = make_engine("a", 1);
    auto b = make_engine("b", 2);
    route(r, a, "a", 1);
    route(r, b, "b", 2);
    for (std::uint64_t id = 1; id <= 3; ++id)
      CHECK(submit(r, request(id))->result);
    CHECK(engines_of(*log) == strings{"b", "b", "b"});
    CHECK(status(r).routable == 1);
  }
  SUBCASE("staleness 1: one version behind still serves") {
    router_config cfg;
    cfg.staleness = 1;
    cfg.policy = router_policy::round_robin;
    auto r = make_router(cfg);
    auto a = make_engine("a", 1);
    auto b = make_engine("b", 2);
    auto c = make_engine("c", 3);
    route(r, a, "a", 1);
    route(r, b, "b", 2);
    route(r, c, "c", 3); // a is now two behind
    for (std::uint64_t id = 1; id <= 4; ++id)
      CHECK(submit(r, request(id))->result);
    CHECK(engines_of(*log) == strings{"b", "c", "b", "c"});
  }
  SUBCASE("a request's min_version waits for a replica that new") {
    auto r = make_router();
    auto a = make_engine("a", 1);
    route(r, a, "a", 1);
    auto req = request(1);
    req.min_version = 2;
    auto out = submit(r, req);
    auto other = submit(r, request(2)); // behind it in the queue, but servable
    CHECK(log->dispatched == strings{"a:2"});
    CHECK(!out->answered());
    CHECK(other->result);
    route(r, a, "a", 2);
    CHECK(log->dispatched == strings{"a:2", "a:1"});
    CHECK(out->result);
  }
}

TEST_CASE_FIXTURE(router_fixture, "staleness counts from the trainer's newest version: further behind, requests wait") {
  router_config cfg;
  cfg.staleness = 1;
  auto r = make_router(cfg);
  auto a = make_engine("a", 1);
  auto b = make_engine("b", 1);
  route(r, a, "a", 1);
  route(r, b, "b", 1);
  auto published = [&](std::uint64_t v) {
    tell(r, version_atom_v, version_info{v, 4, 4096});
    sched.run();
  };
  published(2); // one behind the trainer: both still serve
  CHECK(submit(r, request(1))->result);
  CHECK(status(r).routable == 2);
  published(3); // two behind: neither may serve, though both are routable
  CHECK(status(r).routable == 0);
  auto waiting = submit(r, request(2));
  CHECK(!waiting->answered());
  CHECK(status(r).queued == 1);
  published(1); // an older report changes nothing: versions never go back
  CHECK(status(r).queued == 1);
  route(r, a, "a", 2); // a round brought a within the bound
  CHECK(waiting->result);
  CHECK(engines_of(*log) == strings{"a", "a"});
  CHECK(status(r).routable == 1);
  CHECK(status(r).queued == 0);
}

TEST_CASE_FIXTURE(router_fixture, "malformed requests are refused") {
  auto r = make_router();
  auto a = make_engine("a", 1, act::hold);
  route(r, a, "a", 1);
  auto empty = submit(r, request(1, {}));
  REQUIRE(empty->error);
  CHECK(is(*empty->error, errc::malformed));
  auto zero_budget = request(2);
  zero_budget.sampling.max_tokens = 0;
  auto z = submit(r, zero_budget);
  REQUIRE(z->error);
  CHECK(is(*z->error, errc::malformed));
  // The same request id twice while the first is running.
  auto first = submit(r, request(3));
  auto again = submit(r, request(3));
  REQUIRE(again->error);
  CHECK(is(*again->error, errc::malformed));
  CHECK(!first->answered());
  CHECK(log->dispatched == strings{"a:3"});
  auto s = status(r);
  CHECK(s.rejected == 3);
  CHECK(s.outstanding == 1);
}

TEST_CASE_FIXTURE(router_fixture, "a refusing engine loses the request to another, a timeout fails it") {
  router_config cfg;
  cfg.engine_deadline = 60s;
  auto r = make_router(cfg);
  auto dirty = make_engine("a", 1, act::fail);
  route(r, dirty, "a", 1);
  auto slow = make_engine("b", 1, act::hold);
  route(r, slow, "b", 1);
  // a refuses (dirty): the request goes to b, a is no longer routable.
  auto refused = submit(r, request(1));
  CHECK(log->dispatched == strings{"a:1", "b:1"});
  CHECK(log->aborted == strings{"a:1"}); // best effort: it may hold it after all
  CHECK(status(r).routable == 1);
  CHECK(status(r).rerouted == 1);
  release(slow);
  REQUIRE(refused->result);
  CHECK(refused->result->reason == finish_reason::length);
  CHECK(refused->result->engine == "b");
  // b holds the next one past the engine deadline: failed, and b is told to drop it.
  auto out = submit(r, request(2));
  sched.advance_time(59s);
  sched.run();
  CHECK(!out->answered());
  sched.advance_time(1s);
  sched.run();
  REQUIRE(out->result);
  CHECK(out->result->reason == finish_reason::failed);
  CHECK(out->result->tokens == std::vector<std::int32_t>{200, 201});
  CHECK(log->aborted == strings{"a:1", "b:2"});
  auto s = status(r);
  CHECK(s.completed == 2);
  CHECK(s.outstanding == 0);
  // Its late answer changes nothing.
  release(slow);
  CHECK(status(r).completed == 2);
}

TEST_CASE_FIXTURE(router_fixture, "an engine gone before its down message stops drawing requests") {
  auto r = make_router();
  auto gone = make_engine("a", 1, act::die);
  route(r, gone, "a", 1);
  auto b = make_engine("b", 1);
  route(r, b, "b", 1);
  // a answers request_receiver_down: the request continues on b, and a,
  // with the fewest outstanding, must not draw the next one too.
  auto first = submit(r, request(1));
  REQUIRE(first->result);
  CHECK(first->result->engine == "b");
  CHECK(status(r).routable == 1);
  auto second = submit(r, request(2));
  REQUIRE(second->result);
  CHECK(second->result->engine == "b");
  CHECK(log->dispatched == strings{"a:1", "b:1", "b:2"});
  CHECK(status(r).rerouted == 1);
}

TEST_CASE_FIXTURE(router_fixture, "a failed engine's requests continue elsewhere: one stream, spans intact") {
  auto r = make_router();
  auto a = make_engine("a", 1, act::hold); // streams 2 tokens, never answers
  auto b = make_engine("b", 1);
  route(r, a, "a", 1);
  auto out = submit(r, request(1, {1, 2, 3}, 4));
  CHECK(log->dispatched == strings{"a:1"});
  route(r, b, "b", 1);
  SUBCASE("dead: down message") { kill(a); }
  SUBCASE("silent: the coordinator reports it failed") {
    tell(r, failed_atom_v, std::string{"a"});
    sched.run();
    CHECK(log->aborted == strings{"a:1"});
    release(a); // its late answer is for an abandoned attempt
  }
  CHECK(log->dispatched == strings{"a:1", "b:1"});
  REQUIRE(out->result);
  CHECK(out->result->reason == finish_reason::length);
  CHECK(out->result->engine == "b");
  CHECK(out->result->tokens == std::vector<std::int32_t>{100, 101, 102, 103});
  CHECK(check(*out->result).empty());
  // The sink saw every index once, in order, then the result.
  CHECK(log->events == strings{"token 1.0", "token 1.1", "token 1.2", "token 1.3", "result 1"});
  auto s = status(r);
  CHECK(s.rerouted == 1);
  CHECK(s.completed == 1);
  CHECK(s.outstanding == 0);
}

TEST_CASE_FIXTURE(router_fixture, "version spans survive a reroute: shifted and joined") {
  auto r = make_router();
  auto a = make_engine("a", 3, act::hold);
  auto b = make_engine("b", 4);
  auto c = make_engine("c", 3);
  route(r, a, "a", 3);
  auto to_b = submit(r, request(1, {1}, 4));
  auto to_c = submit(r, request(2, {1}, 4));
  tell(r, evict_atom_v, std::string{"a"});
  route(r, b, "b", 4); // v4 is newest; with staleness 0 only b serves now
  kill(a);
  REQUIRE(to_b->result);
  CHECK(to_b->result->spans.size() == 2);
  CHECK(to_b->result->spans[0].version == 3);
  CHECK(to_b->result->spans[0].begin == 0);
  CHECK(to_b->result->spans[0].end == 2);
  CHECK(to_b->result->spans[1].version == 4);
  CHECK(to_b->result->spans[1].begin == 2);
  CHECK(to_b->result->spans[1].end == 4);
  REQUIRE(to_c->result);
  CHECK(check(*to_c->result).empty());
  (void)c;
}

TEST_CASE_FIXTURE(router_fixture, "a request that had finished, or failed too often, is not rerouted") {
  router_config cfg;
  cfg.max_reroutes = 1;
  auto r = make_router(cfg);
  SUBCASE("its budget was used up when the engine died") {
    auto a = make_engine("a", 1, act::hold);
    route(r, a, "a", 1);
    auto out = submit(r, request(1, {1}, 2)); // both tokens streamed
    kill(a);
    REQUIRE(out->result);
    CHECK(out->result->reason == finish_reason::length);
    CHECK(out->result->tokens == std::vector<std::int32_t>{100, 101});
    CHECK(status(r).rerouted == 0);
  }
  SUBCASE("its last token was a stop token when the engine died") {
    auto a = make_engine("a", 1, act::hold);
    route(r, a, "a", 1);
    auto req = request(1, {1}, 8);
    req.sampling.stop_token_ids = {101}; // the second token streamed
    auto out = submit(r, req);
    kill(a);
    REQUIRE(out->result);
    CHECK(out->result->reason == finish_reason::eos);
    CHECK(out->result->tokens == std::vector<std::int32_t>{100, 101});
    CHECK(status(r).rerouted == 0);
  }
  SUBCASE("past max_reroutes it fails with what the sink has") {
    auto a = make_engine("a", 1, act::hold);
    auto b = make_engine("b", 1, act::hold);
    route(r, a, "a", 1);
    auto out = submit(r, request(1, {1}, 8));
    route(r, b, "b", 1);
    kill(a); // rerouted to b once
    CHECK(log->dispatched == strings{"a:1", "b:1"});
    kill(b); // the second failure: no more reroutes
    REQUIRE(out->result);
    CHECK(out->result->reason == finish_reason::failed);
    CHECK(out->result->tokens == std::vector<std::int32_t>{100, 101, 102, 103});
    CHECK(check(*out->result).empty());
  }
}

TEST_CASE_FIXTURE(router_fixture, "every token reaches the sink once, in order, before the result") {
  auto r = make_router();
  // This engine sends every token twice (the first time with three top
  // tokens), once ahead of its place, and a token for request 1001 besides.
  auto t = make_engine("t", 1, act::answer, true);
  route(r, t, "t", 1);
  auto req = request(1);
  req.generated = {7}; // a continuation: indices start at 1
  req.sampling.max_tokens = 4;
  req.sampling.logprobs = true;
  req.sampling.top_logprobs = 1;
  auto out = submit(r, req);
  REQUIRE(out->result);
  CHECK(out->result->tokens == std::vector<std::int32_t>{101, 102});
  CHECK(log->events == strings{"token 1.1", "token 1.2", "result 1"});
  REQUIRE(log->tokens.size() == 2);
  CHECK(log->tokens[0].token == 101);
  CHECK(log->tokens[1].token == 102);
  for (const auto& ev : log->tokens) { // as many top tokens as asked for
    CHECK(ev.top_tokens == std::vector<std::int32_t>{1});
    CHECK(ev.top_logprobs.size() == 1);
  }
}

TEST_CASE_FIXTURE(router_fixture, "the result reaches the requester only after the sink has every token") {
  auto r = make_router();
  auto a = make_engine("a");
  route(r, a, "a", 1);
  auto out = submit(r, request(1), false);
  // The relay is the slowest actor: everything else runs first.
  sched.run_jobs_filtered([](caf::resumable* job) {
    auto actor = dynamic_cast<caf::local_actor*>(job);
    return actor == nullptr || std::string{actor->name()} != "router-relay";
  });
  CHECK(!out->answered());
  sched.run();
  CHECK(log->events == strings{"token 1.0", "token 1.1", "result 1"});
}

TEST_CASE_FIXTURE(router_fixture, "status counts and heartbeat") {
  router_config cfg;
  cfg.name = "router-0";
  cfg.queue_limit = 1;
  auto r = make_router(cfg);
  auto hb = ask<heartbeat>(r, heartbeat_atom_v, heartbeat{"probe", 42});
  CHECK(hb.from == "router-0");
  CHECK(hb.seq == 42);
  auto s0 = status(r);
  CHECK(s0.routable == 0);
  CHECK(s0.queued == 0);
  CHECK(s0.outstanding == 0);
  CHECK(s0.completed == 0);
  CHECK(s0.rejected == 0);
  CHECK(s0.rerouted == 0);
  auto q = submit(r, request(1));       // queued
  auto full = submit(r, request(2));    // queue_full
  auto bad = submit(r, request(3, {})); // malformed
  auto s1 = status(r);
  CHECK(s1.queued == 1);
  CHECK(s1.rejected == 2);
  auto a = make_engine("a", 1, act::hold);
  route(r, a, "a", 1);
  auto s2 = status(r);
  CHECK(s2.routable == 1);
  CHECK(s2.queued == 0);
  CHECK(s2.outstanding == 1);
  release(a);
  auto s3 = status(r);
  CHECK(s3.outstanding == 0);
  CHECK(s3.completed == 1);
  CHECK(s3.rejected == 2);
  CHECK(q->result);
}

TEST_CASE_FIXTURE(router_fixture, "a router that stops answers every waiting request") {
  auto r = make_router();
  auto a = make_engine("a", 1, act::hold);
  route(r, a, "a", 1);
  auto req = request(1);
  req.min_version = 5; // nothing serves it yet: it waits
  auto queued = submit(r, req);
  auto running = submit(r, request(2));
  caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  sched.run();
  REQUIRE(queued->error);
  CHECK(is(*queued->error, errc::not_routable));
  REQUIRE(running->error);
  CHECK(is(*running->error, errc::not_routable));
  CHECK(log->aborted == strings{"a:2"}); // the engine is told to drop what it runs
}

TEST_CASE_FIXTURE(router_fixture, "a request's own deadline_ms bounds its wait, and the rejection names why") {
  struct row {
    const char* name;
    std::uint32_t deadline_ms; // the request's; 0: the router's
    std::chrono::milliseconds router_deadline;
    std::chrono::milliseconds waited;
    bool rejected;
  };
  const row rows[] = {
    {"own deadline, not yet passed", 5000, 30s, 4999ms, false},
    {"own deadline passed", 5000, 30s, 5000ms, true},
    {"own deadline longer than the router's", 60000, 30s, 30s, false},
    {"no deadline: the router's, not yet passed", 0, 30s, 29999ms, false},
    {"no deadline: the router's passed", 0, 30s, 30s, true},
  };
  for (auto& row : rows) {
    CAPTURE(row.name);
    router_config cfg;
    cfg.queue_deadline = row.router_deadline;
    auto r = make_router(cfg);
    auto req = request(1);
    req.deadline_ms = row.deadline_ms;
    auto out = submit(r, req);
    sched.advance_time(row.waited);
    sched.run();
    CHECK(out->answered() == row.rejected);
    if (row.rejected) {
      REQUIRE(out->error);
      CHECK(is(*out->error, errc::not_routable));
      auto text = sys.render(*out->error);
      CHECK(text.find("deadline passed") != std::string::npos);
      CHECK(text.find("no engine is up") != std::string::npos);
      CHECK(status(r).rejected == 1);
    } else {
      CHECK(status(r).queued == 1);
    }
    caf::anon_send_exit(r, caf::exit_reason::user_shutdown); // answers what waits
    sched.run();
  }
}

TEST_CASE_FIXTURE(router_fixture, "a deadline beyond the limit is refused as malformed") {
  auto r = make_router();
  auto req = request(1);
  req.deadline_ms = static_cast<std::uint32_t>(max_request_deadline_ms) + 1;
  auto out = submit(r, req);
  REQUIRE(out->error);
  CHECK(is(*out->error, errc::malformed));
  CHECK(sys.render(*out->error).find("deadline_ms") != std::string::npos);
}

TEST_CASE_FIXTURE(router_fixture, "every engine down: requests wait, nothing goes to a dead engine, none is lost") {
  auto r = make_router();
  auto a = make_engine("a", 1, act::hold);
  auto b = make_engine("b", 1, act::hold);
  route(r, a, "a", 1);
  route(r, b, "b", 1);
  std::vector<std::shared_ptr<outcome>> outs;
  // A budget no two attempts use up, so each request is still running when its engine dies.
  for (std::uint64_t id = 1; id <= 4; ++id)
    outs.push_back(submit(r, request(id, {1, 2, 3}, 16)));
  CHECK(status(r).outstanding == 4);
  // The whole fleet dies at once.
  kill(a);
  kill(b);
  auto s = status(r);
  CHECK(s.outstanding == 0);
  CHECK(s.queued == 4);
  CHECK(s.routable == 0);
  // The coordinator, not yet aware, announces the dead incarnations again:
  // the router keeps them off the table and sends them nothing.
  log->dispatched.clear();
  route(r, a, "a", 1);
  route(r, b, "b", 1);
  CHECK(status(r).routable == 0);
  CHECK(log->dispatched.empty());
  // New requests wait too (the queue holds them; no error).
  outs.push_back(submit(r, request(5, {1, 2, 3}, 16)));
  CHECK(status(r).queued == 5);
  sched.advance_time(20s);
  sched.run();
  for (auto& o : outs)
    CHECK(!o->answered());
  // a restarts (a new incarnation under the same name): everything is served there.
  auto a2 = make_engine("a", 1);
  route(r, a2, "a", 1);
  CHECK(engines_of(*log) == strings{"a", "a", "a", "a", "a"});
  for (auto& o : outs) {
    REQUIRE(o->result);
    CHECK(o->result->engine == "a");
    CHECK(check(*o->result).empty());
  }
  s = status(r);
  CHECK(s.completed == 5);
  CHECK(s.rejected == 0);
  CHECK(s.queued == 0);
}

TEST_CASE_FIXTURE(router_fixture, "an engine reported silent comes back under the same handle") {
  auto r = make_router();
  auto a = make_engine("a");
  route(r, a, "a", 1);
  tell(r, failed_atom_v, std::string{"a"});
  sched.run();
  CHECK(status(r).routable == 0);
  auto waiting = submit(r, request(1));
  CHECK(!waiting->answered());
  // Healed (not dead): the coordinator's update makes the same handle routable again.
  route(r, a, "a", 1);
  CHECK(status(r).routable == 1);
  CHECK(waiting->result);
}

TEST_CASE_FIXTURE(router_fixture, "an engine whose link was lost comes back under the same handle") {
  auto r = make_router();
  auto a = make_engine("a");
  auto b = make_engine("b");
  route(r, a, "a", 1);
  route(r, b, "b", 1);
  // Its node's link drops: CAF reports the proxy down as unreachable (the
  // engine itself lives on in its node, as `a` does here).
  caf::anon_send(caf::actor_cast<caf::actor>(r), caf::down_msg{a.address(), caf::exit_reason::remote_link_unreachable});
  sched.run();
  CHECK(status(r).routable == 1);
  // The node rejoins with the same engine actors; the coordinator's update
  // after its catch-up round puts the same handle back on the table.
  route(r, a, "a", 1);
  CHECK(status(r).routable == 2);
  // A kill is a death: news of that incarnation stays off the table.
  kill(b);
  route(r, b, "b", 1);
  CHECK(status(r).routable == 1);
}

TEST_CASE_FIXTURE(router_fixture, "a finished relay leaves no monitor behind on the router or the sink") {
  auto r = make_router();
  auto a = make_engine("a");
  route(r, a, "a", 1);
  for (std::uint64_t id = 1; id <= 3; ++id)
    REQUIRE(submit(r, request(id))->result);
  REQUIRE(log->senders.size() == 3); // one relay per request
  for (auto& relay : log->senders) {
    CHECK_FALSE(caf::actor_cast<caf::strong_actor_ptr>(relay)); // it is gone
    // CAF 0.17 keeps a monitor on the watched actor until that one ends:
    // one a relay left on the router or the sink would hold a weak
    // reference to it beside the test's own.
    CHECK(caf::actor_cast<caf::actor_control_block*>(relay)->weak_refs == 1);
  }
}

TEST_CASE_FIXTURE(router_fixture, "a replica that refused a request is not chosen again for it at once") {
  router_config c;
  c.policy = router_policy::prefix_affinity;
  auto r = make_router(c);
  auto req = request(1, {7, 8, 9});
  // The replica the prompt's prefix prefers is full; the other is idle.
  const auto prefix = prefix_hash(req.prompt, c.affinity_prefix_tokens);
  const std::string preferred = affinity_score(prefix, "b") > affinity_score(prefix, "a") ? "b" : "a";
  const std::string other = preferred == "a" ? "b" : "a";
  auto full = std::make_shared<test::engine_script>();
  full->version = 1;
  full->on_generate = act::fail;
  full->refuse_with = errc::queue_full;
  rollout_engine_actor x = spawn(test::scripted_engine, preferred, full, log);
  auto y = make_engine(other);
  route(r, x, preferred, 1);
  route(r, y, other, 1);
  auto out = submit(r, req);
  REQUIRE(out->result);
  CHECK(out->result->engine == other);
  CHECK(engines_of(*log) == strings{preferred, other});
  // With every replica refusing, the request waits for the table to change
  // rather than bouncing until its reroutes run out.
  auto busy = std::make_shared<test::engine_script>(*full);
  rollout_engine_actor z = spawn(test::scripted_engine, other, busy, log);
  route(r, z, other, 1);
  log->dispatched.clear();
  auto waiting = submit(r, request(2, {7, 8, 9}));
  CHECK(engines_of(*log) == strings{preferred, other});
  CHECK(!waiting->answered());
  CHECK(status(r).queued == 1);
  busy->on_generate = act::answer;
  route(r, z, other, 1); // the next round's update
  REQUIRE(waiting->result);
  CHECK(waiting->result->engine == other);
}

TEST_CASE_FIXTURE(router_fixture, "a request its only replica refused goes there again once a slot frees") {
  auto r = make_router();
  auto script = std::make_shared<test::engine_script>();
  script->version = 1;
  script->on_generate = act::hold;
  rollout_engine_actor a = spawn(test::scripted_engine, std::string{"a"}, script, log);
  route(r, a, "a", 1);
  auto first = submit(r, request(1)); // held: it occupies a's last slot
  script->on_generate = act::fail;
  script->refuse_with = errc::queue_full;
  auto second = submit(r, request(2));
  CHECK(status(r).queued == 1); // refused, nowhere else to go: it waits
  script->on_generate = act::answer;
  release(a); // the first finishes: no route update, yet the second goes
  REQUIRE(first->result);
  REQUIRE(second->result);
  CHECK(second->result->engine == "a");
  CHECK(status(r).queued == 0);
}

TEST_CASE_FIXTURE(router_fixture, "queued requests share one deadline timer") {
  auto r = make_router();
  const auto timers_before = sched.clock().schedule().size();
  std::vector<std::shared_ptr<outcome>> outs;
  for (std::uint64_t id = 1; id <= 50; ++id)
    outs.push_back(submit(r, request(id)));
  CHECK(status(r).queued == 50);
  // A timer per request would outlive each dispatched one by its whole deadline.
  CHECK(sched.clock().schedule().size() <= timers_before + 1);
  auto short_wait = request(51);
  short_wait.deadline_ms = 100; // earlier than the others: the timer is armed again, earlier
  auto early = submit(r, short_wait);
  CHECK(sched.clock().schedule().size() <= timers_before + 2);
  sched.advance_time(100ms);
  sched.run();
  REQUIRE(early->error);
  CHECK(is(*early->error, errc::not_routable));
  CHECK(status(r).queued == 50); // the others wait on
  auto a = make_engine("a");
  route(r, a, "a", 1);
  for (auto& o : outs)
    CHECK(o->result);
  sched.advance_time(60s); // their old deadlines pass: nothing left to reject
  sched.run();
  CHECK(status(r).rejected == 1);
}

TEST_CASE_FIXTURE(router_fixture, "a rerouted request past its deadline is rejected with the tokens its sink has") {
  auto r = make_router();
  auto a = make_engine("a", 1, act::hold);
  route(r, a, "a", 1);
  auto req = request(1, {1, 2, 3}, 16);
  req.deadline_ms = 2000;
  auto out = submit(r, req);
  kill(a); // after two tokens: requeued, nothing else to go to
  CHECK(status(r).queued == 1);
  sched.advance_time(2s);
  sched.run();
  REQUIRE(out->result);
  CHECK(out->result->reason == finish_reason::rejected);
  CHECK(out->result->tokens == std::vector<std::int32_t>{100, 101});
  CHECK(check(*out->result).empty());
  CHECK(status(r).rejected == 1);
}
