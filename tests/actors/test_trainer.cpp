// The trainer on CAF's deterministic scheduler. Versions are computed by a
// job runner the test drives by hand, so the test decides when a step's
// work happens and when its result arrives, and time moves only when the
// test moves it. One last case runs the real scheduler and a real thread
// end to end, with bounded waits.
#include "actors/trainer.hpp"

#include <caf/scoped_actor.hpp>

#include "runtime/engine/apply_packed.hpp"
#include "runtime/engine/recording.hpp"
#include "tests/support/actor_fixture.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/threaded_system.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/bucket.hpp"
#include "runtime/transfer/packing.hpp"

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <deque>
#include <future>

using namespace rlsync;
using namespace std::chrono_literals;

namespace {

/// Jobs wait until the test runs them, on the test's thread.
struct manual_runner final : job_runner {
  std::deque<std::function<void()>> jobs;
  bool refuse = false; ///< act full
  bool post(std::function<void()> job) override {
    if (refuse)
      return false;
    jobs.push_back(std::move(job));
    return true;
  }
  bool run_one() {
    if (jobs.empty())
      return false;
    auto job = std::move(jobs.front());
    jobs.pop_front();
    job();
    return true;
  }
};

struct trainer_fixture : test::actor_fixture {
  std::shared_ptr<manual_runner> runner = std::make_shared<manual_runner>();
  std::shared_ptr<manual_runner> packer = std::make_shared<manual_runner>(); ///< CAF pull replies
  std::vector<std::string> log;

  trainer_config config(std::shared_ptr<transfer::weight_source> source) {
    trainer_config c;
    c.source = std::move(source);
    c.step_time = 100ms;
    c.runner = runner;
    c.packer = packer;
    c.log = [this](const std::string& line) { log.push_back(line); };
    return c;
  }

  /// A listener that records every version it is told about.
  version_listener_actor listener(std::shared_ptr<std::vector<version_info>> seen) {
    return spawn([seen](version_listener_actor::pointer) -> version_listener_actor::behavior_type {
      return {[seen](version_atom, const version_info& v) { seen->push_back(v); }};
    });
  }

  /// Lets the pending step do its work, then delivers its result.
  void finish_step() {
    REQUIRE(runner->run_one());
    run();
  }

  trainer_state& state(const trainer_impl_actor& t) {
    auto* ptr = caf::actor_cast<caf::abstract_actor*>(t);
    return dynamic_cast<trainer_impl_actor::stateful_pointer<trainer_state>>(ptr)->state;
  }

  /// Runs the scheduler and every CAF pull reply the packer holds.
  void run_with_packer() {
    run();
    while (packer->run_one())
      run();
  }

  template <class T>
  T answer(const slot<T>& s) {
    run_with_packer();
    REQUIRE(s->has_value());
    REQUIRE(**s);
    return ***s;
  }

  template <class T>
  caf::error failure(const slot<T>& s) {
    run_with_packer();
    REQUIRE(s->has_value());
    REQUIRE_FALSE(**s);
    return (*s)->error();
  }
};

std::uint64_t sum_bytes(const std::vector<tensor_spec>& specs) {
  std::uint64_t n = 0;
  for (const auto& s : specs)
    n += s.bytes();
  return n;
}

} // namespace

TEST_CASE_FIXTURE(trainer_fixture, "trainer: a version every step_time, computed off the mailbox, told to subscribers") {
  const model_config c = test::small_model(3);
  auto source = test::small_source(c);
  auto t = spawn(trainer, config(source));
  run();
  REQUIRE(runner->jobs.size() == 1); // the first step started at once

  // The mailbox stays free while a step is computed.
  CHECK(answer(request<version_info>(t, version_atom::value)).version == 0);
  auto seen = std::make_shared<std::vector<version_info>>();
  tell(t, subscribe_atom::value, listener(seen));
  run();
  CHECK(seen->empty()); // nothing published yet

  finish_step();
  REQUIRE(seen->size() == 1);
  CHECK(seen->back().version == 1);
  CHECK(seen->back().groups == 3);
  CHECK(seen->back().total_bytes == sum_bytes(llama_parameter_specs(c, dtype::bf16)));
  CHECK(seen->back().same_bytes_since == 1);
  CHECK(answer(request<version_info>(t, version_atom::value)).version == 1);

  // The next step starts step_time after the previous one started.
  advance(99ms);
  CHECK(runner->jobs.empty());
  advance(1ms);
  REQUIRE(runner->jobs.size() == 1);
  // At most one step in flight, however long it takes.
  advance(1s);
  CHECK(runner->jobs.size() == 1);
  finish_step();
  REQUIRE(seen->size() == 2);
  CHECK(seen->back().version == 2);
  CHECK(seen->back().same_bytes_since == 2); // perturbed: new bytes
  // A step that took longer than step_time is followed at once.
  advance(0ms);
  CHECK(runner->jobs.size() == 1);
  finish_step();
  CHECK(seen->back().version == 3);
  CHECK(state(t).steps == 3);
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: a step that changed nothing publishes since when its bytes are the same") {
  transfer::synthetic_options o;
  o.config = test::small_model(2);
  o.perturb = 0;
  auto source = std::make_shared<transfer::synthetic_source>(o);
  auto t = spawn(trainer, config(source));
  auto seen = std::make_shared<std::vector<version_info>>();
  tell(t, subscribe_atom::value, listener(seen));
  run();
  for (std::uint64_t v = 1; v <= 3; ++v) {
    advance(100ms);
    finish_step();
    REQUIRE(seen->size() == v);
    CHECK(seen->back().version == v);
    CHECK(seen->back().same_bytes_since == 1);
  }
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: metadata, and one group inline for the CAF fallback path") {
  const model_config c = test::small_model(3);
  auto source = test::small_source(c, /*keep*/ 2);
  auto t = spawn(trainer, config(source));
  run();
  finish_step();

  auto meta = answer(request<std::vector<tensor_meta>>(t, meta_atom::value));
  auto specs = llama_parameter_specs(c, dtype::bf16);
  REQUIRE(meta.size() == specs.size());
  for (std::size_t i = 0; i < meta.size(); ++i) {
    CHECK(meta[i].name == specs[i].name);
    CHECK(meta[i].dtype == static_cast<std::uint8_t>(dtype::bf16));
    CHECK(meta[i].shape == specs[i].shape);
  }

  auto v1 = source->find(1);
  for (std::uint32_t g = 0; g < 3; ++g) {
    auto b = answer(request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, g));
    CHECK(b.version == 1);
    CHECK(b.group == g);
    CHECK(check(b).empty());
    CHECK(transfer::verify_bucket(b));
    std::vector<tensor_spec> want(v1->group(g).begin(), v1->group(g).end());
    transfer::bucket_assembler a(want);
    a.add(b);
    REQUIRE(a.complete());
    auto got = a.tensors();
    for (std::size_t i = 0; i < got.size(); ++i)
      CHECK(test::bytes_of(got[i]) == test::bytes_of(v1->group(g)[i]));
  }

  CHECK(is(failure(request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, std::uint32_t{3})),
           errc::unknown_name));
  // Two more versions: the source keeps two, version 1 is gone.
  advance(100ms);
  finish_step();
  advance(100ms);
  finish_step();
  auto err = failure(request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, std::uint32_t{0}));
  CHECK(is(err, errc::version_gone));
  CHECK(sys.render(err).find("held: 2, 3") != std::string::npos);
  CHECK(answer(request<heartbeat>(t, heartbeat_atom::value, heartbeat{"x", 4})).seq == 4);
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: CAF pulls are packed off the mailbox, within the reply budget") {
  const model_config c = test::small_model(3);
  auto source = test::small_source(c, /*keep*/ 2);
  auto cfg = config(source);
  const std::uint32_t groups = 3; // all the small model has
  std::uint64_t all_groups = 0;
  source->produce_next();
  for (std::uint32_t g = 0; g < groups; ++g)
    all_groups += source->find(1)->group_bytes(g);
  std::size_t packed_at_once = 0;
  SUBCASE("a budget below any group: one at a time") {
    cfg.caf_reply_budget_bytes = 1;
    packed_at_once = 1;
  }
  SUBCASE("a budget for every group: all at once") {
    cfg.caf_reply_budget_bytes = all_groups;
    packed_at_once = groups;
  }
  auto t = spawn(trainer, cfg);
  run();
  finish_step(); // publishes v2; v1 stays held
  std::vector<slot<weight_bucket>> replies;
  for (std::uint32_t g = 0; g < groups; ++g)
    replies.push_back(request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, g));
  run();
  CHECK(packer->jobs.size() == packed_at_once);
  for (auto& r : replies)
    CHECK_FALSE(r->has_value());
  // The mailbox is free while the copies wait: a heartbeat is answered.
  auto beat = request<heartbeat>(t, heartbeat_atom::value, heartbeat{"x", 9});
  run();
  REQUIRE(beat->has_value());
  CHECK((**beat)->seq == 9);
  // A reply claimed by anyone but the trainer's packer is ignored.
  weight_bucket forged;
  forged.version = 1;
  forged.group = 0;
  tell(t, packed_atom::value, std::uint64_t{1}, forged);
  tell(t, packed_atom::value, std::uint64_t{1}, std::string("forged"));
  run();
  CHECK_FALSE(replies[0]->has_value());
  CHECK(packer->jobs.size() == packed_at_once);
  // Each packed reply frees its bytes; the next waiting one is packed then.
  REQUIRE(packer->run_one());
  run();
  REQUIRE(replies[0]->has_value());
  CHECK(packer->jobs.size() == std::min<std::size_t>(packed_at_once, groups - 1));
  auto v1 = source->find(1);
  for (std::uint32_t g = 0; g < groups; ++g) {
    auto b = answer(replies[g]);
    CHECK(b.group == g);
    CHECK(b.data.size() == v1->group_bytes(g));
    CHECK(transfer::verify_bucket(b));
  }
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: CAF pulls beyond max_waiting_pulls are refused, naming the bound") {
  const model_config c = test::small_model(3);
  auto source = test::small_source(c, /*keep*/ 2);
  auto cfg = config(source);
  cfg.caf_reply_budget_bytes = 1; // one packed at a time
  cfg.max_waiting_pulls = 1;
  auto t = spawn(trainer, cfg);
  run();
  finish_step();
  std::vector<slot<weight_bucket>> replies;
  for (std::uint32_t g = 0; g < 3; ++g) // one packing, one waiting, one refused
    replies.push_back(request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, g));
  run();
  REQUIRE(replies[2]->has_value());
  REQUIRE_FALSE(**replies[2]);
  CHECK(is((*replies[2])->error(), errc::queue_full));
  CHECK(sys.render((*replies[2])->error()).find("max_waiting_pulls") != std::string::npos);
  for (std::uint32_t g = 0; g < 2; ++g)
    CHECK(answer(replies[g]).group == g);
  // The queue drained: pulls are taken again.
  CHECK(answer(request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, std::uint32_t{2})).group == 2);
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: a pull the packer refuses waits while another packs, and a stopping trainer answers every pull") {
  const model_config c = test::small_model(3);
  auto source = test::small_source(c, /*keep*/ 2);
  auto t = spawn(trainer, config(source));
  run();
  finish_step();
  auto first = request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, std::uint32_t{0});
  run();
  REQUIRE(packer->jobs.size() == 1);
  packer->refuse = true; // full for now
  auto second = request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, std::uint32_t{1});
  run();
  CHECK_FALSE(second->has_value()); // waits for the pack in flight, not refused
  packer->refuse = false;
  CHECK(answer(first).group == 0);
  CHECK(answer(second).group == 1);

  // Stopping with pulls being packed and waiting: each is answered at once.
  std::vector<slot<weight_bucket>> held;
  for (std::uint32_t g = 0; g < 3; ++g)
    held.push_back(request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, g));
  run();
  REQUIRE(packer->jobs.size() == 3);
  for (auto& h : held)
    REQUIRE_FALSE(h->has_value());
  caf::anon_send_exit(t, caf::exit_reason::user_shutdown);
  run();
  for (std::uint32_t g = 0; g < 3; ++g) {
    REQUIRE(held[g]->has_value());
    REQUIRE_FALSE(**held[g]);
    CHECK(is((*held[g])->error(), errc::round_aborted));
    CHECK(sys.render((*held[g])->error()).find("stopped before group " + std::to_string(g)) != std::string::npos);
  }
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: late subscribers hear the current version, dead ones are dropped") {
  auto source = test::small_source(test::small_model(2));
  auto t = spawn(trainer, config(source));
  run();
  finish_step();

  auto seen = std::make_shared<std::vector<version_info>>();
  auto l = listener(seen);
  tell(t, subscribe_atom::value, l);
  tell(t, subscribe_atom::value, l); // twice: still told once
  run();
  REQUIRE(seen->size() == 1);
  CHECK(seen->front().version == 1);
  CHECK(state(t).subscribers.size() == 1);

  caf::anon_send_exit(l, caf::exit_reason::kill);
  run();
  CHECK(state(t).subscribers.empty());
  advance(100ms);
  finish_step(); // published to nobody
  CHECK(seen->size() == 1);
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer over a checkpoint directory: a failed step is logged once, later steps publish") {
  test::scratch_dir tmp;
  const model_config c = test::small_model(2);
  transfer::checkpoint_dir_options o;
  o.config = c;
  o.dir = tmp.path();
  auto source = std::make_shared<transfer::checkpoint_dir_source>(o);
  auto t = spawn(trainer, config(source));
  auto seen = std::make_shared<std::vector<version_info>>();
  tell(t, subscribe_atom::value, listener(seen));
  run();
  finish_step(); // nothing there yet
  CHECK(seen->empty());
  CHECK(log.empty());

  const std::string bad = tmp / transfer::step_dir_name(1);
  make_synthetic_checkpoint(bad, test::small_model(3), dtype::bf16, 3);
  transfer::mark_step_complete(bad);
  advance(100ms);
  finish_step();
  REQUIRE(log.size() == 1);
  CHECK(log.front().find(bad + "/config.json") != std::string::npos);
  CHECK(state(t).failed_steps == 1);

  const std::string good = tmp / transfer::step_dir_name(2);
  make_synthetic_checkpoint(good, c, dtype::bf16, 3);
  transfer::mark_step_complete(good);
  advance(100ms);
  finish_step();
  REQUIRE(seen->size() == 1);
  CHECK(seen->front().version == 2);
  CHECK(log.size() == 1);
}

TEST_CASE("trainer: a first start and a restart configure the actor from the same topology") {
  // local_trainer_config serves make_local_trainer and restart_trainer alike.
  struct row {
    trainer_source source;
    std::size_t ranks;
    std::chrono::milliseconds step_time;
    bool rank_checksums;
  };
  const row rows[] = {
    {trainer_source::synthetic, 1, 150ms, false},
    {trainer_source::synthetic, 2, 150ms, true},
    {trainer_source::external, 1, external_poll_interval, false}, // the rank's publishes, polled
    {trainer_source::external, 2, external_poll_interval, true},
  };
  for (const auto& r : rows) {
    CAPTURE(static_cast<int>(r.source));
    CAPTURE(r.ranks);
    topology topo = test::small_topology(3);
    topo.trainer.source = r.source;
    topo.trainer.step_time = 150ms;
    topo.trainer.ranks.resize(r.ranks);
    topo.transfer.bucket_bytes = std::int64_t(3) << 20;
    local_trainer parts;
    parts.engines = std::make_shared<engine_nodes>();
    parts.ucx_tickets = std::make_shared<ucx_ticket_office>();
    const auto cfg = local_trainer_config(parts, topo, {});
    CHECK(cfg.step_time == r.step_time);
    CHECK(cfg.rank_checksums == r.rank_checksums);
    CHECK(cfg.nccl_bucket_bytes == std::uint64_t(3) << 20);
    CHECK(cfg.engines.get() == parts.engines.get());
    CHECK(cfg.ucx_tickets.get() == parts.ucx_tickets.get());
    CHECK(bool(cfg.log));
  }
}

TEST_CASE("trainer end to end on the real scheduler: an in-process engine pulls what it is told about") {
  test::rlsync_config cfg;
  caf::actor_system sys{cfg};

  topology topo = test::small_topology(3);
  topo.trainer.step_time = 20ms;
  topo.transfer.groups_in_flight = 2;
  auto lt = make_local_trainer(sys, topo);
  test::stop_on_exit stop{caf::actor_cast<caf::actor>(lt.actor)};

  // A listener that hands the first version to the test and quits.
  std::promise<version_info> first;
  auto first_future = first.get_future();
  auto l = sys.spawn([&first](version_listener_actor::pointer self) -> version_listener_actor::behavior_type {
    return {[&first, self](version_atom, const version_info& v) {
      first.set_value(v);
      self->quit();
    }};
  });
  test::stop_on_exit stop_listener{caf::actor_cast<caf::actor>(l)}; // it refers to `first`, destroyed before sys
  caf::scoped_actor client{sys}; // a named sender: the trainer refuses anonymous ones
  client->send(lt.actor, subscribe_atom::value, l);
  REQUIRE(first_future.wait_for(10s) == std::future_status::ready);
  const version_info v = first_future.get();
  CHECK(v.version >= 1);

  // The engine side: register plans, pull the version, compare.
  const int tp = 2;
  auto set = engine::weight_set::make(topo.model.config, tp, dtype::bf16);
  std::vector<plan::grouped_plan> plans;
  for (int w = 0; w < tp; ++w) {
    auto plan = std::make_shared<const plan::worker_plan>(engine::make_plan(topo.model.config, tp, w, dtype::bf16));
    plans.emplace_back(topo.model.config, plan);
    lt.transfer->register_worker("rollout-0", plan);
  }
  auto snapshot = lt.source->find(v.version); // held while we compare, even if the trainer moves on
  transfer::group_sink sink;
  sink.on_group = [&](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
    engine::apply_group(plans[static_cast<std::size_t>(w)], g, bytes, size, set->workers[static_cast<std::size_t>(w)]);
  };
  if (snapshot) { // the trainer may already have dropped it on a slow machine
    auto report = transfer::pull_engine(*lt.transfer, "rollout-0", tp, v.version, transfer_mode::sharded, sink,
                                        transfer::clock::now() + 10s);
    CHECK(report.groups == 3);
    test::check_identical(*set, *test::loaded(*snapshot, tp));
  }
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: freeze answers after the step in flight, then no new version is made") {
  const model_config c = test::small_model(2);
  auto t = spawn(trainer, config(test::small_source(c)));
  run();
  REQUIRE(runner->jobs.size() == 1); // a step in flight
  auto frozen = request<version_info>(t, freeze_atom::value);
  run();
  CHECK(!frozen->has_value()); // waits for that step
  finish_step();
  CHECK(answer(frozen).version == 1); // it published, and freeze says so
  advance(10s);
  CHECK(runner->jobs.empty()); // no step after a freeze
  CHECK(answer(request<version_info>(t, version_atom::value)).version == 1);
  // Versions held are still served.
  CHECK(answer(request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, std::uint32_t{0})).version == 1);
  CHECK(answer(request<version_info>(t, freeze_atom::value)).version == 1); // idle: at once
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: a pinned version outlives keep_versions until the next pin") {
  const model_config c = test::small_model(2);
  auto source = test::small_source(c); // keeps 2 versions
  auto t = spawn(trainer, config(source));
  run();
  finish_step(); // version 1
  tell(t, pin_atom::value, std::uint64_t{1});
  run();
  for (int i = 0; i < 3; ++i) { // versions 2, 3, 4: version 1 would be dropped
    advance(10s);
    finish_step();
  }
  CHECK(source->versions() == std::vector<std::uint64_t>{1, 3, 4});
  CHECK(answer(request<weight_bucket>(t, pull_atom::value, std::uint64_t{1}, std::uint32_t{0})).version == 1);
  tell(t, pin_atom::value, std::uint64_t{4}); // the next round's
  run();
  CHECK(source->versions() == std::vector<std::uint64_t>{3, 4});
  CHECK(source->pinned() == 4);
  tell(t, pin_atom::value, std::uint64_t{2}); // gone: the pin stays on 4
  run();
  CHECK(source->pinned() == 4);
}

// -- step now (step_atom) ------------------------------------------------------------

TEST_CASE_FIXTURE(trainer_fixture, "trainer: step now starts a step at once and answers with the version it published") {
  auto t = spawn(trainer, config(test::small_source(test::small_model(2))));
  auto seen = std::make_shared<std::vector<version_info>>();
  tell(t, subscribe_atom::value, listener(seen));
  run();
  finish_step(); // version 1 at t = 0; the timer's next step is due at 100 ms
  REQUIRE(runner->jobs.empty());

  advance(50ms);
  auto v = request<version_info>(t, step_atom::value);
  run();
  REQUIRE(runner->jobs.size() == 1); // now, not at the tick
  CHECK(!v->has_value());            // answered once published
  finish_step();
  CHECK(answer(v).version == 2);
  REQUIRE(seen->size() == 2);
  CHECK(seen->back().version == 2); // subscribers hear of it as of any other

  // The timer keeps its cadence: one step per 100 ms from t = 0, and the
  // explicit step at 50 ms adds no second tick chain.
  advance(50ms);
  REQUIRE(runner->jobs.size() == 1);
  finish_step();
  CHECK(seen->back().version == 3);
  advance(50ms);
  CHECK(runner->jobs.empty());
  advance(50ms);
  CHECK(runner->jobs.size() == 1);
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: step during a step in flight answers every waiter after it") {
  auto t = spawn(trainer, config(test::small_source(test::small_model(2))));
  run();
  REQUIRE(runner->jobs.size() == 1); // the first step is in flight
  auto first = request<version_info>(t, step_atom::value);
  auto second = request<version_info>(t, step_atom::value);
  run();
  CHECK(runner->jobs.size() == 1); // joined it, started none
  CHECK(!first->has_value());
  CHECK(!second->has_value());
  finish_step();
  CHECK(answer(first).version == 1);
  CHECK(answer(second).version == 1);
  CHECK(runner->jobs.empty());
  CHECK(state(t).steps == 1);
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: step on a frozen trainer answers at once and starts nothing") {
  auto t = spawn(trainer, config(test::small_source(test::small_model(2))));
  run();
  finish_step();
  CHECK(answer(request<version_info>(t, freeze_atom::value)).version == 1);
  CHECK(answer(request<version_info>(t, step_atom::value)).version == 1);
  CHECK(runner->jobs.empty());
  advance(10s);
  CHECK(runner->jobs.empty());
  CHECK(state(t).steps == 1);
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: step answers a failed step with its error, one with nothing new with the old version") {
  test::scratch_dir tmp;
  const model_config c = test::small_model(2);
  transfer::checkpoint_dir_options o;
  o.config = c;
  o.dir = tmp.path();
  auto t = spawn(trainer, config(std::make_shared<transfer::checkpoint_dir_source>(o)));
  run();
  finish_step(); // nothing there yet

  auto nothing = request<version_info>(t, step_atom::value);
  run();
  finish_step();
  CHECK(answer(nothing).version == 0);

  const std::string bad = tmp / transfer::step_dir_name(1);
  make_synthetic_checkpoint(bad, test::small_model(3), dtype::bf16, 3);
  transfer::mark_step_complete(bad);
  auto failed = request<version_info>(t, step_atom::value);
  run();
  finish_step();
  auto err = failure(failed);
  CHECK(is(err, errc::malformed));
  CHECK(sys.render(err).find(bad + "/config.json") != std::string::npos);
  CHECK(log.size() == 1); // logged as any failed step

  const std::string good = tmp / transfer::step_dir_name(2);
  make_synthetic_checkpoint(good, c, dtype::bf16, 3);
  transfer::mark_step_complete(good);
  auto v = request<version_info>(t, step_atom::value);
  run();
  finish_step();
  CHECK(answer(v).version == 2);
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: step refused by a full runner is an error at once") {
  auto t = spawn(trainer, config(test::small_source(test::small_model(2))));
  run();
  finish_step();
  runner->refuse = true;
  CHECK(is(failure(request<version_info>(t, step_atom::value)), errc::queue_full));
  runner->refuse = false;
  CHECK(answer(request<version_info>(t, version_atom::value)).version == 1);
}

TEST_CASE_FIXTURE(trainer_fixture, "trainer: UCX tickets come from the office once a producer opened it, never before") {
  const model_config c = test::small_model(1);
  auto cfg = config(test::small_source(c));
  cfg.ucx_tickets = std::make_shared<ucx_ticket_office>();
  auto office = cfg.ucx_tickets;
  auto t = spawn(trainer, cfg);
  run();
  const std::int32_t worker = 1;
  auto err = failure(request<ucx_ticket>(t, ucx_ticket_atom::value, std::string("e"), worker));
  CHECK(is(err, errc::unknown_name));
  CHECK(sys.render(err).find("runs no UCX producer") != std::string::npos);

  std::vector<std::pair<std::string, int>> asked;
  office->open([&](const std::string& engine, int w) {
    asked.emplace_back(engine, w);
    return ucx_ticket{{1, 2, 3}, std::vector<std::uint8_t>(32, 7)};
  });
  auto ticket = answer(request<ucx_ticket>(t, ucx_ticket_atom::value, std::string("e"), worker));
  CHECK(ticket.producer == std::vector<std::uint8_t>{1, 2, 3});
  CHECK(ticket.token.size() == 32);
  REQUIRE(asked.size() == 1);
  CHECK(asked[0] == std::make_pair(std::string("e"), 1));
  // A negative worker or an absurd name is refused before the producer sees it.
  CHECK(is(failure(request<ucx_ticket>(t, ucx_ticket_atom::value, std::string("e"), std::int32_t{-1})),
           errc::malformed));
  CHECK(is(failure(request<ucx_ticket>(t, ucx_ticket_atom::value, std::string(5000, 'x'), worker)), errc::malformed));
  CHECK(asked.size() == 1);

  office->close(); // the producer is going
  CHECK(is(failure(request<ucx_ticket>(t, ucx_ticket_atom::value, std::string("e"), worker)), errc::unknown_name));
  caf::anon_send_exit(t, caf::exit_reason::user_shutdown);
  run();
}

// -- trainer ranks ---------------------------------------------------------------------

TEST_CASE_FIXTURE(trainer_fixture, "trainer rank: versions carry each held tensor's checksum, catch_up publishes only the target") {
  const model_config c = test::small_model(3);
  transfer::synthetic_options o;
  o.config = c;
  o.model_seed = 3;
  o.trainer_seed = 11;
  o.perturb = 0.05;
  o.threads = 2;
  o.held_layers = std::vector<std::int64_t>{1, 2}; // a pipeline stage: no embeddings
  auto source = std::make_shared<transfer::synthetic_source>(o);
  auto info = rank_info_of(*source, 1, "n1", 4);
  CHECK(info.rank == 1);
  CHECK(info.incarnation == 4);
  CHECK(check(info).empty()); // ascending, as a registration needs
  CHECK(std::find(info.held.begin(), info.held.end(), "model.embed_tokens.weight") == info.held.end());
  CHECK(std::find(info.held.begin(), info.held.end(), "lm_head.weight") != info.held.end());

  auto cfg = config(source);
  cfg.rank_checksums = true;
  auto t = spawn(trainer, cfg);
  auto seen = std::make_shared<std::vector<version_info>>();
  tell(t, subscribe_atom::value, listener(seen));
  run();
  finish_step();
  REQUIRE(seen->size() == 1);
  auto expected_checksums = [&](const transfer::weight_snapshot& s) {
    std::vector<std::uint64_t> out;
    for (auto& name : info.held) {
      auto& view = s.at(name);
      out.push_back(checksum64(view.data, view.size));
    }
    return out;
  };
  CHECK(seen->back().checksums == expected_checksums(*source->find(1)));

  // A restarted rank told to catch up to v5: one step makes 2..5, publishes 5 only.
  catch_up(caf::actor_cast<trainer_actor>(t), 5);
  run();
  REQUIRE(runner->jobs.size() == 1);
  finish_step();
  REQUIRE(seen->size() == 2);
  CHECK(seen->back().version == 5);
  // The same bytes as a rank that stepped through every version.
  auto stepped = std::make_shared<transfer::synthetic_source>(o);
  for (int i = 0; i < 5; ++i)
    stepped->advance();
  CHECK(seen->back().checksums == expected_checksums(*stepped->find(5)));
  catch_up(caf::actor_cast<trainer_actor>(t), 3); // already past: nothing
  run();
  CHECK(runner->jobs.empty());
  // Without rank_checksums, versions carry none.
  auto plain = spawn(trainer, config(test::small_source(c)));
  auto plain_seen = std::make_shared<std::vector<version_info>>();
  tell(plain, subscribe_atom::value, listener(plain_seen));
  run();
  finish_step();
  REQUIRE(plain_seen->size() == 1);
  CHECK(plain_seen->back().checksums.empty());
}
