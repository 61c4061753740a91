// The nccl backend end to end on the real scheduler, with NCCL played in
// host memory (tests/gpu/fake_nccl_world.hpp): a trainer whose rank sends
// through an nccl_sender serves engine workers that receive through their
// links; the puller verifies what it receives, refuses a trainer that lies
// and never waits past its deadline.
#include "actors/nccl_puller.hpp"

#include "actors/system_config.hpp"
#include "actors/trainer.hpp"
#include "gpu/nccl_membership.hpp"
#include "gpu/nccl_sender.hpp"
#include "tests/gpu/fake_nccl_world.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/fake_tensor_device.hpp"
#include "tests/support/scripted_trainer.hpp"
#include "tests/support/threaded_system.hpp"
#include "tests/support/whole_group_pulls.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/plan/groups.hpp"
#include "gpu/device_pack.hpp"
#include "runtime/transfer/bucket.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/ucx/ucx_wire.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <doctest/doctest.h>

#include <map>
#include <future>
#include <mutex>
#include <thread>

using namespace rlsync;
using namespace std::chrono_literals;
using gpu::comm_member;

namespace {

using test::tensors_by_name;
using recording_sink = test::whole_tensor_sink;

constexpr std::size_t staging = 1 << 20;

struct nccl_fixture {
  test::rlsync_config cfg;
  caf::actor_system sys{cfg};
  model_config model = test::small_model(3);
  std::shared_ptr<transfer::synthetic_source> source = test::small_source(model, 4);
  std::shared_ptr<nccl_desk> desk = std::make_shared<nccl_desk>();
  std::shared_ptr<test::fake_nccl_world> world = test::fake_nccl_world::make();
  trainer_actor trainer;
  std::vector<caf::actor> to_stop;
  // Epoch 1: trainer rank 0, then rollout-0's two workers.
  gpu::comm_layout layout = gpu::make_layout(
    1, {comm_member::trainer_rank(0), comm_member::worker("rollout-0", 0), comm_member::worker("rollout-0", 1)});
  std::map<int, std::shared_ptr<gpu::p2p_link>> worker_links;

  nccl_fixture() {
    trainer_config c;
    c.source = source;
    c.step_time = 1h; // versions come when the test asks
    c.nccl = desk;
    c.nccl_join_window = 300ms; // the collective's: a worker alone falls back soon
    c.nccl_bucket_bytes = 1;    // one group per broadcast (whole-group buckets: "nccl: collective, buckets ...")
    trainer = spawn_trainer(sys, std::move(c));
    to_stop.push_back(caf::actor_cast<caf::actor>(trainer));
    for (int w : {0, 1})
      worker_links[w] = test::fake_nccl_world::join(world, layout, w + 1, staging);
  }
  ~nccl_fixture() {
    for (auto& a : to_stop)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  std::shared_ptr<gpu::nccl_sender> open_sender(gpu::comm_layout l) {
    auto sender = std::make_shared<gpu::nccl_sender>(test::fake_nccl_world::join(world, std::move(l), 0, staging), 16);
    desk->open(sender);
    return sender;
  }

  nccl_puller::link_of links() {
    return [this](const std::string& engine, int worker) -> std::shared_ptr<gpu::p2p_link> {
      if (engine != "rollout-0" || worker_links.count(worker) == 0)
        return nullptr;
      return worker_links[worker];
    };
  }

  std::function<trainer_actor()> asking(trainer_actor t) {
    return [t] { return t; };
  }

  std::uint64_t step() { return test::step_trainer(sys, trainer); }

  tensors_by_name expected(std::uint64_t v) const { return test::tensors_of(*source, v); }

  transfer::transfer_failure failure_of(transfer::weight_puller& p, const std::string& engine, int workers,
                                        std::uint64_t v, std::string& what, std::chrono::milliseconds wait = 10s) {
    return test::pull_failure(p, engine, workers, v, what, wait);
  }

  /// The trainer's honest bucket for `req`, bytes included.
  weight_bucket honest_bucket(const nccl_pull& req) {
    weight_bucket b;
    caf::scoped_actor asker{sys};
    asker->request(trainer, 10s, pull_atom::value, req.version, req.group)
      .receive([&](weight_bucket& got) { b = std::move(got); }, [](caf::error&) {});
    REQUIRE(!b.data.empty());
    return b;
  }
};

} // namespace

TEST_CASE_FIXTURE(nccl_fixture, "nccl: each worker receives every group from the trainer rank's sender") {
  auto sender = open_sender(layout);
  const auto v = step();
  nccl_puller puller(sys, asking(trainer), model, links());
  recording_sink rec;
  auto report = transfer::pull_engine(puller, "rollout-0", 2, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
  const auto groups = plan::group_count(model);
  CHECK(report.groups == groups);
  REQUIRE(rec.got.size() == 2);
  CHECK(rec.got[0] == expected(v)); // whole tensors: each worker slices its own shard
  CHECK(rec.got[1] == expected(v));
  // The workers' receives completed; the sender's thread sees its sends
  // complete at its next poll.
  for (auto until = transfer::clock::now() + 10s; sender->sent() < 2 * groups && transfer::clock::now() < until;)
    std::this_thread::sleep_for(1ms);
  CHECK(sender->sent() == 2 * groups);
  CHECK(sender->failure().empty());
  CHECK(world->unmatched() == 0);
  // The same communicator serves the next version.
  const auto v2 = step();
  recording_sink rec2;
  transfer::pull_engine(puller, "rollout-0", 2, v2, transfer_mode::broadcast, rec2.sink(), test::in(10s));
  CHECK(rec2.got[1] == expected(v2));
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: a worker in no communicator, a trainer without a sender, a stale epoch") {
  const auto v = step();
  nccl_puller puller(sys, asking(trainer), model, links());
  std::string what;
  CHECK(failure_of(puller, "rollout-1", 1, v, what) == transfer::transfer_failure::not_registered);
  CHECK(what.find("joins at the next sync boundary") != std::string::npos);
  CHECK(failure_of(puller, "rollout-0", 1, v, what) == transfer::transfer_failure::producer_failed);
  CHECK(what.find("runs no nccl sender") != std::string::npos);
  // The trainer's rank moved on to epoch 2 while this worker holds epoch 1.
  auto next = layout;
  next.epoch = 2;
  open_sender(next);
  CHECK(failure_of(puller, "rollout-0", 1, v, what) == transfer::transfer_failure::producer_failed);
  CHECK(what.find("epoch 1 asked; this rank's communicator is epoch 2") != std::string::npos);
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: the trainer refuses a worker outside its communicator and a version gone") {
  // A communicator with worker 0 only: worker 1 of rollout-0 is no member.
  open_sender(gpu::make_layout(1, {comm_member::trainer_rank(0), comm_member::worker("rollout-0", 0)}));
  worker_links[0] = test::fake_nccl_world::join(
    world, gpu::make_layout(1, {comm_member::trainer_rank(0), comm_member::worker("rollout-0", 0)}), 1, staging);
  const auto v = step();
  nccl_puller puller(sys, asking(trainer), model, links());
  std::string what;
  CHECK(failure_of(puller, "rollout-0", 2, v, what) == transfer::transfer_failure::producer_failed);
  CHECK(what.find("worker 1 is not in epoch 1's communicator") != std::string::npos);
  worker_links.erase(1);
  CHECK(failure_of(puller, "rollout-0", 1, v + 100, what) == transfer::transfer_failure::version_unavailable);
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: a trainer that answers but never sends holds nobody past the deadline") {
  const auto v = step();
  auto script = std::make_shared<test::trainer_script>();
  script->nccl = [&](const nccl_pull& req) -> caf::result<nccl_chunk> {
    auto b = honest_bucket(req);
    nccl_chunk c{req.epoch, 0, b.data.size(), std::move(b)};
    c.bucket.data.clear();
    return c;
  };
  auto silent = sys.spawn(test::scripted_trainer, script);
  to_stop.push_back(caf::actor_cast<caf::actor>(silent));
  nccl_puller puller(sys, asking(silent), model, links());
  std::string what;
  CHECK(failure_of(puller, "rollout-0", 1, v, what, 300ms) == transfer::transfer_failure::timeout);
  CHECK(what.find("not done by the phase deadline; aborted the communicator") != std::string::npos);
  CHECK(world->unmatched() == 0); // the receive was taken back with the abort
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: a trainer that lies is refused before a receive is posted") {
  const auto v = step();
  struct lie {
    const char* name;
    std::function<void(nccl_chunk&)> edit;
    const char* says;
  };
  const std::vector<lie> lies = {
    {"another epoch", [](nccl_chunk& c) { c.epoch = 9; }, "on epoch 9, this worker is in 1"},
    {"a root that is a worker", [](nccl_chunk& c) { c.root = 2; }, "from rank 2, which is no trainer rank"},
    {"a root outside the communicator", [](nccl_chunk& c) { c.root = 7; }, "from rank 7"},
    {"more bytes than any group", [](nccl_chunk& c) { c.bytes = std::uint64_t{1} << 40; }, "largest group"},
  };
  for (const auto& l : lies) {
    CAPTURE(l.name);
    worker_links[0] = test::fake_nccl_world::join(world, layout, 1, staging); // a fresh link per case
    auto script = std::make_shared<test::trainer_script>();
    script->nccl = [&](const nccl_pull& req) -> caf::result<nccl_chunk> {
      auto b = honest_bucket(req);
      nccl_chunk c{req.epoch, 0, b.data.size(), std::move(b)};
      c.bucket.data.clear();
      l.edit(c);
      return c;
    };
    auto liar = sys.spawn(test::scripted_trainer, script);
    to_stop.push_back(caf::actor_cast<caf::actor>(liar));
    nccl_puller puller(sys, asking(liar), model, links());
    std::string what;
    CHECK(failure_of(puller, "rollout-0", 1, v, what) == transfer::transfer_failure::producer_failed);
    CHECK(what.find(l.says) != std::string::npos);
    CHECK(world->unmatched() == 0);
  }
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: bytes that changed on the way fail the checksum, another size fails the link") {
  const auto v = step();
  auto sender = std::make_shared<gpu::nccl_sender>(test::fake_nccl_world::join(world, layout, 0, staging), 16);
  std::size_t extra = 0; // bytes the liar adds to what it says it sends
  auto script = std::make_shared<test::trainer_script>();
  script->nccl = [&](const nccl_pull& req) -> caf::result<nccl_chunk> {
    auto b = honest_bucket(req);
    auto sent = std::make_shared<std::vector<std::uint8_t>>(b.data);
    (*sent)[sent->size() / 2] ^= 0x40;
    sent->resize(sent->size() + extra);
    REQUIRE(sender->submit({sent, 1, gpu::clock::now() + 10s, "a changed group"}).empty());
    nccl_chunk c{req.epoch, 0, b.data.size(), std::move(b)};
    c.bucket.data.clear();
    return c;
  };
  auto liar = sys.spawn(test::scripted_trainer, script);
  to_stop.push_back(caf::actor_cast<caf::actor>(liar));
  nccl_puller puller(sys, asking(liar), model, links());
  std::string what;
  CHECK(failure_of(puller, "rollout-0", 1, v, what) == transfer::transfer_failure::checksum_mismatch);
  extra = 8;
  CHECK(failure_of(puller, "rollout-0", 1, v, what) == transfer::transfer_failure::producer_failed);
  CHECK(what.find("truncated") != std::string::npos);
}

namespace {

/// The plan the worker of `req` registered last with the scripted trainer.
plan::grouped_plan newest_plan(const test::trainer_script& script, const nccl_pull& req, const model_config& model) {
  for (auto it = script.nccl_plans.rbegin(); it != script.nccl_plans.rend(); ++it)
    if (it->engine == req.engine && it->worker == req.worker)
      return plan::grouped_plan(model, std::make_shared<const plan::worker_plan>(
                                         transfer::ucx_wire::decode_plan(it->plan.data(), it->plan.size())));
  throw std::logic_error("no plan registered");
}

/// Whether `count` of `sender` reaches `n` within 10 s: the sender counts
/// an operation at its next poll, after the workers already have the bytes.
bool counted(const gpu::nccl_sender& sender, std::uint64_t (gpu::nccl_sender::*count)() const, std::uint64_t n) {
  for (auto until = transfer::clock::now() + 10s; (sender.*count)() < n && transfer::clock::now() < until;)
    std::this_thread::sleep_for(1ms);
  return (sender.*count)() == n;
}

/// Pulls `v` sharded into `e`, expecting it to fail: how, and why.
transfer::transfer_failure sharded_failure(test::test_engine& e, transfer::weight_puller& p, std::uint64_t v,
                                           std::string& what, std::chrono::milliseconds wait = 10s) {
  try {
    e.pull(p, v, transfer_mode::sharded, wait);
  } catch (const transfer::transfer_error& x) {
    what = x.what();
    return x.failure;
  }
  FAIL("the pull succeeded");
  return transfer::transfer_failure::cancelled;
}

} // namespace

TEST_CASE_FIXTURE(nccl_fixture, "nccl: sharded, each worker receives only its plan's bytes, packed by the trainer rank") {
  auto sender = open_sender(layout);
  const auto v = step();
  nccl_puller puller(sys, asking(trainer), model, links());
  for (bool in_place : {false, true}) {
    CAPTURE(in_place);
    test::test_engine e("rollout-0", model, 2, puller);
    e.in_place = in_place;
    const auto sent_before = sender->sent();
    auto report = e.pull(puller, v);
    test::check_identical(*e.weights, *test::loaded(*source->find(v), 2));
    CHECK(report.bytes == test::plan_bytes(e)); // ≈ 1/tp of the model per worker, not the whole
    CHECK(report.bytes < 2 * source->find(v)->total_bytes());
    std::uint64_t sends = 0; // a group with none of a worker's entries moves nothing
    for (const auto& p : e.plans)
      for (std::uint32_t g = 0; g < p.group_count(); ++g)
        sends += p.bytes(g) > 0 ? 1 : 0;
    for (auto until = transfer::clock::now() + 10s; sender->sent() - sent_before < sends && transfer::clock::now() < until;)
      std::this_thread::sleep_for(1ms);
    CHECK(sender->sent() - sent_before == sends);
    CHECK(sender->failure().empty());
  }
  // The next version over the same communicator, the plans registered already.
  const auto v2 = step();
  test::test_engine e("rollout-0", model, 2, puller);
  e.pull(puller, v2);
  test::check_identical(*e.weights, *test::loaded(*source->find(v2), 2));
  CHECK(world->unmatched() == 0);
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: sharded, the plan is registered once per trainer and communicator") {
  const auto v = step();
  auto script = std::make_shared<test::trainer_script>();
  auto sender = std::make_shared<gpu::nccl_sender>(test::fake_nccl_world::join(world, layout, 0, staging), 16);
  script->nccl = [&](const nccl_pull& req) -> caf::result<nccl_chunk> {
    // What the trainer would pack: the same plan, replayed here.
    const auto plan = newest_plan(*script, req, model);
    auto bytes = std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(plan.bytes(req.group)));
    nccl_chunk c{req.epoch, 0, bytes->size(), {}};
    c.bucket.version = req.version;
    c.bucket.group = req.group;
    c.bucket.checksum = transfer::pack_group_checksummed(plan, req.group, *source->find(req.version), bytes->data());
    REQUIRE(sender->submit({bytes, layout.rank_of(comm_member::worker(req.engine, req.worker)),
                            gpu::clock::now() + 10s, "a packed group"}).empty());
    return c;
  };
  auto rank = sys.spawn(test::scripted_trainer, script);
  to_stop.push_back(caf::actor_cast<caf::actor>(rank));
  nccl_puller puller(sys, asking(rank), model, links());
  test::test_engine e("rollout-0", model, 2, puller);
  e.pull(puller, v);
  test::check_identical(*e.weights, *test::loaded(*source->find(v), 2));
  REQUIRE(script->nccl_plans.size() == 2); // one per worker
  CHECK(script->nccl_plans[0].epoch == 1);
  e.pull(puller, v);
  CHECK(script->nccl_plans.size() == 2); // registered already
  // A new plan (the engine re-registered its worker) is sent again.
  test::test_engine again("rollout-0", model, 1, puller);
  again.pull(puller, v);
  test::check_identical(*again.weights, *test::loaded(*source->find(v), 1));
  CHECK(script->nccl_plans.size() == 3);
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: sharded, a trainer that lies about the plan or a group's size is refused") {
  const auto v = step();
  auto script = std::make_shared<test::trainer_script>();
  script->nccl_plan_answer = [](const nccl_plan&) -> caf::result<std::uint64_t> { return std::uint64_t{42}; };
  auto liar = sys.spawn(test::scripted_trainer, script);
  to_stop.push_back(caf::actor_cast<caf::actor>(liar));
  nccl_puller puller(sys, asking(liar), model, links());
  test::test_engine e("rollout-0", model, 1, puller);
  std::string what;
  CHECK(sharded_failure(e, puller, v, what) == transfer::transfer_failure::producer_failed);
  CHECK(what.find("took the plan of engine rollout-0 worker 0 as") != std::string::npos);

  script->nccl_plan_answer = nullptr; // takes it honestly, then says a group is larger than the plan packs
  script->nccl = [&](const nccl_pull& req) -> caf::result<nccl_chunk> {
    return nccl_chunk{req.epoch, 0, 1 << 16, {}};
  };
  CHECK(sharded_failure(e, puller, v, what) == transfer::transfer_failure::producer_failed);
  CHECK(what.find("bytes, the plan of engine rollout-0 worker 0 packs") != std::string::npos);
  CHECK(world->unmatched() == 0); // refused before a receive was posted

  worker_links[0] = test::fake_nccl_world::join(world, layout, 1, staging); // the refusal aborted the last link
  nccl_puller unplanned(sys, asking(liar), model, links());
  test::whole_tensor_sink rec;
  try {
    transfer::pull_engine(unplanned, "rollout-0", 1, v, transfer_mode::sharded, rec.sink(), test::in(10s));
    FAIL("a worker without a plan pulled sharded");
  } catch (const transfer::transfer_error& x) {
    CHECK(x.failure == transfer::transfer_failure::not_registered);
  }
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: the trainer rank takes only a fitting plan of a member, and packs only it") {
  open_sender(layout);
  const auto v = step();
  caf::scoped_actor self{sys};
  auto ask = [&](auto&&... xs) {
    std::string error;
    std::uint64_t digest = 0;
    self->request(trainer, 10s, std::forward<decltype(xs)>(xs)...)
      .receive([&](std::uint64_t d) { digest = d; }, [&](caf::error& e) { error = sys.render(e); });
    return std::make_pair(digest, error);
  };
  const auto plan = engine::make_plan(model, 2, 1, dtype::bf16);
  const auto encoded = transfer::ucx_wire::encode_plan(plan);
  struct row {
    const char* name;
    nccl_plan msg;
    const char* says; // empty: taken
  };
  auto truncated = encoded;
  truncated.resize(encoded.size() / 2);
  auto other_model = engine::make_plan(test::small_model(3, true), 2, 1, dtype::f32);
  auto made_up = plan; // another rank's tensor would be skipped: one that no rank has is refused
  made_up.entries.back().source = "model.layers.0.made_up";
  const std::vector<row> rows = {
    {"a member's plan", {"rollout-0", 1, 1, encoded}, ""},
    {"again: the same digest", {"rollout-0", 1, 1, encoded}, ""},
    {"truncated bytes", {"rollout-0", 1, 1, truncated}, "malformed plan"},
    {"another worker's plan", {"rollout-0", 0, 1, encoded}, "registered the plan of worker 1"},
    {"a plan of other dtypes", {"rollout-0", 1, 1, transfer::ucx_wire::encode_plan(other_model)}, "does not fit"},
    {"a made-up tensor", {"rollout-0", 1, 1, transfer::ucx_wire::encode_plan(made_up)}, "is no parameter of the model"},
    {"an older epoch", {"rollout-0", 1, 0, encoded}, "a plan on epoch 0 asked; this rank's communicator is epoch 1"},
    {"an engine outside the communicator", {"rollout-9", 1, 1, encoded},
     "a plan: engine 'rollout-9' worker 1 is not in epoch 1's communicator"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.name);
    auto [digest, error] = ask(nccl_plan_atom::value, r.msg);
    if (*r.says == 0) {
      CHECK(error.empty());
      CHECK(digest == checksum64(encoded.data(), encoded.size()));
    } else {
      CHECK(error.find(r.says) != std::string::npos);
    }
  }
  // A pull naming another digest than the one registered is refused.
  nccl_pull pull{"rollout-0", 1, v, 0, 1, 1000, 7};
  std::string error;
  self->request(trainer, 10s, nccl_pull_atom::value, pull)
    .receive([](nccl_chunk&) {}, [&](caf::error& e) { error = sys.render(e); });
  CHECK(error.find("plan 0000000000000007 of engine 'rollout-0' worker 1 is not registered") != std::string::npos);
}

namespace {

/// A rank's device in host memory that counts what it is asked, and whose
/// allocations fail (out of memory) when `full`.
struct counting_device final : gpu::pack_device {
  explicit counting_device(bool full_) : full(full_) {}
  std::shared_ptr<gpu::pack_device> host = gpu::host_pack_device();
  const bool full;
  std::atomic<int> allocations{0};
  std::atomic<int> packs{0};
  std::atomic<int> concats{0};
  int ordinal() const override { return 0; }
  std::shared_ptr<void> allocate(std::size_t n) override {
    ++allocations;
    if (full)
      throw gpu::gpu_error("cudaMalloc: out of memory");
    return host->allocate(n);
  }
  void upload(void* to, const void* from, std::size_t n) override { host->upload(to, from, n); }
  void download(void* to, const void* from, std::size_t n) override { host->download(to, from, n); }
  void pack(const gpu::pack_layout& l, const std::vector<const void*>& s, void* out) override {
    ++packs;
    host->pack(l, s, out);
  }
  void concat(const std::vector<piece>& pieces, void* out) override {
    ++concats;
    host->concat(pieces, out);
  }
};

} // namespace

TEST_CASE_FIXTURE(nccl_fixture, "nccl: collective, every worker joins the rank's broadcast of each group") {
  auto sender = open_sender(layout);
  nccl_puller puller(sys, asking(trainer), model, links(), std::nullopt, {}, true);
  std::uint64_t last = 0;
  for (int round = 0; round < 2; ++round) {
    const auto v = last = step();
    recording_sink rec;
    auto report =
      transfer::pull_engine(puller, "rollout-0", 2, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
    CHECK(report.groups == plan::group_count(model));
    REQUIRE(rec.got.size() == 2);
    CHECK(rec.got[0] == expected(v));
    CHECK(rec.got[1] == expected(v));
  }
  // Once per group, not once per worker (the sender sees each complete at its next poll).
  for (auto until = transfer::clock::now() + 10s;
       sender->broadcast() < 2 * plan::group_count(model) && transfer::clock::now() < until;)
    std::this_thread::sleep_for(1ms);
  CHECK(sender->broadcast() == 2 * plan::group_count(model));
  CHECK(sender->sent() == 0);
  CHECK(world->open_broadcasts() == 0);
  // Asked again, a version broadcast already moves point to point: nobody else would join a broadcast.
  recording_sink again;
  transfer::pull_engine(puller, "rollout-0", 1, last, transfer_mode::broadcast, again.sink(), test::in(10s));
  CHECK(again.got[0] == expected(last));
  CHECK(counted(*sender, &gpu::nccl_sender::sent, plan::group_count(model)));
  CHECK(sender->broadcast() == 2 * plan::group_count(model));
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: collective, buckets of whole consecutive groups up to bucket_bytes") {
  auto sizes = test::small_source(model, 4);
  const auto v1 = sizes->produce_next(); // the sizes of the groups a rank broadcasts
  std::vector<std::uint64_t> sent; // each group with its checksum
  for (auto g : v1->groups())
    sent.push_back(v1->group_bytes(g) + transfer::checksum_trailer_bytes);
  REQUIRE(sent.size() == 3);
  REQUIRE(sent[0] + sent[1] + sent[2] <= staging);
  struct row {
    const char* what;
    std::uint64_t bucket_bytes;
    std::uint64_t broadcasts;
  };
  const std::vector<row> rows = {
    {"smaller than any group: one group each", 1, 3},
    {"the first two fit, the third goes on its own", sent[0] + sent[1], 2},
    {"one byte short of two groups: one each", std::min(sent[0] + sent[1], sent[1] + sent[2]) - 1, 3},
    {"the default 64 MiB, bounded by the staging (1 MiB): the whole version at once", std::uint64_t(64) << 20, 1},
  };
  int round = 0;
  for (const auto& r : rows) {
    CAPTURE(r.what);
    auto own = test::small_source(model, 4); // a source per rank: one step at a time on it
    trainer_config c;
    c.source = own;
    c.step_time = 1h;
    c.nccl = std::make_shared<nccl_desk>();
    c.nccl_join_window = 300ms;
    c.nccl_bucket_bytes = r.bucket_bytes;
    auto row_desk = c.nccl;
    auto rank = spawn_trainer(sys, std::move(c));
    to_stop.push_back(caf::actor_cast<caf::actor>(rank));
    const auto l = gpu::make_layout(10 + round++, layout.members);
    auto sender = std::make_shared<gpu::nccl_sender>(test::fake_nccl_world::join(world, l, 0, staging), 16);
    row_desk->open(sender);
    for (int w : {0, 1})
      worker_links[w] = test::fake_nccl_world::join(world, l, w + 1, staging);
    nccl_puller puller(sys, asking(rank), model, links(), std::nullopt, {}, true);
    const auto v = test::step_trainer(sys, rank);
    recording_sink rec;
    auto report = transfer::pull_engine(puller, "rollout-0", 2, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
    CHECK(report.groups == 3);
    REQUIRE(rec.got.size() == 2);
    CHECK(rec.got[0] == test::tensors_of(*own, v));
    CHECK(rec.got[1] == test::tensors_of(*own, v));
    CHECK(counted(*sender, &gpu::nccl_sender::broadcast, r.broadcasts));
    CHECK(sender->sent() == 0);
    CHECK(world->open_broadcasts() == 0);
  }
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: collective, from the device copy a version was pushed with, else packed on the CPU") {
  // Version 1 is pushed from "CUDA" tensors (a PyTorch rank): its buckets are
  // filled from that copy. Version 2 is pushed from host tensors: packed on
  // the CPU, with no upload inside the rank's handler.
  auto device = std::make_shared<counting_device>(false);
  auto pushed = test::device_pushed_source(model, std::make_shared<test::fake_tensor_device>());
  auto reference = test::small_source(model, 4);
  trainer_config c;
  c.source = pushed;
  c.step_time = 1h;
  c.nccl = desk;
  c.nccl_join_window = 300ms;
  c.nccl_pack_device = device;
  auto rank = spawn_trainer(sys, std::move(c));
  to_stop.push_back(caf::actor_cast<caf::actor>(rank));
  auto sender = open_sender(layout);
  nccl_puller puller(sys, asking(rank), model, links(), std::nullopt, {}, true);
  const auto groups = static_cast<int>(plan::group_count(model));
  for (std::uint64_t v : {1, 2}) {
    CAPTURE(v);
    auto expect = reference->produce_next();
    pushed->push(v, test::state_dict_of(*expect, v == 1 ? 0 : -1));
    REQUIRE(test::step_trainer(sys, rank) == v);
    recording_sink rec;
    transfer::pull_engine(puller, "rollout-0", 2, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
    REQUIRE(rec.got.size() == 2);
    CHECK(rec.got[0] == test::tensors_of(*reference, v));
    CHECK(rec.got[1] == test::tensors_of(*reference, v));
    // The whole version in one broadcast (64 MiB buckets, a 1 MiB staging), each group at its place.
    CHECK(counted(*sender, &gpu::nccl_sender::broadcast, v));
    CHECK(device->concats == groups); // version 1's groups only
  }
  CHECK(sender->sent() == 0);
  CHECK(device->allocations == 0); // nothing uploaded: adopted, then the CPU
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: collective, a worker alone in its round pulls point to point after the window") {
  auto sender = open_sender(layout);
  nccl_puller puller(sys, asking(trainer), model, links(), std::nullopt, {}, true);
  const auto v = step();
  recording_sink rec; // worker 1 of the communicator never asks
  transfer::pull_engine(puller, "rollout-0", 1, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
  CHECK(rec.got[0] == expected(v));
  CHECK(counted(*sender, &gpu::nccl_sender::sent, plan::group_count(model)));
  CHECK(sender->broadcast() == 0);
  // Worker 1, later in the same version, is not held up either.
  recording_sink late;
  transfer::pull_engine(puller, "rollout-0", 1, v, transfer_mode::broadcast, late.sink(), test::in(10s));
  CHECK(late.got[0] == expected(v));
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: collective, one root only, and a lying manifest is refused before a receive") {
  const auto v = step();
  {
    // Two trainer ranks: a broadcast would need every rank to take part.
    const auto two = gpu::make_layout(1, {comm_member::trainer_rank(0), comm_member::trainer_rank(1),
                                          comm_member::worker("rollout-0", 0)});
    open_sender(two);
    worker_links[0] = test::fake_nccl_world::join(world, two, 2, staging);
    nccl_puller puller(sys, asking(trainer), model, links(), std::nullopt, {}, true);
    std::string what;
    CHECK(failure_of(puller, "rollout-0", 1, v, what) == transfer::transfer_failure::producer_failed);
    CHECK(what.find("a collective broadcast needs a communicator with one trainer rank, epoch 1 has 2")
          != std::string::npos);
  }
  auto honest = [&](const nccl_pull& req) {
    nccl_manifest m{nccl_manifest::broadcast, req.epoch, 0, {}, {}};
    for (std::uint32_t g = 0; g < plan::group_count(model); ++g) {
      auto b = honest_bucket({req.engine, req.worker, req.version, g, req.epoch, 1000, 0});
      m.bytes.push_back(b.data.size() + 8);
      b.data.clear();
      m.buckets.push_back(std::move(b));
    }
    return m;
  };
  struct lie {
    const char* name;
    std::function<void(nccl_manifest&)> edit;
    const char* says;
    bool short_link = false; // the worker's staging holds every group but not all at once
  };
  std::size_t version_bytes = 0;
  for (auto b : honest({"rollout-0", 0, v, 0, layout.epoch, 1000, 0}).bytes)
    version_bytes += static_cast<std::size_t>(b);
  const std::vector<lie> lies = {
    {"another epoch", [](nccl_manifest& m) { m.epoch = 9; }, "a broadcast on epoch 9"},
    {"a root that is a worker", [](nccl_manifest& m) { m.root = 1; }, "from rank 1, which is no trainer rank"},
    {"sizes that do not match the buckets", [](nccl_manifest& m) { m.bytes.pop_back(); }, "sizes for a model of"},
    {"a bucket without its checksum", [](nccl_manifest& m) { m.bytes[0] = 7; }, "bucket 0 of 7 bytes"},
    {"a bucket past the staging", [](nccl_manifest& m) { m.bytes[1] = staging + 1; }, "within the staging"},
    {"the groups out of order", [](nccl_manifest& m) { std::swap(m.buckets[0], m.buckets[1]); }, "in order"},
    {"a status no rank sends", [](nccl_manifest& m) { m.status = 7; }, "a manifest of status 7"},
    {"a broadcast of no group", [](nccl_manifest& m) { m.packed = {0, 3}; }, "broadcast 0 carries 0 groups"},
    {"more groups than the manifest's", [](nccl_manifest& m) { m.packed = {2, 2}; },
     "broadcast 1 carries 2 groups, with 1 of the manifest's 3 left"},
    {"a group in no broadcast", [](nccl_manifest& m) { m.packed = {2}; }, "broadcasts carrying 2 of the manifest's 3 groups"},
    {"a broadcast past the staging (a link one byte short of the version)", [](nccl_manifest& m) { m.packed = {3}; },
     "broadcast 0 of", true},
  };
  for (const auto& l : lies) {
    CAPTURE(l.name);
    worker_links[0] = test::fake_nccl_world::join(world, layout, 1, l.short_link ? version_bytes - 1 : staging); // fresh
    auto script = std::make_shared<test::trainer_script>();
    script->nccl_broadcast = [&](const nccl_pull& req) -> caf::result<nccl_manifest> {
      auto m = honest(req);
      l.edit(m);
      return m;
    };
    auto liar = sys.spawn(test::scripted_trainer, script);
    to_stop.push_back(caf::actor_cast<caf::actor>(liar));
    nccl_puller puller(sys, asking(liar), model, links(), std::nullopt, {}, true);
    std::string what;
    CHECK(failure_of(puller, "rollout-0", 1, v, what) == transfer::transfer_failure::producer_failed);
    CHECK(what.find(l.says) != std::string::npos);
    CHECK(world->open_broadcasts() == 0); // nothing was posted
  }
  // Bytes that changed on the way fail the checksum after them.
  worker_links[0] = test::fake_nccl_world::join(world, layout, 1, staging);
  worker_links[1] = test::fake_nccl_world::join(world, layout, 2, staging);
  auto root = std::make_shared<gpu::nccl_sender>(test::fake_nccl_world::join(world, layout, 0, staging), 16);
  auto script = std::make_shared<test::trainer_script>();
  script->nccl_broadcast = [&](const nccl_pull& req) -> caf::result<nccl_manifest> {
    auto m = honest(req);
    gpu::nccl_sender::collective c;
    c.buckets = m.buckets.size();
    c.pack = [this, req](std::size_t i, std::vector<std::uint8_t>& out) {
      auto b = honest_bucket({req.engine, req.worker, req.version, static_cast<std::uint32_t>(i), req.epoch, 1000, 0});
      out = b.data;
      transfer::append_checksum(out);
      out[(out.size() - transfer::checksum_trailer_bytes) / 2] ^= 0x40; // changed after its checksum was taken
    };
    c.deadline = gpu::clock::now() + 10s;
    c.what = "a changed version";
    if (root->broadcast() == 0 && root->failure().empty())
      REQUIRE(root->submit(std::move(c)).empty());
    return m;
  };
  auto liar = sys.spawn(test::scripted_trainer, script);
  to_stop.push_back(caf::actor_cast<caf::actor>(liar));
  nccl_puller puller(sys, asking(liar), model, links(), std::nullopt, {}, true);
  std::string what;
  CHECK(failure_of(puller, "rollout-0", 2, v, what) == transfer::transfer_failure::checksum_mismatch);
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: two processes join one rendezvous, serve a version, rebuild without a worker") {
  // The trainer's process hosts rank 0, the engine's process both workers;
  // both receive the coordinator's rendezvous.
  auto factory = [this](const gpu::nccl_id&, const gpu::comm_layout& l, int rank) -> std::unique_ptr<gpu::p2p_link> {
    return test::fake_nccl_world::join(world, l, rank, staging);
  };
  gpu::nccl_membership trainer_process(factory), engine_process(factory);
  const comm_member rank0 = comm_member::trainer_rank(0), w0 = comm_member::worker("rollout-0", 0),
                    w1 = comm_member::worker("rollout-0", 1);
  auto rendezvous = [](std::uint64_t epoch, std::vector<comm_member> members) {
    gpu::nccl_rendezvous r;
    r.epoch = epoch;
    r.id.fill(static_cast<std::uint8_t>(epoch));
    r.members = gpu::make_layout(epoch, std::move(members)).members;
    return r;
  };
  auto join_both = [&](const gpu::nccl_rendezvous& r) {
    REQUIRE(trainer_process.join(r, {rank0}).empty());
    REQUIRE(engine_process.join(r, {w0, w1}).empty());
    desk->open(std::make_shared<gpu::nccl_sender>(trainer_process.link(rank0), 16));
  };
  nccl_puller puller(sys, asking(trainer), model, [&](const std::string& engine, int worker) {
    return engine_process.link(comm_member::worker(engine, worker));
  });
  join_both(rendezvous(1, {rank0, w0, w1}));
  const auto v = step();
  recording_sink rec;
  transfer::pull_engine(puller, "rollout-0", 2, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
  CHECK(rec.got[0] == expected(v));
  CHECK(rec.got[1] == expected(v));
  // Worker 1 is gone at the next boundary: epoch 2 leaves it out.
  join_both(rendezvous(2, {rank0, w0}));
  const auto v2 = step();
  recording_sink rec2;
  transfer::pull_engine(puller, "rollout-0", 1, v2, transfer_mode::broadcast, rec2.sink(), test::in(10s));
  CHECK(rec2.got[0] == expected(v2));
  std::string what;
  CHECK(failure_of(puller, "rollout-0", 2, v2, what) == transfer::transfer_failure::not_registered);
  CHECK(world->unmatched() == 0);
}

TEST_CASE("nccl: the trainer rank makes the id and joins the coordinator's rendezvous through its messages") {
  test::rlsync_config cfg;
  caf::actor_system sys{cfg};
  const model_config model = test::small_model(3);
  auto source = test::small_source(model, 4);
  auto world = test::fake_nccl_world::make();
  auto factory = [world](const gpu::nccl_id&, const gpu::comm_layout& l, int rank) -> std::unique_ptr<gpu::p2p_link> {
    return test::fake_nccl_world::join(world, l, rank, staging);
  };
  auto desk = std::make_shared<nccl_desk>();
  trainer_config c;
  c.source = source;
  c.step_time = 1h;
  c.nccl = desk;
  auto membership = std::make_shared<gpu::nccl_membership>(factory);
  c.nccl_membership = membership;
  c.nccl_rank = 0;
  c.make_nccl_id = [] { return std::vector<std::uint8_t>(gpu::nccl_id_bytes, 0x5a); };
  auto trainer = spawn_trainer(sys, std::move(c));
  test::stop_on_exit stop{caf::actor_cast<caf::actor>(trainer)};
  caf::scoped_actor coordinator{sys}; // this process: the one that may send rendezvous

  std::vector<std::uint8_t> id;
  coordinator->request(trainer, 10s, nccl_id_atom::value)
    .receive([&](std::vector<std::uint8_t>& got) { id = std::move(got); }, [](caf::error&) {});
  REQUIRE(id.size() == gpu::nccl_id_bytes);
  const comm_member rank0 = comm_member::trainer_rank(0), w0 = comm_member::worker("rollout-0", 0);
  auto rendezvous = [&](std::uint64_t epoch, std::vector<comm_member> members) {
    gpu::nccl_rendezvous r;
    r.epoch = epoch;
    std::copy(id.begin(), id.end(), r.id.begin());
    r.members = gpu::make_layout(epoch, std::move(members)).members;
    return gpu::to_wire(r);
  };
  auto join = [&](const nccl_rendezvous_msg& m, std::string& error) {
    std::uint64_t epoch = 0;
    coordinator->request(trainer, 10s, nccl_join_atom::value, m)
      .receive([&](std::uint64_t e) { epoch = e; }, [&](caf::error& e) { error = sys.render(e); });
    return epoch;
  };
  std::string error;
  CHECK(join(rendezvous(1, {rank0, w0}), error) == 1);
  REQUIRE(desk->producer());
  CHECK(desk->producer()->layout().epoch == 1);
  CHECK(desk->producer()->rank() == 0);

  // The engine's process joins the same rendezvous; its worker pulls.
  gpu::nccl_membership engine_process(factory);
  REQUIRE(engine_process.join(gpu::from_wire(rendezvous(1, {rank0, w0})), {w0}).empty());
  std::uint64_t v = 0;
  coordinator->request(trainer, 10s, step_atom::value).receive([&](const version_info& vi) { v = vi.version; },
                                                               [](caf::error&) {});
  nccl_puller puller(sys, [trainer] { return trainer; }, model,
                     [&](const std::string& engine, int worker) {
                       return engine_process.link(comm_member::worker(engine, worker));
                     });
  recording_sink rec;
  transfer::pull_engine(puller, "rollout-0", 1, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
  CHECK(rec.got[0].size() == source->find(v)->tensors().size());

  // A retry of the same rendezvous (its reply was lost) is answered and
  // keeps the sender; an older or malformed one is refused and changes nothing.
  const auto serving = desk->producer();
  CHECK(join(rendezvous(1, {rank0, w0}), error) == 1);
  CHECK(desk->producer() == serving);
  auto other_id = rendezvous(1, {rank0, w0});
  other_id.id[3] ^= 1;
  CHECK(join(other_id, error) == 0); // the same epoch with another id is no retry
  CHECK(error.find("differs from the first") != std::string::npos);
  CHECK(join(rendezvous(0, {rank0, w0}), error) == 0);
  CHECK(error.find("trainer rank 0: stale rendezvous") != std::string::npos);
  auto short_id = rendezvous(2, {rank0, w0});
  short_id.id.resize(8);
  CHECK(join(short_id, error) == 0);
  CHECK(error.find("an id of 8 bytes") != std::string::npos);
  CHECK(desk->producer()->layout().epoch == 1);
  // An epoch without this rank: it serves no nccl pulls.
  CHECK(join(rendezvous(2, {comm_member::trainer_rank(1), w0}), error) == 2);
  CHECK(desk->producer() == nullptr);
  // The collective with two ranks: its sender broadcasts in its own
  // communicator (it, then the workers), and sends point to point in the main one.
  auto two = rendezvous(3, {rank0, comm_member::trainer_rank(1), w0});
  two.root_ids = {std::vector<std::uint8_t>(gpu::nccl_id_bytes, 1), std::vector<std::uint8_t>(gpu::nccl_id_bytes, 2)};
  CHECK(join(two, error) == 3);
  REQUIRE(desk->producer());
  CHECK(desk->producer()->layout().members.size() == 3);
  CHECK(desk->producer()->collective_layout().members == std::vector<comm_member>{rank0, w0});
  CHECK(desk->producer()->collective_rank() == 0);

  // The coordinator says a member died: news of an older epoch changes
  // nothing; of the one joined, the rank's membership holds it, and its
  // sender's waits (dead_member_hooks) abort.
  auto told = [&](std::uint64_t epoch) {
    coordinator->send(trainer, nccl_dead_atom::value, epoch, std::string("engine rollout-0"));
    coordinator->request(trainer, 10s, version_atom::value).receive([](const version_info&) {}, [](caf::error&) {});
  };
  told(2);
  CHECK_FALSE(membership->dead_member().has_value());
  told(3);
  REQUIRE(membership->dead_member().has_value());
  CHECK(membership->dead_member()->find("engine rollout-0 died") != std::string::npos);
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: a pull waits its turn on a shared link, never past its deadline") {
  auto sender = open_sender(layout);
  const auto v = step();
  nccl_puller puller(sys, asking(trainer), model, links());
  // Another rank's pull, say, holds the link's turn on a thread of its own.
  std::promise<void> holding, release;
  std::thread other_exchange([&, link = worker_links[0]] {
    std::lock_guard<std::timed_mutex> turn(link->turn());
    holding.set_value();
    release.get_future().wait();
  });
  holding.get_future().wait();
  std::string what;
  CHECK(failure_of(puller, "rollout-0", 1, v, what, 300ms) == transfer::transfer_failure::timeout);
  CHECK(what.find("the link stayed busy past the deadline") != std::string::npos);
  release.set_value();
  other_exchange.join();
  recording_sink rec;
  transfer::pull_engine(puller, "rollout-0", 1, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
  CHECK(rec.got[0] == expected(v));
  CHECK(sender->failure().empty()); // nothing the busy link refused reached the sender
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: from the trainer rank's device copy, sharded (packed there) and whole") {
  trainer_config c;
  auto own = test::small_source(model, 4); // the fixture's trainer steps its own
  c.source = own;
  c.step_time = 1h;
  c.nccl = desk;
  c.nccl_pack_device = gpu::host_pack_device(); // the fake world's links stage in host memory
  auto on_device = spawn_trainer(sys, std::move(c));
  to_stop.push_back(caf::actor_cast<caf::actor>(on_device));
  auto sender = open_sender(layout);
  const auto v = test::step_trainer(sys, on_device);
  nccl_puller puller(sys, asking(on_device), model, links());
  for (bool in_place : {false, true}) {
    CAPTURE(in_place);
    test::test_engine e("rollout-0", model, 2, puller);
    e.in_place = in_place;
    auto report = e.pull(puller, v);
    test::check_identical(*e.weights, *test::loaded(*own->find(v), 2));
    CHECK(report.bytes == test::plan_bytes(e)); // the checksum after each group is not counted
  }
  const auto v2 = test::step_trainer(sys, on_device);
  test::test_engine e("rollout-0", model, 2, puller);
  e.pull(puller, v2);
  test::check_identical(*e.weights, *test::loaded(*own->find(v2), 2));
  // Broadcast mode: whole groups, copied from the same device copy.
  recording_sink rec;
  auto report = transfer::pull_engine(puller, "rollout-0", 2, v2, transfer_mode::broadcast, rec.sink(), test::in(10s));
  CHECK(report.groups == plan::group_count(model));
  REQUIRE(rec.got.size() == 2);
  CHECK(rec.got[0] == test::tensors_of(*own, v2));
  CHECK(rec.got[1] == test::tensors_of(*own, v2));
  CHECK(sender->failure().empty());
  CHECK(world->unmatched() == 0);
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: sharded, a device-packed group that changed, lacks its checksum or was not "
                                "asked for is refused") {
  const auto v = step();
  auto script = std::make_shared<test::trainer_script>();
  auto sender = std::make_shared<gpu::nccl_sender>(test::fake_nccl_world::join(world, layout, 0, staging), 16);
  auto device = gpu::host_pack_device();
  auto copy = std::make_shared<const gpu::device_snapshot>(*source->find(v), *device);
  auto lie = std::make_shared<std::string>(); // read on the sender's thread too: set only between pulls
  script->nccl = [&, device, copy, lie](const nccl_pull& req) -> caf::result<nccl_chunk> {
    auto plan = std::make_shared<plan::grouped_plan>(newest_plan(*script, req, model));
    auto layout_of = std::make_shared<gpu::pack_layout>(gpu::layout_group(*plan, req.group, *source->find(v)));
    nccl_chunk c{req.epoch, 0, layout_of->bytes + transfer::checksum_trailer_bytes, {}};
    c.trailer = true;
    c.bucket.version = req.version;
    c.bucket.group = req.group;
    if (*lie == "no room")
      c.bytes = layout_of->bytes;
    gpu::nccl_sender::job j{nullptr, layout.rank_of(comm_member::worker(req.engine, req.worker)),
                            gpu::clock::now() + 10s, "a group packed on the device"};
    j.fill = [device, copy, lie, layout_of](void* staging) {
      device->pack(*layout_of, copy->sources(), staging);
      if (*lie == "changed" && layout_of->bytes > 0)
        static_cast<std::uint8_t*>(staging)[layout_of->bytes / 2] ^= 0x10; // after its checksum was taken
    };
    j.fill_bytes = static_cast<std::size_t>(c.bytes);
    if (*lie != "no room" && *lie != "whole") // refused before any receive: nothing to send
      REQUIRE(sender->submit(std::move(j)).empty());
    return c;
  };
  auto rank = sys.spawn(test::scripted_trainer, script);
  to_stop.push_back(caf::actor_cast<caf::actor>(rank));
  nccl_puller puller(sys, asking(rank), model, links());
  test::test_engine e("rollout-0", model, 1, puller);
  e.pull(puller, v); // honest: verified by mixsum64
  test::check_identical(*e.weights, *test::loaded(*source->find(v), 1));
  std::string what;
  *lie = "changed";
  CHECK(sharded_failure(e, puller, v, what) == transfer::transfer_failure::checksum_mismatch);
  CHECK(what.find("packed on the trainer's device, failed its checksum (sent mixsum64") != std::string::npos);
  *lie = "no room";
  CHECK(sharded_failure(e, puller, v, what) == transfer::transfer_failure::producer_failed);
  CHECK(what.find("packs") != std::string::npos);
  CHECK(what.find("and its checksum") != std::string::npos);
  // Whole tensors asked for, a device-packed answer given.
  *lie = "whole";
  worker_links[0] = test::fake_nccl_world::join(world, layout, 1, staging); // the refusal aborted the last link
  recording_sink rec;
  try {
    transfer::pull_engine(puller, "rollout-0", 1, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
    FAIL("a device-packed answer to a whole-tensor pull was taken");
  } catch (const transfer::transfer_error& x) {
    CHECK(x.failure == transfer::transfer_failure::producer_failed);
    CHECK(std::string(x.what()).find("packed on the device, and engine rollout-0 worker 0 asked for whole tensors")
          != std::string::npos);
  }
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: sharded, a version the rank's device cannot hold is packed on the CPU") {
  auto full = std::make_shared<counting_device>(true);
  trainer_config c;
  auto own = test::small_source(model, 4);
  c.source = own;
  c.step_time = 1h;
  c.nccl = desk;
  c.nccl_pack_device = full;
  struct lines {
    std::mutex mutex;
    std::vector<std::string> said;
  };
  auto logs = std::make_shared<lines>(); // written on the trainer's thread
  c.log = [logs](const std::string& line) {
    std::lock_guard<std::mutex> lock(logs->mutex);
    logs->said.push_back(line);
  };
  auto rank = spawn_trainer(sys, std::move(c));
  to_stop.push_back(caf::actor_cast<caf::actor>(rank));
  open_sender(layout);
  const auto v = test::step_trainer(sys, rank);
  nccl_puller puller(sys, asking(rank), model, links());
  test::test_engine e("rollout-0", model, 2, puller);
  e.pull(puller, v);
  test::check_identical(*e.weights, *test::loaded(*own->find(v), 2));
  CHECK(full->allocations == 1); // tried once for the version, not for every group
  std::lock_guard<std::mutex> lock(logs->mutex);
  REQUIRE(logs->said.size() == 1);
  CHECK(logs->said.front().find("could not be copied to the device (cudaMalloc: out of memory): its groups are "
                                "packed on the CPU")
        != std::string::npos);
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: sharded, a version pushed from the rank's device is packed from that copy") {
  // A PyTorch rank publishing CUDA tensors: the push copies them to host
  // memory and to a device copy on the rank's device, which the trainer
  // packs from as it is. Its pack device could not hold an upload: every
  // group still goes the device way, with no allocation.
  auto full = std::make_shared<counting_device>(true);
  auto tensors = std::make_shared<test::fake_tensor_device>();
  auto pushed = test::device_pushed_source(model, tensors);
  auto v1 = test::small_source(model, 4)->produce_next();
  const auto inputs = test::state_dict_of(*v1, 0);
  pushed->push(1, inputs);
  CHECK(tensors->device_copies == static_cast<int>(inputs.size()));
  trainer_config c;
  c.source = pushed;
  c.step_time = 1h;
  c.nccl = desk;
  c.nccl_pack_device = full;
  auto rank = spawn_trainer(sys, std::move(c));
  to_stop.push_back(caf::actor_cast<caf::actor>(rank));
  open_sender(layout);
  REQUIRE(test::step_trainer(sys, rank) == 1);
  nccl_puller puller(sys, asking(rank), model, links());
  test::test_engine e("rollout-0", model, 2, puller);
  e.pull(puller, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 2));
  CHECK(full->allocations == 0);
  CHECK(full->packs > 0);
  CHECK(tensors->allocations == 1);
  // The rank keeps no adopted copy once its sends are done: version 3's
  // push drops version 1's copy (room for two: 1 and the pending 2) and then
  // version 2's (superseded unpublished), and both are freed.
  pushed->push(2, inputs);
  pushed->push(3, inputs);
  CHECK(test::eventually([&] { return tensors->live == 1; }));
}

TEST_CASE_FIXTURE(nccl_fixture, "nccl: collective, two ranks each broadcast in a communicator of their own, one rank after another") {
  // The main communicator (both ranks, both workers) and each rank's own
  // (it as rank 0, then the workers), each a world of its own, as NCCL's are.
  const auto main = gpu::make_layout(2, {comm_member::trainer_rank(0), comm_member::trainer_rank(1),
                                         comm_member::worker("rollout-0", 0), comm_member::worker("rollout-0", 1)});
  std::map<int, std::shared_ptr<test::fake_nccl_world>> own_world{{0, test::fake_nccl_world::make()},
                                                                  {1, test::fake_nccl_world::make()}};
  std::map<int, trainer_actor> trainers{{0, trainer}};
  std::map<int, std::shared_ptr<nccl_desk>> desks{{0, desk}};
  {
    trainer_config c; // rank 1: a source of its own with the same seeds (the same bytes), its own desk
    c.source = test::small_source(model, 4);
    c.step_time = 1h;
    c.nccl = desks[1] = std::make_shared<nccl_desk>();
    c.nccl_join_window = 300ms;
    c.nccl_bucket_bytes = 1;
    trainers[1] = spawn_trainer(sys, std::move(c));
    to_stop.push_back(caf::actor_cast<caf::actor>(trainers[1]));
  }
  std::map<int, std::shared_ptr<gpu::nccl_sender>> senders;
  for (int r : {0, 1}) {
    senders[r] = std::make_shared<gpu::nccl_sender>(test::fake_nccl_world::join(world, main, r, staging), 16,
                                                    gpu::wait_hooks{},
                                                    test::fake_nccl_world::join(own_world[r], gpu::root_layout(main, r), 0, staging));
    desks[r]->open(senders[r]);
    CHECK(senders[r]->collective_rank() == 0);
    CHECK(senders[r]->collective_layout().members.size() == 3);
  }
  std::map<std::pair<int, int>, std::shared_ptr<gpu::p2p_link>> own_links; // (rank, worker)
  for (int w : {0, 1}) {
    worker_links[w] = test::fake_nccl_world::join(world, main, 2 + w, staging);
    for (int r : {0, 1})
      own_links[{r, w}] = test::fake_nccl_world::join(own_world[r], gpu::root_layout(main, r), 1 + w, staging);
  }
  auto own = [&](int r) -> nccl_puller::link_of {
    return [&own_links, r](const std::string& engine, int worker) -> std::shared_ptr<gpu::p2p_link> {
      auto it = own_links.find({r, worker});
      return engine == "rollout-0" && it != own_links.end() ? it->second : nullptr;
    };
  };
  nccl_puller rank0(sys, asking(trainers[0]), model, links(), std::nullopt, {}, true, {}, own(0));
  nccl_puller rank1(sys, asking(trainers[1]), model, links(), std::nullopt, {}, true, {}, own(1));
  CHECK(rank0.needs_rank_order(transfer_mode::broadcast));
  CHECK_FALSE(rank0.needs_rank_order(transfer_mode::sharded));
  // Both ranks at one version (each may or may not have made its first at start).
  auto v = step();
  auto v1 = test::step_trainer(sys, trainers[1]);
  for (int i = 0; i < 4 && v != v1; ++i)
    (v < v1 ? v : v1) = v < v1 ? step() : test::step_trainer(sys, trainers[1]);
  REQUIRE(v == v1);
  // In rank order, as the M:N pull takes them (tested apart): rank 0's collective, then rank 1's, each
  // with both workers at once.
  for (auto* p : {&rank0, &rank1}) {
    recording_sink rec;
    const auto report = transfer::pull_engine(*p, "rollout-0", 2, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
    CHECK(report.groups == plan::group_count(model));
    REQUIRE(rec.got.size() == 2);
    CHECK(rec.got[0] == expected(v));
    CHECK(rec.got[1] == expected(v));
  }
  for (int r : {0, 1}) {
    CAPTURE(r);
    CHECK(counted(*senders[r], &gpu::nccl_sender::broadcast, plan::group_count(model))); // one broadcast a group
    CHECK(senders[r]->sent() == 0);
    CHECK(own_world[r]->open_broadcasts() == 0);
  }
  CHECK(world->open_broadcasts() == 0); // the main communicator broadcast nothing
}
