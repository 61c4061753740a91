// The cuda_ipc backend end to end on the real scheduler, with device memory
// played in host memory (tests/gpu/fake_ipc_memory.hpp): a trainer with an
// ipc_producer serves engine workers through its exported buffer; the
// puller verifies what it copies out and refuses a producer that lies.
#include "actors/ipc_puller.hpp"

#include "actors/caf_puller.hpp"

#include "actors/system_config.hpp"
#include "actors/trainer.hpp"
#include "runtime/config/topology.hpp"
#include "gpu/ipc_producer.hpp"
#include "tests/gpu/fake_ipc_memory.hpp"
#include "tests/support/scripted_trainer.hpp"
#include "tests/support/threaded_system.hpp"
#include "tests/support/whole_group_pulls.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/bucket.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>

using namespace rlsync;
using namespace std::chrono_literals;

namespace {

using test::tensors_by_name;
using recording_sink = test::whole_tensor_sink;

std::function<trainer_actor()> asking(trainer_actor t) {
  return [t] { return t; };
}

/// Everything `a` was sent before this call has been handled when it returns.
void drain(caf::actor_system& sys, const trainer_actor& a) {
  caf::scoped_actor self{sys};
  self->request(a, 10s, version_atom::value).receive([](const version_info&) {}, [](caf::error&) {});
}

struct ipc_fixture {
  test::rlsync_config cfg;
  caf::actor_system sys{cfg};
  std::shared_ptr<test::fake_ipc_memory> memory = std::make_shared<test::fake_ipc_memory>();
  model_config model = test::small_model(3);
  std::shared_ptr<transfer::synthetic_source> source = test::small_source(model, 4);
  std::shared_ptr<ipc_desk> desk = std::make_shared<ipc_desk>();
  trainer_actor trainer;
  std::vector<caf::actor> to_stop;

  ipc_fixture() {
    trainer_config c;
    c.source = source;
    c.step_time = 1h; // versions come when the test asks
    c.cuda_ipc = desk;
    trainer = spawn_trainer(sys, std::move(c));
    to_stop.push_back(caf::actor_cast<caf::actor>(trainer));
  }
  ~ipc_fixture() {
    for (auto& a : to_stop)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  std::uint64_t step() { return test::step_trainer(sys, trainer); }

  /// What the source's largest group packs to (its tensors are bf16).
  std::size_t largest_group_bytes() const {
    std::vector<std::size_t> bytes(plan::group_count(model), 0);
    for (const auto& spec : llama_parameter_specs(model, dtype::bf16))
      bytes[plan::group_of(model, spec.name)] += static_cast<std::size_t>(spec.bytes());
    return *std::max_element(bytes.begin(), bytes.end());
  }

  tensors_by_name expected(std::uint64_t v) const { return test::tensors_of(*source, v); }

  transfer::transfer_failure failure_of(transfer::weight_puller& p, const std::string& engine, std::uint64_t v,
                                        std::string& what) {
    return test::pull_failure(p, engine, 1, v, what);
  }
};

} // namespace

TEST_CASE_FIXTURE(ipc_fixture, "cuda_ipc: workers pull whole groups through the trainer's exported buffer") {
  auto producer = std::make_shared<gpu::ipc_producer>(memory, largest_group_bytes(), 2);
  desk->open(producer);
  const auto v = step();
  ipc_puller puller(sys, asking(trainer), model, memory);
  recording_sink rec;
  auto report = transfer::pull_engine(puller, "rollout-0", 2, v, transfer_mode::sharded, rec.sink(), test::in(10s));
  CHECK(report.groups == plan::group_count(model));
  const auto want = expected(v);
  REQUIRE(rec.got.size() == 2);
  CHECK(rec.got[0] == want); // whole tensors: each worker slices its own shard
  CHECK(rec.got[1] == want);
  // One buffer, mapped once per session, no mapping left behind.
  CHECK(memory->allocations == 1);
  CHECK(memory->mappings_made == 2);
  CHECK(memory->mappings_open == 0);
  auto stats = producer->stats();
  CHECK(stats.sessions == 2);
  CHECK(stats.chunks == 2 * plan::group_count(model));
  CHECK(stats.aborted == 0);
  // Both sessions were released: another engine's workers find free slots.
  const auto v2 = step();
  recording_sink rec2;
  transfer::pull_engine(puller, "rollout-1", 2, v2, transfer_mode::sharded, rec2.sink(), test::in(10s));
  CHECK(rec2.got[0] == expected(v2));
  CHECK(rec2.got[1] == expected(v2));
}

TEST_CASE_FIXTURE(ipc_fixture, "cuda_ipc: for an engine on a device, each group is packed by the worker's plan "
                                "from the mapping and landed as the runs a sharded pull stores") {
  auto producer = std::make_shared<gpu::ipc_producer>(memory, largest_group_bytes(), 2);
  desk->open(producer);
  const auto v = step();
  ipc_puller puller(sys, asking(trainer), model, memory);
  const int tp = 2;
  std::vector<std::shared_ptr<const plan::grouped_plan>> plans;
  for (int w = 0; w < tp; ++w) {
    auto p = std::make_shared<const plan::worker_plan>(engine::make_plan(model, tp, w, dtype::bf16));
    puller.register_worker("rollout-0", p);
    plans.push_back(std::make_shared<const plan::grouped_plan>(model, p));
  }
  // Each worker's store targets: one per plan entry, in host memory of
  // the test's own; the runs landed are recorded by where they go.
  std::mutex mutex;
  std::map<int, std::map<std::uint32_t, std::vector<std::uint8_t>>> stores; // worker, group: the packed bytes
  std::map<const std::uint8_t*, std::vector<std::uint8_t>> landed;          // target: the run's bytes
  int wrong_device = 0;
  recording_sink rec;
  auto sink = rec.sink();
  sink.targets = [&](int w, std::uint32_t g) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& store = stores[w][g];
    store.resize(plans[static_cast<std::size_t>(w)]->bytes(g));
    std::vector<transfer::store_target> out;
    std::size_t at = 0;
    for (const auto* e : plans[static_cast<std::size_t>(w)]->entries(g)) {
      out.push_back({store.data() + at, static_cast<std::size_t>(e->bytes())});
      at += static_cast<std::size_t>(e->bytes());
    }
    return out;
  };
  sink.on_stored = [](int, std::uint32_t) { FAIL("whole groups are delivered, never stored"); };
  sink.on_device = [&](const transfer::store_target& t, const void* bytes, int device) {
    std::lock_guard<std::mutex> lock(mutex);
    wrong_device += device != 0 ? 1 : 0;
    const auto* b = static_cast<const std::uint8_t*>(bytes);
    landed[t.at].assign(b, b + t.bytes);
  };
  transfer::pull_engine(puller, "rollout-0", tp, v, transfer_mode::sharded, sink, test::in(10s));
  CHECK(rec.got[0] == expected(v)); // the host path as before
  CHECK(wrong_device == 0);
  const auto snapshot = source->find(v);
  REQUIRE(snapshot);
  std::size_t runs = 0;
  for (int w = 0; w < tp; ++w)
    for (std::uint32_t g = 0; g < plans[static_cast<std::size_t>(w)]->group_count(); ++g) {
      CAPTURE(w);
      CAPTURE(g);
      const auto& plan = *plans[static_cast<std::size_t>(w)];
      std::vector<std::uint8_t> want(plan.bytes(g));
      transfer::pack_group(plan, g, *snapshot, want.data());
      auto& store = stores[w][g];
      std::vector<std::uint8_t> got;
      std::size_t at = 0;
      for (const auto* e : plan.entries(g)) {
        const auto it = landed.find(store.data() + at);
        REQUIRE(it != landed.end());
        got.insert(got.end(), it->second.begin(), it->second.end());
        at += static_cast<std::size_t>(e->bytes());
        ++runs;
      }
      CHECK(got == want);
    }
  CHECK(runs == landed.size());
  // A group that fails its checksum lands nothing (nor does any after it).
  landed.clear();
  const auto v3 = step();
  memory->corrupt_reads = true;
  CHECK_THROWS_AS(transfer::pull_engine(puller, "rollout-0", tp, v3, transfer_mode::sharded, sink, test::in(10s)),
                  transfer::transfer_error);
  CHECK(landed.empty());
  memory->corrupt_reads = false;
  // Without a plan registered (or a sink that lands nothing) nothing lands.
  landed.clear();
  const auto v2 = step();
  ipc_puller unregistered(sys, asking(trainer), model, memory);
  transfer::pull_engine(unregistered, "rollout-0", tp, v2, transfer_mode::sharded, sink, test::in(10s));
  CHECK(landed.empty());
}

TEST_CASE("CAF puller: groups_in_flight groups are asked for before the first answer, and no more") {
  test::rlsync_config cfg;
  caf::actor_system sys{cfg};
  const topology t = test::small_topology(3);
  for (std::size_t in_flight : {1, 3}) {
    CAPTURE(in_flight);
    auto script = std::make_shared<test::trainer_script>();
    script->pulls_answered_together = 3; // nothing is answered before three are asked
    auto trainer = caf::actor_cast<trainer_actor>(sys.spawn(test::scripted_trainer, script));
    test::stop_on_exit stop{caf::actor_cast<caf::actor>(trainer)};
    caf_puller puller(sys, asking(trainer), t.model.config, std::nullopt, in_flight);
    recording_sink rec;
    try {
      transfer::pull_engine(puller, "rollout-0", 1, 1, transfer_mode::broadcast, rec.sink(), test::in(1500ms));
      FAIL("a pull succeeded against a trainer that refuses every group");
    } catch (const transfer::transfer_error& e) {
      if (in_flight == 3) // three asked at once: all answered
        CHECK(std::string(e.what()).find("answered together with 3 pulls") != std::string::npos);
      else // one at a time: the first never answered
        CHECK(e.failure == transfer::transfer_failure::timeout);
    }
  }
}

TEST_CASE("whole groups: a bucket whose tensors are not its group's is refused, naming the tensor") {
  const model_config model = test::small_model(3);
  const group_tensors expected(model);
  // Group 1 (layer 1) and group 2's tensors, as a trainer would send them (bf16, zeros).
  std::map<std::uint32_t, std::vector<tensor_spec>> by_group;
  for (const auto& spec : llama_parameter_specs(model, dtype::bf16))
    by_group[plan::group_of(model, spec.name)].push_back(spec);
  std::deque<std::vector<std::byte>> storage;
  auto view_of = [&](const tensor_spec& spec) {
    tensor_view v;
    static_cast<tensor_spec&>(v) = spec;
    v.size = static_cast<std::size_t>(spec.bytes());
    v.data = storage.emplace_back(v.size).data();
    return v;
  };
  std::vector<tensor_view> group1;
  for (const auto& spec : by_group.at(1))
    group1.push_back(view_of(spec));
  auto deliver = [&](const std::vector<tensor_view>& tensors) -> std::string {
    const auto buckets = transfer::bucketize(7, 1, tensors, std::uint64_t{1} << 30);
    REQUIRE(buckets.size() == 1);
    transfer::pull_request req;
    req.version = 7;
    transfer::group_sink sink;
    std::size_t delivered = 0;
    sink.on_full_group = [&](int, std::uint32_t, const std::vector<tensor_view>&) { ++delivered; };
    transfer::pull_report report;
    try {
      deliver_whole_group(expected, req, 1, buckets.front(), sink, report);
    } catch (const transfer::transfer_error& e) {
      CHECK(e.failure == transfer::transfer_failure::producer_failed);
      CHECK(delivered == 0);
      return e.what();
    }
    CHECK(delivered == 1);
    return {};
  };
  CHECK(deliver(group1).empty());
  CHECK(deliver({group1.begin(), group1.begin() + 1}).empty()); // a rank may hold part of a group

  auto twice = group1;
  twice.push_back(group1.front());
  CHECK(deliver(twice).find("'" + group1.front().name + "' comes twice") != std::string::npos);

  auto foreign = group1;
  foreign.push_back(view_of(by_group.at(2).front()));
  CHECK(deliver(foreign).find("'" + by_group.at(2).front().name + "' is not a tensor of group 1 of the model")
        != std::string::npos);

  auto reshaped = group1;
  tensor_spec odd = by_group.at(1).front();
  odd.shape = {3, 7};
  reshaped.front() = view_of(odd);
  CHECK(deliver(reshaped).find("'" + odd.name + "' has shape [3, 7], the model's is ") != std::string::npos);

  auto unknown = group1;
  tensor_spec made_up{"model.layers.1.made_up.weight", dtype::bf16, {4}};
  unknown.push_back(view_of(made_up));
  CHECK(deliver(unknown).find("'model.layers.1.made_up.weight' is not a tensor of group 1") != std::string::npos);
}

TEST_CASE("cuda_ipc and CAF: a rank's puller streams only the groups that rank holds") {
  test::rlsync_config cfg;
  caf::actor_system sys{cfg};
  topology t = test::small_topology(3);
  t.trainer.step_time = 1h;
  t.trainer.ranks = {trainer_rank{"a", {0, 1}}, trainer_rank{"a", {2}}};
  auto rank = make_local_trainer(sys, t, 1); // the last layer's rank
  test::stop_on_exit stop{caf::actor_cast<caf::actor>(rank.actor)};
  std::uint64_t v = 0;
  {
    caf::scoped_actor self{sys};
    self->request(rank.actor, 10s, step_atom::value).receive([&](const version_info& vi) { v = vi.version; },
                                                             [](caf::error&) {});
  }
  REQUIRE(v > 0);
  std::vector<std::string> held;
  tensors_by_name want;
  for (const auto& tensor : rank.source->find(v)->tensors()) {
    held.push_back(tensor.name);
    want[tensor.name] = test::bytes_of(tensor);
  }
  const auto groups = groups_holding(t.model.config, held);
  REQUIRE(groups.size() < plan::group_count(t.model.config));
  auto memory = std::make_shared<test::fake_ipc_memory>();
  rank.cuda_ipc->open(std::make_shared<gpu::ipc_producer>(memory, 1 << 20, 1));
  ipc_puller over_ipc(sys, asking(rank.actor), t.model.config, memory, groups);
  caf_puller over_caf(sys, asking(rank.actor), t.model.config, groups);
  for (transfer::weight_puller* p : {static_cast<transfer::weight_puller*>(&over_ipc),
                                     static_cast<transfer::weight_puller*>(&over_caf)}) {
    recording_sink rec;
    auto report = transfer::pull_engine(*p, "rollout-0", 1, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
    CHECK(report.groups == groups.size());
    CHECK(rec.got[0] == want);
  }
  // Asked for every group, as both did before, a rank refuses the first it lacks.
  caf_puller every_group(sys, asking(rank.actor), t.model.config);
  recording_sink rec;
  try {
    transfer::pull_engine(every_group, "rollout-0", 1, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
    FAIL("a rank served a group it does not hold");
  } catch (const transfer::transfer_error& e) {
    CHECK(std::string(e.what()).find("is not held by this trainer") != std::string::npos);
  }
}

TEST_CASE_FIXTURE(ipc_fixture, "cuda_ipc and CAF: a pull let go stops before its next group, and the next pull succeeds") {
  auto producer = std::make_shared<gpu::ipc_producer>(memory, largest_group_bytes(), 2);
  desk->open(producer);
  const auto v = step();
  ipc_puller over_ipc(sys, asking(trainer), model, memory);
  caf_puller over_caf(sys, asking(trainer), model);
  for (transfer::weight_puller* p : {static_cast<transfer::weight_puller*>(&over_ipc),
                                     static_cast<transfer::weight_puller*>(&over_caf)}) {
    CAPTURE((p == &over_ipc ? "cuda_ipc" : "caf"));
    recording_sink rec;
    auto sink = rec.sink();
    // Let go once the first group arrived (its round went on without it).
    std::atomic<int> groups{0};
    auto record = sink.on_full_group;
    sink.on_full_group = [&](int w, std::uint32_t g, const std::vector<tensor_view>& tensors) {
      record(w, g, tensors);
      ++groups;
    };
    sink.abandoned = [&] { return groups.load() > 0; };
    try {
      transfer::pull_engine(*p, "rollout-0", 1, v, transfer_mode::broadcast, sink, test::in(10s));
      FAIL("a pull let go completed");
    } catch (const transfer::transfer_error& e) {
      CHECK(e.failure == transfer::transfer_failure::abandoned);
      CHECK(std::string(e.what()).find("after 1 of " + std::to_string(plan::group_count(model)) + " groups")
            != std::string::npos);
    }
    CHECK(groups == 1);
    // Nothing is left held: the same engine pulls the version whole next.
    recording_sink again;
    auto report = transfer::pull_engine(*p, "rollout-0", 1, v, transfer_mode::broadcast, again.sink(), test::in(10s));
    CHECK(report.groups == plan::group_count(model));
    CHECK(again.got[0] == expected(v));
  }
  CHECK(memory->mappings_open == 0);
}

TEST_CASE_FIXTURE(ipc_fixture, "cuda_ipc: bytes that changed in device memory fail the pull, the next one succeeds") {
  desk->open(std::make_shared<gpu::ipc_producer>(memory, largest_group_bytes(), 1));
  const auto v = step();
  ipc_puller puller(sys, asking(trainer), model, memory);
  memory->corrupt_reads = true;
  std::string what;
  CHECK(failure_of(puller, "rollout-0", v, what) == transfer::transfer_failure::checksum_mismatch);
  CHECK(memory->mappings_open == 0);
  memory->corrupt_reads = false;
  recording_sink rec;
  transfer::pull_engine(puller, "rollout-0", 1, v, transfer_mode::sharded, rec.sink(), test::in(10s));
  CHECK(rec.got[0] == expected(v));
}

TEST_CASE_FIXTURE(ipc_fixture, "cuda_ipc: a trainer without a producer, or a version it no longer holds, is refused") {
  const auto v = step();
  ipc_puller puller(sys, asking(trainer), model, memory);
  std::string what;
  CHECK(failure_of(puller, "rollout-0", v, what) == transfer::transfer_failure::producer_failed);
  CHECK(what.find("runs no cuda_ipc producer") != std::string::npos);
  desk->open(std::make_shared<gpu::ipc_producer>(memory, largest_group_bytes(), 1));
  CHECK(failure_of(puller, "rollout-0", v + 100, what) == transfer::transfer_failure::version_unavailable);
  // A worker number past the largest tp would take another engine's slot.
  desk->open(std::make_shared<gpu::ipc_producer>(memory, largest_group_bytes(), 4, 2));
  {
    recording_sink rec;
    try {
      transfer::pull_engine(puller, "rollout-0", 3, v, transfer_mode::broadcast, rec.sink(), test::in(10s));
      FAIL("worker 2 of 2 at most was served");
    } catch (const transfer::transfer_error& e) {
      CHECK(std::string(e.what()).find("engines have at most 2 workers") != std::string::npos);
    }
  }
  // The slot is too small for a group: the producer says so.
  desk->open(std::make_shared<gpu::ipc_producer>(memory, 16, 1));
  CHECK(failure_of(puller, "rollout-0", v, what) == transfer::transfer_failure::producer_failed);
  CHECK(what.find("does not fit an IPC slot") != std::string::npos);
}

/// What an honest producer answers for `req` in session `session`: the
/// group's bucket from the real trainer, written at the start of `buffer`.
ipc_chunk honest_answer(caf::actor_system& sys, const trainer_actor& trainer, gpu::ipc_memory::buffer& buffer,
                        std::uint64_t session, const ipc_pull& req) {
  weight_bucket b;
  caf::scoped_actor asker{sys};
  asker->request(trainer, 10s, pull_atom::value, req.version, req.group)
    .receive([&](weight_bucket& got) { b = std::move(got); }, [](caf::error&) {});
  buffer.write(0, b.data.data(), b.data.size());
  ipc_chunk c;
  c.session = session;
  c.chunk = req.chunk;
  c.handle.assign(buffer.handle().begin(), buffer.handle().end());
  c.buffer_bytes = buffer.size();
  c.offset = 0;
  c.bytes = b.data.size();
  b.data.clear();
  c.bucket = std::move(b);
  return c;
}

TEST_CASE_FIXTURE(ipc_fixture, "cuda_ipc: a producer that lies is refused before a byte is read, and released") {
  // A scripted trainer answers with real group layouts and checksums from
  // the source, and lies about one field per case.
  const auto v = step();
  auto real = memory->allocate(largest_group_bytes() * 2);
  struct lie {
    const char* name;
    std::function<void(ipc_chunk&)> edit; ///< applied to every answer
    std::uint32_t at_chunk;               ///< ... from this chunk on
    const char* says;
  };
  const std::vector<lie> lies = {
    {"a short handle", [](ipc_chunk& c) { c.handle.resize(10); }, 0, "a handle of 10 bytes"},
    {"a range past the buffer", [](ipc_chunk& c) { c.offset = c.buffer_bytes - 1; }, 0, "outside"},
    {"more bytes than any group", [](ipc_chunk& c) { c.bytes = std::uint64_t{1} << 40; }, 0, "largest group"},
    {"another session mid-pull", [](ipc_chunk& c) { c.session += 1; }, 1, "another session"},
    {"a chunk out of order", [](ipc_chunk& c) { c.chunk += 1; }, 1, "was next"},
    {"a handle that is not exported", [](ipc_chunk& c) { c.handle[5] ^= 0xff; }, 0, "cannot map"},
  };
  std::uint64_t session = 1000;
  for (const auto& l : lies) {
    CAPTURE(l.name);
    auto script = std::make_shared<test::trainer_script>();
    const std::uint64_t this_session = ++session;
    script->ipc = [&, this_session](const ipc_pull& req) -> caf::result<ipc_chunk> {
      auto c = honest_answer(sys, trainer, *real, this_session, req);
      if (req.chunk >= l.at_chunk)
        l.edit(c);
      return c;
    };
    auto liar = sys.spawn(test::scripted_trainer, script);
    to_stop.push_back(caf::actor_cast<caf::actor>(liar));
    ipc_puller puller(sys, asking(liar), model, memory);
    std::string what;
    CHECK(failure_of(puller, "rollout-0", v, what) == transfer::transfer_failure::producer_failed);
    CHECK(what.find(l.says) != std::string::npos);
    CHECK(memory->mappings_open == 0);
    // Whatever was refused, the session the liar opened is released.
    drain(sys, liar);
    REQUIRE(script->ipc_releases.size() == 1);
    CHECK(script->ipc_releases[0].session == this_session);
    CHECK(script->ipc_releases[0].engine == "rollout-0");
  }
  // The same session twice is a replay: refused at its chunk 0.
  auto script = std::make_shared<test::trainer_script>();
  script->ipc = [&](const ipc_pull& req) -> caf::result<ipc_chunk> {
    return honest_answer(sys, trainer, *real, 7, req);
  };
  auto replayer = sys.spawn(test::scripted_trainer, script);
  to_stop.push_back(caf::actor_cast<caf::actor>(replayer));
  ipc_puller puller(sys, asking(replayer), model, memory);
  recording_sink rec;
  transfer::pull_engine(puller, "rollout-0", 1, v, transfer_mode::sharded, rec.sink(), test::in(10s));
  CHECK(rec.got[0] == expected(v));
  std::string what;
  CHECK(failure_of(puller, "rollout-0", v, what) == transfer::transfer_failure::producer_failed);
  CHECK(what.find("a replay") != std::string::npos);
}
