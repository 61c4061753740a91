// The workload driver against a scripted router (tests/support/scripted_router.hpp)
// on CAF's deterministic scheduler: it streams canned tokens to the driver
// (its sink) and answers, refuses, holds or garbles requests as each test
// scripts it.
// Time moves only with advance(), which is how the retry backoff and the
// request deadline are reached without sleeping.
#include "actors/router.hpp"
#include "actors/workload.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/engine/tokenizer.hpp"

#include "tests/support/actor_fixture.hpp"
#include "tests/support/scripted_engine.hpp"
#include "tests/support/scripted_router.hpp"

#include <algorithm>
#include <future>
#include <map>
#include <set>

using namespace rlsync;
using namespace rlsync::test;
using namespace std::chrono_literals;

namespace {

struct workload_fixture : test::actor_fixture {
  std::shared_ptr<router_script> script = std::make_shared<router_script>();
  scripted_router_actor router;
  std::shared_ptr<std::vector<workload_progress>> progress =
    std::make_shared<std::vector<workload_progress>>();
  std::future<workload_result> future;
  caf::actor driver;

  workload_fixture() {
    router = spawn(scripted_router, script);
    run();
  }

  /// Spawns the driver; nothing runs until the test runs the scheduler.
  void start(workload_options opts) {
    auto done = std::make_shared<std::promise<workload_result>>();
    future = done->get_future();
    auto seen = progress;
    driver = spawn_workload(sys, caf::actor_cast<router_actor>(router), opts,
                            [seen](const workload_progress& p) { seen->push_back(p); }, done);
  }

  bool finished() {
    return future.wait_for(0s) == std::future_status::ready;
  }

  workload_result result() {
    REQUIRE(finished());
    return future.get();
  }

  void release() {
    caf::anon_send(router, resume_atom_v);
    run();
  }
  /// A new scripted router, handed to the driver as the next one; its script.
  std::shared_ptr<router_script> attach_next_router() {
    auto next_script = std::make_shared<router_script>();
    auto next = spawn(scripted_router, next_script);
    run();
    set_workload_router(driver, caf::actor_cast<router_actor>(next));
    run();
    return next_script;
  }

  /// An engine for the real router: three tokens per request, the first two
  /// at version 1, the last at version 2.
  rollout_engine_actor spawn_canned_engine() {
    auto canned = std::make_shared<engine_script>();
    canned->tokens = 3;
    canned->token_versions = {1, 1, 2};
    return spawn(scripted_engine, std::string{"e"}, canned, std::make_shared<engine_journal>());
  }
};

workload_options small(std::uint32_t prompts, std::uint32_t concurrency) {
  workload_options o;
  o.prompts = prompts;
  o.concurrency = concurrency;
  o.max_tokens = 8;
  return o;
}

bool mentions(const std::vector<std::string>& errors, const std::string& word) {
  return std::any_of(errors.begin(), errors.end(),
                     [&](auto& e) { return e.find(word) != std::string::npos; });
}

} // namespace

TEST_CASE("workload prompts are deterministic and distinct") {
  std::set<std::string> seen;
  for (std::uint32_t i = 0; i < 100; ++i) {
    CHECK(workload_prompt(i) == workload_prompt(i));
    seen.insert(workload_prompt(i));
  }
  CHECK(seen.size() == 100);
  workload_spec spec;
  spec.prompts = 10;
  spec.concurrency = 3;
  spec.max_tokens = 5;
  spec.temperature = 0.5;
  spec.seed = 9;
  auto o = to_workload_options(spec);
  CHECK(o.prompts == 10);
  CHECK(o.concurrency == 3);
  CHECK(o.max_tokens == 5);
  CHECK(o.temperature == 0.5f);
  CHECK(o.seed == 9);
}

TEST_CASE_FIXTURE(workload_fixture, "every request completes and the counts add up") {
  auto opts = small(5, 2);
  opts.temperature = 0.7f;
  opts.top_p = 0.9f;
  opts.seed = 40;
  start(opts);
  run();
  auto r = result();
  CHECK(r.completed == 5);
  CHECK(r.failed == 0);
  CHECK(r.rejected == 0);
  CHECK(r.not_sent == 0);
  CHECK(r.tokens == 15);
  CHECK(r.streamed_tokens == 15);
  CHECK(r.tokens_by_version == std::map<std::uint64_t, std::uint64_t>{{1, 10}, {2, 5}});
  CHECK(r.stale_kv_tokens == 5);
  CHECK(r.stream_mismatches == 0);
  CHECK(r.errors.empty());
  CHECK(r.seconds >= 0);
  // Requests: ids 1..5, each with its prompt, the sampling and seed + i.
  REQUIRE(script->received.size() == 5);
  for (std::uint32_t i = 0; i < 5; ++i) {
    auto& req = script->received[i];
    CHECK(req.request_id == i + 1);
    CHECK(req.prompt == engine::encode(workload_prompt(i)));
    CHECK(req.generated.empty());
    CHECK(req.sampling.seed == 40 + i);
    CHECK(req.sampling.max_tokens == 8);
    CHECK(req.sampling.temperature == 0.7f);
    CHECK(req.sampling.top_p == 0.9f);
    CHECK(req.sampling.stop_at_eos);
  }
  // Progress after each request, ending at the totals.
  REQUIRE(progress->size() == 5);
  CHECK(progress->back().sent == 5);
  CHECK(progress->back().completed == 5);
  CHECK(progress->back().tokens == 15);
}

TEST_CASE_FIXTURE(workload_fixture, "no more than concurrency requests are outstanding") {
  script->hold = true;
  start(small(10, 3));
  run();
  CHECK(script->outstanding == 3);
  CHECK(script->received.size() == 3);
  for (int round = 0; round < 10 && !finished(); ++round)
    release();
  auto r = result();
  CHECK(r.completed == 10);
  CHECK(script->max_outstanding == 3);
  CHECK(script->received.size() == 10);
}

TEST_CASE_FIXTURE(workload_fixture, "a refused request is retried after a backoff and completes") {
  script->refuse = {{2, 2}}; // request 2: queue_full twice, then served
  start(small(3, 3));
  run();
  CHECK(!finished());
  CHECK(script->attempts[2] == 1);
  advance(49ms); // first backoff: 50 ms
  CHECK(script->attempts[2] == 1);
  advance(1ms);
  CHECK(script->attempts[2] == 2);
  advance(99ms); // second backoff: 100 ms
  CHECK(script->attempts[2] == 2);
  advance(1ms);
  CHECK(script->attempts[2] == 3);
  auto r = result();
  CHECK(r.completed == 3);
  CHECK(r.rejected == 0);
  CHECK(r.stream_mismatches == 0);
  CHECK(r.errors.empty());
  CHECK(progress->back().sent == 3); // a retry is not a new request
}

TEST_CASE_FIXTURE(workload_fixture, "a request refused every time is rejected after max_retries") {
  script->refuse = {{1, 100}};
  script->refuse_with = errc::not_routable;
  auto opts = small(2, 2);
  opts.max_retries = 2;
  start(opts);
  run();
  advance(50ms);
  advance(100ms);
  auto r = result();
  CHECK(script->attempts[1] == 3); // the first send and two retries
  CHECK(r.rejected == 1);
  CHECK(r.completed == 1);
  REQUIRE(r.errors.size() == 1);
  CHECK(mentions(r.errors, "request 1"));
  CHECK(mentions(r.errors, "not_routable"));
}

TEST_CASE_FIXTURE(workload_fixture, "engine failures and other errors count as failed, malformed as rejected") {
  script->reasons = {{1, finish_reason::failed}, {2, finish_reason::aborted},
                     {3, finish_reason::eos}};
  script->errors = {{4, make_error(errc::engine_dirty, "partial update")},
                    {5, make_error(errc::malformed, "bad request")}};
  start(small(6, 2));
  run();
  auto r = result();
  CHECK(r.completed == 2); // 3 (eos) and 6
  CHECK(r.failed == 3);    // 1, 2, 4
  CHECK(r.rejected == 1);  // 5, not retried
  CHECK(script->attempts[5] == 1);
  CHECK(r.tokens == 12);   // results 1, 2, 3 and 6 carry tokens
  CHECK(r.errors.size() == 4);
  CHECK(mentions(r.errors, "engine_dirty"));
  CHECK(mentions(r.errors, "failed on fake"));
}

TEST_CASE_FIXTURE(workload_fixture, "a gap, a reordering or a duplicate in a stream is a mismatch") {
  script->faults = {{1, stream_fault::drop}, {2, stream_fault::swap},
                    {3, stream_fault::duplicate}};
  start(small(5, 5));
  run();
  auto r = result();
  CHECK(r.stream_mismatches == 3);
  CHECK(r.completed == 5);
  CHECK(r.streamed_tokens == 2 + 3 + 4 + 3 + 3); // every event received counts
}

TEST_CASE_FIXTURE(workload_fixture, "stop sends nothing new, awaits the outstanding and delivers") {
  script->hold = true;
  start(small(10, 2));
  run();
  CHECK(script->received.size() == 2);
  stop_workload(driver);
  run();
  CHECK(!finished()); // two still outstanding
  release();
  auto r = result();
  CHECK(r.completed == 2);
  CHECK(r.not_sent == 8);
  CHECK(script->received.size() == 2);
}

TEST_CASE_FIXTURE(workload_fixture, "stop settles a request waiting for its retry at once") {
  script->refuse = {{1, 100}};
  start(small(4, 1)); // request 1 holds the only slot while it waits
  run();
  CHECK(!finished());
  stop_workload(driver);
  run(); // no time passes: the backoff timer never fires
  auto r = result();
  CHECK(r.rejected == 1);
  CHECK(r.completed == 0);
  CHECK(r.not_sent == 3);
  CHECK(mentions(r.errors, "stopped before a retry"));
  CHECK(script->attempts[1] == 1);
  advance(1s); // the stale retry timer lands nowhere
  CHECK(script->attempts[1] == 1);
}

TEST_CASE_FIXTURE(workload_fixture, "a request the router never answers fails at its deadline") {
  script->hold = true;
  auto opts = small(1, 1);
  opts.request_deadline = 2000ms;
  start(opts);
  run();
  advance(1999ms);
  CHECK(!finished());
  advance(1ms);
  auto r = result();
  CHECK(r.failed == 1);
  CHECK(mentions(r.errors, "request_timeout"));
  release(); // the late answer is dropped
}

TEST_CASE_FIXTURE(workload_fixture, "no prompts: the result comes at once") {
  start(small(0, 4));
  run();
  auto r = result();
  CHECK(r.completed == 0);
  CHECK(script->received.empty());
}

TEST_CASE_FIXTURE(workload_fixture, "a killed driver still fulfils the promise") {
  script->hold = true;
  start(small(5, 2));
  run();
  caf::anon_send_exit(driver, caf::exit_reason::kill);
  run();
  auto r = result();
  CHECK(r.failed == 2);
  CHECK(r.not_sent == 3);
  CHECK(mentions(r.errors, "outstanding"));
  release();
}

TEST_CASE_FIXTURE(workload_fixture, "through the real router: queue_full is retried, streams match") {
  router_config cfg;
  cfg.queue_limit = 1; // nothing routable yet: one request waits, the others are refused
  auto real = spawn_router(sys, cfg);
  auto engine = spawn_canned_engine();
  run();
  auto done = std::make_shared<std::promise<workload_result>>();
  auto fut = done->get_future();
  spawn_workload(sys, real, small(3, 3), nullptr, done);
  run();
  tell(real, route_atom_v, route_update{"e", 2, true}, engine);
  run(); // the queued request is served now
  CHECK(fut.wait_for(0s) != std::future_status::ready); // two wait for their retry
  advance(50ms); // the refused ones come back and are served
  REQUIRE(fut.wait_for(0s) == std::future_status::ready);
  auto r = fut.get();
  CHECK(r.completed == 3);
  CHECK(r.rejected == 0);
  CHECK(r.streamed_tokens == 9);
  CHECK(r.stream_mismatches == 0);
  CHECK(r.tokens_by_version == std::map<std::uint64_t, std::uint64_t>{{1, 6}, {2, 3}});
  caf::anon_send_exit(real, caf::exit_reason::user_shutdown);
  run();
}

TEST_CASE_FIXTURE(workload_fixture, "requests a dead router held go to the next one as continuations") {
  script->hold = true;
  script->held_stream = 1; // each request streams one token, then the router dies
  start(small(2, 2));
  run();
  REQUIRE(script->received.size() == 2);
  caf::anon_send_exit(router, caf::exit_reason::kill);
  run();
  CHECK(!finished()); // the requests wait for a router
  auto next_script = attach_next_router();
  REQUIRE(next_script->received.size() == 2);
  for (auto& req : next_script->received) // each continues after the token it had
    CHECK(req.generated == std::vector<std::int32_t>{static_cast<std::int32_t>(req.request_id * 100)});
  auto r = result();
  CHECK(r.completed == 2);
  CHECK(r.failed == 0);
  CHECK(r.stream_mismatches == 0);
  CHECK(r.tokens == 6); // three per request: one before the router died, two after
  CHECK(r.streamed_tokens == 6);
  CHECK(r.tokens_by_version == std::map<std::uint64_t, std::uint64_t>{{1, 4}, {2, 2}});
}

TEST_CASE_FIXTURE(workload_fixture, "requests bounced unread by a dying router go to the next one, not failed") {
  // The router dies reading the first of three requests, the others still
  // in its mailbox: CAF answers those request_receiver_down before it sends
  // the monitors' down message, so the driver hears of them first.
  script->die_on = 1;
  start(small(3, 3));
  run();
  CHECK(script->received.size() == 1);
  CHECK(!finished()); // the requests wait for a router
  auto next_script = attach_next_router();
  CHECK(next_script->received.size() == 3);
  auto r = result();
  CHECK(r.completed == 3);
  CHECK(r.failed == 0);
}

TEST_CASE_FIXTURE(workload_fixture, "without a new router, the requests a dead router held fail at their deadline") {
  script->hold = true;
  auto opts = small(1, 1);
  opts.request_deadline = 1000ms;
  start(opts);
  run();
  caf::anon_send_exit(router, caf::exit_reason::kill);
  run();
  advance(999ms);
  CHECK(!finished());
  advance(1ms);
  auto r = result();
  CHECK(r.failed == 1);
  CHECK(mentions(r.errors, "no other came in time"));
}
