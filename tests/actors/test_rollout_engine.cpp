// The rollout-engine actor on the deterministic scheduler: a real (tiny)
// engine behind the typed interface — streaming to a sink, pause/resume,
// the weight-update session over inline buckets, integrity checks.
#include "actors/rollout_engine.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "tests/support/phase_answer_sink.hpp"
#include "tests/support/actor_fixture.hpp"
#include "tests/support/engine_fixtures.hpp"
#include "tests/support/recording_sink.hpp"

using namespace rlsync;

namespace {

/// One bucket per tensor, as the inline path ships full tensors.
weight_bucket bucket_of(const tensor_view& t, std::uint64_t version) {
  weight_bucket b;
  b.version = version;
  b.entries.push_back({t.name, static_cast<std::uint8_t>(t.type), t.shape, 0, t.size, 0});
  const auto* p = reinterpret_cast<const std::uint8_t*>(t.data);
  b.data.assign(p, p + t.size);
  b.checksum = checksum64(b.data.data(), b.data.size());
  return b;
}

/// A test-stepped engine of the tiny model behind a fault gate the test
/// cuts off and heals (cfg.faults->partitioned).
rollout_engine_config partitionable(const std::string& name) {
  rollout_engine_config cfg;
  cfg.model = test::tiny_config();
  cfg.options.name = name;
  cfg.self_stepping = false;
  cfg.faults = std::make_shared<engine_fault_gate>();
  return cfg;
}

struct engine_fixture : test::actor_fixture {
  model_config config = test::tiny_config();
  test::source_weights v1 = test::make_source(config, dtype::bf16, 1);
  test::source_weights v2 = test::make_source(config, dtype::bf16, 2);
  rollout_engine_impl engine_impl;
  rollout_engine_actor engine;
  std::shared_ptr<test::sink_record> log = std::make_shared<test::sink_record>();
  token_sink_actor sink;

  engine_fixture() {
    rollout_engine_config cfg;
    cfg.model = config;
    cfg.options.name = "rollout-0";
    cfg.options.tp = 2;
    cfg.self_stepping = false; // the test steps the engine
    engine_impl = spawn(rollout_engine, cfg);
    engine = caf::actor_cast<rollout_engine_actor>(engine_impl);
    sink = spawn(test::recording_sink, log);
  }

  /// `n` engine steps, each run to quiescence (tokens reach the sink).
  void steps(int n) {
    for (int i = 0; i < n; ++i) {
      caf::send_as(engine_impl, engine_impl, step_atom::value);
      run();
    }
  }

  template <class T, class... Ts>
  caf::expected<T> ask(Ts... xs) {
    auto slot = request<T>(engine, xs...);
    run();
    REQUIRE(*slot);
    return **slot;
  }

  /// A whole session through inline buckets; returns the first error.
  caf::error update_to(const test::source_weights& w, std::uint64_t version, std::size_t skip_last = 0) {
    if (auto r = ask<phase_ack>(start_atom::value, version); !r)
      return r.error();
    auto views = w.views();
    for (std::size_t i = 0; i + skip_last < views.size(); ++i)
      if (auto r = ask<std::uint64_t>(update_atom::value, bucket_of(views[i], version)); !r)
        return r.error();
    auto r = ask<phase_ack>(finish_atom::value, version);
    return r ? caf::error{} : r.error();
  }

  generate_request request_of(std::uint64_t id, std::uint32_t max_tokens) {
    generate_request r;
    r.request_id = id;
    r.prompt = engine::encode("an actor-wrapped engine");
    r.sampling.max_tokens = max_tokens;
    r.sampling.stop_at_eos = false;
    return r;
  }
};

} // namespace

TEST_CASE_FIXTURE(engine_fixture, "a fresh engine holds no weights and refuses to generate") {
  auto r = ask<generate_result>(generate_atom::value, request_of(1, 4), sink);
  REQUIRE(!r);
  CHECK(is(r.error(), errc::engine_dirty));
  auto st = ask<engine_status>(status_atom::value);
  REQUIRE(st);
  CHECK(st->dirty);
  CHECK(st->name == "rollout-0");
}

TEST_CASE_FIXTURE(engine_fixture, "the cold sync over inline buckets, then tokens stream to the sink") {
  REQUIRE(ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false}));
  REQUIRE(!update_to(v1, 1));
  REQUIRE(ask<phase_ack>(resume_atom::value));
  auto slot = request<generate_result>(engine, generate_atom::value, request_of(1, 6), sink);
  run();
  steps(6);
  REQUIRE(*slot);
  auto r = **slot;
  REQUIRE(r);
  CHECK(r->tokens.size() == 6);
  CHECK(r->reason == finish_reason::length);
  REQUIRE(log->tokens.size() == 6);
  for (std::uint32_t i = 0; i < 6; ++i) {
    CHECK(log->tokens[i].index == i);
    CHECK(log->tokens[i].token == r->tokens[i]);
    CHECK(log->tokens[i].version == 1);
  }
  // The same weights loaded directly give the same tokens: the actor moved
  // every byte.
  engine::engine_options o;
  o.tp = 2;
  engine::engine_core direct(config, o);
  direct.load(v1.load(2), 1);
  std::vector<std::int32_t> expect;
  REQUIRE(!direct.add(request_of(1, 6), {[&](const token_event& e) { expect.push_back(e.token); }, {}}));
  for (int i = 0; i < 100 && direct.has_work(); ++i)
    direct.step();
  CHECK(r->tokens == expect);
}

TEST_CASE_FIXTURE(engine_fixture, "pause(keep) freezes generation until resume, the weights and version change in between") {
  REQUIRE(ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false}));
  REQUIRE(!update_to(v1, 1));
  REQUIRE(ask<phase_ack>(resume_atom::value));
  const std::uint32_t max_tokens = 10;
  auto result = request<generate_result>(engine, generate_atom::value, request_of(7, max_tokens), sink);
  run();
  steps(3);
  CHECK(log->tokens.size() == 3);
  auto report = ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false});
  REQUIRE(report);
  CHECK(report->frozen == 1);
  CHECK(report->state == scheduler_state::paused_all);
  auto frozen_at = log->tokens.size();
  steps(2);
  CHECK(log->tokens.size() == frozen_at); // nothing moves while paused
  CHECK(!*result);
  REQUIRE(!update_to(v2, 2));
  REQUIRE(ask<phase_ack>(resume_atom::value));
  steps(max_tokens - static_cast<int>(frozen_at));
  REQUIRE(*result);
  REQUIRE(**result);
  const auto& r = ***result;
  CHECK(r.tokens.size() == max_tokens);
  CHECK(frozen_at > 0);
  CHECK(frozen_at < max_tokens);
  REQUIRE(r.spans.size() == 2);
  CHECK(r.spans[0].version == 1);
  CHECK(r.spans[0].end == frozen_at);
  CHECK(r.spans[1].version == 2);
  CHECK(r.stale_kv_tokens == max_tokens - frozen_at); // clear_cache was false: stale KV, and said so
}

TEST_CASE_FIXTURE(engine_fixture, "pause(wait) answers once running requests finished, resume before is an error") {
  REQUIRE(ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false}));
  REQUIRE(!update_to(v1, 1));
  REQUIRE(ask<phase_ack>(resume_atom::value));
  auto result = request<generate_result>(engine, generate_atom::value, request_of(3, 8), sink);
  run();
  steps(2);
  auto pause = request<pause_report>(engine, pause_atom::value, pause_request{pause_mode::wait, false});
  run();
  CHECK(!*pause); // two of eight tokens so far: the pause waits
  auto early = request<phase_ack>(engine, resume_atom::value);
  run();
  REQUIRE(*early);
  REQUIRE(!**early);
  CHECK(is((*early)->error(), errc::pause_in_flight));
  steps(6);
  REQUIRE(*pause);
  REQUIRE(**pause);
  CHECK((**pause)->waited == 1);
  REQUIRE(*result);
  CHECK((**result)->tokens.size() == 8);
  CHECK(log->tokens.size() == 8); // every token was sent before the pause answered
}

TEST_CASE_FIXTURE(engine_fixture, "pause(wait) answers when a rerouted request's new attempt ends the last running one") {
  REQUIRE(ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false}));
  REQUIRE(!update_to(v1, 1));
  REQUIRE(ask<phase_ack>(resume_atom::value));
  auto first = request<generate_result>(engine, generate_atom::value, request_of(3, 8), sink);
  run();
  steps(2);
  auto pause = request<pause_report>(engine, pause_atom::value, pause_request{pause_mode::wait, false});
  run();
  REQUIRE(!*pause); // the request still runs
  // The same request again (the router rerouted it and its abort was lost):
  // the old attempt ends, and with it the last running request.
  auto other_log = std::make_shared<test::sink_record>();
  auto second = request<generate_result>(engine, generate_atom::value, request_of(3, 8),
                                         spawn(test::recording_sink, other_log));
  run();
  REQUIRE(*first);
  REQUIRE(**first);
  CHECK((**first)->reason == finish_reason::aborted);
  REQUIRE(*pause); // answered without another step
  REQUIRE(**pause);
  CHECK(!*second); // queued behind the pause
  REQUIRE(ask<phase_ack>(resume_atom::value));
  steps(8);
  REQUIRE(*second);
  REQUIRE(**second);
  CHECK((**second)->tokens.size() == 8);
}

TEST_CASE_FIXTURE(engine_fixture, "integrity: a corrupted bucket and an incomplete session leave the engine dirty") {
  REQUIRE(ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false}));
  REQUIRE(ask<phase_ack>(start_atom::value, std::uint64_t{1}));
  auto bucket = bucket_of(v1.views().front(), 1);
  bucket.data[5] ^= 0x40;
  auto corrupt = ask<std::uint64_t>(update_atom::value, bucket);
  REQUIRE(!corrupt);
  CHECK(is(corrupt.error(), errc::checksum_mismatch));
  // A bucket of another version (a late one of an earlier session) is not this session's.
  auto late = ask<std::uint64_t>(update_atom::value, bucket_of(v1.views().front(), 0));
  REQUIRE(!late);
  CHECK(is(late.error(), errc::version_mismatch));
  auto incomplete = update_to(v1, 2, 1); // every tensor but the last
  CHECK(is(incomplete, errc::update_incomplete));
  auto st = ask<engine_status>(status_atom::value);
  CHECK(st->dirty);
  REQUIRE(ask<phase_ack>(resume_atom::value));
  auto refused = ask<generate_result>(generate_atom::value, request_of(1, 2), sink);
  CHECK(is(refused.error(), errc::engine_dirty));
  // A complete update repairs it.
  REQUIRE(ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false}));
  REQUIRE(!update_to(v1, 3));
  CHECK(!ask<engine_status>(status_atom::value)->dirty);
}

TEST_CASE_FIXTURE(engine_fixture, "malformed calls are refused, heartbeats echo") {
  auto bad = ask<pause_report>(pause_atom::value, pause_request{static_cast<pause_mode>(9), false});
  CHECK(is(bad.error(), errc::malformed));
  auto not_paused = ask<phase_ack>(start_atom::value, std::uint64_t{1});
  CHECK(is(not_paused.error(), errc::not_paused));
  auto hb = ask<heartbeat>(heartbeat_atom::value, heartbeat{"coordinator", 41});
  REQUIRE(hb);
  CHECK(hb->seq == 41);
  CHECK(hb->from == "rollout-0");
}

TEST_CASE_FIXTURE(engine_fixture, "resume without finish (an aborted round) closes the session: clean if nothing arrived") {
  REQUIRE(ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false}));
  REQUIRE(!update_to(v1, 1));
  REQUIRE(ask<phase_ack>(resume_atom::value));
  std::size_t buckets = 0;
  bool dirty = false;
  SUBCASE("nothing of v2 arrived: it serves v1 again") {
    buckets = 0;
    dirty = false;
  }
  SUBCASE("one bucket of v2 arrived: dirty, it serves nothing") {
    buckets = 1;
    dirty = true;
  }
  REQUIRE(ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false}));
  REQUIRE(ask<phase_ack>(start_atom::value, std::uint64_t{2}));
  auto views = v2.views();
  for (std::size_t i = 0; i < buckets; ++i)
    REQUIRE(ask<std::uint64_t>(update_atom::value, bucket_of(views[i], 2)));
  auto ack = ask<phase_ack>(resume_atom::value); // the round's continue, no finish before it
  REQUIRE(ack);
  CHECK(ack->engine == "rollout-0");
  CHECK(ack->version == 1);
  CHECK(ack->dirty == dirty);
  auto st = ask<engine_status>(status_atom::value);
  REQUIRE(st);
  CHECK(st->version == 1);
  CHECK(st->dirty == dirty);
  CHECK(st->state == scheduler_state::unpaused);
  auto result = request<generate_result>(engine, generate_atom::value, request_of(1, 4), sink);
  run();
  steps(4);
  REQUIRE(*result);
  if (dirty) {
    REQUIRE(!**result);
    CHECK(is((*result)->error(), errc::engine_dirty));
    CHECK(log->tokens.empty());
  } else {
    REQUIRE(**result);
    CHECK((**result)->tokens.size() == 4);
    REQUIRE(log->tokens.size() == 4);
    for (auto& t : log->tokens)
      CHECK(t.version == 1);
  }
  // The session is closed: a finish now has none; the next round completes.
  auto late = ask<phase_ack>(finish_atom::value, std::uint64_t{2});
  CHECK(is(late.error(), errc::no_session));
  REQUIRE(ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false}));
  REQUIRE(!update_to(v2, 2));
  REQUIRE(ask<phase_ack>(resume_atom::value));
  st = ask<engine_status>(status_atom::value);
  CHECK(st->version == 2);
  CHECK(!st->dirty);
}

TEST_CASE_FIXTURE(engine_fixture, "a request whose sink is gone ends on the engine") {
  // The router closes an attempt's relay when it reroutes the request: the
  // engine must not go on generating tokens nobody receives.
  REQUIRE(ask<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false}));
  REQUIRE(!update_to(v1, 1));
  REQUIRE(ask<phase_ack>(resume_atom::value));
  auto other_log = std::make_shared<test::sink_record>();
  auto doomed = spawn(test::recording_sink, other_log);
  auto kept = request<generate_result>(engine, generate_atom::value, request_of(1, 8), sink);
  auto orphan = request<generate_result>(engine, generate_atom::value, request_of(2, 8), doomed);
  run();
  steps(2);
  CHECK(other_log->tokens.size() == 2);
  caf::anon_send_exit(doomed, caf::exit_reason::kill);
  run();
  REQUIRE(*orphan);
  REQUIRE(**orphan);
  CHECK((**orphan)->reason == finish_reason::aborted);
  auto st = ask<engine_status>(status_atom::value);
  REQUIRE(st);
  CHECK(st->running + st->waiting == 1);
  steps(6);
  REQUIRE(*kept);
  REQUIRE(**kept);
  CHECK((**kept)->tokens.size() == 8);
  CHECK(other_log->tokens.size() == 2);
}

TEST_CASE_FIXTURE(test::actor_fixture, "partition gate: an order is lost while cut off, one taken before is answered") {
  auto cfg = partitionable("rollout-order-cut");
  auto engine = caf::actor_cast<rollout_engine_actor>(spawn(rollout_engine, cfg));
  auto answers = std::make_shared<std::vector<test::answer>>();
  auto coordinator = spawn(test::answer_sink, answers);
  cfg.faults->partitioned = true;
  caf::send_as(coordinator, engine, phase_atom::value, test::order_of(sync_phase::flush, 1));
  run();
  CHECK(answers->empty()); // lost in the partition
  cfg.faults->partitioned = false;
  caf::send_as(coordinator, engine, phase_atom::value, test::order_of(sync_phase::flush, 2));
  sched.run_once(); // the engine takes the order (and asks itself the flush) ...
  REQUIRE(answers->empty());
  cfg.faults->partitioned = true; // ... and is cut off before it answers itself
  run();
  REQUIRE(answers->size() == 1); // an order taken is answered
  CHECK(answers->front().token == 2);
  CHECK(answers->front().what == "ack");
}

TEST_CASE_FIXTURE(test::actor_fixture, "partition gate: cut off, no request is answered, healed, every one is") {
  auto cfg = partitionable("rollout-cut");
  auto engine = caf::actor_cast<rollout_engine_actor>(spawn(rollout_engine, cfg));
  cfg.faults->partitioned = true;
  auto hb = request<heartbeat>(engine, heartbeat_atom::value, heartbeat{"coordinator", 7});
  auto status = request<engine_status>(engine, status_atom::value);
  auto flush = request<phase_ack>(engine, flush_atom::value);
  auto pause = request<pause_report>(engine, pause_atom::value, pause_request{pause_mode::keep, false});
  auto bad = request<phase_ack>(engine, start_atom::value, std::uint64_t{1}); // not paused: an error if it ran
  auto digest = request<weight_digest>(engine, digest_atom::value);
  run();
  CHECK(!hb->has_value());
  CHECK(!status->has_value());
  CHECK(!flush->has_value());
  CHECK(!pause->has_value());
  CHECK(!bad->has_value()); // the handler did not run: no refusal either
  CHECK(!digest->has_value());
  cfg.faults->partitioned = false;
  auto hb2 = request<heartbeat>(engine, heartbeat_atom::value, heartbeat{"coordinator", 8});
  auto status2 = request<engine_status>(engine, status_atom::value);
  auto bad2 = request<phase_ack>(engine, start_atom::value, std::uint64_t{1});
  run();
  REQUIRE(hb2->has_value());
  REQUIRE(**hb2);
  CHECK((**hb2)->seq == 8);
  CHECK((**hb2)->from == "rollout-cut");
  REQUIRE(status2->has_value());
  CHECK(**status2);
  REQUIRE(bad2->has_value());
  CHECK(is((**bad2).error(), errc::not_paused));
}
